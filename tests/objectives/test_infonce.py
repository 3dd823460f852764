"""InfoNCE (SimCSE eq. 1): value, paper 002's Table 1 decomposition, paper 003's eq. 6 norms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from objective_testing import (
    grads,
    numpy_unit,
    objective,
    pair_gradient_norms,
    paradigm_gradient,
    split_angles,
    tangent,
    views,
)

from stages.objectives import diagnostics
from stages.objectives.geometry import cosine_matrix
from stages.objectives.infonce import cross_entropy_per_anchor


def infonce_transcribed(z, z_pos, tau: float) -> float:
    h, h_pos = numpy_unit(z), numpy_unit(z_pos)
    losses = []
    for i in range(len(h)):
        denominator = sum(math.exp(h[i] @ h_pos[j] / tau) for j in range(len(h)))
        losses.append(-math.log(math.exp(h[i] @ h_pos[i] / tau) / denominator))
    return float(np.mean(losses))


@pytest.mark.parametrize("tau", [0.05, 0.3])
def test_loss_is_eq1(tau):
    z, z_pos = views(correlated=1.0)
    out = objective("infonce", tau=tau)(z, z_pos)
    assert out.loss.item() == pytest.approx(infonce_transcribed(z, z_pos, tau), rel=1e-12)


def test_scheduled_tau_overrides_the_configured_one():
    z, z_pos = views()
    scheduled = objective("infonce", tau=0.05)(z, z_pos, tau=0.1).loss
    assert scheduled.item() == pytest.approx(objective("infonce", tau=0.1)(z, z_pos).loss.item())


def test_stats_are_detached_scalars_of_the_batch():
    z, z_pos = views()
    stats = objective("infonce")(z, z_pos).stats
    cos = cosine_matrix(z, z_pos).detach()
    assert stats["pos_cos"].item() == pytest.approx(cos.diagonal().mean().item())
    off = cos[~torch.eye(len(cos), dtype=torch.bool)]
    assert stats["neg_cos"].item() == pytest.approx(off.mean().item())
    assert all(s.ndim == 0 and not s.requires_grad for s in stats.values())


def test_gradient_is_paper002_table1_paradigm():
    """dL_i/dh_i = GD sum_j W_j (h'_j - h'_i), GD and W from Table 1 (eq. 1)."""
    tau = 0.05
    h, h_pos = views(unit=True, correlated=1.0)
    (g,) = grads(cross_entropy_per_anchor(cosine_matrix(h, h_pos.detach()) / tau).sum(), h)
    theta_pos, theta_neg, columns = split_angles(h, h_pos)
    components = diagnostics.infonce_components(theta_pos, theta_neg, tau)
    expected = paradigm_gradient(*components, h_pos.detach(), columns)
    torch.testing.assert_close(g, tangent(expected, h.detach()), rtol=1e-9, atol=1e-12)


def test_gradient_norms_are_paper003_eq6():
    """Per pair: ||grad^pos|| and ||grad^neg_j|| equal the closed forms of B.3 / ||h_i||."""
    tau = 0.05
    z, z_pos = views(correlated=1.0)
    norms = pair_gradient_norms(lambda c: cross_entropy_per_anchor(c / tau).sum(), z, z_pos)
    theta_pos, theta_neg, columns = split_angles(z, z_pos)
    scale = z.detach().norm(dim=1)
    positive = diagnostics.cl_positive_norm(theta_pos, theta_neg, tau) / scale
    torch.testing.assert_close(norms.diagonal(), positive, rtol=1e-9, atol=1e-14)
    negative = diagnostics.cl_negative_norms(theta_pos, theta_neg, tau) / scale[:, None]
    torch.testing.assert_close(norms.gather(1, columns), negative, rtol=1e-9, atol=1e-14)
    batch_positive, _ = diagnostics.infonce_gradient_norms(
        diagnostics.view_geometry(z.detach(), z_pos.detach()), tau
    )
    torch.testing.assert_close(batch_positive, positive, rtol=1e-9, atol=1e-14)
