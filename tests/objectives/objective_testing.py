"""Shared helpers of the objective tests: deterministic float64 batches, tangent projections,
and per-pair gradients of a loss written as a function of the cosine matrix."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from stages.objectives.base import Objective
from stages.objectives.registry import loss_class

N, D = 8, 16


def views(n: int = N, d: int = D, seed: int = 0, unit: bool = False, correlated: float = 0.0):
    """Two float64 leaf views; ``correlated`` mixes z into z' (positives closer than negatives);
    ``unit`` normalizes them first (gradients are then tangent projections of the closed forms)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=g, dtype=torch.float64)
    z_pos = correlated * z + torch.randn(n, d, generator=g, dtype=torch.float64)
    z = z * (0.5 + torch.rand(n, 1, generator=g, dtype=torch.float64))  # non-unit norms
    if unit:
        z, z_pos = (torch.nn.functional.normalize(x, dim=-1) for x in (z, z_pos))
    return z.requires_grad_(), z_pos.requires_grad_()


def objective(name: str, **hyperparameters) -> Objective:
    return loss_class(name)(name=name, **hyperparameters)


def numpy_unit(x: torch.Tensor) -> np.ndarray:
    x = x.detach().numpy()
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def tangent(g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Rows of g without their component along the unit rows of h."""
    return g - (g * h).sum(-1, keepdim=True) * h


def grads(loss: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(loss, inputs, allow_unused=True, materialize_grads=True)


def pair_gradient_norms(
    loss_of_cos: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor, z_pos: torch.Tensor
) -> torch.Tensor:
    """||dL/dz_i through C_ij alone|| for every pair (i, j): entry (i, i) is the gradient norm
    w.r.t. the positive, (i, j) the one w.r.t. negative j (Nie et al. B.3's decomposition).
    Each pair gets its own copy of the anchor; the positives are constants."""
    n = z.size(0)
    copies = z.detach()[:, None, :].expand(n, n, -1).clone().requires_grad_()
    h_copies = torch.nn.functional.normalize(copies, dim=-1)
    h_pos = torch.nn.functional.normalize(z_pos.detach(), dim=-1)
    cos = (h_copies * h_pos[None, :, :]).sum(-1)
    (grad,) = torch.autograd.grad(loss_of_cos(cos), copies)
    return grad.norm(dim=-1)


def split_angles(
    z: torch.Tensor, z_pos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """theta_ii' (N,), theta_ij' for j != i (N, N-1) in column order, and those column indices."""
    h, h_pos = (torch.nn.functional.normalize(x.detach(), dim=-1) for x in (z, z_pos))
    theta = torch.acos((h @ h_pos.T).clamp(-1, 1))
    n = theta.size(0)
    columns = torch.tensor([[j for j in range(n) if j != i] for i in range(n)])
    return theta.diagonal(), theta.gather(1, columns), columns


def paradigm_gradient(
    gd: torch.Tensor, weight: torch.Tensor, ratio: torch.Tensor, h_pos: torch.Tensor, columns
) -> torch.Tensor:
    """gd_i sum_j W_ij (h'_j - R_ij h'_i) (paper 002 eq. 4) for negatives h'_{columns[i, :]}."""
    negatives = h_pos[columns]
    pulled = negatives - ratio[..., None] * h_pos[:, None, :]
    return gd[:, None] * (weight[..., None] * pulled).sum(1)
