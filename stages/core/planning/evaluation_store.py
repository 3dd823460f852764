"""Finished evaluations stored under their ids (``runs/evaluations/``), beside the runs they
score: an evaluation asked for again (a rerun after a comment edit, another checkout) is written
back from there instead of computed."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stages.core.identity.experiments import Experiment, Plan
from stages.core.storage import layout
from stages.core.storage.atomic import atomic_path, write_json


def stored_evaluation(plan: Plan, evaluation: str, experiment: Experiment) -> tuple[Path, str]:
    """Where registered evaluation ``evaluation`` of ``experiment`` is stored under its id, and
    the id."""
    identity = plan.evaluation_id(evaluation, experiment)
    return layout.evaluation_file(evaluation, identity), identity


def reuse_evaluation(
    plan: Plan, stage: str, experiment: Experiment, output: Path, beside: Sequence[Path] = ()
) -> bool:
    """Write ``output`` and the folders ``beside`` it from the stored result of the same
    evaluation, if there is one with those folders: the outputs a computed one leaves."""
    stored, identity = stored_evaluation(plan, stage, experiment)
    kept = layout.evaluation_folders(stage, identity)
    if not stored.is_file() or not all((kept / folder.name).is_dir() for folder in beside):
        return False
    for folder in beside:
        _restore(kept / folder.name, folder)
    record = json.loads(stored.read_text(encoding="utf-8"))
    if not output.is_file() or json.loads(output.read_text(encoding="utf-8")) != record:
        write_json(output, record)
    return True


def store_evaluation(
    plan: Plan,
    stage: str,
    experiment: Experiment,
    record: dict[str, Any],
    beside: Sequence[Path] = (),
) -> dict[str, Any]:
    """Store a finished evaluation under its id, with a copy of the folders it wrote ``beside``
    its results JSON; the record with the id, as stored."""
    stored, evaluation = stored_evaluation(plan, stage, experiment)
    kept = layout.evaluation_folders(stage, evaluation)
    for folder in beside:
        with atomic_path(kept / folder.name) as tmp:
            shutil.copytree(folder, tmp)
    record = {**record, "evaluation_id": evaluation}
    write_json(stored, record)  # last: a result is reused only once its folders are stored
    return record


def _restore(source: Path, dest: Path) -> None:
    """Put every file of ``source`` into ``dest`` where it is missing or differs. Files only
    ``dest`` has stay: mteb's results layout holds any number of models' results."""
    for path in sorted(source.rglob("*")):
        target = dest / path.relative_to(source)
        if path.is_file() and (not target.is_file() or target.read_bytes() != path.read_bytes()):
            with atomic_path(target) as tmp:
                shutil.copyfile(path, tmp)
