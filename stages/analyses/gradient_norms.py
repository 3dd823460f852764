"""Paper 003 (Nie et al., ICLR 2023, "On the Inadequacy of Optimizing Alignment and Uniformity"):
gradient norms of every objective as functions of the anchor-positive angle theta_ii' and the
anchor-negative angle theta_ij', from the objectives module's closed forms (Appendix B.3, in
stages.objectives.diagnostics) and, for the curves, from autograd on the real objectives.

- Fig. 2a/2b (alignment part): ||grad^pos|| of L_cl for several negative counts, L_align, L_dcl,
  L_dcl+, L_mpt, L_met, L_mat, as heat-maps over (theta_ij', theta_ii');
- Fig. 4 (uniformity part): the same for one negative's ||grad^neg_j||, with L_uniform for L_align;
- curves: slices of both at a fixed angle, where autograd through the registry's InfoNCE, DCL and
  DCL+ on an explicit batch reproduces the closed forms.

As in the paper's figures, 1/||h_i|| is dropped (the anchor has norm 1), every negative of an
anchor shares one angle, and the hyperparameters are Table 2's BERT-base column (the objectives'
defaults).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import torch

from stages.objectives import diagnostics
from stages.objectives.alignment_uniformity import DCL, AlignUniform, DCLPlus
from stages.objectives.base import Objective
from stages.objectives.hardest_negative import MAT, MET, MPT
from stages.objectives.infonce import InfoNCE

Norms = dict[str, np.ndarray]


def angles(points: int) -> np.ndarray:
    """The heat-maps' axis: ``points`` angles over [0, pi], endpoints included."""
    return np.linspace(0.0, math.pi, points)


def alignment_part(
    theta_pos: np.ndarray, theta_neg: np.ndarray, negative_counts: tuple[int, ...]
) -> Norms:
    """Fig. 2a and 2b: ||grad^pos|| * ||h_i|| on the grid theta_pos (rows) x theta_neg (columns),
    every anchor with negative_counts[0] negatives except L_cl's panels."""
    cl, au, dcl, dcl_plus = _contrastive_objectives()
    mpt, met, mat = MPT(name="mpt"), MET(name="met"), MAT(name="mat")
    anchors, negatives = theta_pos[:, None], theta_neg[None, :, None]
    count = negative_counts[0]
    rows = np.ones((1, len(theta_neg)))  # these norms do not depend on theta_ij'
    norms = {
        f"L_cl, {k} negatives": diagnostics.cl_positive_norm(anchors, negatives, cl.tau, k)
        for k in negative_counts
    }
    norms[f"L_align (alpha = {au.alpha:g})"] = (
        diagnostics.align_positive_norm(anchors, au.alpha) * rows
    )
    norms[f"L_dcl (tau = {dcl.tau:g})"] = diagnostics.dcl_positive_norm(anchors, dcl.tau) * rows
    norms[f"L_dcl+ (tau = {dcl_plus.tau:g}), {count} negatives"] = (
        diagnostics.dcl_plus_positive_norm(anchors, negatives, dcl_plus.tau, count)
    )
    norms[f"L_mpt (m = {mpt.margin:g})"] = diagnostics.mpt_positive_norm(
        anchors, negatives, mpt.margin
    )
    norms[f"L_met (m = {met.margin:g})"] = diagnostics.met_positive_norm(
        anchors, negatives, met.margin
    )
    norms[f"L_mat (m = {mat.margin_pi:g} pi)"] = diagnostics.mat_positive_norm(
        anchors, negatives, mat.margin_pi * math.pi
    )
    return norms


def uniformity_part(
    theta_pos: np.ndarray, theta_neg: np.ndarray, negative_counts: tuple[int, ...]
) -> Norms:
    """Fig. 4: one negative's ||grad^neg_j|| * ||h_i|| on the grid (for the hinge losses, the
    hardest negative's); L_uniform for a batch of negative_counts[0] + 1 anchors whose negatives
    all sit at theta_ij'."""
    cl, au, dcl, dcl_plus = _contrastive_objectives()
    mpt, met, mat = MPT(name="mpt"), MET(name="met"), MAT(name="mat")
    anchors, negatives = theta_pos[:, None], theta_neg[None, :, None]
    count = negative_counts[0]
    columns = np.ones((len(theta_pos), 1))  # these norms do not depend on theta_ii'

    def one(norms: np.ndarray) -> np.ndarray:  # the first (or hardest) negative's norm
        return norms[..., 0]

    norms = {
        f"L_cl, {k} negatives": one(diagnostics.cl_negative_norms(anchors, negatives, cl.tau, k))
        for k in negative_counts
    }
    batch = np.ones((count + 1, count))
    uniform = [one(diagnostics.uniform_negative_norms(t * batch, au.t))[0] for t in theta_neg]
    norms[f"L_uniform (t = {au.t:g}), batch {count + 1}"] = columns * np.array(uniform)
    norms[f"L_dcl (tau = {dcl.tau:g}), {count} negatives"] = columns * one(
        diagnostics.dcl_negative_norms(theta_neg[:, None], dcl.tau, count)
    )
    norms[f"L_dcl+ (tau = {dcl_plus.tau:g}), {count} negatives"] = one(
        diagnostics.dcl_plus_negative_norms(anchors, negatives, dcl_plus.tau, count)
    )
    norms[f"L_mpt (m = {mpt.margin:g})"] = one(
        diagnostics.mpt_negative_norms(anchors, negatives, mpt.margin)
    )
    norms[f"L_met (m = {met.margin:g})"] = one(
        diagnostics.met_negative_norms(anchors, negatives, met.margin)
    )
    norms[f"L_mat (m = {mat.margin_pi:g} pi)"] = one(
        diagnostics.mat_negative_norms(anchors, negatives, mat.margin_pi * math.pi)
    )
    return norms


