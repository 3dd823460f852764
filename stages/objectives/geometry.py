"""Cosines, angles and distances between the two views of a batch, computed safely.

Every objective works on ``C = normalize(z) @ normalize(z')^T`` (``C[i, j] = cos theta_ij'``): row i
is anchor i, column i its positive, the other columns its in-batch negatives. Half-precision
inputs are upcast to fp32 (float64 stays float64, for exact tests).

Two guards keep gradients finite where the papers' formulas are singular:
- ``arccos``/``arcsin`` have derivative -/+1/sqrt(1 - c^2), infinite at |c| = 1 (identical or
  antipodal views; in fp32 the cosine of near-identical vectors rounds to 1). Cosines are clamped
  to [-1 + ACOS_EPS, 1 - ACOS_EPS]: the derivative stays below ~707, and only pairs within
  ~0.08 degrees of (anti)parallel lose their gradient.
- ``sqrt(2 - 2c)`` has an infinite derivative at c = 1; squared distances are floored at
  SQUARED_DISTANCE_FLOOR (pairs closer than 1e-3 lose their gradient).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

ACOS_EPS = 1e-6
SQUARED_DISTANCE_FLOOR = 1e-6


def upcast(x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> fp32; fp32 and float64 unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def normalize(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit l2 norm, in at least fp32."""
    return F.normalize(upcast(x), dim=-1)


def cosine_matrix(z: torch.Tensor, z_pos: torch.Tensor) -> torch.Tensor:
    """C[i, j] = cos(z_i, z'_j), computed in at least fp32 whatever the input dtype."""
    return normalize(z) @ normalize(z_pos).T


class _Gram(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x @ x.T

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return (grad + grad.T) @ x


def gram(x: torch.Tensor) -> torch.Tensor:
    """X X^T (within-view similarities) whose backward, (dG + dG^T) X, is one matmul instead of
    autograd's two."""
    return _Gram.apply(x)


def row_cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cos(a_i, b_i) for every row i (the diagonal of ``cosine_matrix`` without the matrix)."""
    return (normalize(a) * normalize(b)).sum(-1)


def angle(cos: torch.Tensor) -> torch.Tensor:
    """arccos with a finite derivative everywhere (see ACOS_EPS)."""
    return torch.acos(cos.clamp(-1 + ACOS_EPS, 1 - ACOS_EPS))


def angular_similarity(cos: torch.Tensor) -> torch.Tensor:
    """pi/2 - arccos(c) = arcsin(c) (SimACE eq. 7), with a finite derivative everywhere."""
    return torch.asin(cos.clamp(-1 + ACOS_EPS, 1 - ACOS_EPS))


def distance(cos: torch.Tensor) -> torch.Tensor:
    """||a - b|| = sqrt(2 - 2 cos) for unit vectors, with a finite derivative everywhere."""
    return (2 - 2 * cos).clamp_min(SQUARED_DISTANCE_FLOOR).sqrt()


def off_diagonal(n: int, device: torch.device | str) -> torch.Tensor:
    """Boolean N x N mask that is False on the diagonal (the positives)."""
    return ~torch.eye(n, dtype=torch.bool, device=device)


def mean_off_diagonal(m: torch.Tensor) -> torch.Tensor:
    """Mean of the N(N-1) off-diagonal entries of a square matrix."""
    n = m.size(0)
    return (m.sum() - m.diagonal().sum()) / (n * (n - 1))


def view_stats(h: torch.Tensor, h_pos: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mean positive and negative cosine of normalized views, in O(N d) (no N x N matrix):
    the negatives' sum is (sum_i h_i).(sum_j h'_j) minus the positives'. Detached 0-d tensors,
    no host sync."""
    h, h_pos = h.detach(), h_pos.detach()
    n = h.size(0)
    positives = (h * h_pos).sum(-1)
    negatives = h.sum(0) @ h_pos.sum(0) - positives.sum()
    return {"pos_cos": positives.mean(), "neg_cos": negatives / (n * (n - 1))}
