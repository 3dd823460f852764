"""``cse carry-over [EXPERIMENT ...] [--steps N] [--dry-run]``: keep the stored runs and
evaluations of a workspace across a code change that computes the same numbers, verified.

For each planned run with nothing stored under its id, a stored run of the same settings made by
other code is looked up; the planned run's first steps (through the first dev evaluation, or
``--steps``) are trained again under the current code and every value the logs hold for those
steps must agree bit for bit, and so must the learning rate, temperature and epoch the current
code's schedules give every update the stored log records; then the stored run is copied under
the new id (weights hard-linked, the files naming the id written anew). Each planned evaluation
with nothing stored under its id is carried over from a stored result of the same run (or
baseline) for the same tasks when the current code reproduces its record on a sample of tasks
that reaches each code path and its summary from its task results, exactly. Anything that
differs is named and left for the pipeline to compute again. ``stages.core.planning.carry_over``
holds the rules; docs/identity.md explains the choice.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stages.core.errors import StageError
from stages.core.identity.experiments import Experiment, Plan, Run, plan_experiments
from stages.core.planning.carry_over import (
    as_stored,
    carried_config,
    carry_evaluation_over,
    carry_run_over,
    evaluation_candidates,
    log_differences,
    remove_dead_staging,
    replay_steps,
    run_candidates,
    schedule_differences,
    value_differences,
)
from stages.core.planning.evaluation_store import stored_evaluation
from stages.core.planning.jobs import build_jobs
from stages.core.schema.data_check import verify_workspace_data
from stages.core.schema.params import DEFAULT_PARAMS, load_params
from stages.core.storage import layout
from stages.core.storage.atomic import temporary_beside
from stages.core.storage.hashing import sha256_of
from stages.core.storage.run_folders import (
    CONFIG_FILE,
    LOG_FILE,
    METRICS_FILE,
    is_complete,
    read_config,
    read_log,
)
from stages.core.storage.run_lock import RunLocked, run_lock
from stages.evaluations import evaluation_module

# The model folders of a run, whose files naming the run are written anew for a carried copy.
MODEL_FOLDERS = ("best", "final")
# What config.json's ``carried_over`` says was compared for a run.
RUN_COMPARED = (
    "every logged value of the replayed steps, and the learning rate, temperature and epoch of "
    "every logged step, exactly"
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cse carry-over", description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", nargs="*", help="default: every planned experiment")
    parser.add_argument("--steps", type=int, help="updates to replay (default: through the "
                        "first dev evaluation)")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="list what would be verified")
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be at least 1 (got {args.steps})")
    plan = plan_experiments(load_params(args.params))
    names = args.experiment or list(plan.experiments)
    experiments = [plan.experiment(name) for name in names]
    # every module checked before any work: a missing function is named at once
    modules = {name: evaluation_module(name) for name in plan.params.planned_evaluations()}
    if not args.dry_run:
        remove_dead_staging(plan)
    carried = 0
    for experiment in experiments:
        sources: set[str] = set()
        if isinstance(experiment, Run):
            line, sources = carry_run(plan, experiment, args.steps, args.dry_run, args.params)
            carried += line.startswith("carried over")
            print(f"{experiment.name}: run {experiment.run_id}: {line}")
        for evaluation, module in modules.items():
            settings = plan.params.evaluation_settings(evaluation, experiment.method)
            if not settings.is_enabled():
                continue
            line = carry_evaluation(plan, evaluation, module, experiment, sources, args.dry_run)
            carried += line.startswith("carried over")
            print(f"{experiment.name}: {evaluation}: {line}")
    print(f"{carried} result(s) carried over" + (" (dry run: none)" if args.dry_run else ""))


def carry_run(
    plan: Plan, run: Run, steps: int | None, dry_run: bool, params_file: str
) -> tuple[str, set[str]]:
    """What became of ``run`` (a line), and the stored runs whose evaluations score it."""
    if is_complete(run.run_dir):
        return "stored", stored_sources(run)
    candidates = run_candidates(run)
    if not candidates:
        return "nothing stored with the same settings", set()
    if dry_run:
        execution = (read_config(candidates[0]) or {}).get("execution", {})
        count = replay_steps(run, execution, steps)
        return f"would replay {count} steps against {candidates[0].name}", set()
    try:
        with run_lock(run.run_dir, run.name):
            if is_complete(run.run_dir):  # carried over by another process meanwhile
                return "stored", stored_sources(run)
            return verify_and_carry(plan, run, candidates, steps, params_file)
    except RunLocked as err:
        return f"not carried over: {err}", set()


def stored_sources(run: Run) -> set[str]:
    """``run``'s id and, if it was carried over, its source's: the runs its evaluations score."""
    carried_from = (read_config(run.run_dir) or {}).get("carried_over", {}).get("from")
    return {run.run_id, *([carried_from] if carried_from else [])}


def verify_and_carry(
    plan: Plan, run: Run, candidates: list[Path], steps: int | None, params_file: str
) -> tuple[str, set[str]]:
    """Carry the first candidate the current code reproduces over (the caller holds the run's
    lock); the line saying so, or why none was."""
    why = []
    for candidate in candidates:
        config = read_config(candidate) or {}
        execution = config.get("execution", {})
        count = replay_steps(run, execution, steps)
        problem = same_triplets(plan, run, config, params_file)
        if problem is None:
            problem = replay_against(plan, run, candidate, execution, count)
        if problem is None:
            verified = {"steps_replayed": count, "compared": RUN_COMPARED}
            new_config = carried_config(config, run, candidate, verified)
            carry_run_over(run, candidate, files_naming_the_run(candidate, new_config))
            return f"carried over from {candidate.name} ({count} steps replayed)", {candidate.name}
        why.append(f"{candidate.name}: {problem}")
    return "not carried over: " + "; ".join(why), set()


def files_naming_the_run(source: Path, config: dict[str, Any]) -> dict[str, str]:
    """The files of stored run ``source`` that name its id, as the carried copy holds them
    (``config``: its config.json): config.json, metrics.json, and in each model folder
    encoder.json (which evaluations record as the run they score), run.json and the model card."""
    from stages.modeling.checkpoint import ENCODER_FILE
    from stages.modeling.model_card import render_model_card
    from stages.training.outputs import MODEL_CARD, RUN_CONFIG_IN_MODEL

    def text(data: dict[str, Any]) -> str:
        return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"

    metrics = {**json.loads((source / METRICS_FILE).read_text()), "run_id": config["run_id"]}
    files = {CONFIG_FILE: text(config), METRICS_FILE: text(metrics)}
    for folder in MODEL_FOLDERS:
        info = json.loads((source / folder / ENCODER_FILE).read_text())
        files[f"{folder}/{ENCODER_FILE}"] = json.dumps({**info, "run_id": config["run_id"]},
                                                       indent=2) + "\n"  # fmt: skip
        files[f"{folder}/{RUN_CONFIG_IN_MODEL}"] = text(config)
        if (source / folder / MODEL_CARD).is_file():
            files[f"{folder}/{MODEL_CARD}"] = render_model_card(config, metrics)
    return files


def same_triplets(plan: Plan, run: Run, config: dict[str, Any], params_file: str) -> str | None:
    """Why the masked triplets of ``run`` are not those its candidate trained on, or None."""
    if run.triplets is None:
        return None
    old = Path(config.get("triplets") or "")
    if not old.is_file():
        return f"its masked triplets {old} are gone"
    if not run.triplets.is_file():  # made by the triplets stage, as the pipeline would
        job = next(j for j in build_jobs(plan, params_file) if j.key == run.triplets_id)
        subprocess.run([sys.executable, *shlex.split(job.cmd)[1:]], check=True)
    if sha256_of(old) != sha256_of(run.triplets):
        return f"the masked triplets differ ({old} and {run.triplets})"
    return None


def replay_against(
    plan: Plan, run: Run, candidate: Path, execution: dict[str, Any], steps: int
) -> str | None:
    """Why ``run`` under the current code is not what the candidate logged, or None: its first
    ``steps`` updates trained again, then its schedules over every logged update."""
    device = str(execution.get("device", "cpu"))
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return f"trained on {device}: replay it where a GPU is"
    verify_workspace_data(run.corpus, layout.DATA / "senteval")
    # torch: only when there is work to do
    from stages.training.replay import replay_run, schedule_values

    with temporary_beside(run.run_dir) as scratch:
        replayed, now = replay_run(run, plan.params, steps, execution, scratch / "replay")
    stored = read_log(candidate / LOG_FILE)
    differences = log_differences(stored, replayed, steps)
    if differences and device == "cpu" and "threads" not in execution:
        # runs from before the thread count was recorded
        differences[-1] += (
            "; a CPU run's sums depend on its thread count, which this run did not record: "
            "replay with OMP_NUM_THREADS set to the count it trained with"
        )
    for key in ("total_steps", "steps_per_epoch"):
        if key in execution and execution[key] != now.get(key):
            differences.append(f"{key}: {execution[key]} stored, {now.get(key)} now")
    if not differences:
        schedule = schedule_values(run, plan.params, now["total_steps"], now["steps_per_epoch"])
        differences = schedule_differences(stored, schedule)
    if not differences:
        return None
    more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
    return differences[0] + more


def carry_evaluation(
    plan: Plan,
    evaluation: str,
    module: Any,
    experiment: Experiment,
    sources: set[str],
    dry_run: bool,
) -> str:
    """What became of ``evaluation`` of ``experiment`` (a line)."""
    target, _ = stored_evaluation(plan, evaluation, experiment)
    if target.is_file():
        return "stored"
    if isinstance(experiment, Run) and not is_complete(experiment.run_dir):
        return "its run is not stored"
    settings = plan.params.evaluation_settings(evaluation, experiment.method)
    found = [
        (path, record)
        for source in sources or {None}
        for path, record in evaluation_candidates(evaluation, experiment, source)
    ]
    matching = [(p, r) for p, r in found if not module.mismatches(r, settings)]
    if not matching:
        reasons = "; ".join(f"{p.stem}: {module.mismatches(r, settings)[0]}" for p, r in found)
        return "nothing stored for the same tasks" + (f" ({reasons})" if reasons else "")
    tasks = module.sample(settings)
    if dry_run:
        return f"would score {', '.join(tasks)} against {matching[0][0].stem}"
    from stages.evaluations.target import encoder_for  # torch: only when there is work to do

    encoder = encoder_for(experiment, batch_size=settings.batch_size)
    try:
        with tempfile.TemporaryDirectory() as workdir:
            scored = module.score(encoder, settings, tasks, experiment.name, Path(workdir))
        rescored = as_stored(scored)
    except StageError as err:
        return f"not carried over: its sample ({', '.join(tasks)}) could not be scored: {err}"
    why = []
    for path, record in matching:
        differences = value_differences(
            module.comparable(record, tasks), module.comparable(rescored, tasks), "rescored"
        )
        recomputed = as_stored(module.recomputed_summary(record))
        differences += value_differences(
            {key: record.get(key) for key in recomputed}, recomputed, "recomputed"
        )
        if not differences:
            verified = {
                "tasks_rescored": list(tasks),
                "compared": "the record's part for these tasks, and its summary recomputed "
                "from its task results, exactly",
            }
            carry_evaluation_over(
                plan, evaluation, experiment, path, record, rescored["encoder"], verified
            )
            return f"carried over from {path.stem} ({', '.join(tasks)} rescored)"
        more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
        why.append(f"{path.stem}: {differences[0]}{more}")
    return "not carried over: " + "; ".join(why)
