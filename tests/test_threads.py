"""Jobs respect their share of the cores: each rule declares its threads, Snakemake hands them to
the job (OMP_NUM_THREADS and the BLAS variables), and the stage runs torch, polars and the
tokenizers on that many threads; a run records the count it trained with."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def gpu_visible(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``nvidia-smi -L`` lists one GPU (the machine has none)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return {**env, "PATH": f"{tmp_path}{os.pathsep}{env['PATH']}"}


def planned_jobs(*args: str, env: dict[str, str] | None = None) -> dict[str, tuple[str, str]]:
    """Snakemake's dry run of the committed pipeline: each rule's (threads, gpu) (threads 1 when
    not shown; gpu as its resources line gives it, "-" when the rule asks for none)."""
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--forceall", *args],
        cwd=REPO, capture_output=True, text=True, check=True, env=env,
    ).stdout  # fmt: skip
    jobs = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", out):
        head = re.match(r"(?:local)?rule (\w+):", block)
        if head:
            threads = re.search(r"threads: (\d+)", block)
            gpu = re.search(r"\bgpu=(\d+)", block)
            jobs[head[1]] = (threads[1] if threads else "1", gpu[1] if gpu else "-")
    return jobs


@pytest.mark.parametrize(
    ("cores", "gpus", "gpu_job"),
    [(4, "gpu=1", "4"), (8, "gpu=2", "4"), (1, "gpu=1", "1"), (8, "gpu_share=4", "2")],
)
def test_each_rule_declares_its_share_of_the_cores(
    cores: int, gpus: str, gpu_job: str, gpu_visible: dict[str, str]
) -> None:
    """A GPU job gets cores / (GPU jobs at once) threads (``gpu=N``: one per GPU;
    ``gpu_share=N``: N sharing the GPUs), the CPU-heavy triplets and figures every core, the rest
    one: Snakemake then never runs more threads than --cores at once."""
    jobs = planned_jobs("--cores", str(cores), "--resources", gpus, env=gpu_visible)
    assert jobs["train"] == jobs["evaluate"] == (gpu_job, "1")
    assert jobs["triplets"][0] == jobs["figures"][0] == str(cores)
    assert jobs["report"][0] == jobs["download_corpus"][0] == "1"


def test_without_a_gpu_the_cpu_runs_one_job_per_core() -> None:
    """No GPU visible: train and evaluate jobs on ``train.device: auto`` run on the CPU, hold no
    ``gpu`` and take one core each, so ``--cores 4 --resources gpu=1`` runs four at once."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # what a GPU machine hiding its GPUs looks like, too
    jobs = planned_jobs("--cores", "4", "--resources", "gpu=1", env=env)
    assert jobs["train"] == jobs["evaluate"] == ("1", "0")
    assert jobs["triplets"][0] == jobs["figures"][0] == "4"


def test_a_stage_takes_its_threads_from_the_jobs_variables() -> None:
    script = (
        "import os, stages, torch; "
        "print(torch.get_num_threads(), os.environ['POLARS_MAX_THREADS'], "
        "os.environ['RAYON_NUM_THREADS'])"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("POLARS_MAX_THREADS",)}
    env |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAYON_NUM_THREADS": "2"}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    assert out.split() == ["1", "1", "2"]  # a variable set by the user wins


@pytest.mark.parametrize(("user", "seen"), [(None, "10000"), ("300000", "300000")])
def test_the_openmp_threads_spin_briefly_unless_the_user_says_otherwise(
    user: str | None, seen: str
) -> None:
    """Set before torch loads libgomp: a job's threads sleep soon at a barrier instead of
    spinning on a core another process needs."""
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if user is not None:
        env["GOMP_SPINCOUNT"] = user
    script = "import os, stages; print(os.environ['GOMP_SPINCOUNT'])"
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    assert out.strip() == seen


def test_a_run_records_the_threads_it_trained_with(tmp_path: Path, shared_data: Path) -> None:
    from fault_helpers import EXPERIMENT, env, make_workspace, run_id

    root = make_workspace(tmp_path, shared_data)
    result = subprocess.run(
        [sys.executable, "-m", "stages.train", EXPERIMENT],
        cwd=root, env=env(OMP_NUM_THREADS="1"), capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    config = json.loads((root / "runs" / run_id(root) / "config.json").read_text())
    assert config["execution"]["threads"] == 1


def test_sharing_gpus_changes_no_job_s_command_or_params(gpu_visible: dict[str, str]) -> None:
    """``--resources gpu_share=N`` reaches the launcher in the environment, so a workspace
    built with ``gpu=1`` and then run shared (or back) reruns nothing."""

    def commands(resources: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-m", "snakemake", "-n", "-p", "--forceall", "--cores", "4",
             "--resources", resources],
            cwd=REPO, capture_output=True, text=True, check=True, env=gpu_visible,
        ).stdout  # fmt: skip
        # the dry run's job order is Snakemake's to choose; the set of commands is what counts
        return sorted(line for line in out.splitlines() if "gpu-slot" in line)

    whole = commands("gpu=1")
    assert whole and whole == commands("gpu_share=4")
