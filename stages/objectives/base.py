"""The contract every training objective follows.

An objective's loss class subclasses its settings (``stages.core.schema.objective_settings``: the
hyperparameters, validated when params.yaml is loaded) and ``Objective``. Callers use ``objective(z,
z_pos, tau=..., triplets=...)``, which checks the inputs, turns autocast off and upcasts half-
precision inputs, so every loss is computed in at least fp32 (safe under bf16/fp16 autocast);
subclasses implement ``compute`` on those inputs. Objectives are pure functions of their inputs: no
state, no device logic, no host-device sync.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field

import torch

from stages.objectives.geometry import upcast

Triplets = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class LossOutput:
    """What ``compute`` returns: ``loss``, the 0-d tensor the trainer back-propagates, and
    ``stats``, cheap diagnostics by name (detached 0-d tensors left on the device, logged beside
    the loss at every optimizer step: the run's ``train`` events), e.g. ``view_stats``'s
    ``pos_cos`` and ``neg_cos``."""

    loss: torch.Tensor
    stats: dict[str, torch.Tensor] = field(default_factory=dict)


class Objective:
    """The loss of an objective: mixed into a subclass of its settings, which gives ``name``,
    ``uses_temperature``, ``needs_triplets`` and the hyperparameters (not annotated here: pydantic
    would take annotations for fields)."""

    @property
    def initial_tau(self) -> float | None:
        """The configured temperature: where a schedule ends (and what it returns when constant)."""
        return getattr(self, "tau", None) if self.uses_temperature else None

    def __call__(
        self,
        z: torch.Tensor,
        z_pos: torch.Tensor,
        *,
        tau: float | None = None,
        triplets: Triplets | None = None,
    ) -> LossOutput:
        """Loss of anchors ``z`` (N x d) against positives ``z_pos`` (N x d).

        ``z`` and ``z_pos`` are the pooled sentence vectors of the two dropout views
        (``train.pooler``), not normalised. Row i of ``z_pos`` is the positive of row i of
        ``z``; every other row is an in-batch negative. With ``train.gather_negatives`` on
        several ranks the trainer gathers every rank's rows (with their gradients) before the
        call, so N is the global batch. ``tau`` overrides the configured temperature
        (temperature schedules); ``triplets`` carries (s, s', s'') representations, three
        N_t x d tensors, for objectives that need them.
        """
        if z.ndim != 2 or z.shape != z_pos.shape:
            raise ValueError(
                f"{self.name}: expected two N x d views of the same shape, got "
                f"{tuple(z.shape)} and {tuple(z_pos.shape)}"
            )
        if z.size(0) < 2:
            raise ValueError(f"{self.name}: needs at least 2 rows (in-batch negatives), got 1")
        if tau is not None and not self.uses_temperature:
            raise ValueError(f"{self.name}: has no temperature, but tau={tau} was given")
        if tau is not None and not tau > 0:
            raise ValueError(f"{self.name}: tau must be > 0, got {tau}")
        if triplets is not None and not self.needs_triplets:
            raise ValueError(f"{self.name}: does not use triplets, but triplets were given")
        with torch.autocast(device_type=z.device.type, enabled=False):
            return self.compute(
                upcast(z),
                upcast(z_pos),
                tau=self.initial_tau if tau is None else tau,
                triplets=None if triplets is None else tuple(upcast(t) for t in triplets),
            )

    @abstractmethod
    def compute(
        self,
        z: torch.Tensor,
        z_pos: torch.Tensor,
        *,
        tau: float | None,
        triplets: Triplets | None,
    ) -> LossOutput:
        """The loss on validated inputs in at least fp32, autocast off (shapes and meaning as
        ``__call__`` says; normalising is the loss's own business: ``geometry.normalize``);
        ``tau`` is the temperature of this step (None for objectives without one)."""
