"""Diagnostics the papers' analyses use, for training logs and for the figures stage.

- Wang & Isola alignment and uniformity (alpha = 2, t = 2, as in SimCSE's analysis).
- Batch angles and gaps: mean positive / negative angle (SimACE Fig. 4, 7), the Euclidean gap
  d_ij of Nie et al. Fig. 3, per-anchor InfoNCE gradient norms w.r.t. the positive and the
  negatives (Nie et al. eq. 6).
- Closed forms on angles, for heat-maps and simulations (numpy arrays or torch tensors in, the
  same kind out; negatives on the last axis): Nie et al. B.3's per-anchor gradient norms of every
  loss (alignment part w.r.t. the positive, uniformity part per negative), and paper 002's
  Table 1 paradigm components (GD, W, R) of InfoNCE, ArcCon, MPT and MET (and their GD alone,
  for heat-maps that broadcast anchors against negatives), plus the hardest negative's share of
  the exponential weight (its Fig. 3).

Closed-form norms are ||grad|| * ||h_i|| (the 1/||h_i|| of the normalization is dropped, as in
the paper's figures). ``repeat`` lets one negative angle stand for that many identical negatives
(heat-maps where all negatives share one angle).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from stages.objectives.geometry import (
    angle,
    mean_off_diagonal,
    normalize,
    off_diagonal,
    upcast,
)

# ---------------------------------------------------------------------------------------------
# Wang & Isola metrics and batch summaries (torch)


class ViewGeometry(NamedTuple):
    """A batch's two views normalised once, for every batch summary: unit rows h and h' (at
    least fp32), their cosine matrix C = h h'^T (row i: anchor i; column i its positive) and
    the anchors' norms ||z_i||."""

    h: torch.Tensor
    h_pos: torch.Tensor
    cos: torch.Tensor
    norms: torch.Tensor


def view_geometry(z: torch.Tensor, z_pos: torch.Tensor) -> ViewGeometry:
    h, h_pos = normalize(z), normalize(z_pos)
    return ViewGeometry(h, h_pos, h @ h_pos.T, upcast(z).norm(dim=1))


def alignment(views: ViewGeometry, alpha: float = 2.0) -> torch.Tensor:
    """E ||f(x) - f(y)||^alpha over positive pairs (rows), f = l2 normalization."""
    return (views.h - views.h_pos).norm(dim=1).pow(alpha).mean()


def uniformity(views: ViewGeometry, t: float = 2.0) -> torch.Tensor:
    """log E_{i<j} e^{-t ||f(x_i) - f(x_j)||^2} over the anchors."""
    return torch.pdist(views.h).pow(2).mul(-t).exp().mean().log()


def mean_angles_deg(views: ViewGeometry) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean anchor-positive angle and mean anchor-negative angle (all in-batch negatives)."""
    degrees = torch.rad2deg(angle(views.cos))
    return degrees.diagonal().mean(), mean_off_diagonal(degrees)


def euclidean_gap(views: ViewGeometry) -> torch.Tensor:
    """d (Nie et al. Fig. 3): mean_i [mean_{j != i} ||h_i - h'_j|| - ||h_i - h'_i||]."""
    dist = (2 - 2 * views.cos).clamp_min(0).sqrt()
    n = dist.size(0)
    mean_negative = (dist.sum(1) - dist.diagonal()) / (n - 1)
    return (mean_negative - dist.diagonal()).mean()


def infonce_gradient_norms(views: ViewGeometry, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per anchor, ||grad^pos|| and ||sum_j grad^neg_j|| of l_i = InfoNCE w.r.t. z_i (eq. 6):
    grad^pos = -(1 - p_ii)/tau (h'_i - h_i)(I - h_i h_i^T)/||z_i||,
    grad^neg_j = -p_ij/tau (h_i - h'_j)(I - h_i h_i^T)/||z_i||, p = row softmax of C / tau."""
    h, h_pos = views.h, views.h_pos
    p = torch.softmax(views.cos / tau, dim=1)
    scale = 1 / (tau * views.norms)

    def tangent_norm(v: torch.Tensor) -> torch.Tensor:  # ||v (I - h_i h_i^T)||, row-wise
        return (v - (v * h).sum(-1, keepdim=True) * h).norm(dim=1)

    positive = scale * (1 - p.diagonal()) * tangent_norm(h_pos)
    p_neg = p * off_diagonal(p.size(0), p.device)
    negative = scale * tangent_norm(p_neg @ h_pos)
    return positive, negative


