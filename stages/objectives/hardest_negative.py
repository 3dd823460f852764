"""Hardest-negative triplet losses of Nie et al. (ICLR 2023): MPT, MET and MAT (eqs. 13-15).

Each is max(0, rho(h_i, h'_i) - min_{j != i} rho(h_i, h'_j) + m) for a distance rho, averaged
over all anchors (inactive ones included), so an anchor's gradient vanishes once its hardest
negative is more than m farther than its positive (hard gradient dissipation):
- MPT: rho = -cosine (minimum dot-product triplet; the paper's h_j is h'_j, as in the code);
- MET: rho = Euclidean distance sqrt(2 - 2 cos);
- MAT: rho = angle arccos(cos); m is given in units of pi (Table 2).
The released code [C] takes the hardest negative per *column* (for each positive h'_j, the
hardest first-view h_i, i != j) and fills the excluded diagonal with cosine 0 in MPT and MAT, which
floors the hardest similarity at 0 (MPT) and caps the smallest negative angle at pi/2 (MAT).
``implementation: code`` reproduces both (and clamps before arccos, which the code does not).
"""

from __future__ import annotations

import math

import torch

from stages.core.schema.objective_settings import (
    Implementation,
    MATSettings,
    METSettings,
    MPTSettings,
)
from stages.objectives.base import LossOutput, Objective, Triplets
from stages.objectives.geometry import angle, distance, normalize, off_diagonal, view_stats


def _hardest(values: torch.Tensor, largest: bool, dim: int) -> torch.Tensor:
    """The largest (or smallest) off-diagonal value per row (dim 1) or per column (dim 0)."""
    excluded = -math.inf if largest else math.inf
    masked = values.masked_fill(~off_diagonal(values.size(0), values.device), excluded)
    return masked.amax(dim=dim) if largest else masked.amin(dim=dim)


def mpt_per_anchor(
    cos: torch.Tensor, margin: float, implementation: Implementation
) -> torch.Tensor:
    """max(0, max_{j != i} cos_ij' - cos_ii' + m)."""
    if implementation == "code":
        cos_neg = cos * off_diagonal(cos.size(0), cos.device)  # diagonal -> 0, not excluded
        return torch.relu(cos_neg.amax(dim=0) - cos.diagonal() + margin)
    return torch.relu(_hardest(cos, largest=True, dim=1) - cos.diagonal() + margin)


def met_per_anchor(
    cos: torch.Tensor, margin: float, implementation: Implementation
) -> torch.Tensor:
    """max(0, ||h_i - h'_i|| - min_{j != i} ||h_i - h'_j|| + m). (The code's diagonal fill, the
    maximum distance 2, never wins the minimum, so only the row/column choice differs.)"""
    dist = distance(cos)
    dim = 1 if implementation == "paper" else 0
    return torch.relu(dist.diagonal() - _hardest(dist, largest=False, dim=dim) + margin)


def mat_per_anchor(
    cos: torch.Tensor, margin: float, implementation: Implementation
) -> torch.Tensor:
    """max(0, theta_ii' - min_{j != i} theta_ij' + m), m in radians."""
    if implementation == "code":
        angles_neg = angle(cos * off_diagonal(cos.size(0), cos.device))  # diagonal -> pi/2
        return torch.relu(angle(cos.diagonal()) - angles_neg.amin(dim=0) + margin)
    angles = angle(cos)
    return torch.relu(angles.diagonal() - _hardest(angles, largest=False, dim=1) + margin)


def _hinge_output(stats: dict[str, torch.Tensor], per_anchor: torch.Tensor) -> LossOutput:
    stats = stats | {"active_fraction": (per_anchor.detach() > 0).float().mean()}
    return LossOutput(per_anchor.mean(), stats)


class MPT(MPTSettings, Objective):
    """Minimum dot-Product Triplet loss (eq. 13)."""

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
        return _hinge_output(
            view_stats(h, h_pos), mpt_per_anchor(cos, self.margin, self.implementation)
        )


class MET(METSettings, Objective):
    """Minimum Euclidean distance Triplet loss (eq. 14)."""

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
        return _hinge_output(
            view_stats(h, h_pos), met_per_anchor(cos, self.margin, self.implementation)
        )


class MAT(MATSettings, Objective):
    """Minimum Angle Triplet loss (eq. 15)."""

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
        per_anchor = mat_per_anchor(cos, self.margin_pi * math.pi, self.implementation)
        return _hinge_output(view_stats(h, h_pos), per_anchor)
