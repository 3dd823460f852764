"""Fault 2: two trainers of one run at once, and a lock left by a trainer that died. One
trainer trains, the other stops naming it; the stored run is whole and its curves are not
doubled; a lock whose holder is gone is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest
from fault_helpers import (
    EVALS,
    EXPERIMENT,
    STEPS,
    assert_same_run,
    make_workspace,
    run_id,
    stage,
    trainer_held_in_its_lock,
)

import stages.train as train_stage
import stages.training.run_folder as runner
from stages.core.identity.experiments import plan_experiments
from stages.core.planning.status import status_rows
from stages.core.schema.params import load_params
from stages.core.storage.run_lock import STALE_AFTER_S, RunLocked, machine, run_lock

pytestmark = pytest.mark.faults


def no_training(*args, **kwargs):
    raise AssertionError("trained again")


def test_two_trainers_of_one_run_one_trains_the_other_names_it(
    reference: Path, shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_workspace(tmp_path, shared_data)
    rid = run_id(root)
    # The first trainer is held inside the run's lock, just before it trains, until the second
    # has been answered: the two overlap whatever the machine's speed (8 tiny steps take less
    # than a second, a stage's start several).
    release = tmp_path / "release"
    first = trainer_held_in_its_lock(root, release, rid)
    second = stage(root, "stages.train", EXPERIMENT, "--params", "params.yaml")
    release.touch()
    error = first.communicate(timeout=600)[1]
    assert (first.returncode, second.returncode) == (0, 2), (error, second.stderr)

    holder = f"host {socket.gethostname()}, pid {first.pid}, since "
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert lines[0].startswith(
        f"error: run {rid} ({EXPERIMENT}) is being trained by another process ({holder}"
    )
    assert "Rerun when it has finished (the run is then a cache hit)" in lines[0]
    assert f"delete runs/{rid}.lock" in lines[0]

    assert_same_run(root, reference, resumes=0)  # whole, and what one trainer alone makes
    curves = root / "experiments" / EXPERIMENT
    steps = pl.read_csv(curves / "train_steps.csv")["step"].to_list()
    dev = pl.read_csv(curves / "dev_evals.csv")["step"].to_list()
    assert steps == list(range(1, STEPS + 1)) and dev == EVALS  # no row twice
    monkeypatch.chdir(root)
    (row,) = status_rows(plan_experiments(load_params("params.yaml")))
    assert (row["run_id"], row["train"]) == (rid, "yes")
    assert row["run stored"] == f"yes (trained on {socket.gethostname()})"
    pointer = curves / "train.json"
    before = pointer.stat().st_mtime_ns
    monkeypatch.setattr(runner, "train", no_training)
    train_stage.main([EXPERIMENT])  # a cache hit: nothing trained, nothing rewritten
    assert pointer.stat().st_mtime_ns == before


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def write_lock(path: Path, host: str, pid: int, started: float) -> None:
    """A lock as a trainer writes it; one of this host names this machine."""
    here = host == socket.gethostname()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": host, "machine": machine() if here else host, "pid": pid,
                                "started": started, "experiment": EXPERIMENT}))  # fmt: skip


def test_a_live_holder_stops_the_stage_and_a_dead_one_is_taken_over(
    reference: Path, shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_workspace(tmp_path, shared_data)
    monkeypatch.chdir(root)
    rid = run_id(root)
    lock = root / "runs" / f"{rid}.lock"
    params = load_params("params.yaml")

    write_lock(lock, socket.gethostname(), os.getppid(), time.time())  # alive: pytest's parent
    assert status_rows(plan_experiments(params))[0]["run stored"].startswith(
        f"training (host {socket.gethostname()}, pid {os.getppid()}, since "
    )
    with pytest.raises(RunLocked, match=f"pid {os.getppid()}, since "):
        train_stage.main([EXPERIMENT])
    assert sorted(p.name for p in (root / "runs").iterdir()) == [f"{rid}.lock"]

    write_lock(lock, socket.gethostname(), dead_pid(), time.time() - 60)  # its trainer died
    assert status_rows(plan_experiments(params))[0]["run stored"] == "-"
    train_stage.main([EXPERIMENT])
    assert_same_run(root, reference, resumes=0)
    assert sorted(p.name for p in (root / "runs").iterdir()) == [rid]


def test_a_lock_of_another_host_is_stale_only_without_heartbeat(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "abc"
    lock = tmp_path / "runs" / "abc.lock"
    write_lock(lock, "elsewhere", 1, time.time())  # refreshed now: its trainer is alive
    with pytest.raises(RunLocked, match="host elsewhere, pid 1, since "), run_lock(run_dir, "x"):
        pass
    old = time.time() - STALE_AFTER_S - 60
    os.utime(lock, (old, old))  # no heartbeat for longer than STALE_AFTER_S: taken over
    with run_lock(run_dir, "x"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()
    assert sorted(p.name for p in lock.parent.iterdir()) == []  # no temporaries left either
