"""Two orchestrators started together on one workspace (issue 45): `snakemake` with `dvc repro`,
and two `snakemake` calls whose targets overlap. Each tool deletes a job's outputs before it
runs the job, so they must not work in one workspace at once: the second to start stops before
any job with a message naming the first (Snakemake takes a shared hold on DVC's workspace lock,
workflow/rules/dvc_lock.py; Snakemake's own lock refuses a second Snakemake whose jobs
overlap). Run again once the first has finished, it finds every run and evaluation stored.

Counted, per scenario: the runs and evaluations produced (each once), produced twice (0), and
wrong or partial results visible (0: no unfinished run, lock or hidden temporary, every output
whole and equal to a sequential run's: the same run ids, bitwise the same weights, the same
metrics and SentEval scores)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from project_copy import REPO, project_copy
from test_end_to_end import run_ids, senteval_scores, shared_data

from benchmarks.contention import cut_to_ci_size
from stages.core.storage.run_folders import RUN_FILES, is_complete

pytestmark = pytest.mark.e2e

EXPERIMENT = "simcse.tiny-bert.s42"
SNAKEMAKE = ["snakemake", "--cores", "1", "--resources", "gpu=1"]
DVC = ["dvc", "repro"]
SENTEVAL = f"experiments/{EXPERIMENT}/senteval.json"
# what each tool says when it refuses to start beside the other
SNAKEMAKE_REFUSES_DVC = "a DVC command is working in this workspace (pid "
DVC_REFUSES = "Unable to acquire lock"
SNAKEMAKE_REFUSES_SNAKEMAKE = "Directory cannot be locked"


def small_params() -> dict[str, Any]:
    """The smoke preset at its CI size, cut to one SimCSE run, STS-B only, no MTEB."""
    params = cut_to_ci_size(yaml.safe_load((REPO / "presets" / "smoke.yaml").read_text()))
    params["experiments"] = [{"methods": ["simcse"], "backbones": ["tiny-bert"], "seeds": [42]}]
    params["evaluations"]["senteval"]["tasks"] = ["STSBenchmark"]
    params["evaluations"]["senteval"].pop("mode", None)  # the transfer tasks' setting
    params["evaluations"]["mteb"]["enabled"] = False
    return params


def environment() -> dict[str, str]:
    env = {**os.environ, "CSE_DATA_DIR": str(shared_data()), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # fmt: skip
    env.pop("CSE_RUNS_DIR", None)
    return env


def together(root: Path, *commands: list[str], after: str = "") -> list[tuple[int, str]]:
    """``commands`` started at once in ``root`` (``after``: each once the previous one's output
    shows it): each one's exit status and output."""
    logs = [root.parent / f"orchestrator{i}.log" for i in range(len(commands))]
    processes: list[subprocess.Popen[bytes]] = []
    deadline = time.monotonic() + 900
    for command, log in zip(commands, logs, strict=True):
        while processes and after and after not in logs[len(processes) - 1].read_text():
            assert processes[-1].poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        with log.open("w") as out:
            started = subprocess.Popen(
                command, cwd=root, env=environment(), stdout=out, stderr=subprocess.STDOUT
            )
            processes.append(started)
    for process in processes:
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
    return [(p.returncode, log.read_text()) for p, log in zip(processes, logs, strict=True)]


def alone(root: Path, command: list[str]) -> str:
    result = subprocess.run(command, cwd=root, env=environment(), capture_output=True,
                            text=True, timeout=900)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{output[-6000:]}"
    return output


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def results(root: Path) -> dict[str, Any]:
    """What the workspace computed: run ids, each run's weights and metrics (timings aside),
    each evaluation's scores."""
    [rid] = run_ids(root, [EXPERIMENT]).values()
    run = root / "runs" / rid
    metrics = json.loads((run / "metrics.json").read_text())
    return {
        "run_id": rid,
        "weights": {f: sha256(run / f) for f in RUN_FILES if f.endswith(".safetensors")},
        "metrics": {k: v for k, v in metrics.items() if k != "timing"},
        "senteval": senteval_scores(root, EXPERIMENT),
    }


