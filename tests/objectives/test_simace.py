"""SimACE: angular similarity (eq. 7), its derivative (eq. 6) and the margin loss (eq. 9)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from objective_testing import grads, numpy_unit, objective, views

from stages.objectives.geometry import angle, angular_similarity


def simace_transcribed(z, z_pos, tau: float, margin_deg: float) -> float:
    h, h_pos = numpy_unit(z), numpy_unit(z_pos)
    m = math.radians(margin_deg)

    def s(i, j):
        return math.pi / 2 - math.acos(h[i] @ h_pos[j])

    losses = []
    for i in range(len(h)):
        positive = math.exp((s(i, i) - m) / tau)
        negatives = sum(math.exp(s(i, j) / tau) for j in range(len(h)) if j != i)
        losses.append(-math.log(positive / (positive + negatives)))
    return float(np.mean(losses))


@pytest.mark.parametrize("margin_deg", [10.0, 0.0, -10.0])
def test_loss_is_eq9_for_both_margin_signs(margin_deg):
    z, z_pos = views(correlated=1.0)
    out = objective("simace", tau=0.06, margin_deg=margin_deg)(z, z_pos)
    assert out.loss.item() == pytest.approx(
        simace_transcribed(z, z_pos, 0.06, margin_deg), rel=1e-12
    )


def test_positive_margin_makes_the_positive_harder():
    """s_ang - m = pi/2 - (theta + m): m > 0 raises the loss, m < 0 (Table 14's -10) lowers it."""
    z, z_pos = views(correlated=1.0)
    losses = [objective("simace", margin_deg=m)(z, z_pos).loss.item() for m in (-10, 0, 10)]
    assert losses[0] < losses[1] < losses[2]


def cosine_derivative(z_i: torch.Tensor, z_j: torch.Tensor) -> torch.Tensor:
    """Eq. 6a: d cossim(z_i, z_j)/dz_i = z_j/(|z_i||z_j|) - cossim z_i/|z_i|^2."""
    cos = z_i @ z_j / (z_i.norm() * z_j.norm())
    return z_j / (z_i.norm() * z_j.norm()) - cos * z_i / z_i.norm() ** 2


def test_angle_derivative_is_eq6():
    """Eq. 6b: d theta_ij/dz_i = -1/sqrt(1 - cossim^2) d cossim/dz_i; the angular similarity
    pi/2 - theta has the opposite sign."""
    z, z_pos = views()
    for i, j in [(0, 0), (1, 3), (5, 2)]:
        z_i, z_j = z[i].detach().clone().requires_grad_(), z_pos[j].detach()

        def cos(z_i=z_i, z_j=z_j):
            return torch.nn.functional.cosine_similarity(z_i, z_j, dim=0)

        (g_theta,) = grads(angle(cos()), z_i)
        c = cos().detach()
        expected = -cosine_derivative(z_i.detach(), z_j) / torch.sqrt(1 - c**2)
        torch.testing.assert_close(g_theta, expected, rtol=1e-10, atol=1e-14)
        (g_sim,) = grads(angular_similarity(cos()), z_i)
        torch.testing.assert_close(g_sim, -g_theta, rtol=1e-10, atol=1e-14)


def test_loss_gradient_chains_eq6_through_the_softmax():
    """dl_i/dz_i = (1/tau) sum_j (p_ij - 1{i=j}) ds_ij/dz_i (A.1.1 corrected), mean over anchors."""
    tau, m = 0.06, math.radians(10)
    z, z_pos = views(correlated=1.0)
    (g,) = grads(objective("simace", tau=tau)(z, z_pos.detach()).loss, z)
    zd, zpd = z.detach(), z_pos.detach()
    n = len(zd)
    expected = torch.zeros_like(zd)
    for i in range(n):
        cos = torch.stack([zd[i] @ zpd[j] / (zd[i].norm() * zpd[j].norm()) for j in range(n)])
        logits = (math.pi / 2 - torch.acos(cos)) / tau
        logits[i] -= m / tau
        p = torch.softmax(logits, 0)
        for j in range(n):
            ds = cosine_derivative(zd[i], zpd[j]) / torch.sqrt(1 - cos[j] ** 2)
            expected[i] += (p[j] - float(i == j)) * ds / tau
    torch.testing.assert_close(g, expected / n, rtol=1e-9, atol=1e-13)


def test_gradient_norm_is_constant_in_the_angle():
    """A.1.5: ||d s_ang/dz_i|| = 1/||z_i|| whatever the angle, unlike the cosine's sin(phi)."""
    z_j = torch.tensor([1.0, 0.0], dtype=torch.float64)
    for phi in (0.1, 0.5, 1.2, 2.5):
        z_i = (
            2 * torch.tensor([math.cos(phi), math.sin(phi)], dtype=torch.float64)
        ).requires_grad_()
        cos = torch.nn.functional.cosine_similarity(z_i, z_j, dim=0)
        (g,) = grads(angular_similarity(cos), z_i)
        assert g.norm().item() == pytest.approx(0.5, rel=1e-9)