def heatmap_frame(theta_pos: np.ndarray, theta_neg: np.ndarray, norms: Norms) -> pl.DataFrame:
    """Tidy rows panel, theta_pos, theta_neg, value."""
    pos, neg = np.meshgrid(theta_pos, theta_neg, indexing="ij")
    return pl.concat(
        pl.DataFrame(
            {"panel": name, "theta_pos": pos.ravel(), "theta_neg": neg.ravel(), "value": v.ravel()}
        )
        for name, v in norms.items()
    )


def _contrastive_objectives() -> tuple[InfoNCE, AlignUniform, DCL, DCLPlus]:
    return (
        InfoNCE(name="infonce"),
        AlignUniform(name="align_uniform"),
        DCL(name="dcl"),
        DCLPlus(name="dcl_plus"),
    )


# Autograd on the real objectives ---------------------------------------------------------------


def anchor_batch(
    theta_pos: float, theta_neg: float, negatives: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A float64 batch (z, z') of negatives + 1 rows in which anchor 0 is e_0, its positive sits
    at theta_pos along e_1 and negative j at theta_neg along e_{j+1}: the tangent directions are
    orthogonal, so the anchor's gradient splits exactly into its positive part (the e_1
    component) and one component per negative. Rows j >= 1 are their own positives (for the
    row-wise objectives they do not touch anchor 0's gradient)."""
    dim = negatives + 2
    z_pos = torch.zeros(negatives + 1, dim, dtype=torch.float64)
    z_pos[0, 0], z_pos[0, 1] = math.cos(theta_pos), math.sin(theta_pos)
    z_pos[1:, 0] = math.cos(theta_neg)
    z_pos[1:, 2:] = math.sin(theta_neg) * torch.eye(negatives, dtype=torch.float64)
    z = z_pos.clone()
    z[0] = 0.0
    z[0, 0] = 1.0
    return z, z_pos


def autograd_norms(
    objective: Objective, theta_pos: float, theta_neg: float, negatives: int
) -> tuple[float, float]:
    """||grad^pos|| and one negative's ||grad^neg_j|| of anchor 0's loss l_0 w.r.t. z_0, by
    autograd through ``objective`` (a mean over anchors, hence the factor negatives + 1)."""
    z, z_pos = anchor_batch(theta_pos, theta_neg, negatives)
    z.requires_grad_()
    loss = objective(z, z_pos).loss * (negatives + 1)
    (grad,) = torch.autograd.grad(loss, z)
    return abs(grad[0, 1].item()), abs(grad[0, 2].item())


def norm_curves(
    theta: np.ndarray,
    theta_neg_fixed: float,
    theta_pos_fixed: float,
    negative_counts: tuple[int, ...],
    autograd_every: int = 10,
) -> pl.DataFrame:
    """Slices of Fig. 2a and 4: ||grad^pos|| against theta_ii' at theta_ij' = theta_neg_fixed
    (part "positive"), and one negative's ||grad^neg_j|| against theta_ij' at theta_ii' =
    theta_pos_fixed (part "negative"), from the closed forms; at every ``autograd_every``-th
    angle also by autograd through InfoNCE, DCL and DCL+ (negative_counts[0] negatives).
    Columns part, series, source, angle, value."""
    cl, _, dcl, dcl_plus = _contrastive_objectives()
    count = negative_counts[0]
    fixed_neg, fixed_pos = np.array([[theta_neg_fixed]]), np.array([theta_pos_fixed])
    closed = {
        "positive": {
            **{
                f"L_cl, {k} negatives": diagnostics.cl_positive_norm(theta, fixed_neg, cl.tau, k)
                for k in negative_counts
            },
            f"L_dcl, {count} negatives": diagnostics.dcl_positive_norm(theta, dcl.tau),
            f"L_dcl+, {count} negatives": diagnostics.dcl_plus_positive_norm(
                theta, fixed_neg, dcl_plus.tau, count
            ),
        },
        "negative": {
            **{
                f"L_cl, {k} negatives": diagnostics.cl_negative_norms(
                    fixed_pos, theta[:, None], cl.tau, k
                )[:, 0]
                for k in negative_counts
            },
            f"L_dcl, {count} negatives": diagnostics.dcl_negative_norms(
                theta[:, None], dcl.tau, count
            )[:, 0],
            f"L_dcl+, {count} negatives": diagnostics.dcl_plus_negative_norms(
                fixed_pos, theta[:, None], dcl_plus.tau, count
            )[:, 0],
        },
    }
    rows = [
        pl.DataFrame(
            {"part": part, "series": name, "source": "closed form", "angle": theta, "value": v}
        )
        for part, series in closed.items()
        for name, v in series.items()
    ]
    sampled = theta[::autograd_every]
    for name, objective in (("L_cl", cl), ("L_dcl", dcl), ("L_dcl+", dcl_plus)):
        series = f"{name}, {count} negatives"
        positive = [autograd_norms(objective, t, theta_neg_fixed, count)[0] for t in sampled]
        negative = [autograd_norms(objective, theta_pos_fixed, t, count)[1] for t in sampled]
        for part, values in (("positive", positive), ("negative", negative)):
            rows.append(
                pl.DataFrame(
                    {
                        "part": part,
                        "series": series,
                        "source": "autograd",
                        "angle": sampled,
                        "value": values,
                    }
                )
            )
    return pl.concat(rows)
