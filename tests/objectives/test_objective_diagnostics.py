"""Diagnostics: Wang & Isola metrics, batch angles and gaps, gradient norms, closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from objective_testing import numpy_unit, views

from stages.objectives import diagnostics
from stages.objectives.geometry import cosine_matrix
from stages.objectives.infonce import cross_entropy_per_anchor


def test_alignment_and_uniformity_are_wang_isola():
    z, z_pos = views(correlated=1.0)
    h, h_pos = numpy_unit(z), numpy_unit(z_pos)
    n = len(h)
    align = np.mean([np.sum((h[i] - h_pos[i]) ** 2) for i in range(n)])
    pairs = [math.exp(-2 * np.sum((h[i] - h[j]) ** 2)) for i in range(n) for j in range(i + 1, n)]
    geometry = diagnostics.view_geometry(z, z_pos)
    assert diagnostics.alignment(geometry).item() == pytest.approx(align, rel=1e-12)
    assert diagnostics.uniformity(geometry).item() == pytest.approx(
        math.log(np.mean(pairs)), rel=1e-12
    )


def test_mean_angles_and_euclidean_gap():
    z, z_pos = views(correlated=1.0)
    h, h_pos = numpy_unit(z), numpy_unit(z_pos)
    n = len(h)
    theta = np.degrees(np.arccos(np.clip(h @ h_pos.T, -1, 1)))
    geometry = diagnostics.view_geometry(z, z_pos)
    pos, neg = diagnostics.mean_angles_deg(geometry)
    assert pos.item() == pytest.approx(np.mean(np.diag(theta)), rel=1e-9)
    assert neg.item() == pytest.approx(np.mean(theta[~np.eye(n, dtype=bool)]), rel=1e-9)
    gaps = [
        np.mean([np.linalg.norm(h[i] - h_pos[j]) for j in range(n) if j != i])
        - np.linalg.norm(h[i] - h_pos[i])
        for i in range(n)
    ]
    assert diagnostics.euclidean_gap(geometry).item() == pytest.approx(np.mean(gaps), rel=1e-9)


def test_infonce_negative_gradient_norm_is_the_summed_negatives():
    """||sum_j grad^neg_j||: the gradient through the negative logits only (eq. 6)."""
    tau = 0.05
    z, z_pos = views(correlated=1.0)
    anchors_for_negatives = z.detach().clone().requires_grad_()
    positives = cosine_matrix(z.detach(), z_pos.detach()).diagonal()
    negatives = cosine_matrix(anchors_for_negatives, z_pos.detach())
    logits = torch.diagonal_scatter(negatives, positives)
    (g,) = torch.autograd.grad(cross_entropy_per_anchor(logits / tau).sum(), anchors_for_negatives)
    _, negative = diagnostics.infonce_gradient_norms(
        diagnostics.view_geometry(z.detach(), z_pos.detach()), tau
    )
    torch.testing.assert_close(negative, g.norm(dim=1), rtol=1e-9, atol=1e-14)


def test_closed_forms_take_numpy_or_torch():
    theta_pos = np.linspace(0.1, 1.5, 7)
    theta_neg = np.stack([np.linspace(0.3, 3.0, 5)] * 7)
    as_numpy = diagnostics.cl_negative_norms(theta_pos, theta_neg, 0.05)
    as_torch = diagnostics.cl_negative_norms(
        torch.from_numpy(theta_pos), torch.from_numpy(theta_neg), 0.05
    )
    assert isinstance(as_numpy, np.ndarray) and isinstance(as_torch, torch.Tensor)
    np.testing.assert_allclose(as_numpy, as_torch.numpy())
    components = diagnostics.met_components(theta_pos, theta_neg, 0.45)
    assert all(isinstance(c, np.ndarray) for c in components)


def test_repeat_stands_for_identical_negatives():
    theta_pos, theta_neg = np.array([0.4, 0.9]), np.array([[1.2], [1.0]])
    repeated = diagnostics.cl_positive_norm(theta_pos, theta_neg, 0.05, repeat=63)
    explicit = diagnostics.cl_positive_norm(theta_pos, np.repeat(theta_neg, 63, axis=1), 0.05)
    np.testing.assert_allclose(repeated, explicit, rtol=1e-12)
    for per_negative in (diagnostics.dcl_plus_negative_norms, diagnostics.cl_negative_norms):
        repeated = per_negative(theta_pos, theta_neg, 0.17, repeat=63)
        explicit = per_negative(theta_pos, np.repeat(theta_neg, 63, axis=1), 0.17)
        np.testing.assert_allclose(repeated, explicit[:, :1], rtol=1e-12)


def test_gd_alone_is_the_components_gd_and_broadcasts():
    """infonce_gd / arccon_gd are the GD of the (autograd-checked) components; anchors of shape
    (P, 1, B) against negatives (1, M, B, K) give a (P, M, B) grid (paper 002 Fig. 2)."""
    theta_pos, theta_neg = np.array([0.3, 0.9, 1.4]), np.array([[0.5, 1.0], [1.1, 1.3], [0.8, 2]])
    for gd, components, extra in (
        (diagnostics.infonce_gd, diagnostics.infonce_components, ()),
        (diagnostics.arccon_gd, diagnostics.arccon_components, (np.pi / 18,)),
    ):
        expected = components(theta_pos, theta_neg, 0.05, *extra).gd
        np.testing.assert_array_equal(gd(theta_pos, theta_neg, 0.05, *extra), expected)
        grid = gd(theta_pos[:, None, None], theta_neg.T[None, :, None, :], 0.05, *extra)
        assert grid.shape == (3, 2, 1)
        single = gd(theta_pos[2], theta_neg.T[1], 0.05, *extra)
        assert grid[2, 1, 0] == single


def test_gradient_dissipation_region_shrinks_with_more_negatives():
    """Nie et al. Fig. 2a: ||grad^pos_cl|| vanishes once theta_ij' is adequately larger than
    theta_ii', and the weak-gradient region shrinks as the number of negatives grows."""
    theta_pos, theta_neg = np.array([0.6]), np.array([[1.2]])
    norms = [
        diagnostics.cl_positive_norm(theta_pos, theta_neg, 0.05, repeat=k)[0] for k in (64, 4096)
    ]
    assert norms[0] < 0.05 * diagnostics.dcl_positive_norm(theta_pos, 0.05)[0]
    assert norms[1] > 10 * norms[0]


def test_hardest_weight_share_limits():
    theta_neg = np.array([[0.5, 1.0, 1.5, 2.0]])
    assert diagnostics.hardest_weight_share(theta_neg, 1e-3)[0] == pytest.approx(1.0)
    assert diagnostics.hardest_weight_share(theta_neg, 1e3)[0] == pytest.approx(0.25, rel=1e-3)


def test_batch_diagnostics_are_cheap_detached_scalars():
    z = torch.randn(32, 24, requires_grad=True)
    z_pos = z.detach() + 0.3 * torch.randn(32, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        stats = diagnostics.batch_diagnostics(z.bfloat16(), z_pos.bfloat16(), tau=0.05)
    assert set(stats) == {"alignment", "uniformity", "pos_angle_deg", "neg_angle_deg",
                          "euclidean_gap", "infonce_grad_pos", "infonce_grad_neg"}  # fmt: skip
    for value in stats.values():
        assert value.ndim == 0 and not value.requires_grad and torch.isfinite(value)
        assert value.dtype == torch.float32
