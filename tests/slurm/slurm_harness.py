"""Running Snakemake in the SLURM tests: locally, or on the test cluster with the SLURM profile."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = Path(__file__).resolve().parent / "cluster.sh"
FIXTURE = Path(__file__).resolve().parent / "fixture"
SLURM_PROFILE = REPO / "workflow" / "profiles" / "slurm"

# What this test cluster needs on top of the profile (docs/scale-out.md explains each):
# no accounting database, so squeue reports job states and there is no account to guess;
# short status intervals so that the tests take seconds, not minutes.
TEST_CLUSTER_ARGS = (
    "--slurm-status-command", "squeue",
    "--slurm-no-account",
    "--slurm-init-seconds-before-status-checks", "2",
    "--seconds-between-status-checks", "1",
)  # fmt: skip


def workflow_env() -> dict[str, str]:
    """The environment of the Snakemake runs: the repo importable, its venv's tools first, the
    shared data as the local data source."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("SLURM_CONF", None)
    # the tiny preset reads its corpus and SentEval data from the local data source
    env.setdefault("CSE_DATA_DIR", str(REPO.parent / "shared" / "data"))
    return env


def snakemake_command(snakefile: Path, *args: str, slurm: bool) -> list[str]:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(snakefile), *args]
    if slurm:
        cmd += ["--profile", str(SLURM_PROFILE), *TEST_CLUSTER_ARGS]
    return cmd


def run_snakemake(
    workdir: Path, snakefile: Path, *args: str, slurm: bool, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        snakemake_command(snakefile, *args, slurm=slurm),
        cwd=workdir,
        env=workflow_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Background:
    """Snakemake running in the background, stopped like a user would (Ctrl-C) if need be."""

    def __init__(self, workdir: Path, snakefile: Path, *args: str, slurm: bool) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "snakemake.out"
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                snakemake_command(snakefile, *args, slurm=slurm),
                cwd=workdir,
                env=workflow_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            message = f"snakemake still running after {timeout}s:\n{self.output()}"
            raise AssertionError(message) from None

    def stop(self) -> None:
        """SIGINT: Snakemake cancels its SLURM jobs and exits."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def output(self) -> str:
        return self.log.read_text()


T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float, what: str) -> T:
    """Poll ``condition`` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def squeue_jobs(*fields: str) -> list[Sequence[str]]:
    """Queued and running jobs: the requested squeue format fields (%i, %k, ...), per job."""
    fmt = "|".join(fields)
    out = subprocess.run(
        ["squeue", "-h", "-o", fmt], capture_output=True, text=True, check=True
    ).stdout
    return [line.split("|") for line in out.splitlines() if line.strip()]
