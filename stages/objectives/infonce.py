"""SimCSE's NT-Xent / InfoNCE with cosine similarity (Gao et al., 2021, eq. 1): the baseline."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from stages.objectives.base import LossOutput, ObjectiveParams, Triplets


def cosine_matrix(z: torch.Tensor, z_pos: torch.Tensor) -> torch.Tensor:
    """C[i, j] = cos(z_i, z'_j), computed in fp32 whatever the input dtype."""
    return F.normalize(z.float(), dim=-1) @ F.normalize(z_pos.float(), dim=-1).T


def infonce_loss(z: torch.Tensor, z_pos: torch.Tensor, tau: float) -> torch.Tensor:
    cos = cosine_matrix(z, z_pos)
    labels = torch.arange(cos.size(0), device=cos.device)
    return F.cross_entropy(cos / tau, labels)


class InfoNCE(ObjectiveParams):
    """-log softmax_j(cos(z_i, z'_j) / tau)[i], mean over anchors; negatives include j != i."""

    name: Literal["infonce"]
    tau: float = Field(0.05, gt=0, description="temperature")

    uses_temperature: ClassVar[bool] = True

    def __call__(
        self,
        z: torch.Tensor,
        z_pos: torch.Tensor,
        *,
        tau: float | None = None,
        triplets: Triplets | None = None,
    ) -> LossOutput:
        return LossOutput(infonce_loss(z, z_pos, self.tau if tau is None else tau))
