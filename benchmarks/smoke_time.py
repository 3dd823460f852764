"""The smoke preset end to end on this machine: each job's time, the total, and what each stage
timed of its own work, for the dry run's estimates (benchmarks/rates.py takes the tiny model's
CPU rates from this record; tests/test_estimates.py checks the dry run's estimate of each job
against the time measured), and the README's figure for the smoke run.

    python -m benchmarks.smoke_time [--cores 2] [--schedules NAME ...] [--out FILE]

The workflow files are copied into a fresh temporary folder per schedule (the checkout itself is
never run in) and ``snakemake --cores N --resources gpu=1 --config params=presets/smoke.yaml
--quiet`` runs there on the shared data (``CSE_DATA_DIR``), on the CPU. The schedules, one after
the other in one invocation:

- ``one_per_core``: the command as a user runs it: each train and evaluation job on the CPU
  takes one core, so N run at once (workflow/rules/rule_jobs.py, ``CPU_JOB_THREADS``);
- ``one_at_a_time``: the same with ``--set-threads train=N evaluate=N``: one such job at a time
  on every core, the schedule before CPU jobs took one core each;
- ``one_per_core_busy``: ``one_per_core`` beside one process spinning a core in pure Python
  (benchmarks/contention.py's), another user's job on a shared machine.

Recorded, for ``one_per_core`` (the first schedule run):

- each job's wall time, from Snakemake's metadata (``.snakemake/metadata``: every output's job
  start and end), per rule and in all, and the run's wall time;
- what the stages timed themselves: each training run's seconds and its STS-B dev evaluations'
  (``runs/<id>/metrics.json``), SentEval's encoding and classifiers per task, MTEB's encoding;
- each train and evaluation job's start-up: its wall time less what the stage timed itself
  (process start and imports, loading model and data, writing its results);

and for every schedule its wall time, its jobs' summed time and the load average every
``LOAD_SAMPLE_SECONDS``: on a shared machine the figures are worth what the load lets them be.
The ratios compare each schedule's wall time with ``one_per_core``'s.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import harness
from stages.core.identity.experiments import Run, plan_experiments
from stages.core.planning.estimates import architecture
from stages.core.schema.params import Params, load_params

PRESET = "presets/smoke.yaml"
WORKFLOW_FILES = ("Snakefile", "params.yaml", "dvc.yaml", ".dvcignore", ".gitignore")
WORKFLOW_DIRS = ("workflow", "stages", ".dvc", "presets")
LOAD_SAMPLE_SECONDS = 10.0
# the rules whose jobs the dry run estimates; their outputs are experiments/<name>/<stage>.json
ESTIMATED_RULES = ("train", "evaluate")


def copy_workflow(root: Path) -> None:
    """The files a Snakemake run of the project needs, without caches."""
    for name in WORKFLOW_FILES:
        shutil.copy(harness.REPO / name, root / name)
    for name in WORKFLOW_DIRS:
        shutil.copytree(
            harness.REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__")
        )


def job_times(metadata: Iterable[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One entry per job from Snakemake's metadata records (output path, record): a job's
    outputs share its ``job_hash``; its start is the earliest start among them, its end the
    latest end. Sorted by start."""
    jobs: dict[tuple[str, int], dict[str, Any]] = {}
    for output, record in metadata:
        job = jobs.setdefault(
            (record["rule"], record["job_hash"]),
            {"rule": record["rule"], "outputs": [], "start": record["starttime"],
             "end": record["endtime"]},
        )  # fmt: skip
        job["outputs"].append(output)
        job["start"] = min(job["start"], record["starttime"])
        job["end"] = max(job["end"], record["endtime"])
    return sorted(
        (
            {**job, "outputs": sorted(job["outputs"]), "seconds": job["end"] - job["start"]}
            for job in jobs.values()
        ),
        key=lambda job: job["start"],
    )


def read_metadata(root: Path) -> list[tuple[str, dict[str, Any]]]:
    """Snakemake's metadata records: one file per output, named by its path in base64."""
    folder = root / ".snakemake" / "metadata"
    return [
        (base64.urlsafe_b64decode(path.name).decode(), json.loads(path.read_text()))
        for path in sorted(folder.iterdir())
    ]


