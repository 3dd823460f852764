"""What one training run is given: the planned run's settings, resolved (``stages.train``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stages.core.schema.params import BackboneParams, TrainParams
from stages.core.schema.temperature_settings import TemperatureSchedule
from stages.objectives.base import Objective


@dataclass(frozen=True)
class TrainJob:
    """Everything one training run needs; built from a planned Run by ``stages.train``."""

    run_id: str
    objective: Objective
    temperature: TemperatureSchedule
    train: TrainParams
    backbone: BackboneParams
    backbone_name: str
    seed: int
    corpus: Path
    out_dir: Path
    cache_dir: Path
    config: dict[str, Any] = field(default_factory=dict)
    max_sentences: int | None = None
    triplets: Path | None = None
    eval_batch_size: int = 128
    selection_metric: str = "spearman"
    live_dir: Path | None = None  # the live loggers' folder (train.loggers); None: no loggers
