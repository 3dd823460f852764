"""SimCSE's NT-Xent / InfoNCE with cosine similarity (Gao et al., 2021, eq. 1): the baseline.

l_i = -log( e^{cos(z_i, z'_i)/tau} / sum_j e^{cos(z_i, z'_j)/tau} ), mean over anchors; the
denominator includes the positive (j = i). Row-wise, one direction, as in SimCSE.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from stages.core.schema.objective_settings import InfoNCESettings
from stages.objectives.base import LossOutput, Objective, Triplets
from stages.objectives.geometry import normalize, view_stats


def cross_entropy_per_anchor(logits: torch.Tensor) -> torch.Tensor:
    """-log softmax(logits[i])[i] for every row i: the positive is on the diagonal."""
    labels = torch.arange(logits.size(0), device=logits.device)
    return F.cross_entropy(logits, labels, reduction="none")


class InfoNCE(InfoNCESettings, Objective):
    """-log softmax_j(cos(z_i, z'_j) / tau)[i], mean over anchors; negatives include j != i."""

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
        return LossOutput(cross_entropy_per_anchor(cos / tau).mean(), view_stats(h, h_pos))
