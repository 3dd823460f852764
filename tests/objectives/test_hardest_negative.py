"""Nie et al. (ICLR 2023) MPT / MET / MAT (eqs. 13-15): values (paper and released-code
variants), B.3 gradient norms, and paper 002's Table 1 components of MPT and MET."""

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
from stages.objectives.hardest_negative import mat_per_anchor, met_per_anchor, mpt_per_anchor
from stages.objectives.infonce import cross_entropy_per_anchor

MARGINS = {"mpt": 0.23, "met": 0.45, "mat": 0.15 * math.pi}


def rho(kind: str, a: np.ndarray, b: np.ndarray) -> float:
    """The distance each loss uses: -dot product, Euclidean, angle."""
    if kind == "mpt":
        return -float(a @ b)
    if kind == "met":
        return float(np.linalg.norm(a - b))
    return math.acos(float(np.clip(a @ b, -1, 1)))


def hinge_transcribed(kind: str, z, z_pos, margin: float, implementation: str) -> np.ndarray:
    h, h_pos = numpy_unit(z), numpy_unit(z_pos)
    n = len(h)
    losses = []
    for k in range(n):
        if implementation == "paper":  # anchor h_k, hardest over its negatives h'_j
            hardest = min(rho(kind, h[k], h_pos[j]) for j in range(n) if j != k)
        elif kind == "met":  # column k: hardest first view h_i against h'_k
            hardest = min(rho(kind, h[i], h_pos[k]) for i in range(n) if i != k)
        else:  # column k with the diagonal's cosine replaced by 0 (angle pi/2)
            zero = math.pi / 2 if kind == "mat" else 0.0
            hardest = min([zero] + [rho(kind, h[i], h_pos[k]) for i in range(n) if i != k])
        losses.append(max(0.0, rho(kind, h[k], h_pos[k]) - hardest + margin))
    return np.array(losses)


@pytest.mark.parametrize("implementation", ["paper", "code"])
@pytest.mark.parametrize("kind", ["mpt", "met", "mat"])
def test_loss_is_eqs_13_to_15(kind, implementation):
    z, z_pos = views(correlated=0.8)
    margin = {"margin": MARGINS[kind]} if kind != "mat" else {"margin_pi": 0.15}
    out = objective(kind, implementation=implementation, **margin)(z, z_pos)
    expected = hinge_transcribed(kind, z, z_pos, MARGINS[kind], implementation)
    assert 0 < (expected > 0).sum() < len(expected)  # active and inactive anchors
    assert out.loss.item() == pytest.approx(expected.mean(), rel=1e-12)
    assert out.stats["active_fraction"].item() == pytest.approx((expected > 0).mean())


def test_code_variant_floors_the_hardest_cosine_at_zero():
    """All negatives anti-aligned: the code's 0-filled diagonal wins the max in MPT."""
    h = torch.eye(4, dtype=torch.float64)
    h_pos = h.clone()
    h_pos[:, 0] -= 1  # every negative cosine <= 0
    cos = cosine_matrix(h, h_pos)
    paper = mpt_per_anchor(cos, 1.0, "paper")
    code = mpt_per_anchor(cos, 1.0, "code")
    assert (code >= paper).all() and (code > paper).any()


PER_ANCHOR = {"mpt": mpt_per_anchor, "met": met_per_anchor, "mat": mat_per_anchor}
NORMS = {
    "mpt": (diagnostics.mpt_positive_norm, diagnostics.mpt_negative_norms),
    "met": (diagnostics.met_positive_norm, diagnostics.met_negative_norms),
    "mat": (diagnostics.mat_positive_norm, diagnostics.mat_negative_norms),
}


@pytest.mark.parametrize("kind", ["mpt", "met", "mat"])
def test_gradient_norms_are_b3(kind):
    """Alignment part sin theta / cos(theta/2) / 1 (eq. 39), uniformity part the same functions
    of theta_ij*' for the hardest negative only (eq. 40), both only while the hinge is active."""
    z, z_pos = views(correlated=0.8)
    fn = PER_ANCHOR[kind]
    norms = pair_gradient_norms(lambda c: fn(c, MARGINS[kind], "paper").sum(), z, z_pos)
    theta_pos, theta_neg, columns = split_angles(z, z_pos)
    scale = z.detach().norm(dim=1)
    positive, negative = NORMS[kind]
    expected_pos = positive(theta_pos, theta_neg, MARGINS[kind]) / scale
    expected_neg = negative(theta_pos, theta_neg, MARGINS[kind]) / scale[:, None]
    torch.testing.assert_close(norms.diagonal(), expected_pos, rtol=1e-9, atol=1e-14)
    torch.testing.assert_close(norms.gather(1, columns), expected_neg, rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("kind", ["mpt", "met"])
def test_gradient_is_paper002_table1_paradigm(kind):
    """MPT: GD = 1{cos_ii' - max_k cos_ik' < m}, W = 1 at the hardest, R = 1; MET: W = 1/||h_i -
    h'_j*||, R = sqrt((1 - cos_ij*') / (1 - cos_ii')) (eq. 3)."""
    h, h_pos = views(unit=True, correlated=0.8)
    fn = PER_ANCHOR[kind]
    (g,) = grads(fn(cosine_matrix(h, h_pos.detach()), MARGINS[kind], "paper").sum(), h)
    theta_pos, theta_neg, columns = split_angles(h, h_pos)
    components_of = {"mpt": diagnostics.mpt_components, "met": diagnostics.met_components}[kind]
    components = components_of(theta_pos, theta_neg, MARGINS[kind])
    assert 0 < components.gd.sum() < len(h)
    expected = paradigm_gradient(*components, h_pos.detach(), columns)
    torch.testing.assert_close(g, tangent(expected, h.detach()), rtol=1e-9, atol=1e-12)


def test_mpt_bounds_the_contrastive_loss():
    """With m = tau log(N-1): tau L_cl <= tau log 2 + L_mpt per anchor (Part C)."""
    tau = 0.05
    z, z_pos = views(correlated=0.8)
    cos = cosine_matrix(z, z_pos).detach()
    mpt = mpt_per_anchor(cos, tau * math.log(len(cos) - 1), "paper")
    assert (tau * cross_entropy_per_anchor(cos / tau) <= tau * math.log(2) + mpt + 1e-12).all()
