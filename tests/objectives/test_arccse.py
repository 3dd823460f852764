"""ArcCon (ArcCSE eq. 3), the masked-triplet loss (eq. 4) and ArcCSE (eq. 5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from objective_testing import (
    grads,
    numpy_unit,
    objective,
    paradigm_gradient,
    split_angles,
    tangent,
    views,
)

from stages.objectives import diagnostics
from stages.objectives.arccse import arccon_logits
from stages.objectives.geometry import cosine_matrix
from stages.objectives.infonce import cross_entropy_per_anchor


def arccon_transcribed(z, z_pos, tau: float, margin_deg: float) -> float:
    h, h_pos = numpy_unit(z), numpy_unit(z_pos)
    m = math.radians(margin_deg)
    losses = []
    for i in range(len(h)):
        positive = math.exp(math.cos(math.acos(h[i] @ h_pos[i]) + m) / tau)
        negatives = sum(math.exp(h[i] @ h_pos[j] / tau) for j in range(len(h)) if j != i)
        losses.append(-math.log(positive / (positive + negatives)))
    return float(np.mean(losses))


def triplet_transcribed(h0, h1, h2, margin: float) -> float:
    a, b, c = (numpy_unit(x) for x in (h0, h1, h2))
    return float(np.mean([max(0.0, a[i] @ c[i] - a[i] @ b[i] + margin) for i in range(len(a))]))


@pytest.mark.parametrize(("tau", "margin_deg"), [(0.05, 10.0), (0.1, 25.0)])
def test_arccon_is_eq3(tau, margin_deg):
    z, z_pos = views(correlated=1.0)
    out = objective("arccon", tau=tau, margin_deg=margin_deg)(z, z_pos)
    assert out.loss.item() == pytest.approx(
        arccon_transcribed(z, z_pos, tau, margin_deg), rel=1e-12
    )


def test_zero_margin_is_exactly_nt_xent():
    z, z_pos = views()
    arccon = objective("arccon", margin_deg=0)(z, z_pos).loss
    assert arccon.item() == objective("infonce", tau=0.05)(z, z_pos).loss.item()


def test_margin_never_raises_the_positive_logit():
    """cos(theta + m) < cos(theta) for theta <= pi - m (ArcCSE Part C check)."""
    cos = torch.linspace(-0.98, 0.999, 200, dtype=torch.float64)
    m = math.radians(10)
    with_margin = arccon_logits(torch.diag(cos), 1.0, m).diagonal()
    allowed = torch.acos(cos) <= math.pi - m
    assert (with_margin[allowed] < cos[allowed]).all()


def test_gradient_is_paper002_table1_paradigm():
    """ArcCon (eq. 2): GD with the margin on the positive, R = sin(theta + u) / sin theta."""
    tau, u = 0.05, math.radians(10)
    h, h_pos = views(unit=True, correlated=1.0)
    logits = arccon_logits(cosine_matrix(h, h_pos.detach()), tau, u)
    (g,) = grads(cross_entropy_per_anchor(logits).sum(), h)
    theta_pos, theta_neg, columns = split_angles(h, h_pos)
    components = diagnostics.arccon_components(theta_pos, theta_neg, tau, u)
    expected = paradigm_gradient(*components, h_pos.detach(), columns)
    torch.testing.assert_close(g, tangent(expected, h.detach()), rtol=1e-9, atol=1e-12)


def test_arccse_is_arccon_plus_weighted_triplet_loss():
    z, z_pos = views(correlated=1.0)
    triplets = (*views(n=5, seed=1), views(n=5, seed=2)[0])
    loss = objective("arccse", triplet_weight=0.1)(z, z_pos, triplets=triplets).loss
    expected = arccon_transcribed(z, z_pos, 0.05, 10.0) + 0.1 * triplet_transcribed(*triplets, 0.0)
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_triplet_loss_vanishes_when_the_short_mask_is_closer():
    h = torch.randn(6, 16, dtype=torch.float64)
    short = h + 0.1 * torch.randn(6, 16, dtype=torch.float64)
    long = -h  # as far as possible
    out = objective("arccse")(h, h + 0.01, triplets=(h, short, long))
    assert out.stats["triplet_loss"].item() == 0
    assert out.stats["triplet_active_fraction"].item() == 0


@pytest.mark.parametrize("triplets", [None, "empty"])
def test_steps_without_triplets_are_plain_arccon(triplets):
    z, z_pos = views()
    if triplets == "empty":
        triplets = tuple(torch.zeros(0, z.size(1), dtype=z.dtype) for _ in range(3))
    loss = objective("arccse")(z, z_pos, triplets=triplets).loss
    assert loss.item() == objective("arccon")(z, z_pos).loss.item()


def test_triplet_branch_receives_gradient():
    """The dropout-off forward is not wrapped in no_grad: its representations get gradient."""
    z, z_pos = views()
    triplets = (*views(n=4, seed=3), views(n=4, seed=4)[0])
    loss = objective("arccse", triplet_margin=1.0)(z, z_pos, triplets=triplets).loss
    assert all(g.abs().sum() > 0 for g in grads(loss, *triplets))
