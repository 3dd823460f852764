"""The smoke preset end to end on this machine: each job's time, the total, and what each stage
timed of its own work, for the dry run's estimates (stages/core/planning/estimates.py takes the
tiny model's CPU rates from this record; tests/test_estimates.py checks the dry run's total
against the measured one).

    python -m benchmarks.smoke_time [--cores 2] [--out benchmarks/results/smoke_time.json]

The workflow files are copied into a temporary folder (the checkout itself is never run in) and
``snakemake --cores N --resources gpu=1 --config params=presets/smoke.yaml --quiet`` runs there
on the shared data (``CSE_DATA_DIR``). Recorded:

- each job's wall time, from Snakemake's metadata (``.snakemake/metadata``: every output's job
  start and end), per rule and in all, and the run's wall time;
- what the stages timed themselves: each training run's seconds and its STS-B dev evaluations'
  (``runs/<id>/metrics.json``), SentEval's encoding and classifiers per task, MTEB's encoding;
- each train and evaluation job's start-up: its wall time less what the stage timed itself
  (process start and imports, loading model and data, writing its results);
- the load average before, after, and every ``LOAD_SAMPLE_SECONDS`` during the run: on a
  shared machine the figures are worth what the load lets them be.
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
from pathlib import Path
from typing import Any

from benchmarks import harness
from stages.core.identity.experiments import Run, plan_experiments
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--out", type=Path, default=harness.RESULTS / "smoke_time.json")
    args = parser.parse_args()
    invocation = harness.begin(__file__)
    command = ["snakemake", "--cores", str(args.cores), "--resources", "gpu=1",
               "--config", f"params={PRESET}", "--quiet"]  # fmt: skip
    # on the CPU even where a GPU is visible: the record is the CPU's rates for the tiny model
    env = {**os.environ, "CSE_DATA_DIR": str(harness.data_dir()), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    env.pop("CSE_RUNS_DIR", None)  # its runs in the copy's runs/, none taken from a store
    with tempfile.TemporaryDirectory(prefix="smoke_time_") as tmp:
        root = Path(tmp)
        copy_workflow(root)
        samples: list[list[float]] = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample_load, args=(samples, stop), daemon=True)
        sampler.start()
        with harness.stopwatch() as wall:
            done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
        stop.set()
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-4000:]}{done.stderr}")
        plan = plan_experiments(load_params(root / PRESET))
        jobs = job_times(read_metadata(root))
        start = min(job["start"] for job in jobs)
        estimated: list[dict[str, Any]] = []
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
                estimated.append(job)
        result = {
            "preset": PRESET,
            "command": " ".join(command),
            "cores": args.cores,
            "model": tiny_model(plan.params),
            "wall_s": wall.seconds,
            "jobs_s": sum(job["seconds"] for job in jobs),
            # the jobs the dry run estimates (train and evaluations): its total's counterpart
            "estimated_jobs_s": sum(job["seconds"] for job in estimated),
            "load_average_during": samples,
            "rules": per_rule(jobs),
            "jobs": jobs,
        }  # fmt: skip
    harness.write_result(args.out, result, invocation)
    print(f"{len(jobs)} jobs in {wall.seconds:.0f} s; the estimated ones (train, evaluations) "
          f"{result['estimated_jobs_s']:.0f} s summed")  # fmt: skip


if __name__ == "__main__":
    main()
