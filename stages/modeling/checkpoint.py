"""The on-disk format of a trained encoder: a Hugging Face model directory (safetensors,
config, tokenizer) plus ``encoder.json``, which records how to turn it into sentence vectors.

Every evaluator reads the pooler from ``encoder.json``, so a trained run is always evaluated
the way it was meant to be (no flag to forget).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from stages.core.schema.params import Pooler

ENCODER_FILE = "encoder.json"


class EncoderInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    eval_pooler: Pooler
    train_pooler: Pooler
    max_seq_length: int
    run_id: str | None = None
    backbone: str | None = None


def write_encoder_info(model_dir: str | Path, info: EncoderInfo) -> None:
    (Path(model_dir) / ENCODER_FILE).write_text(info.model_dump_json(indent=2) + "\n")


def read_encoder_info(model_dir: str | Path) -> EncoderInfo | None:
    """The encoder's recorded settings, or None for a plain Hugging Face model directory."""
    path = Path(model_dir) / ENCODER_FILE
    if not path.is_file():
        return None
    return EncoderInfo.model_validate_json(path.read_text())
