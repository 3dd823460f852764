"""Decoupled objectives of Nie et al. (ICLR 2023, "On the Inadequacy of Optimizing Alignment and
Uniformity"): alignment + uniformity, DCL, and DCL+ (DCL with gradient dissipation).

With h = normalize(z), h' = normalize(z'), N anchors, N - 1 in-batch negatives each:
- L_a&u = (1 - lambda) L_align + lambda L_uniform                                   (eq. 2)
  L_align = mean_i ||h_i - h'_i||^alpha                                             (eq. 3)
  L_uniform = log 1/(N(N-1)) sum_i sum_{j != i} e^{-t ||h_i - h'_j||^2}              (eq. 29)
  The released code [C] uses within-view pairs instead, averaged over the two views, plus a
  constant 2t: 2t + (log mean_{i<j} e^{-t||h_i - h_j||^2} + the same for h') / 2.
- L_dcl_i = -h_i.h'_i / tau + log sum_{j != i} e^{h_i.h'_j / tau}                   (eq. 5)
- L_dcl+_i = max(L_dcl_i, 0)                                                        (eq. 10)
Per-anchor losses are averaged over all anchors (inactive ones included), one direction.
"""

from __future__ import annotations

import math

import torch

from stages.core.schema.objective_settings import (
    AlignUniformSettings,
    DCLPlusSettings,
    DCLSettings,
)
from stages.objectives.base import LossOutput, Objective, Triplets
from stages.objectives.geometry import (
    gram,
    normalize,
    off_diagonal,
    view_stats,
)


def alignment_term(h: torch.Tensor, h_pos: torch.Tensor, alpha: float) -> torch.Tensor:
    """mean_i ||h_i - h'_i||^alpha, from the difference vectors (as Wang & Isola's code).

    Not from the cosines: 2 - 2 cos cancels for close pairs (in fp32 it is 0 or noise below
    ~1e-7) and a floor on it zeroes their gradient, while alpha ||d||^(alpha - 2) d stays exact.
    At distance 0 the gradient is its limit for alpha > 1, 0 (and a subgradient for alpha <= 1).
    """
    diff = h - h_pos
    if alpha == 2:
        return diff.square().sum(-1).mean()
    distance = torch.linalg.vector_norm(diff, dim=-1)  # gradient 0 at distance 0
    apart = distance > 0
    powered = torch.where(apart, distance, 1).pow(alpha)  # no 0^(alpha - 1) in the backward
    return torch.where(apart, powered, 0).mean()


def log_mean_offdiagonal_exp(cos: torch.Tensor, t: float) -> torch.Tensor:
    """log 1/(N(N-1)) sum_{i != j} e^{-t (2 - 2 C_ij)}: uniformity over the off-diagonal pairs."""
    n = cos.size(0)
    exponents = (-t * (2 - 2 * cos)).masked_fill(~off_diagonal(n, cos.device), -math.inf)
    return exponents.flatten().logsumexp(0) - math.log(n * (n - 1))


def uniformity_cross_view(cos: torch.Tensor, t: float) -> torch.Tensor:
    """Eq. 29: pairs (h_i, h'_j), i != j."""
    return log_mean_offdiagonal_exp(cos, t)


def uniformity_within_view(h: torch.Tensor, h_pos: torch.Tensor, t: float) -> torch.Tensor:
    """The released code's variant: within-view pairs, averaged over the two views, + 2t.
    (The mean over i < j equals the mean over i != j: the Gram matrix is symmetric.)"""
    within = [log_mean_offdiagonal_exp(gram(v), t) for v in (h, h_pos)]
    return 2 * t + (within[0] + within[1]) / 2


def dcl_per_anchor(cos: torch.Tensor, tau: float) -> torch.Tensor:
    """-cos_ii'/tau + log sum_{j != i} e^{cos_ij'/tau} (the positive left out of the sum)."""
    logits = cos / tau
    negatives = logits.masked_fill(~off_diagonal(cos.size(0), cos.device), -math.inf)
    return negatives.logsumexp(dim=1) - logits.diagonal()


class AlignUniform(AlignUniformSettings, Objective):
    """(1 - lambda) L_align(alpha) + lambda L_uniform(t) (eqs. 2-4, 29)."""

    def compute(
        self,
        z: torch.Tensor,
        z_pos: torch.Tensor,
        *,
        tau: float | None,
        triplets: Triplets | None,
    ) -> LossOutput:
        h, h_pos = normalize(z), normalize(z_pos)
        align = alignment_term(h, h_pos, self.alpha)
        if self.implementation == "paper":
            uniform = uniformity_cross_view(h @ h_pos.T, self.t)
        else:
            uniform = uniformity_within_view(h, h_pos, self.t)
        lam = self.uniformity_weight
        stats = view_stats(h, h_pos) | {"alignment": align.detach(), "uniformity": uniform.detach()}
        return LossOutput((1 - lam) * align + lam * uniform, stats)


class DCL(DCLSettings, Objective):
    """Decoupled contrastive loss (Yeh et al.) as in Nie et al. eq. 5: cross-view negatives only,
    one direction."""

    def compute(
        self,
        z: torch.Tensor,
        z_pos: torch.Tensor,
        *,
        tau: float | None,
        triplets: Triplets | None,
    ) -> LossOutput:
        h, h_pos = normalize(z), normalize(z_pos)
        cos = h @ h_pos.T
        return LossOutput(dcl_per_anchor(cos, tau).mean(), view_stats(h, h_pos))


class DCLPlus(DCLPlusSettings, Objective):
    """max(L_dcl, 0) per anchor (eq. 10): the gradient of anchors with L_dcl < 0 is cut."""

    def compute(
        self,
        z: torch.Tensor,
        z_pos: torch.Tensor,
        *,
        tau: float | None,
        triplets: Triplets | None,
    ) -> LossOutput:
        h, h_pos = normalize(z), normalize(z_pos)
        cos = h @ h_pos.T
        per_anchor = torch.relu(dcl_per_anchor(cos, tau))
        stats = view_stats(h, h_pos) | {"active_fraction": (per_anchor.detach() > 0).float().mean()}
        return LossOutput(per_anchor.mean(), stats)
