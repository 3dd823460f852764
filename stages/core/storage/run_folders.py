"""What a run folder in the runs store holds, and how to read it: a run is complete when every
file of ``RUN_FILES`` is there (the folder's name alone proves nothing: it appears by one rename
after the files are written, but a store can be damaged)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"

METRICS_FILE = "metrics.json"

LOG_FILE = "log.jsonl"

RUN_FILES = (
    CONFIG_FILE,
    LOG_FILE,
    METRICS_FILE,
    "best/model.safetensors",
    "final/model.safetensors",
)


def read_log(path: Path) -> list[dict[str, Any]]:
    """A run's log.jsonl: one record per line."""
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def missing_files(folder: Path) -> list[str]:
    return [f for f in RUN_FILES if not (folder / f).is_file()]


def is_complete(folder: Path) -> bool:
    return folder.is_dir() and not missing_files(folder)


def is_stored_run(folder: Path) -> bool:
    """A complete run folder named as the run its config.json records (a copy staged under
    another name, or a folder renamed by hand, is no stored run)."""
    return is_complete(folder) and (read_config(folder) or {}).get("run_id") == folder.name


def read_config(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# How config.json's execution.compile (train.compile as resolved on the device) reads.
COMPILE_LABELS = {False: "eager", True: "compiled", "reduce-overhead": "CUDA graphs"}


def environment_summary(config: dict[str, Any] | None) -> str:
    """'torch 2.13.0, transformers 4.57.1, cpu fp32, unpadded eager' from a run's config.json
    (the forward as far as the record says: runs recorded before it say nothing of it)."""
    if not config or "execution" not in config:
        return "?"
    e = config["execution"]
    parts = [f"torch {e.get('torch', '?')}", f"transformers {e.get('transformers', '?')}"]
    summary = ", ".join(parts) + f", {e.get('device', '?')} {e.get('precision', '?')}"
    forward = [] if "unpadded" not in e else ["unpadded" if e["unpadded"] else "padded"]
    if e.get("compile") in COMPILE_LABELS:
        forward.append(COMPILE_LABELS[e["compile"]])
    return ", ".join([summary, " ".join(forward)]) if forward else summary


def origin_label(origin: dict[str, Any]) -> str:
    """'trained here' or 'fetched from <store>' (runs from before the store: 'origin unknown')."""
    if origin.get("origin") == "fetched":
        return f"fetched from {origin.get('store')}"
    if origin.get("origin") == "trained":
        return f"trained on {origin.get('host')}"
    return "origin unknown"
