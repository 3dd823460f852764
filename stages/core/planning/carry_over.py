"""Verified carry-over: stored results kept across code changes that compute the same numbers.

An id covers the code that computes its output (``stages.core.identity.code``), so any edit of
that code, a refactor or a moved module included, gives new ids and the cache no longer finds the
results of the old ones. ``cse carry-over`` (``stages/commands/carry_over.py``) looks, for each
planned run with nothing stored under its id, for a stored run whose identity is the same in
everything but the code (``run_candidates``), and verifies it under the current code in two ways:
the planned run's first steps trained again, every value the two logs hold for those steps
compared bit for bit (``log_differences``), and the schedules' values (learning rate,
temperature, epoch) at every logged step of the whole run recomputed and compared
(``schedule_differences``). Only when all agree is the stored run copied under the new id
(``carry_run_over``): its weights hard-linked, the files that name its id written anew.
Evaluations are carried over likewise: a stored result of the carried run (or of the same
baseline) for the same tasks, whose record the current code reproduces exactly on a sample of
its tasks and whose summary it recomputes exactly from its task results (``value_differences``).

What is not verified: a change acting after the replayed steps on anything but the schedules
(a late epoch boundary, the final export) and tasks outside the sample; hence a command a user
runs, not something the stages do by themselves (docs/identity.md).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from stages.core.identity.experiments import Baseline, Experiment, Plan, Run
from stages.core.planning.evaluation_store import stored_evaluation
from stages.core.storage import layout
from stages.core.storage.atomic import (
    atomic_path,
    remove_stale_temporaries,
    rename_durably,
    temporary_beside,
    write_json,
    write_text,
)
from stages.core.storage.run_folders import CONFIG_FILE, is_stored_run, read_config

# Identity keys that may differ between a run and its carried-over predecessor: the code (what
# the replay checks) and the masked triplets' id (whose files are compared byte for byte).
CARRIED_KEYS = ("code", "triplets")
# Log values that are timings, not results.
TIMING_KEYS = frozenset({"eval_s"})
# What an evaluation record's `encoder` says about which encoder it scored, not how: they name
# the run (its id, its folder) and so differ between a stored run and its carried copy.
ENCODER_IDENTITY_KEYS = ("model", "location", "run_id", "fingerprint", "mteb_revision")


def only(mapping: Mapping[str, Any], keys: Collection[str]) -> dict[str, Any]:
    """The entries of ``mapping`` under ``keys`` (a record's part for some tasks)."""
    return {k: v for k, v in mapping.items() if k in keys}


def without(mapping: Mapping[str, Any], keys: Collection[str]) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k not in keys}


def _comparable(identity: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in identity.items() if k not in CARRIED_KEYS}


def run_candidates(run: Run) -> list[Path]:
    """Stored runs whose identity is ``run``'s in everything but the code (and the triplets'
    id), newest first; never ``run``'s own folder, nor a folder named other than the run its
    config.json records (a copy being staged)."""
    if not layout.RUNS.is_dir():
        return []
    wanted = _comparable(run.identity)
    found = []
    for folder in layout.RUNS.iterdir():
        if folder.name == run.run_id or not is_stored_run(folder):
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


def schedule_differences(
    stored: list[dict[str, Any]], schedule: Mapping[int, Mapping[str, Any]]
) -> list[str]:
    """Where a value the stored log records at an update differs from ``schedule`` (update ->
    the values the current code's schedules give it: learning rate, temperature, epoch), over
    the whole log, exactly. An update ``schedule`` lacks is past the run's end under the
    current code."""
    differences = []
    for record in stored:
        if record.get("event") != "train":
            continue
        step = record["step"]
        if step not in schedule:
            differences.append(f"train step {step}: past the run's last update now")
            continue
        for key, now in schedule[step].items():
            if key not in record:
                differences.append(f"train step {step}: '{key}' is not in the stored log")
            elif not _same(record[key], now):
                differences.append(
                    f"train step {step}: {key} {record[key]!r} stored, {now!r} by the current "
                    "code's schedule"
                )
    return differences


