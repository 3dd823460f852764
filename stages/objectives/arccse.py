"""ArcCSE (Zhang et al., 2022, ACL): ArcCon loss and the masked-triplet loss.

ArcCon (eq. 3): an additive angular margin m on the positive pair only,
    l_i = -log( e^{cos(theta_ii' + m)/tau} / (e^{cos(theta_ii' + m)/tau}
                                              + sum_{j != i} e^{cos theta_ij' / tau}) ),
mean over anchors, row-wise (as SimCSE); with m = 0 it is exactly NT-Xent (eq. 1). theta + m > pi
is not special-cased (the paper mentions no easy-margin / threshold trick).

Triplet loss (eq. 4), on representations of (s, s', s'') encoded with dropout off:
    l_i = max(0, cos(h_i, h_i'') - cos(h_i, h_i') + m_tri),  m_tri = 0,
per triplet (the diagonal, not all pairs), mean over the triplets of the step.
ArcCSE (eq. 5): L = L_arc + lambda * L_tri, lambda = 0.1.
"""

from __future__ import annotations

import math

import torch

from stages.core.schema.objective_settings import ArcConSettings, ArcCSESettings
from stages.objectives.base import LossOutput, Objective, Triplets
from stages.objectives.geometry import angle, normalize, row_cosines, view_stats
from stages.objectives.infonce import cross_entropy_per_anchor


def arccon_logits(cos: torch.Tensor, tau: float, margin: float) -> torch.Tensor:
    """cos(theta_ii' + m)/tau on the diagonal, cos(theta_ij')/tau elsewhere (margin in radians)."""
    if margin == 0:
        return cos / tau  # exactly NT-Xent, without the arccos round trip
    return torch.diagonal_scatter(cos, torch.cos(angle(cos.diagonal()) + margin)) / tau


def triplet_per_example(
    h: torch.Tensor, h_short: torch.Tensor, h_long: torch.Tensor, margin: float
) -> torch.Tensor:
    """max(0, cos(h, h'') - cos(h, h') + m) per triplet; h' masks 20% of s, h'' 40%."""
    return torch.relu(row_cosines(h, h_long) - row_cosines(h, h_short) + margin)


class ArcCon(ArcConSettings, Objective):
    """ArcCon loss alone (ArcCSE 'w/o Triplet loss'; the ArcCon baseline of SimACE and of the
    temperature cool-down paper)."""

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
        loss = cross_entropy_per_anchor(arccon_logits(cos, tau, math.radians(self.margin_deg)))
        return LossOutput(loss.mean(), view_stats(h, h_pos))


class ArcCSE(ArcCSESettings, Objective):
    """L_arc + lambda * L_tri (eq. 5). ``margin_deg: 0`` is the 'w/o ArcCon loss' ablation
    (NT-Xent + lambda * L_tri); the 'w/o Triplet loss' ablation is the ``arccon`` objective.

    ``triplets`` = (h, h', h'') of the step's triplets (dropout off; ``train.triplet_batching``
    decides which); None or empty tensors when the step has none, which contributes 0 (and 0
    to the triplet statistics, so every step records the same ones).
    """

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
        loss = cross_entropy_per_anchor(arccon_logits(cos, tau, math.radians(self.margin_deg)))
        loss = loss.mean()
        stats = view_stats(h, h_pos)
        stats["triplet_loss"] = stats["triplet_active_fraction"] = loss.new_zeros(())
        if triplets is not None and triplets[0].size(0) > 0:
            hinge = triplet_per_example(*triplets, margin=self.triplet_margin)
            loss = loss + self.triplet_weight * hinge.mean()
            stats["triplet_loss"] = hinge.detach().mean()
            stats["triplet_active_fraction"] = (hinge.detach() > 0).float().mean()
        return LossOutput(loss, stats)
