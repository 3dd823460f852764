"""How far a run got besides its step: the dev evaluations, the best one and its weights, the
training time of earlier sessions (``Progress``); a checkpoint keeps it
(``stages.training.checkpoints``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel


@dataclass
class Progress:
    """A run's progress besides its step; a checkpoint keeps it, a resumed run restores it."""

    evaluations: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None  # the best evaluation: its step and scores
    best_weights: dict[str, torch.Tensor] | None = None  # the encoder's then, on the host
    best_unsaved: bool = False  # the best weights changed since the last checkpoint
    elapsed_before: float = 0.0  # seconds trained by the earlier sessions of a resumed run

    def add_evaluation(
        self, step: int, scores: dict[str, float], key: str, encoder: PreTrainedModel
    ) -> bool:
        """Record the evaluation of ``step``; if it has the best finite ``key`` score so far (the
        earlier one wins a tie), keep ``encoder``'s weights as the best. Whether it has."""
        improved = math.isfinite(scores[key]) and (
            self.best is None or scores[key] > self.best[key]
        )
        if improved:
            self.best = {"step": step, **scores}
            self.best_weights = {
                k: v.detach().to("cpu", copy=True) for k, v in encoder.state_dict().items()
            }
            self.best_unsaved = True
        self.evaluations.append({"step": step, **scores})
        return improved
