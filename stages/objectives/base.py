"""The contract every training objective follows.

An objective is a small frozen pydantic model holding its hyperparameters (validated when
params.yaml is loaded) whose ``__call__`` maps two views of a batch of embeddings to a scalar
loss. Objectives are pure functions of their inputs: no state, no device logic, fp32 math.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict

Triplets = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class LossOutput:
    """A scalar loss plus cheap diagnostics (detached 0-d tensors, read only when logging)."""

    loss: torch.Tensor
    stats: dict[str, torch.Tensor] = field(default_factory=dict)


class ObjectiveParams(BaseModel):
    """Base class of every objective. Subclasses set ``name: Literal[...]`` and their fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    # Whether the objective reads a temperature (and so accepts a temperature schedule).
    uses_temperature: ClassVar[bool] = False
    # Whether the trainer must encode ArcCSE masked triplets (dropout off) for this objective.
    needs_triplets: ClassVar[bool] = False

    @property
    def initial_tau(self) -> float | None:
        """The temperature the schedule starts from / returns to, if the objective has one."""
        return getattr(self, "tau", None) if self.uses_temperature else None

    @abstractmethod
    def __call__(
        self,
        z: torch.Tensor,
        z_pos: torch.Tensor,
        *,
        tau: float | None = None,
        triplets: Triplets | None = None,
    ) -> LossOutput:
        """Loss of anchors ``z`` (N x d) against positives ``z_pos`` (N x d).

        Row i of ``z_pos`` is the positive of row i of ``z``; every other row is an in-batch
        negative. ``tau`` overrides the configured temperature (temperature schedules);
        ``triplets`` carries (s, s', s'') representations for objectives that need them.
        """