def experiment_output(job: dict[str, Any]) -> tuple[str, str] | None:
    """(experiment, stage) of a train or evaluation job, from its output
    ``experiments/<experiment>/<stage>.json``; None for the other jobs."""
    for output in job["outputs"]:
        parts = Path(output).parts
        if len(parts) == 3 and parts[0] == "experiments" and parts[2].endswith(".json"):
            return parts[1], Path(parts[2]).stem
    return None


def self_timed(root: Path, experiment: str, stage: str, runs: dict[str, Run]) -> dict[str, Any]:
    """What a train or evaluation stage timed of its own work, from what it wrote."""
    if stage == "train":
        run = runs[experiment]
        metrics = json.loads((root / run.run_dir / "metrics.json").read_text())
        log = [
            json.loads(line) for line in (root / run.run_dir / "log.jsonl").read_text().splitlines()
        ]
        settings = run.settings
        return {
            "seconds": metrics["timing"]["wall_s"],
            "steps": metrics["steps"],
            "eval_s": [event["eval_s"] for event in log if event["event"] == "eval"],
            # a step of these costs more than a plain one: the estimates take the plain ones'
            "sam": settings.train.sam.enabled,
            "triplets": settings.objective.needs_triplets,
        }
    result = json.loads((root / "experiments" / experiment / f"{stage}.json").read_text())
    if stage == "senteval":
        timings = result["timings"]
        scored = sum(task.get("score_s", 0.0) for task in timings["tasks"].values())
        return {
            "seconds": timings["encode_s"] + timings["classifier_s"] + scored,
            "tasks": timings["tasks"],
        }
    if stage == "mteb":
        return {
            "seconds": result["timing"]["wall_s"],
            "texts_encoded": result["timing"]["texts_encoded"],
            "encode_s": result["timing"]["encode_s"],
        }
    raise ValueError(f"no self-timing known for stage {stage}")


def tiny_model(params: Params) -> dict[str, Any]:
    """The preset's tiny model (its randomly initialised backbone; its baseline's is a real one)
    and how it trains: what the estimates need to take this record's rates for it."""
    for name, backbone in params.backbones.items():
        if backbone.random_init is not None:
            shape = backbone.random_init
            return {
                "backbone": name,
                "layers": shape.num_hidden_layers,
                "hidden": shape.hidden_size,
                "intermediate": shape.intermediate_size,
                "batch_size": params.train.batch_size,
                "max_seq_length": params.train.max_seq_length,
                "device": "cpu",  # CUDA_VISIBLE_DEVICES is empty for the run
                "precision": "fp32",  # train.precision auto on the CPU
                "senteval_mode": params.evaluations.senteval.mode,
            }
    raise SystemExit(f"{PRESET}: no randomly initialised backbone (the tiny model)")


def other_backbones(params: Params, tiny: str) -> dict[str, dict[str, int]]:
    """The layer shapes of the preset's other backbones (the baseline's pretrained MiniLM):
    its jobs' rates are those of a real encoder, one job per core as users run them."""
    return {
        name: asdict(architecture(spec)) for name, spec in params.backbones.items() if name != tiny
    }


