"""``experiments/<name>/train.json``: the small file the orchestrators track for a trained run,
written by the train stage and read here only (status, the report): which run it points to, its
best dev score, its steps and time, where it was computed and where it came from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stages.core.identity.experiments import Run
from stages.core.storage.atomic import write_json
from stages.core.storage.run_folders import METRICS_FILE, read_config
from stages.core.storage.shared_store import read_origin

# Where a run's files came from besides its own training, as its config.json records it.
REUSE_MARKS = ("adopted_from", "carried_over")


def train_pointer(run: Run) -> dict[str, Any]:
    """The pointer of ``run``, finished in the runs store: the run, its best dev score, its
    environment and origin."""
    folder = run.run_dir
    metrics = json.loads((folder / METRICS_FILE).read_text(encoding="utf-8"))
    config = read_config(folder) or {}
    return {
        "experiment": run.name,
        "method": run.method,
        "backbone": run.backbone,
        "seed": run.seed,
        "run_id": run.run_id,
        "run_dir": str(folder),
        "best_model": str(folder / "best"),
        "best_dev_spearman": metrics["best"]["spearman"],
        "best_step": metrics["best"]["step"],
        "steps": metrics["steps"],
        "wall_time_s": metrics["timing"]["wall_s"],
        "environment": config.get("execution", {}),
        "origin": read_origin(folder) or {"origin": "unknown"},
        **{mark: config[mark] for mark in REUSE_MARKS if mark in config},
    }


def write_train_pointer(run: Run) -> None:
    """Write ``run``'s pointer unless it already says the same (its bytes and time then stay)."""
    record = train_pointer(run)
    dest = run.pointer_file
    if not dest.is_file() or read_train_pointer(dest) != record:
        write_json(dest, record)


def read_train_pointer(path: Path) -> dict[str, Any] | None:
    """The pointer at ``path``; None if there is none or it cannot be read."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def pointed_run_id(record: dict[str, Any]) -> str | None:
    """The run a pointer points to."""
    return record.get("run_id")
