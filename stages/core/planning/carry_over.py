"""Verified carry-over: stored results kept across code changes that compute the same numbers.

An id covers the code that computes its output (``stages.core.identity.code``), so any edit of
that code, a refactor or a moved module included, gives new ids and the cache no longer finds the
results of the old ones. ``cse carry-over`` (``stages/commands/carry_over.py``) looks, for each
planned run with nothing stored under its id, for a stored run whose identity is the same in
everything but the code (``run_candidates``), trains the planned run's first steps again under the
current code and compares every value the two logs hold for those steps, bit for bit
(``log_differences``); only when all agree are the stored run's files linked under the new id,
its config.json saying where they came from (``carry_run_over``). Evaluations are carried over
likewise: a stored result of the carried run (or of the same baseline) for the same tasks, whose
scores on a sample of them the current code reproduces exactly (``task_differences``).

What this verifies is the computation of the replayed steps and sampled tasks; a change that only
acts later in training (a late schedule phase, the final export) is not seen, which is why it is a
command a user runs, not something the stages do by themselves (docs/identity.md).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from stages.core.identity.experiments import Baseline, Experiment, Plan, Run
from stages.core.planning.evaluation_store import stored_evaluation
from stages.core.storage import layout
from stages.core.storage.atomic import rename_durably, write_json
from stages.core.storage.run_folders import CONFIG_FILE, is_complete, read_config

# Identity keys that may differ between a run and its carried-over predecessor: the code (what
# the replay checks) and the masked triplets' id (whose files are compared byte for byte).
CARRIED_KEYS = ("code", "triplets")
# Log values that are timings, not results.
TIMING_KEYS = frozenset({"eval_s"})


def _comparable(identity: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in identity.items() if k not in CARRIED_KEYS}


def run_candidates(run: Run) -> list[Path]:
    """Complete stored runs whose identity is ``run``'s in everything but the code (and the
    triplets' id), newest first; never ``run``'s own folder."""
    if not layout.RUNS.is_dir():
        return []
    wanted = _comparable(run.identity)
    found = []
    for folder in layout.RUNS.iterdir():
        if folder.name == run.run_id or not is_complete(folder):
            continue
        config = read_config(folder) or {}
        identity = config.get("identity", {})
        if "code" in identity and _comparable(identity) == wanted:
            found.append(folder)
    return sorted(found, key=lambda folder: (folder / CONFIG_FILE).stat().st_mtime, reverse=True)


def replay_steps(run: Run, execution: dict[str, Any], asked: int | None = None) -> int:
    """How many updates to replay: ``asked``, or through the first dev evaluation (the replay
    then covers checkpoint selection too), never more than the run has."""
    total = int(execution.get("total_steps", run.settings.train.max_steps or 0))
    steps = asked or run.settings.train.eval_steps
    return min(steps, total) if total else steps


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and type(a) is type(b)


def log_differences(
    stored: list[dict[str, Any]], replayed: list[dict[str, Any]], steps: int
) -> list[str]:
    """Where the replayed log's first ``steps`` updates differ from the stored log's: every
    training and evaluation record, every value but timings, compared exactly. Empty: the
    same."""

    def records(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in log if r.get("event") in ("train", "eval") and r["step"] <= steps]

    old, new = records(stored), records(replayed)
    if [(r["event"], r["step"]) for r in old] != [(r["event"], r["step"]) for r in new]:
        return [f"the logs record other steps: {len(old)} records stored, {len(new)} replayed"]
    differences = []
    for a, b in zip(old, new, strict=True):
        where = f"{a['event']} step {a['step']}"
        keys = (set(a) | set(b)) - TIMING_KEYS
        for key in sorted(keys):
            if key not in a or key not in b:
                differences.append(f"{where}: '{key}' is in one log only")
            elif not _same(a[key], b[key]):
                differences.append(f"{where}: {key} {a[key]!r} stored, {b[key]!r} replayed")
    return differences


def carry_run_over(run: Run, source: Path, verified: dict[str, Any]) -> None:
    """Link ``source``'s files under ``run``'s id (nothing of ``source`` is changed or removed);
    config.json gets the new identity and what was verified, as ``carried_over``."""
    staging = run.run_dir.with_name(run.run_id + ".carrying")
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(source, staging, copy_function=os.link)
    config = read_config(source) or {}
    (staging / CONFIG_FILE).unlink()  # a hard link: rewriting it in place would edit the source
    carried = {"from": source.name, **verified}
    write_json(staging / CONFIG_FILE, {**config, **run.config(), "carried_over": carried})
    rename_durably(staging, run.run_dir)


def evaluation_candidates(
    evaluation: str, experiment: Experiment, source_run: str | None
) -> list[tuple[Path, dict[str, Any]]]:
    """Stored results of ``evaluation`` that scored what ``experiment`` scores: the run it was
    carried over from (``source_run``), or the same pretrained backbone and pooler (a
    baseline)."""
    folder = layout.RUNS / "evaluations"
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob(f"{evaluation}-*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        encoder = record.get("encoder", {}) if isinstance(record, dict) else {}
        if isinstance(experiment, Baseline):
            scored = (encoder.get("run_id") is None and encoder.get("pooler") ==
                      experiment.spec.pooler and encoder.get("model") ==
                      experiment.backbone_spec.model)  # fmt: skip
        else:
            scored = source_run is not None and encoder.get("run_id") == source_run
        if scored:
            found.append((path, record))
    return found


def task_differences(stored: dict[str, Any], replayed: dict[str, Any]) -> list[str]:
    """Where the replayed scores of the sampled tasks differ from the stored ones (exactly)."""
    differences = []
    for task, result in replayed.items():
        if task not in stored:
            differences.append(f"{task}: not in the stored result")
        elif stored[task] != result:
            differences.append(f"{task}: {stored[task]!r} stored, {result!r} replayed")
    return differences


def carry_evaluation_over(
    plan: Plan,
    evaluation: str,
    experiment: Experiment,
    source: Path,
    record: dict[str, Any],
    verified: dict[str, Any],
) -> None:
    """Store ``record`` (a result of ``source``) under the planned evaluation's id, pointing to
    the planned run, with the folders stored beside it and ``carried_over`` saying what was
    verified."""
    target, identity = stored_evaluation(plan, evaluation, experiment)
    old_folders = source.with_suffix("")
    if old_folders.is_dir():
        new_folders = layout.evaluation_folders(evaluation, identity)
        if new_folders.exists():
            shutil.rmtree(new_folders)
        shutil.copytree(old_folders, new_folders, copy_function=os.link)
    encoder = dict(record.get("encoder", {}))
    if isinstance(experiment, Run):
        best = str(experiment.run_dir / "best")
        encoder |= {"run_id": experiment.run_id, "location": best, "model": best}
    carried = {"from": record.get("evaluation_id"), **verified}
    write_json(
        target, {**record, "encoder": encoder, "evaluation_id": identity, "carried_over": carried}
    )
