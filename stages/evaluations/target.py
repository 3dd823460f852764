"""What an evaluation stage scores for an experiment name: a trained run's best checkpoint
(found through experiments/<name>/train.json, pooler from its encoder.json) or a baseline
(``baseline.<key>``: an untrained backbone with the pooler params.yaml gives it)."""

from __future__ import annotations

import json
from typing import Any

from stages.core.errors import StageError
from stages.core.identity.experiments import plan_baselines, plan_runs
from stages.core.schema.params import Params
from stages.core.storage import layout
from stages.modeling.encoder import EncoderError, SentenceEncoder

TRAIN_POINTER = "train.json"


def encoder_for(
    name: str, params: Params, *, batch_size: int, device: str = "auto"
) -> SentenceEncoder:
    """The encoder of experiment ``name`` on ``device``; a clear StageError if it cannot be
    evaluated yet."""
    baselines = plan_baselines(params)
    runs = plan_runs(params)
    if name in baselines:
        baseline = baselines[name]
        backbone = params.backbones[baseline.backbone]  # pretrained: the schema checks it
        return load_encoder(
            backbone.model,
            baseline.pooler,
            label=name,
            revision=backbone.revision,
            batch_size=batch_size,
            device=device,
        )
    if name not in runs:
        known = ", ".join([*runs, *baselines]) or "(none)"
        raise StageError(f"unknown experiment '{name}'; planned: {known}")
    pointer = layout.experiment_dir(name) / TRAIN_POINTER
    if not pointer.is_file():
        raise StageError(f"{name} is not trained yet: {pointer} is missing (run its train stage)")
    run_id = json.loads(pointer.read_text(encoding="utf-8"))["run_id"]
    if run_id != runs[name].run_id:
        raise StageError(
            f"{pointer} points to run {run_id}, but params now give run {runs[name].run_id}: "
            "train it first (the orchestrators do this in order)"
        )
    model_dir = layout.run_dir(run_id) / "best"
    if not model_dir.is_dir():
        raise StageError(f"{name}: the best checkpoint {model_dir} is missing from the run store")
    return load_encoder(str(model_dir), None, label=name, batch_size=batch_size, device=device)


def load_encoder(
    model: str, pooler: str | None, *, label: str | None = None, **options: Any
) -> SentenceEncoder:
    """``SentenceEncoder(model, pooler, **options)``; a StageError (after ``label``) if the model
    cannot be loaded."""
    try:
        return SentenceEncoder(model, pooler, **options)
    except (EncoderError, ValueError, OSError) as err:
        raise StageError(f"{label}: {err}" if label else str(err)) from None