def produced(root: Path) -> dict[str, tuple[int, int]]:
    """Each stored run's and evaluation's result file and its identity (inode, mtime): one
    computed (or stored) again gets another."""
    files = [*root.glob("runs/*/metrics.json"), *root.glob("runs/evaluations/*.json")]
    return {str(f.relative_to(root)): (f.stat().st_ino, f.stat().st_mtime_ns) for f in files}


def computed(outputs: list[str], rid: str) -> dict[str, int]:
    """How many times the orchestrators' outputs show the run trained and STS-B scored."""
    return {
        "trainings": sum(f"train {rid[:8]}:" in output for output in outputs),
        "evaluations": sum(output.count("STSBenchmark: spearman") for output in outputs),
    }


def assert_whole(root: Path, expected: dict[str, Any], *, report: bool = True) -> None:
    """No unfinished run, lock or hidden temporary is left; every output is complete and what
    the sequential run made (``report``: down to the report)."""
    leftovers = [
        str(p.relative_to(root))
        for folder in ("runs", "experiments", "reports", "data")
        for p in (root / folder).rglob("*")
        if p.name.endswith((".partial", ".lock", ".tmp"))
    ]
    assert leftovers == []
    rid = expected["run_id"]
    assert is_complete(root / "runs" / rid)
    stored = json.loads(next((root / "runs" / "evaluations").glob("senteval-*.json")).read_text())
    assert {k: stored[k] for k in ("tasks", "summary")} == expected["senteval"]
    assert results(root) == expected
    if report:
        assert (root / "reports" / "results" / "report.html").stat().st_size > 0


@pytest.fixture(scope="module")
def sequential(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The results of one `snakemake` alone."""
    root = project_copy(tmp_path_factory.mktemp("sequential"), small_params())
    alone(root, SNAKEMAKE)
    return results(root)


def check_one_refused(runs: list[tuple[int, str]], refusals: tuple[str, ...]) -> tuple[int, int]:
    """The index of the orchestrator that ran and of the one that stopped before any job."""
    codes = [code for code, _ in runs]
    assert sorted(code == 0 for code in codes) == [False, True], runs
    ran, refused = codes.index(0), 1 - codes.index(0)
    output = runs[refused][1]
    assert any(message in output for message in refusals), output[-4000:]
    assert "Running stage" not in output and "Finished jobid" not in output  # no job at all
    return ran, refused


def scenario(tmp_path: Path, sequential: dict[str, Any], commands: list[list[str]],
             refusals: tuple[str, ...], after: str = "") -> None:  # fmt: skip
    root = project_copy(tmp_path, small_params())
    runs = together(root, *commands, after=after)
    ran, refused = check_one_refused(runs, refusals)
    assert_whole(root, sequential, report=commands[ran] in (SNAKEMAKE, DVC))
    first = produced(root)
    assert len(first) == 2  # one run, one evaluation

    rerun = alone(root, commands[refused])  # once the first has finished
    assert produced(root) == first  # nothing computed or stored again
    assert_whole(root, sequential)
    counts = computed([runs[ran][1], rerun], sequential["run_id"])
    assert counts == {"trainings": 1, "evaluations": 1}, counts
    if "rule train:" in rerun or "Running stage 'train." in rerun:  # a train job ran again:
        assert "(the stored run " in rerun  # it found the run stored


def test_snakemake_and_dvc_repro_started_together(
    tmp_path: Path, sequential: dict[str, Any]
) -> None:
    scenario(tmp_path, sequential, [SNAKEMAKE, DVC], (SNAKEMAKE_REFUSES_DVC, DVC_REFUSES))


def test_dvc_repro_started_while_snakemake_runs_its_first_job(
    tmp_path: Path, sequential: dict[str, Any]
) -> None:
    """Started together, DVC usually wins (Snakemake reaches its first job seconds later):
    here Snakemake is first for sure, and DVC, rerun afterwards, finds every run and evaluation
    stored."""
    scenario(tmp_path, sequential, [SNAKEMAKE, DVC], (DVC_REFUSES,), after="localrule ")


def test_two_snakemake_calls_with_overlapping_targets(
    tmp_path: Path, sequential: dict[str, Any]
) -> None:
    one_job = ["snakemake", SENTEVAL, *SNAKEMAKE[1:]]  # its target is also one of `all`'s
    scenario(tmp_path, sequential, [SNAKEMAKE, one_job], (SNAKEMAKE_REFUSES_SNAKEMAKE,))
