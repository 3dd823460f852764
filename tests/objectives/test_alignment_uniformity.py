"""Nie et al. (ICLR 2023): alignment + uniformity, DCL, DCL+ (eqs. 2-5, 10, 29), their B.3
gradient norms, and the upper-bound chain of eq. 12."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from objective_testing import numpy_unit, objective, pair_gradient_norms, split_angles, views

from stages.objectives import diagnostics
from stages.objectives.alignment_uniformity import (
    alignment_term,
    dcl_per_anchor,
    uniformity_cross_view,
)
from stages.objectives.geometry import cosine_matrix, normalize
from stages.objectives.infonce import cross_entropy_per_anchor


def squared_distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sum((a - b) ** 2))


def align_uniform_transcribed(z, z_pos, lam, alpha, t, implementation) -> float:
    h, h_pos = numpy_unit(z), numpy_unit(z_pos)
    n = len(h)
    align = np.mean([np.linalg.norm(h[i] - h_pos[i]) ** alpha for i in range(n)])
    if implementation == "paper":
        pairs = [
            math.exp(-t * squared_distance(h[i], h_pos[j]))
            for i in range(n)
            for j in range(n)
            if j != i
        ]
        uniform = math.log(np.mean(pairs))
    else:
        within = [
            math.log(
                np.mean(
                    [
                        math.exp(-t * squared_distance(v[i], v[j]))
                        for i in range(n)
                        for j in range(i + 1, n)
                    ]
                )
            )
            for v in (h, h_pos)
        ]
        uniform = 2 * t + (within[0] + within[1]) / 2
    return (1 - lam) * align + lam * uniform


@pytest.mark.parametrize("implementation", ["paper", "code"])
@pytest.mark.parametrize(("lam", "alpha", "t"), [(0.1, 2.0, 6.0), (0.4, 1.5, 2.0)])
def test_align_uniform_is_eqs_2_to_4(implementation, lam, alpha, t):
    z, z_pos = views(correlated=1.0)
    loss = objective(
        "align_uniform", uniformity_weight=lam, alpha=alpha, t=t, implementation=implementation
    )(z, z_pos).loss
    expected = align_uniform_transcribed(z, z_pos, lam, alpha, t, implementation)
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def dcl_transcribed(z, z_pos, tau) -> np.ndarray:
    h, h_pos = numpy_unit(z), numpy_unit(z_pos)
    n = len(h)
    return np.array(
        [
            -h[i] @ h_pos[i] / tau
            + math.log(sum(math.exp(h[i] @ h_pos[j] / tau) for j in range(n) if j != i))
            for i in range(n)
        ]
    )


def test_dcl_is_eq5_and_dcl_plus_is_eq10():
    z, z_pos = views(correlated=0.7)
    per_anchor = dcl_transcribed(z, z_pos, 0.17)
    assert 0 < (per_anchor > 0).sum() < len(per_anchor)  # both kinds of anchors present
    dcl = objective("dcl", tau=0.17)(z, z_pos).loss
    assert dcl.item() == pytest.approx(per_anchor.mean(), rel=1e-12)
    out = objective("dcl_plus", tau=0.17)(z, z_pos)
    assert out.loss.item() == pytest.approx(np.maximum(per_anchor, 0).mean(), rel=1e-12)
    assert out.stats["active_fraction"].item() == pytest.approx((per_anchor > 0).mean())


def test_upper_bound_chain_eq12():
    """L_cl = log(1 + e^{L_dcl}) <= log 2 + L_dcl+ <= log 2 + relu(hinge, m = tau log(N-1))/tau."""
    tau = 0.05
    for seed in range(5):
        z, z_pos = views(seed=seed, correlated=seed / 2)
        cos = cosine_matrix(z, z_pos).detach()
        cl = cross_entropy_per_anchor(cos / tau)
        dcl = dcl_per_anchor(cos, tau)
        torch.testing.assert_close(cl, torch.log1p(dcl.exp()))
        hardest = cos.masked_fill(torch.eye(len(cos), dtype=torch.bool), -2).amax(1)
        mpt = torch.relu(hardest - cos.diagonal() + tau * math.log(len(cos) - 1))
        assert (cl <= math.log(2) + torch.relu(dcl) + 1e-12).all()
        assert (torch.relu(dcl) <= mpt / tau + 1e-12).all()


def test_alignment_and_uniformity_gradient_norms_are_b3():
    """||grad^pos L_align|| = alpha (2 sin(theta/2))^(alpha-2) sin theta / ||h_i|| (eq. 8);
    ||grad^neg_j L_uniform|| = 2t e^{2t cos} sin theta / sum e^{2t cos} / ||h_i|| (eq. 17)."""
    z, z_pos = views(correlated=1.0)
    theta_pos, theta_neg, columns = split_angles(z, z_pos)
    scale = z.detach().norm(dim=1)
    for alpha in (2.0, 1.5):
        anchors = z.detach().requires_grad_()
        loss = alignment_term(normalize(anchors), normalize(z_pos.detach()), alpha) * len(z)
        (grad,) = torch.autograd.grad(loss, anchors)
        expected = diagnostics.align_positive_norm(theta_pos, alpha) / scale
        torch.testing.assert_close(grad.norm(dim=-1), expected, rtol=1e-9, atol=1e-14)
    norms = pair_gradient_norms(lambda c: uniformity_cross_view(c, 6.0), z, z_pos)
    expected = diagnostics.uniform_negative_norms(theta_neg, 6.0) / scale[:, None]
    torch.testing.assert_close(norms.gather(1, columns), expected, rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("variant", ["dcl", "dcl_plus"])
def test_dcl_gradient_norms_are_b3(variant):
    """Eq. 9 / 11: sin theta_ii'/tau (cut where L_dcl <= 0); eqs. 18 / 19 per negative."""
    tau = 0.17
    z, z_pos = views(correlated=0.7)
    if variant == "dcl":
        loss_of_cos = lambda c: dcl_per_anchor(c, tau).sum()  # noqa: E731
        positive, negative = diagnostics.dcl_positive_norm, diagnostics.dcl_negative_norms
    else:
        loss_of_cos = lambda c: torch.relu(dcl_per_anchor(c, tau)).sum()  # noqa: E731
        positive = diagnostics.dcl_plus_positive_norm
        negative = diagnostics.dcl_plus_negative_norms
    norms = pair_gradient_norms(loss_of_cos, z, z_pos)
    theta_pos, theta_neg, columns = split_angles(z, z_pos)
    scale = z.detach().norm(dim=1)
    if variant == "dcl":
        expected_pos, expected_neg = positive(theta_pos, tau), negative(theta_neg, tau)
    else:
        expected_pos = positive(theta_pos, theta_neg, tau)
        expected_neg = negative(theta_pos, theta_neg, tau)
    torch.testing.assert_close(norms.diagonal(), expected_pos / scale, rtol=1e-9, atol=1e-14)
    torch.testing.assert_close(
        norms.gather(1, columns), expected_neg / scale[:, None], rtol=1e-9, atol=1e-14
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("alpha", [1.5, 3.0])
@pytest.mark.parametrize("distance", [0.0, 1e-8, 1e-3])
def test_alignment_gradient_is_exact_for_close_pairs(dtype, alpha, distance) -> None:
    """The gradient of mean ||h - h'||^alpha w.r.t. h for fp32/bf16 inputs at distance 0, 1e-8
    and 1e-3 equals float64 autograd on the same inputs and the closed form
    alpha ||d||^(alpha - 2) d / N (a floor on 2 - 2 cos would zero it below 1e-3)."""
    generator = torch.Generator().manual_seed(0)
    h64 = torch.nn.functional.normalize(torch.randn(4, 8, generator=generator, dtype=torch.float64))
    step = torch.randn(4, 8, generator=generator, dtype=torch.float64)
    h_pos64 = h64 + distance * step / step.norm(dim=-1, keepdim=True)
    h, h_pos = h64.to(dtype), h_pos64.to(dtype)  # the inputs as the objective gets them
    ours = h.float().detach().clone().requires_grad_()
    alignment_term(ours, h_pos.float(), alpha).backward()
    exact = h.double().detach().clone().requires_grad_()
    alignment_term(exact, h_pos.double(), alpha).backward()
    d = h.double() - h_pos.double()
    norm = d.norm(dim=-1, keepdim=True)
    closed = torch.where(norm > 0, alpha * norm.clamp_min(1e-300) ** (alpha - 2) * d, 0) / len(d)
    torch.testing.assert_close(exact.grad, closed, rtol=1e-12, atol=0)
    torch.testing.assert_close(ours.grad.double(), closed, rtol=1e-4, atol=1e-30)
    if dtype == torch.float32 and distance > 0:
        assert (ours.grad.abs().sum(-1) > 0).all()  # close pairs keep their gradient
