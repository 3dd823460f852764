"""``cse carry-over [EXPERIMENT ...] [--steps N] [--dry-run]``: keep the stored runs and
evaluations of a workspace across a code change that computes the same numbers, verified.

For each planned run with nothing stored under its id, a stored run of the same settings made by
other code is looked up; the planned run's first steps (through the first dev evaluation, or
``--steps``) are trained again under the current code and every value the logs hold for those
steps must agree bit for bit; then the stored files are linked under the new id. Each planned
evaluation with nothing stored under its id is carried over from a stored result of the same
run (or baseline) for the same tasks when the current code reproduces its scores on a sample of
them exactly. Anything that differs is named and left for the pipeline to compute again.
``stages.core.planning.carry_over`` holds the rules; docs/identity.md explains the choice.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stages.core.identity.experiments import Experiment, Plan, Run, plan_experiments
from stages.core.planning.carry_over import (
    carry_evaluation_over,
    carry_run_over,
    evaluation_candidates,
    log_differences,
    replay_steps,
    run_candidates,
    task_differences,
)
from stages.core.planning.evaluation_store import stored_evaluation
from stages.core.planning.jobs import build_jobs
from stages.core.schema.data_check import verify_workspace_data
from stages.core.schema.evaluation_settings import EVALUATIONS
from stages.core.schema.params import DEFAULT_PARAMS, load_params
from stages.core.storage import layout
from stages.core.storage.hashing import sha256_of
from stages.core.storage.run_folders import LOG_FILE, is_complete, read_config, read_log
from stages.core.storage.run_lock import run_lock


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
    carried = 0
    for experiment in experiments:
        sources: set[str] = set()
        if isinstance(experiment, Run):
            line, sources = carry_run(plan, experiment, args.steps, args.dry_run, args.params)
            carried += line.startswith("carried over")
            print(f"{experiment.name}: run {experiment.run_id}: {line}")
        for evaluation in plan.params.planned_evaluations():
            settings = plan.params.evaluation_settings(evaluation, experiment.method)
            if not settings.is_enabled():
                continue
            line = carry_evaluation(plan, evaluation, experiment, sources, args.dry_run)
            carried += line.startswith("carried over")
            print(f"{experiment.name}: {evaluation}: {line}")
    print(f"{carried} result(s) carried over" + (" (dry run: none)" if args.dry_run else ""))


def carry_run(
    plan: Plan, run: Run, steps: int | None, dry_run: bool, params_file: str
) -> tuple[str, set[str]]:
    """What became of ``run`` (a line), and the stored runs whose evaluations score it."""
    if is_complete(run.run_dir):
        carried_from = (read_config(run.run_dir) or {}).get("carried_over", {}).get("from")
        return "stored", {run.run_id, *([carried_from] if carried_from else [])}
    candidates = run_candidates(run)
    if not candidates:
        return "nothing stored with the same settings", set()
    why = []
    for candidate in candidates:
        config = read_config(candidate) or {}
        execution = config.get("execution", {})
        count = replay_steps(run, execution, steps)
        if dry_run:
            return f"would replay {count} steps against {candidate.name}", set()
        problem = same_triplets(plan, run, config, params_file)
        if problem is None:
            problem = replay_against(plan, run, candidate, execution, count)
        if problem is None:
            verified = {"steps_replayed": count, "compared": "every logged value, exactly"}
            carry_run_over(run, candidate, verified)
            return f"carried over from {candidate.name} ({count} steps replayed)", {candidate.name}
        why.append(f"{candidate.name}: {problem}")
    return "not carried over: " + "; ".join(why), set()


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
    """Why the first ``steps`` updates of ``run`` under the current code are not those the
    candidate logged, or None."""
    device = str(execution.get("device", "cpu"))
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return f"trained on {device}: replay it where a GPU is"
    verify_workspace_data(run.corpus, layout.DATA / "senteval")
    from stages.training.replay import replay_run  # torch: only when there is work to do

    with run_lock(run.run_dir, run.name):
        scratch = run.run_dir.with_name(run.run_id + ".replay")
        replayed = replay_run(run, plan.params, steps, execution, scratch)
    differences = log_differences(read_log(candidate / LOG_FILE), replayed, steps)
    if not differences:
        return None
    more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
    if device == "cpu" and "threads" not in execution:  # runs before the count was recorded
        more += (
            "; a CPU run's sums depend on its thread count, which this run did not record: "
            "replay with OMP_NUM_THREADS set to the count it trained with"
        )
    return differences[0] + more


def carry_evaluation(
    plan: Plan, evaluation: str, experiment: Experiment, sources: set[str], dry_run: bool
) -> str:
    """What became of ``evaluation`` of ``experiment`` (a line)."""
    target, _ = stored_evaluation(plan, evaluation, experiment)
    if target.is_file():
        return "stored"
    if isinstance(experiment, Run) and not is_complete(experiment.run_dir):
        return "its run is not stored"
    module = importlib.import_module(EVALUATIONS[evaluation].module)
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
    sample = module.sample(settings)
    if dry_run:
        return f"would score {', '.join(sample.task_names())} against {matching[0][0].stem}"
    from stages.evaluations.target import encoder_for  # torch: only when there is work to do

    encoder = encoder_for(experiment, batch_size=settings.batch_size)
    why = []
    with tempfile.TemporaryDirectory() as workdir:
        replayed = module.task_results(
            module.score(encoder, sample, experiment.name, Path(workdir))
        )
    for path, record in matching:
        differences = task_differences(module.task_results(record), replayed)
        if not differences:
            verified = {"tasks_rescored": sorted(replayed), "compared": "their scores, exactly"}
            carry_evaluation_over(plan, evaluation, experiment, path, record, verified)
            return f"carried over from {path.stem} ({', '.join(sorted(replayed))} rescored)"
        why.append(f"{path.stem}: {differences[0]}")
    return "not carried over: " + "; ".join(why)