@torch.no_grad()
def batch_diagnostics(z: torch.Tensor, z_pos: torch.Tensor, tau: float) -> dict[str, torch.Tensor]:
    """Cheap per-step summaries of a training batch (detached 0-d tensors, no host sync),
    computed in at least fp32 even under autocast, from one normalisation of each view."""
    with torch.autocast(device_type=z.device.type, enabled=False):
        views = view_geometry(z, z_pos)
        pos_angle, neg_angle = mean_angles_deg(views)
        grad_pos, grad_neg = infonce_gradient_norms(views, tau)
        return {
            "alignment": alignment(views),
            "uniformity": uniformity(views),
            "pos_angle_deg": pos_angle,
            "neg_angle_deg": neg_angle,
            "euclidean_gap": euclidean_gap(views),
            "infonce_grad_pos": grad_pos.mean(),
            "infonce_grad_neg": grad_neg.mean(),
        }


# ---------------------------------------------------------------------------------------------
# Closed forms on angles (numpy or torch)

Array = Any  # np.ndarray or torch.Tensor


def _numpy_or_torch(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` in torch; numpy (or float) inputs are computed in float64 and returned as
    numpy, torch inputs stay torch."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values())):
            return fn(*args, **kwargs)

        def to_torch(a: Any) -> Any:
            return torch.as_tensor(a, dtype=torch.float64) if isinstance(a, np.ndarray) else a

        out = fn(*map(to_torch, args), **{k: to_torch(v) for k, v in kwargs.items()})
        if isinstance(out, tuple):
            return type(out)(*(o.numpy() if isinstance(o, torch.Tensor) else o for o in out))
        return out.numpy()

    return wrapper


def _as_tensor(x: Array) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=torch.float64)


def _hardest_mask(theta_neg: torch.Tensor) -> torch.Tensor:
    """1 at the hardest (smallest-angle) negative of each anchor, 0 elsewhere."""
    hardest = theta_neg.argmin(dim=-1, keepdim=True)
    return torch.zeros_like(theta_neg).scatter_(-1, hardest, 1.0)


def _softmax_parts(
    theta_pos: torch.Tensor, theta_neg: torch.Tensor, tau: float, repeat: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log e^{cos theta_ii'/tau}, log e^{cos theta_ij'/tau}, log sum_{k != i} e^{cos theta_ik'/tau}
    (overflow-free for any tau)."""
    log_pos = torch.cos(theta_pos) / tau
    log_neg = torch.cos(theta_neg) / tau
    return log_pos, log_neg, log_neg.logsumexp(-1) + math.log(repeat)


# Nie et al. B.3, alignment part: ||grad^pos|| * ||h_i|| (eqs. 7, 8, 9, 11, 39) -----------------


@_numpy_or_torch
def cl_positive_norm(theta_pos: Array, theta_neg: Array, tau: float, repeat: int = 1) -> Array:
    """(1/tau) sum_j e^{cos theta_ij'/tau} / (e^{cos theta_ii'/tau} + sum_j ...) sin theta_ii'."""
    theta_pos, theta_neg = _as_tensor(theta_pos), _as_tensor(theta_neg)
    log_pos, _, log_negs = _softmax_parts(theta_pos, theta_neg, tau, repeat)
    share_of_negatives = torch.sigmoid(log_negs - log_pos)
    return share_of_negatives * torch.sin(theta_pos) / tau


@_numpy_or_torch
def align_positive_norm(theta_pos: Array, alpha: float = 2.0) -> Array:
    """alpha (2 sin(theta_ii'/2))^(alpha - 2) sin theta_ii' (times 1 - lambda inside L_a&u)."""
    theta_pos = _as_tensor(theta_pos)
    return alpha * (2 * torch.sin(theta_pos / 2)).pow(alpha - 2) * torch.sin(theta_pos)


@_numpy_or_torch
def dcl_positive_norm(theta_pos: Array, tau: float) -> Array:
    """sin theta_ii' / tau, whatever the negatives."""
    return torch.sin(_as_tensor(theta_pos)) / tau


@_numpy_or_torch
def dcl_active(theta_pos: Array, theta_neg: Array, tau: float, repeat: int = 1) -> Array:
    """1{L_dcl > 0}: -cos theta_ii'/tau + log sum_j e^{cos theta_ij'/tau} > 0 (bool)."""
    theta_pos, theta_neg = _as_tensor(theta_pos), _as_tensor(theta_neg)
    log_pos, _, log_negs = _softmax_parts(theta_pos, theta_neg, tau, repeat)
    return log_negs - log_pos > 0


@_numpy_or_torch
def dcl_plus_positive_norm(
    theta_pos: Array, theta_neg: Array, tau: float, repeat: int = 1
) -> Array:
    """sin theta_ii' / tau where L_dcl > 0, else 0."""
    theta_pos = _as_tensor(theta_pos)
    return dcl_active(theta_pos, theta_neg, tau, repeat) * torch.sin(theta_pos) / tau


@_numpy_or_torch
def mpt_active(theta_pos: Array, theta_neg: Array, margin: float) -> Array:
    """cos theta_ij*' - cos theta_ii' + m > 0 for the hardest negative j*."""
    theta_pos, theta_neg = _as_tensor(theta_pos), _as_tensor(theta_neg)
    return torch.cos(theta_neg).amax(-1) - torch.cos(theta_pos) + margin > 0


@_numpy_or_torch
def met_active(theta_pos: Array, theta_neg: Array, margin: float) -> Array:
    """||h_i - h'_i|| - min_j ||h_i - h'_j|| + m > 0, with ||.|| = 2 sin(theta/2)."""
    theta_pos, theta_neg = _as_tensor(theta_pos), _as_tensor(theta_neg)
    return 2 * torch.sin(theta_pos / 2) - 2 * torch.sin(theta_neg / 2).amin(-1) + margin > 0


@_numpy_or_torch
def mat_active(theta_pos: Array, theta_neg: Array, margin: float) -> Array:
    """theta_ii' - min_j theta_ij' + m > 0."""
    theta_pos, theta_neg = _as_tensor(theta_pos), _as_tensor(theta_neg)
    return theta_pos - theta_neg.amin(-1) + margin > 0


@_numpy_or_torch
def mpt_positive_norm(theta_pos: Array, theta_neg: Array, margin: float) -> Array:
    """sin theta_ii' while the hinge is active."""
    theta_pos = _as_tensor(theta_pos)
    return mpt_active(theta_pos, theta_neg, margin) * torch.sin(theta_pos)


@_numpy_or_torch
def met_positive_norm(theta_pos: Array, theta_neg: Array, margin: float) -> Array:
    """cos(theta_ii'/2) while the hinge is active."""
    theta_pos = _as_tensor(theta_pos)
    return met_active(theta_pos, theta_neg, margin) * torch.cos(theta_pos / 2)


@_numpy_or_torch
def mat_positive_norm(theta_pos: Array, theta_neg: Array, margin: float) -> Array:
    """1 while the hinge is active."""
    theta_pos = _as_tensor(theta_pos)
    return mat_active(theta_pos, theta_neg, margin).to(theta_pos.dtype)


# Nie et al. B.3, uniformity part: ||grad^neg_j|| * ||h_i|| per negative (eqs. 16-22, 40) -------


@_numpy_or_torch
def cl_negative_norms(theta_pos: Array, theta_neg: Array, tau: float, repeat: int = 1) -> Array:
    """(1/tau) e^{cos theta_ij'/tau} sin theta_ij' / (e^{cos theta_ii'/tau} + sum_k ...)."""
    theta_pos, theta_neg = _as_tensor(theta_pos), _as_tensor(theta_neg)
    log_pos, log_neg, log_negs = _softmax_parts(theta_pos, theta_neg, tau, repeat)
    log_z = torch.logaddexp(log_pos, log_negs)[..., None]
    return (log_neg - log_z).exp() * torch.sin(theta_neg) / tau


@_numpy_or_torch
def uniform_negative_norms(theta_neg: Array, t: float) -> Array:
    """2t e^{2t cos theta_ij'} sin theta_ij' / sum_{i'} sum_{k != i'} e^{2t cos theta_i'k'}
    for the cross-view uniformity of a whole batch: theta_neg is N x (N - 1), every anchor's
    negatives (times lambda inside L_a&u)."""
    theta_neg = _as_tensor(theta_neg)
    log_w = 2 * t * torch.cos(theta_neg)
    return 2 * t * (log_w - log_w.flatten().logsumexp(0)).exp() * torch.sin(theta_neg)


@_numpy_or_torch
def dcl_negative_norms(theta_neg: Array, tau: float, repeat: int = 1) -> Array:
    """(1/tau) e^{cos theta_ij'/tau} sin theta_ij' / sum_k e^{cos theta_ik'/tau}."""
    theta_neg = _as_tensor(theta_neg)
    log_neg = torch.cos(theta_neg) / tau
    log_negs = log_neg.logsumexp(-1, keepdim=True) + math.log(repeat)
    return (log_neg - log_negs).exp() * torch.sin(theta_neg) / tau


@_numpy_or_torch
def dcl_plus_negative_norms(
    theta_pos: Array, theta_neg: Array, tau: float, repeat: int = 1
) -> Array:
    """As DCL where L_dcl > 0, else 0."""
    active = dcl_active(theta_pos, theta_neg, tau, repeat)
    return active[..., None] * dcl_negative_norms(theta_neg, tau, repeat)


@_numpy_or_torch
def mpt_negative_norms(theta_pos: Array, theta_neg: Array, margin: float) -> Array:
    """sin theta_ij*' for the hardest negative while active; 0 for the others."""
    theta_neg = _as_tensor(theta_neg)
    active = mpt_active(theta_pos, theta_neg, margin)[..., None]
    return active * _hardest_mask(theta_neg) * torch.sin(theta_neg)


@_numpy_or_torch
def met_negative_norms(theta_pos: Array, theta_neg: Array, margin: float) -> Array:
    """cos(theta_ij*'/2) for the hardest negative while active; 0 for the others."""
    theta_neg = _as_tensor(theta_neg)
    active = met_active(theta_pos, theta_neg, margin)[..., None]
    return active * _hardest_mask(theta_neg) * torch.cos(theta_neg / 2)


@_numpy_or_torch
def mat_negative_norms(theta_pos: Array, theta_neg: Array, margin: float) -> Array:
    """1 for the hardest negative while active; 0 for the others."""
    theta_neg = _as_tensor(theta_neg)
    return mat_active(theta_pos, theta_neg, margin)[..., None] * _hardest_mask(theta_neg)


# Paper 002, Table 1: GD, W, R of the effective contrastive losses -----------------------------


class ParadigmComponents(NamedTuple):
    """dL_i/dh_i = gd_i sum_j weight_ij (h'_j - ratio_ij h'_i) (eq. 4): gd has the anchors'
    shape, weight and ratio that shape plus the negatives axis."""

    gd: Array
    weight: Array
    ratio: Array


@_numpy_or_torch
def infonce_gd(theta_pos: Array, theta_neg: Array, tau: float, repeat: int = 1) -> Array:
    """GD = 1 / (1 + e^{cos theta_ii'/tau} / sum_k e^{cos theta_ik'/tau}) alone: it needs no
    tensor of the negatives' shape, so heat-maps can broadcast anchors against negatives."""
    theta_pos, theta_neg = _as_tensor(theta_pos), _as_tensor(theta_neg)
    log_pos, _, log_negs = _softmax_parts(theta_pos, theta_neg, tau, repeat)
    return torch.sigmoid(log_negs - log_pos)


@_numpy_or_torch
def arccon_gd(
    theta_pos: Array, theta_neg: Array, tau: float, margin: float, repeat: int = 1
) -> Array:
    """InfoNCE's GD with the positive angle theta_ii' + u (u in radians)."""
    return infonce_gd(_as_tensor(theta_pos) + margin, theta_neg, tau, repeat)


@_numpy_or_torch
def infonce_components(
    theta_pos: Array, theta_neg: Array, tau: float, repeat: int = 1
) -> ParadigmComponents:
    """GD = infonce_gd, W_j = e^{cos theta_ij'/tau} / (tau sum_k e^{cos theta_ik'/tau}), R = 1."""
    theta_pos, theta_neg = _as_tensor(theta_pos), _as_tensor(theta_neg)
    _, log_neg, log_negs = _softmax_parts(theta_pos, theta_neg, tau, repeat)
    weight = (log_neg - log_negs[..., None]).exp() / tau
    gd = infonce_gd(theta_pos, theta_neg, tau, repeat)
    return ParadigmComponents(gd, weight, torch.ones_like(weight))


@_numpy_or_torch
def arccon_components(
    theta_pos: Array, theta_neg: Array, tau: float, margin: float, repeat: int = 1
) -> ParadigmComponents:
    """GD = arccon_gd, W as InfoNCE's, and R = sin(theta_ii' + u) / sin theta_ii'."""
    theta_pos, theta_neg = _as_tensor(theta_pos), _as_tensor(theta_neg)
    _, weight, _ = infonce_components(theta_pos, theta_neg, tau, repeat)
    gd = arccon_gd(theta_pos, theta_neg, tau, margin, repeat)
    ratio = (torch.sin(theta_pos + margin) / torch.sin(theta_pos))[..., None]
    return ParadigmComponents(gd, weight, torch.broadcast_tensors(ratio, weight)[0])


@_numpy_or_torch
def mpt_components(theta_pos: Array, theta_neg: Array, margin: float) -> ParadigmComponents:
    """GD = 1{cos theta_ii' - max_k cos theta_ik' < m}, W = 1 at the hardest negative, R = 1."""
    theta_neg = _as_tensor(theta_neg)
    weight = _hardest_mask(theta_neg)
    gd = mpt_active(theta_pos, theta_neg, margin).to(theta_neg.dtype)
    return ParadigmComponents(gd, weight, torch.ones_like(weight))


@_numpy_or_torch
def met_components(theta_pos: Array, theta_neg: Array, margin: float) -> ParadigmComponents:
    """GD = 1{min_k ||h_i - h'_k|| - ||h_i - h'_i|| < m}, W = 1/||h_i - h'_j|| at the hardest
    negative, R = sqrt((1 - cos theta_ij') / (1 - cos theta_ii'))."""
    theta_pos, theta_neg = _as_tensor(theta_pos), _as_tensor(theta_neg)
    dist_neg = (2 - 2 * torch.cos(theta_neg)).sqrt()
    weight = _hardest_mask(theta_neg) / dist_neg
    ratio = ((1 - torch.cos(theta_neg)) / (1 - torch.cos(theta_pos))[..., None]).sqrt()
    gd = met_active(theta_pos, theta_neg, margin).to(theta_neg.dtype)
    return ParadigmComponents(gd, weight, ratio)


@_numpy_or_torch
def hardest_weight_share(theta_neg: Array, tau: float) -> Array:
    """max_j w_j / sum_j w_j with w_j = e^{cos theta_ij'/tau} (paper 002 Fig. 3)."""
    return torch.softmax(torch.cos(_as_tensor(theta_neg)) / tau, dim=-1).amax(-1)
