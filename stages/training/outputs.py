"""A finished run's outputs: metrics.json's content, and the final/ and best/ model folders
(Hugging Face and sentence-transformers model folders with tokenizer, encoder.json, run.json and
a model card README.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from stages.core.storage.atomic import atomic_path, write_json
from stages.modeling.checkpoint import EncoderInfo, write_encoder_info
from stages.modeling.model_card import render_model_card
from stages.modeling.st_format import write_sentence_transformers_files
from stages.training.parts import TrainingParts
from stages.training.progress import Progress

RUN_CONFIG_IN_MODEL = "run.json"
MODEL_CARD = "README.md"


def run_metrics(
    run: TrainingParts, progress: Progress, elapsed: float, wall: float, steps_now: int
) -> dict[str, Any]:
    """metrics.json: the best and final dev evaluations, all of them, and the run's timing
    (``elapsed``: every session's seconds; ``wall``, ``steps_now``: this session's)."""
    job = run.job
    return {
        "run_id": job.run_id,
        "steps": run.step,
        "epochs": run.step / run.updates_per_epoch,
        "batch_size": job.train.batch_size,
        "best": progress.best,
        "final": progress.evaluations[-1],
        "evaluations": progress.evaluations,
        "timing": {
            "wall_s": elapsed,
            "steps_this_session": steps_now,
            "steps_per_s_this_session": steps_now / wall if wall > 0 else None,
            "device": str(run.runtime.device),
            "precision": run.runtime.precision,
            "eval_precision": run.dev_encoder.precision,
            "world_size": run.ctx.world_size,
        },
    }


def save_final_and_best(
    run: TrainingParts, best_weights: dict[str, torch.Tensor], metrics: dict[str, Any]
) -> None:
    """final/ (the weights as trained), then best/ (``best_weights``, loaded into the encoder)."""
    job = run.job
    info = EncoderInfo(
        eval_pooler=job.train.eval_pooler,
        train_pooler=job.train.pooler,
        max_seq_length=job.train.max_seq_length,
        run_id=job.run_id,
        backbone=job.backbone_name,
    )
    config = {**job.config, "execution": run.execution()}
    card = render_model_card(config, metrics)
    save_encoder(job.out_dir / "final", run.encoder, run.tokenizer, info, config, card)
    run.encoder.load_state_dict(best_weights)
    save_encoder(job.out_dir / "best", run.encoder, run.tokenizer, info, config, card)


def save_encoder(
    dest: Path,
    encoder: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    info: EncoderInfo,
    run_config: dict[str, Any],
    model_card: str | None = None,
) -> None:
    """A trained encoder folder: safetensors weights, tokenizer, encoder.json, run.json, also a
    sentence-transformers model folder for the evaluation pooler, with a model card README.md."""
    with atomic_path(dest) as tmp:
        encoder.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_encoder_info(tmp, info)
        write_json(tmp / RUN_CONFIG_IN_MODEL, run_config)
        write_sentence_transformers_files(tmp, info.eval_pooler)
        if model_card is not None:
            (tmp / MODEL_CARD).write_text(model_card, encoding="utf-8")
