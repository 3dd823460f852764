"""Shared pieces of the fault suite: a workspace with the real data, a tiny experiment, the stage
CLIs run as subprocesses, and stage runs killed at chosen points."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "training"))

from train_helpers import TINY, copy_real_data  # noqa: E402

from stages.core.identity.experiments import plan_experiments  # noqa: E402
from stages.core.schema.params import load_params  # noqa: E402

KILL_POINT = Path(__file__).with_name("kill_point.py")
EXPERIMENT = "simcse.tiny.s1"
CORPUS_FILE = "data/corpus/wiki1m_head_11913.txt"
STSB_DEV = "data/senteval/downstream/STS/STSBenchmark/sts-dev.csv"
# 8 steps of 16 sentences: evaluated on STS-B dev at 4 and 8, checkpointed at 3 and 6, logged
# every 2 steps (and at each checkpoint and evaluation).
STEPS, EVALS, CHECKPOINTS = 8, [4, 8], [3, 6]
TRAIN = {
    "batch_size": 16,
    "max_steps": 8,
    "eval_steps": 4,
    "checkpoint_steps": 3,
    "log_steps": 2,
    "device": "cpu",
}


def params(**sections: Any) -> dict[str, Any]:
    """The tiny experiment's params (sections replace the defaults)."""
    return {
        "data": {"corpus": "wiki1m_head_11913", "max_sentences": 240},
        "train": TRAIN,
        "backbones": {"tiny": TINY.model_dump(mode="json")},
        "methods": {"simcse": {"objective": {"name": "infonce", "tau": 0.05}}},
        "experiments": [{"methods": ["simcse"], "backbones": ["tiny"], "seeds": [1]}],
        "evaluations": {"senteval": {"tasks": ["STSBenchmark"], "mode": "fasttest"}},
        **sections,
    }


def make_workspace(root: Path, shared_data: Path, *, senteval: bool = False) -> Path:
    """The corpus and STS-B dev (``senteval``: all of SentEval's files) in root/data, verified
    against the manifest like a download would leave them, and the tiny params."""
    root.mkdir(parents=True, exist_ok=True)
    copy_real_data(shared_data, root)
    if senteval:
        shutil.copytree(shared_data / "senteval", root / "data" / "senteval", dirs_exist_ok=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params()))
    return root


def run_id(root: Path, experiment: str = EXPERIMENT) -> str:
    return plan_experiments(load_params(root / "params.yaml")).runs[experiment].run_id


def env(**extra: str) -> dict[str, str]:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **extra}
    environ.pop("CSE_RUNS_DIR", None)
    return environ


def stage(root: Path, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m <module> args`` in ``root``."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=root, env=env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def trainer_held_in_its_lock(root: Path, release: Path, rid: str) -> subprocess.Popen[str]:
    """``stages.train`` of ``EXPERIMENT`` held inside run ``rid``'s lock just before it trains
    (its params read, its run planned) until ``release`` exists; returned once it holds the
    lock."""
    trainer = subprocess.Popen(
        [sys.executable, str(KILL_POINT), "stages.training.run_folder:train", "1", "before", "--",
         "stages.train", EXPERIMENT, "--params", "params.yaml"],
        cwd=root, env=env(HOLD_UNTIL=str(release)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lock = root / "runs" / f"{rid}.lock"
    deadline = time.monotonic() + 300
    while not (lock.is_file() and json.loads(lock.read_text()).get("pid") == trainer.pid):
        assert trainer.poll() is None, trainer.communicate()[1]
        assert time.monotonic() < deadline, "the trainer never took the lock"
        time.sleep(0.1)
    return trainer


def killed(root: Path, target: str, n: int, when: str, module: str, *args: str,
           match: str = "", signal: str = "SIGKILL",
           returncode: int = -9) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """The stage run sent ``signal`` at the ``n``-th call of ``target`` (see kill_point.py),
    ending with ``returncode``."""
    command = [sys.executable, str(KILL_POINT), target, str(n), when]
    command += [match] if match else []
    result = subprocess.run(
        [*command, "--", module, *args],
        cwd=root, env={**env(), "KILL_SIGNAL": signal}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == returncode, (
        f"not stopped at {target} #{n}:\n{result.stderr[-3000:]}"
    )
    return result


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def assert_same_run(root: Path, reference: Path, *, resumes: int | None = None) -> None:
    """The run stored in ``root`` is the reference's: complete, the same metrics (timings
    aside), bitwise the same best and final weights, one log record per step."""
    from train_helpers import assert_same_weights, without_timing

    from stages.core.storage.run_folders import RUN_FILES, read_log

    rid = run_id(root)
    done, first = root / "runs" / rid, reference / "runs" / rid
    assert [f for f in RUN_FILES if not (done / f).is_file()] == []
    assert not (root / "runs" / f"{rid}.partial").exists()
    assert not (root / "runs" / f"{rid}.lock").exists()
    metrics, expected = load_json(done / "metrics.json"), load_json(first / "metrics.json")
    assert without_timing(metrics) == without_timing(expected)
    assert_same_weights(first / "best", done / "best")
    assert_same_weights(first / "final", done / "final")
    log = read_log(done / "log.jsonl")
    assert [r["step"] for r in log if r["event"] == "train"] == list(range(1, STEPS + 1))
    assert [r["step"] for r in log if r["event"] == "eval"] == EVALS
    if resumes is not None:
        assert [r["event"] for r in log].count("resume") == resumes


def no_finished_outputs(root: Path) -> bool:
    """No pointer, curve or result file under experiments/ (the live metrics a run streams
    while it trains, experiments/<name>/live/, are no finished output)."""
    names = {"train.json", "train_steps.csv", "dev_evals.csv", "senteval.json", "mteb.json"}
    return not any(p.name in names for p in (root / "experiments").rglob("*"))


def stage_error(module: str, args: list[str], monkeypatch, capsys) -> str:
    """The stage as `python -m <module> args` runs it, in this process: its one error line
    (exit status 2, no traceback, nothing on stdout)."""
    import importlib

    import pytest

    from stages.core import cli

    stage = importlib.import_module(module)
    monkeypatch.setattr(sys, "argv", [module, *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli.run(stage.main)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and "Traceback" not in captured.err, captured.err
    assert captured.out == ""
    return captured.err
