"""The Snakemake profiles of workflow/profiles: what they ask of SLURM, and GPU pinning.

The SLURM profile's run on a real cluster is tests/slurm; here it is a dry run of the pipeline,
which checks the resources every rule asks for.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from itertools import combinations
from pathlib import Path

import pytest

from stages.core.identity.experiments import plan_experiments
from stages.core.planning.estimates import job_limit_minutes
from stages.core.planning.jobs import build_jobs
from stages.core.schema.params import load_params

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "workflow" / "profiles"
TOY_SNAKEFILE = REPO / "tests" / "slurm" / "fixture" / "Snakefile"
# how every rule's shell line logs (workflow/rules/common.smk says why)
TEE_LOG = "(trap '' INT TERM; exec tee {log})"
# a stage that, stopped by a signal, prints what it kept after a moment of cleaning up
STOPPABLE_STAGE = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.default_int_handler)
print("started", flush=True)
try:
    time.sleep(30)
except KeyboardInterrupt:
    time.sleep(0.3)
    print("interrupted: the run stays in runs/x.partial", flush=True)
    sys.exit(130)
"""


def env_for(visible_gpus: str | None = None, lock_dir: Path | None = None) -> dict[str, str]:
    env = {**os.environ}
    if lock_dir is not None:
        env["CSE_GPU_LOCK_DIR"] = str(lock_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible_gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_gpus
    return env


def dry_run_jobs(root: Path, *args: str) -> dict[str, dict[str, str]]:
    """Snakemake's dry run: per job (by its first output), its resources and shell command."""
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--forceall", *args],
        cwd=root, env=env_for(), capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    jobs = {}
    for block in re.split(r"\n(?=rule \w+:)", out):
        if not (head := re.match(r"rule (\w+):", block)):
            continue
        output = re.search(r"output: ([^,\n]+)", block)
        resources = re.search(r"resources: (.*)", block)
        shell = re.search(r"Shell command: (.*)", block)
        jobs[output[1] if output else head[1]] = {
            "resources": dict(kv.split("=", 1) for kv in resources[1].split(", ")),
            "shell": shell[1] if shell else "",
        }
    return jobs


@pytest.mark.e2e
def test_the_slurm_profile_asks_for_gpus_memory_cpus_and_estimated_time() -> None:
    pytest.importorskip(
        "snakemake_executor_plugin_slurm", reason="pip install -e '.[slurm]' for the profile"
    )
    jobs = dry_run_jobs(REPO, "--profile", str(PROFILES / "slurm"))
    params = load_params(REPO / "params.yaml")
    for job in build_jobs(plan_experiments(params)):
        dry = jobs[job.outputs[0]]
        if job.gpu:
            assert dry["resources"]["gpu"] == "1"
            assert dry["resources"]["mem_mb"] == "32000"
            assert dry["resources"]["cpus_per_task"] == "8"
            assert dry["resources"]["runtime"] == str(
                job_limit_minutes(plan_experiments(params), job)
            )
            # through the GPU slot (see workflow/rules/rule_jobs.py)
            log = f"logs/{job.stage}/{job.key}.log"
            assert dry["shell"] == (
                f"python -m stages.commands gpu-slot --gpus 1 -- {job.cmd} 2>&1 | "
                f"{TEE_LOG.format(log=log)}"
            )
        else:
            assert dry["resources"]["runtime"] == "60"
            assert "gpu" not in dry["resources"]


@pytest.mark.e2e
def test_the_local_gpus_profile_gives_each_training_job_its_own_device(tmp_path: Path) -> None:
    """The toy workflow of tests/slurm, four trainings on a two-GPU machine."""
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(TOY_SNAKEFILE),
         "--profile", str(REPO / "workflow" / "profiles" / "local-gpus"),
         "--resources", "gpu=2", "--cores", "4",
         "--config", "runs=a,b,c,d", "steps=5", "step_seconds=0.2"],
        cwd=tmp_path, env=env_for("0,1", tmp_path / "locks"), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    ends = []
    for run in "abcd":
        lines = (tmp_path / "logs" / f"{run}.starts").read_text().splitlines()
        ends += [r for r in map(json.loads, lines) if r["event"] == "end"]
    assert len(ends) == 4
    assert {e["gpu"] for e in ends} == {"0", "1"}
    for a, b in combinations(ends, 2):  # never one device for two jobs at once
        assert a["gpu"] != b["gpu"] or a["end"] <= b["start"] or b["end"] <= a["start"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("logging", ["rules", "plain tee"])
def test_the_log_keeps_the_last_line_of_a_stage_stopped_with_its_process_group(
    logging: str, signum: int, tmp_path: Path
) -> None:
    """Ctrl-C and scancel signal the job's whole process group: the rules' tee outlives the
    signal and logs the stage's last line; a plain tee dies with it and loses the line."""
    log = tmp_path / "stage.log"
    (tmp_path / "stage.py").write_text(STOPPABLE_STAGE)
    tee = TEE_LOG.format(log=log) if logging == "rules" else f"tee {log}"
    job = subprocess.Popen(
        ["bash", "-c", f"set -euo pipefail; {sys.executable} stage.py 2>&1 | {tee}"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while "started" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and job.poll() is None
        time.sleep(0.05)
    os.killpg(job.pid, signum)
    job.wait(timeout=30)
    while group_alive(job.pid):  # bash dies of SIGTERM at once; the stage still unwinds
        assert time.monotonic() < deadline
        time.sleep(0.05)
    kept = "interrupted: the run stays in runs/x.partial" in log.read_text()
    assert kept is (logging == "rules")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_every_rule_logs_through_the_signal_proof_tee() -> None:
    rules = sorted((REPO / "workflow" / "rules").glob("*.smk"))
    lines = [line.strip() for f in rules for line in f.read_text().splitlines()]
    shells = [line for line in lines if "2>&1 |" in line and not line.startswith("#")]
    assert len(shells) >= 8
    assert all(line.rstrip().endswith(f'2>&1 | {TEE_LOG}"') for line in shells), shells
