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


def planned_threads(*args: str) -> dict[str, str]:
    """Snakemake's dry run of the committed pipeline: each rule's threads (1 when not shown)."""
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--forceall", *args],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    threads = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", out):
        head = re.match(r"(?:local)?rule (\w+):", block)
        if head:
            found = re.search(r"threads: (\d+)", block)
            threads[head[1]] = found[1] if found else "1"
    return threads


@pytest.mark.parametrize(
    ("cores", "gpus", "gpu_job"),
    [(4, "gpu=1", "4"), (8, "gpu=2", "4"), (1, "gpu=1", "1"), (8, "gpu_share=4", "2")],
)
def test_each_rule_declares_its_share_of_the_cores(cores: int, gpus: str, gpu_job: str) -> None:
    """A GPU job gets cores / (GPU jobs at once) threads (``gpu=N``: one per GPU;
    ``gpu_share=N``: N sharing the GPUs), the CPU-heavy triplets and figures every core, the rest
    one: Snakemake then never runs more threads than --cores at once."""
    threads = planned_threads("--cores", str(cores), "--resources", gpus)
    assert threads["train"] == threads["evaluate"] == gpu_job
    assert threads["triplets"] == threads["figures"] == str(cores)
    assert threads["report"] == threads["download_corpus"] == "1"


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


def test_sharing_gpus_changes_no_job_s_command_or_params() -> None:
    """``--resources gpu_share=N`` reaches the launcher in the environment, so a workspace
    built with ``gpu=1`` and then run shared (or back) reruns nothing."""

    def commands(resources: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-m", "snakemake", "-n", "-p", "--forceall", "--cores", "4",
             "--resources", resources],
            cwd=REPO, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        # the dry run's job order is Snakemake's to choose; the set of commands is what counts
        return sorted(line for line in out.splitlines() if "gpu-slot" in line)

    whole = commands("gpu=1")
    assert whole and whole == commands("gpu_share=4")
