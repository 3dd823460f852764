"""What the runs store holds: which runs are complete, what they were computed with, and runs
made before code identity existed (``ID_SCHEMA`` 1), which are listed but reused only on request.

A run is complete when every file of ``RUN_FILES`` is there; the folder's name alone proves
nothing (it appears by one rename after the files are written, but a store can be damaged).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from stages.core.errors import StageError
from stages.core.identity.backbones import unpinned_message
from stages.core.identity.experiments import Experiment, Plan, Run
from stages.core.planning.evaluation_store import stored_evaluation
from stages.core.planning.train_pointer import pointed_run_id
from stages.core.schema.evaluation_settings import output_file
from stages.core.storage import layout
from stages.core.storage.atomic import rename_durably, temporary_beside, write_json
from stages.core.storage.run_folders import (
    CONFIG_FILE,
    environment_summary,
    is_complete,
    missing_files,
    origin_label,
    read_config,
)
from stages.core.storage.run_lock import is_stale, lock_holder, lock_path
from stages.core.storage.shared_store import read_origin

# Identity keys a run made before code identity lacks; without them its identity may still match.
NEW_IN_SCHEMA_2 = ("id_schema", "code", "environment")


def _without(identity: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in identity.items() if k not in NEW_IN_SCHEMA_2}


def legacy_run_for(run: Run) -> Path | None:
    """A complete run made before code identity whose other settings equal ``run``'s."""
    if not layout.RUNS.is_dir():
        return None
    wanted = _without(run.identity)
    for folder in sorted(layout.RUNS.iterdir()):
        config = read_config(folder)
        if not config or not is_complete(folder):
            continue
        identity = config.get("identity", {})
        if "code" not in identity and _without(identity) == wanted:
            return folder
    return None


def run_state(run: Run) -> str:
    if run.run_dir.is_dir():
        missing = missing_files(run.run_dir)
        if missing:
            return f"broken (missing {', '.join(missing)})"
        config = read_config(run.run_dir) or {}
        if "adopted_from" in config:
            return "yes (adopted, code unknown)"
        if "carried_over" in config:
            return f"yes (carried over from {config['carried_over']['from']})"
        return f"yes ({origin_label(read_origin(run.run_dir))})"
    lock = lock_path(run.run_dir)
    if lock.is_file() and not is_stale(lock):
        return f"training ({lock_holder(lock)})"
    if run.partial_dir.is_dir():
        return "partial (resumes)"
    legacy = legacy_run_for(run)
    if legacy is not None:
        return f"- (old run {legacy.name}, code unknown: `cse adopt {run.name}`)"
    return "-"


def recorded_output(
    plan: Plan, stage: str, experiment: Experiment, root: Path = Path(".")
) -> tuple[dict[str, Any] | None, str | None]:
    """``experiments/<experiment>/<stage>.json`` under ``root``, and what keeps it from being
    the output the plan holds now: None when it is (a run's pointer: the planned run id; an
    evaluation: the planned evaluation id), else 'missing', 'unreadable: ...' or 'stale: ...'
    (settings, data or code changed since, or it was computed with command-line overrides)."""
    path = root / output_file(stage, experiment.name)
    if not path.is_file():
        return None, "missing"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return None, f"unreadable: {error}"
    if not isinstance(data, dict):
        return None, "unreadable: not a JSON object"
    planned_run = experiment.evaluated_identity().get("run_id")
    recorded = pointed_run_id(data) if stage == "train" else data.get("encoder", {}).get("run_id")
    if planned_run is not None and recorded != planned_run:
        return data, f"stale: run {recorded}, planned {planned_run}"
    if stage != "train":
        planned = plan.evaluation_id(stage, experiment)
        if data.get("evaluation_id") != planned:
            shown = data.get("evaluation_id") or "not as planned"
            return data, f"stale: evaluation {shown}, planned {planned}"
    return data, None


def status_rows(plan: Plan) -> list[dict[str, str]]:
    """One row per planned experiment: its run id, whether its run is stored (and where it came
    from), each of its outputs, and the environment its run was computed in."""
    evaluations = plan.params.planned_evaluations()
    rows = []
    for name, experiment in plan.experiments.items():
        run = plan.runs.get(name)
        outputs = ("train", *evaluations) if run else evaluations
        done = {stage: output_state(plan, stage, experiment) for stage in outputs}
        state = run_state(run) if run else "n/a (baseline)"
        environment = (
            run_environment(read_config(run.run_dir)) if run and state.startswith("yes") else ""
        )
        rows.append(
            {"experiment": name, "run_id": run.run_id if run else "-", "run stored": state,
             "train": "n/a", **done, "environment": environment}
        )  # fmt: skip
    return rows


def run_environment(config: dict[str, Any] | None) -> str:
    """``environment_summary`` of a run's config.json, and why its forward ran as it did
    (``execution.compile_reason``: what ``compile: auto`` resolved to, a fallback to eager)."""
    summary = environment_summary(config)
    reason = (config or {}).get("execution", {}).get("compile_reason")
    return f"{summary} ({reason})" if reason else summary


def unpinned_lines(plan: Plan) -> list[str]:
    """One line per planned hub backbone on a branch or tag that backbones.lock does not pin:
    its id names no fixed weights, and loading it stops until ``cse pin`` records its commit."""
    return [
        f"warning: {unpinned_message(key, spec)}" for key, spec in plan.unpinned_backbones().items()
    ]


def output_state(plan: Plan, stage: str, experiment: Experiment) -> str:
    """'yes' when the experiment's output is the planned one; 'stored' when it is not written
    yet but the planned evaluation is stored (the orchestrator writes it without computing);
    '-' or what is wrong otherwise."""
    problem = recorded_output(plan, stage, experiment)[1]
    if problem is None:
        return "yes"
    if stage != "train" and stored_evaluation(plan, stage, experiment)[0].is_file():
        return "stored"
    return "-" if problem == "missing" else problem


def adopt_legacy_run(plan: Plan, name: str) -> str:
    """Reuse a run made before code identity for experiment ``name``: its files are linked under
    the current run id, marked 'adopted, code unknown' (status and the report say so)."""
    run = plan.run(name)
    if is_complete(run.run_dir):
        return f"{name}: run {run.run_id} is already stored"
    legacy = legacy_run_for(run)
    if legacy is None:
        raise StageError(f"{name}: no run made before code identity matches its settings")
    # staged in this process's own temporary, which no reader takes for a run and a later
    # command removes if this one is killed
    with temporary_beside(run.run_dir) as scratch:
        staging = scratch / run.run_id
        shutil.copytree(legacy, staging, copy_function=os.link)
        config = read_config(legacy) or {}
        # a hard link: rewriting it in place would edit the old run
        (staging / CONFIG_FILE).unlink()
        write_json(
            staging / CONFIG_FILE,
            {**config, **run.config(), "adopted_from": legacy.name, "code": "unknown"},
        )
        rename_durably(staging, run.run_dir)
    return f"{name}: adopted {legacy.name} as {run.run_id} (code unknown; {legacy} is kept)"
