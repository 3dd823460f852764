"""The executor mechanics on a real SLURM, with a toy workflow of the pipeline's shape.

The SLURM profile of workflow/profiles/slurm runs unchanged (plus the settings a cluster
without accounting needs); each test compares what SLURM produced with a local run.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from slurm_harness import (
    FIXTURE,
    Background,
    run_snakemake,
    squeue_jobs,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

SNAKEFILE = FIXTURE / "Snakefile"


def results(root: Path) -> dict[str, str]:
    """Every result file of a run of the toy workflow, by relative path."""
    files = [root / "results.tsv", *sorted((root / "experiments").rglob("*.json"))]
    return {str(f.relative_to(root)): f.read_text() for f in files}


def attempts(root: Path, run: str, event: str = "start") -> list[dict[str, Any]]:
    lines = (root / "logs" / f"{run}.starts").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def local_run(root: Path, *config: str) -> Path:
    done = run_snakemake(
        root, SNAKEFILE, "--cores", "2", "--resources", "gpu=2", "--config", *config, slurm=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def checkpoint_step(root: Path, run: str) -> int:
    try:
        return json.loads((root / "runs" / f"{run}.partial" / "checkpoint.json").read_text())[
            "step"
        ]
    except FileNotFoundError:
        return 0


def slurm_job_of(rule: str, run: str | None = None) -> str | None:
    """The SLURM id of a running job of ``rule`` (the executor puts rule and wildcards in the
    job's comment)."""
    comment = f"rule_{rule}" + (f"_wildcards_{run}" if run else "")
    running = [job for job, c, state in squeue_jobs("%i", "%k", "%T") if c == comment]
    return running[0] if running else None


def scontrol(job: str) -> str:
    return subprocess.run(
        ["scontrol", "show", "job", job], capture_output=True, text=True, check=True
    ).stdout


def test_toy_workflow_on_slurm_gives_the_local_results(tmp_path: Path) -> None:
    config = ("runs=a,b,c", "steps=10", "step_seconds=0.05")
    local = local_run(tmp_path / "local", *config)
    root = tmp_path / "slurm"
    done = run_snakemake(root, SNAKEFILE, "--config", *config, slurm=True)
    assert done.returncode == 0, done.stdout + done.stderr

    assert results(root) == results(local)
    starts = {run: attempts(root, run) for run in "abc"}
    assert all(len(s) == 1 for s in starts.values())
    jobs = {s[0]["job"] for s in starts.values()}
    assert None not in jobs and len(jobs) == 3  # three SLURM jobs
    # Each saw the GPU SLURM gave it (the node has two), and the profile's requests held.
    assert {s[0]["gpu"] for s in starts.values()} <= {"0", "1"}
    shown = scontrol(starts["a"][0]["job"])
    for request in ("TresPerJob=gres:gpu:1", "CPUs/Task=8", "MinMemoryNode=32000M"):
        assert request in shown


def test_a_cancelled_training_job_is_retried_and_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    config = ("runs=a,b", "steps=60", "step_seconds=0.25")
    root = tmp_path / "slurm"
    snakemake = Background(root, SNAKEFILE, "--config", *config, slurm=True)
    try:
        wait_until(lambda: checkpoint_step(root, "a") >= 10, 180, "run a to reach step 10")
        job = wait_until(lambda: slurm_job_of("train", "a"), 10, "the SLURM job of run a")
        subprocess.run(["scancel", job], check=True)  # as a node failure would
        assert snakemake.wait(300) == 0, snakemake.output()
    finally:
        snakemake.stop()

    assert f"SLURM-job '{job}' failed, SLURM status is: 'CANCELLED'" in snakemake.output()
    first, second = attempts(root, "a")
    assert first["job"] == job and second["job"] != job
    assert first["step"] == 0 and second["step"] >= 10  # resumed, not restarted
    assert len(attempts(root, "b")) == 1  # the rest of the DAG went on
    assert not (root / "runs" / "a.partial").exists()
    assert results(root) == results(local_run(tmp_path / "local", *config))


def test_a_killed_job_leaves_nothing_that_looks_finished(tmp_path: Path) -> None:
    """``export`` writes its output naively; killed halfway, the half file must go."""
    root = tmp_path / "slurm"
    config = ("runs=a", "steps=1", "step_seconds=0")
    output = root / "results.tsv"
    snakemake = Background(
        root, SNAKEFILE, "--retries", "0", "--config", *config, "export_pause=120", slurm=True
    )
    try:
        wait_until(output.is_file, 180, "export to start writing")
        assert output.read_text() == "run\tscore\n"  # half-written
        job = wait_until(lambda: slurm_job_of("export"), 10, "the SLURM job of export")
        subprocess.run(["scancel", job], check=True)
        assert snakemake.wait(120) != 0
    finally:
        snakemake.stop()

    assert not output.exists()  # Snakemake removed the failed job's output
    done = run_snakemake(root, SNAKEFILE, "--config", *config, "export_pause=0", slurm=True)
    assert done.returncode == 0, done.stdout + done.stderr
    local = local_run(tmp_path / "local", *config, "export_pause=0")
    assert results(root) == results(local)


def test_a_job_over_its_time_limit_is_retried_with_more_time_and_resumes(
    tmp_path: Path,
) -> None:
    """The toy's train asks for `train_minutes` x attempt minutes, as the pipeline's rules do.

    Two minutes of training under a one-minute limit: SLURM kills the first attempt (TIMEOUT),
    the second gets two minutes and finishes from where the first stopped."""
    config = ("runs=a", "steps=600", "step_seconds=0.2", "train_minutes=1")
    root = tmp_path / "slurm"
    target = "experiments/a/train.json"
    done = run_snakemake(root, SNAKEFILE, target, "--config", *config, slurm=True, timeout=420)
    assert done.returncode == 0, done.stdout + done.stderr

    assert "SLURM status is: 'TIMEOUT'" in done.stdout + done.stderr
    first, second = attempts(root, "a")
    assert first["step"] == 0 and second["step"] > 0
    assert "TimeLimit=00:02:00" in scontrol(second["job"])
    local = tmp_path / "local"
    done = run_snakemake(local, SNAKEFILE, target, "--cores", "1", "--config", "runs=a",
                         "steps=600", "step_seconds=0", slurm=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (root / target).read_text() == (local / target).read_text()
