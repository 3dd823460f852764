"""SimACE: angle-based similarity for contrastive sentence representations (eqs. 7-9).

s_ang(i, j) = pi/2 - arccos(cos(z_i, z'_j)) = arcsin(cos) in [-pi/2, pi/2]          (eq. 7)
l_i = -log( e^{(s_ang(i,i') - m)/tau} / (e^{(s_ang(i,i') - m)/tau}
                                         + sum_{j != i} e^{s_ang(i,j')/tau}) )     (eq. 9)
mean over anchors. The margin is subtracted from the positive logit only; since
s_ang - m = pi/2 - (theta + m), a positive m is an additive angular penalty on the positive
(the same direction as ArcCon). m is in degrees (Table 7: "The unit of margin value is degree"),
not the "10 (radians)" of the prose. Table 14's "m = -10" ablation is ``margin_deg: -10``.
"""

from __future__ import annotations

import math

import torch

from stages.core.schema.objective_settings import SimACESettings
from stages.objectives.base import LossOutput, Objective, Triplets
from stages.objectives.geometry import angular_similarity, normalize, view_stats
from stages.objectives.infonce import cross_entropy_per_anchor


def simace_logits(cos: torch.Tensor, tau: float, margin: float) -> torch.Tensor:
    """(s_ang - m * 1{i = j}) / tau, margin in radians."""
    s = angular_similarity(cos)
    return (s - margin * torch.eye(s.size(0), dtype=s.dtype, device=s.device)) / tau


class SimACE(SimACESettings, Objective):
    """InfoNCE on the angular similarity arcsin(cos) with a margin on the positive (eq. 9)."""

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
        loss = cross_entropy_per_anchor(simace_logits(cos, tau, math.radians(self.margin_deg)))
        return LossOutput(loss.mean(), view_stats(h, h_pos))