def per_rule(jobs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    rules: dict[str, list[float]] = {}
    for job in jobs:
        rules.setdefault(job["rule"], []).append(job["seconds"])
    return {
        rule: {"jobs": len(times), "seconds": sum(times), "median_s": statistics.median(times)}
        for rule, times in rules.items()
    }


def sample_load(samples: list[list[float]], stop: threading.Event) -> None:
    while not stop.wait(LOAD_SAMPLE_SECONDS):
        samples.append(harness.load_average())


SCHEDULES = ("one_per_core", "one_at_a_time", "one_per_core_busy")


def schedule_command(schedule: str, cores: int) -> list[str]:
    command = ["snakemake", "--cores", str(cores), "--resources", "gpu=1",
               "--config", f"params={PRESET}", "--quiet"]  # fmt: skip
    if schedule == "one_at_a_time":
        command += ["--set-threads", f"train={cores}", f"evaluate={cores}"]
    return command


def run_schedule(schedule: str, cores: int, root: Path) -> dict[str, Any]:
    """One timed Snakemake run of the smoke preset in ``root`` (a fresh folder)."""
    command = schedule_command(schedule, cores)
    # on the CPU even where a GPU is visible: the record is the CPU's rates for the tiny model
    env = {**os.environ, "CSE_DATA_DIR": str(harness.data_dir()), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    # its runs in the copy's runs/, none taken from a store; each job's threads the workflow's
    for variable in ("CSE_RUNS_DIR", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(variable, None)
    copy_workflow(root)
    samples: list[list[float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_load, args=(samples, stop), daemon=True)
    sampler.start()
    load_start = harness.load_average()
    busy = 1 if schedule.endswith("_busy") else 0
    with harness.busy_processes(busy), harness.stopwatch() as wall:
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    stop.set()
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-4000:]}{done.stderr}")
    jobs = job_times(read_metadata(root))
    print(f"{schedule}: {len(jobs)} jobs in {wall.seconds:.0f} s (load {load_start[0]:.2f} at "
          "start)", flush=True)  # fmt: skip
    return {"command": " ".join(command), "busy_processes": busy, "wall_s": wall.seconds,
            "jobs_s": sum(job["seconds"] for job in jobs), "load_average_start": load_start,
            "load_average_during": samples, "jobs": jobs}  # fmt: skip


def job_record(root: Path, jobs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float]:
    """The jobs with their start offsets and, for train and evaluation jobs, what the stage timed
    itself and the start-up; and those jobs' summed time (what the dry run estimates)."""
    plan = plan_experiments(load_params(root / PRESET))
    start = min(job["start"] for job in jobs)
    estimated = 0.0
    for job in jobs:
        job["start_offset_s"] = job.pop("start") - start
        del job["end"]
        found = experiment_output(job)
        if job["rule"] in ESTIMATED_RULES and found is not None:
            experiment, stage = found
            timed = self_timed(root, experiment, stage, plan.runs)
            job.update(
                experiment=experiment,
                stage=stage,
                backbone=plan.experiment(experiment).backbone,
                self_timed=timed,
                start_up_s=job["seconds"] - timed["seconds"],
            )
            estimated += job["seconds"]
    return jobs, estimated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES),
                        help="the first one's jobs are recorded in detail")  # fmt: skip
    parser.add_argument("--out", type=Path, default=harness.RESULTS / "smoke_time.json")
    args = parser.parse_args()
    invocation = harness.begin(__file__)
    schedules: dict[str, dict[str, Any]] = {}
    for schedule in args.schedules:
        with tempfile.TemporaryDirectory(prefix=f"smoke_time_{schedule}_") as tmp:
            root = Path(tmp)
            schedules[schedule] = run_schedule(schedule, args.cores, root)
            if schedule == args.schedules[0]:
                detailed = schedules[schedule]
                jobs, estimated = job_record(root, detailed.pop("jobs"))
                params = load_params(root / PRESET)
                model = tiny_model(params)
                others = other_backbones(params, model["backbone"])
            else:
                del schedules[schedule]["jobs"]
    first = args.schedules[0]
    result = {
        "preset": PRESET,
        "schedule": first,
        "command": detailed["command"],
        "cores": args.cores,
        "model": model,
        "other_backbones": others,
        "wall_s": detailed["wall_s"],
        "jobs_s": detailed["jobs_s"],
        # the jobs the dry run estimates (train and evaluations): its total's counterpart
        "estimated_jobs_s": estimated,
        "load_average_during": detailed["load_average_during"],
        "rules": per_rule(jobs),
        "jobs": jobs,
        "schedules": schedules,
        "wall_over_first": {
            name: run["wall_s"] / detailed["wall_s"] for name, run in schedules.items()
        },
    }
    harness.write_result(args.out, result, invocation)
    print(", ".join(f"{name} {ratio:.2f}x" for name, ratio in result["wall_over_first"].items())
          + f" the wall time of {first}")  # fmt: skip


if __name__ == "__main__":
    main()
