"""What one training run is given: the planned run (its settings, backbone, seed, data and
identity) and where it trains (``stages.training.run_folder`` builds it for the train stage;
tests and benchmarks build one from a ``standalone_run``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stages.core.identity.experiments import Run
from stages.core.schema.objective_settings import InfoNCESettings
from stages.core.schema.params import BackboneParams, ResolvedMethod, TrainParams
from stages.core.schema.temperature_settings import TemperatureSchedule
from stages.objectives.base import Objective


@dataclass(frozen=True)
class TrainJob:
    """A run to train: the run as planned, the loss it computes, and where it trains."""

    run: Run
    # the loss, built from ``run.settings.objective`` (a test may pass one of its own)
    objective: Objective
    out_dir: Path
    cache_dir: Path  # the tokenised corpus cache
    eval_batch_size: int = 128
    selection_metric: str = "spearman"
    live_dir: Path | None = None  # the live loggers' folder (train.loggers); None: no loggers

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def train(self) -> TrainParams:
        return self.run.settings.train

    @property
    def temperature(self) -> TemperatureSchedule:
        return self.run.settings.temperature

    @property
    def backbone(self) -> BackboneParams:
        return self.run.backbone_spec

    @property
    def backbone_name(self) -> str:
        return self.run.backbone

    @property
    def seed(self) -> int:
        return self.run.seed

    @property
    def corpus(self) -> Path:
        return self.run.corpus

    @property
    def max_sentences(self) -> int | None:
        return self.run.max_sentences

    @property
    def triplets(self) -> Path | None:
        return self.run.triplets

    @property
    def config(self) -> dict[str, Any]:
        """config.json of the run: its identity and resolved settings."""
        return self.run.config()


def standalone_run(
    train: TrainParams,
    backbone: BackboneParams,
    corpus: Path,
    *,
    name: str = "standalone",
    backbone_name: str = "backbone",
    seed: int = 42,
    temperature: TemperatureSchedule | None = None,
    max_sentences: int | None = None,
    triplets: Path | None = None,
) -> Run:
    """A run outside any params file's plan (tests, benchmarks): its id hashes its settings,
    not code or data, so it is never confused with a planned run. Its objective settings are
    InfoNCE's; the ``TrainJob`` says which loss it computes."""
    # constructed, not validated: the job's own objective (a triplet one, say) decides what
    # the train settings may say, not these placeholder settings
    settings = ResolvedMethod.model_construct(
        objective=InfoNCESettings(name="infonce"),
        temperature=temperature or TemperatureSchedule(),
        train=train,
    )
    identity = {
        "standalone": name,
        "train": train.model_dump(mode="json"),
        "backbone": backbone.model_dump(mode="json"),
        "seed": seed,
    }
    return Run(
        name=name,
        method="standalone",
        backbone=backbone_name,
        seed=seed,
        settings=settings,
        backbone_spec=backbone,
        corpus=corpus,
        max_sentences=max_sentences,
        triplets_id=triplets.stem if triplets else None,
        triplets=triplets,
        identity=identity,
    )