def value_differences(stored: Any, now: Any, how: str, where: str = "") -> list[str]:
    """Where ``now`` (a record part, ``how`` it was obtained: 'rescored', 'recomputed')
    differs from ``stored``, key by key down nested mappings and lists, each value exactly
    (its type too: compare JSON with JSON, ``as_stored``); each difference named by its key
    path."""
    if isinstance(stored, Mapping) and isinstance(now, Mapping):
        differences = []
        for key in sorted(set(stored) | set(now), key=str):
            path = f"{where}.{key}" if where else str(key)
            if key not in stored or key not in now:
                side = "stored" if key in stored else how
                differences.append(f"{path}: only in the {side} record")
            else:
                differences += value_differences(stored[key], now[key], how, path)
        return differences
    if isinstance(stored, list | tuple) and isinstance(now, list | tuple):
        if len(stored) != len(now):
            return [f"{where}: {len(stored)} items stored, {len(now)} {how}"]
        return [
            difference
            for index, (a, b) in enumerate(zip(stored, now, strict=True))
            for difference in value_differences(a, b, how, f"{where}[{index}]")
        ]
    return [] if _same(stored, now) else [f"{where}: {stored!r} stored, {now!r} {how}"]


def as_stored(record: Any) -> Any:
    """``record`` as a results JSON stores it and reading it back gives it (``write_json``'s
    encoding: numpy scalars as it writes them, tuples as lists), to compare with a stored one."""
    return json.loads(json.dumps(record, default=str))


def remove_dead_staging(plan: Plan) -> None:
    """Remove what killed carry-overs (and replays) of this host left beside the planned runs
    (``temporary_beside``'s folders, whose writer is gone)."""
    if layout.RUNS.is_dir():
        for run in plan.runs.values():
            remove_stale_temporaries(run.run_dir)


def carry_run_over(run: Run, source: Path, rewritten: Mapping[str, str]) -> None:
    """Copy ``source`` under ``run``'s id: the files named in ``rewritten`` (paths relative to
    the run folder) written with the text given, every other file hard-linked (nothing of
    ``source`` is changed or removed). Staged in this process's temporary beside the run's
    folder, which a killed carry-over leaves hidden and incomplete (no run to any reader) and
    the next one removes; the run appears by one rename, complete."""
    with temporary_beside(run.run_dir) as staging:
        copy = staging / run.run_id

        def link_unless_rewritten(src: str, dst: str) -> None:
            if Path(dst).relative_to(copy).as_posix() not in rewritten:
                os.link(src, dst)

        shutil.copytree(source, copy, copy_function=link_unless_rewritten)
        for name, text in rewritten.items():
            write_text(copy / name, text)
        rename_durably(copy, run.run_dir)


def carried_config(
    source_config: dict[str, Any], run: Run, source: Path, verified: dict[str, Any]
) -> dict[str, Any]:
    """config.json of ``run`` carried over from ``source``: the new identity and id, and
    ``carried_over`` saying where from and what was verified."""
    return {**source_config, **run.config(), "carried_over": {"from": source.name, **verified}}


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


def carry_evaluation_over(
    plan: Plan,
    evaluation: str,
    experiment: Experiment,
    source: Path,
    record: dict[str, Any],
    encoder: dict[str, Any],
    verified: dict[str, Any],
) -> None:
    """Store ``record`` (a result of ``source``) under the planned evaluation's id, its encoder
    named as ``encoder`` (the encoder the current code scored: its run id, folder and
    fingerprint), with the folders stored beside it and ``carried_over`` saying what was
    verified. The record is written last: it is reused only once its folders are there."""
    target, identity = stored_evaluation(plan, evaluation, experiment)
    old_folders = source.with_suffix("")
    if old_folders.is_dir():
        new_folders = layout.evaluation_folders(evaluation, identity)
        with atomic_path(new_folders) as tmp:
            shutil.copytree(old_folders, tmp, copy_function=os.link)
    named = {k: encoder[k] for k in ENCODER_IDENTITY_KEYS if k in encoder}
    carried = {"from": record.get("evaluation_id"), **verified}
    write_json(
        target,
        {
            **record,
            "encoder": {**record.get("encoder", {}), **named},
            "evaluation_id": identity,
            "carried_over": carried,
        },
    )
