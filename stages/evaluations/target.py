"""The encoder an evaluation scores for an experiment: a trained run's best checkpoint (the pooler
from its encoder.json) or a baseline's untrained backbone with the pooler params.yaml gives it."""

from __future__ import annotations

from typing import Any

from stages.core.errors import StageError
from stages.core.identity.backbones import unpinned, unpinned_message
from stages.core.identity.experiments import Baseline, Experiment
from stages.core.storage.run_folders import is_complete
from stages.modeling.encoder import EncoderError, SentenceEncoder


def encoder_for(
    experiment: Experiment, *, batch_size: int, device: str = "auto"
) -> SentenceEncoder:
    """The encoder of ``experiment`` on ``device``; a clear StageError if it cannot be evaluated
    yet."""
    if isinstance(experiment, Baseline):
        backbone = experiment.backbone_spec  # pretrained: the schema checks it
        if unpinned(backbone, {}):  # the plan pins it where backbones.lock does
            raise StageError(unpinned_message(experiment.backbone, backbone))
        return load_encoder(
            backbone.model,
            experiment.spec.pooler,
            label=experiment.name,
            revision=backbone.revision,
            layers=backbone.layers,
            batch_size=batch_size,
            device=device,
        )
    if not is_complete(experiment.run_dir):
        raise StageError(
            f"{experiment.name} is not trained yet: run {experiment.run_id} is not in the runs "
            f"store ({experiment.run_dir}); run its train stage (the orchestrators do this first)"
        )
    model_dir = experiment.run_dir / "best"
    return load_encoder(
        str(model_dir), None, label=experiment.name, batch_size=batch_size, device=device
    )


def load_encoder(
    model: str, pooler: str | None, *, label: str | None = None, **options: Any
) -> SentenceEncoder:
    """``SentenceEncoder(model, pooler, **options)``; a StageError (after ``label``) if the model
    cannot be loaded."""
    try:
        return SentenceEncoder(model, pooler, **options)
    except (EncoderError, ValueError, OSError) as err:
        raise StageError(f"{label}: {err}" if label else str(err)) from None
