"""Snakemake's shared hold on DVC's workspace lock (workflow/rules/dvc_lock.py): refused while a
DVC command holds the lock or runs a stage, kept otherwise, and a `dvc repro` started meanwhile
stops before its first stage. Both orchestrators started together on one workspace:
tests/test_two_orchestrators.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import zc.lockfile
from project_copy import REPO, project_copy

sys.path.insert(0, str(REPO / "workflow" / "rules"))

import dvc_lock


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / ".dvc").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dvc_lock, "_held", [])
    return tmp_path


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_refused_while_dvc_holds_its_lock(workspace: Path) -> None:
    (workspace / ".dvc" / "tmp").mkdir()
    held = zc.lockfile.LockFile(str(workspace / ".dvc" / "tmp" / "lock"))  # as DVC takes it
    try:
        stop = dvc_lock.share_dvc_lock()
    finally:
        held.close()
    assert stop is not None
    assert stop.startswith(f"a DVC command is working in this workspace (pid {os.getpid()});")
    assert "Rerun when it has finished" in stop and dvc_lock._held == []


def test_refused_while_a_dvc_stage_runs_and_kept_otherwise(workspace: Path) -> None:
    tmp = workspace / ".dvc" / "tmp"
    tmp.mkdir()
    rwlock = tmp / "rwlock"
    stage = {"pid": os.getpid(), "cmd": "dvc repro"}  # DVC lets go of its lock while a stage runs
    rwlock.write_text(json.dumps({"write": {"/w/experiments": stage}, "read": {}}))
    stop = dvc_lock.share_dvc_lock()
    assert stop is not None and f"(pid {os.getpid()}: dvc repro)" in stop
    assert dvc_lock._held == []
    stage["pid"] = dead_pid()  # a DVC that was killed: its entries stay behind
    rwlock.write_text(json.dumps({"write": {}, "read": {"/w/data": [stage]}}))
    assert dvc_lock.share_dvc_lock() is None
    assert len(dvc_lock._held) == 1
    assert dvc_lock.share_dvc_lock() is None  # shared: a second Snakemake is not refused here
    with pytest.raises(zc.lockfile.LockError):
        zc.lockfile.LockFile(str(tmp / "lock"))


def test_no_dvc_folder_nothing_to_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert dvc_lock.share_dvc_lock() is None
    assert not (tmp_path / ".dvc").exists()


def test_dvc_repro_stops_before_its_first_stage_while_snakemake_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project_copy(tmp_path, None)
    monkeypatch.chdir(root)
    monkeypatch.setattr(dvc_lock, "_held", [])
    assert dvc_lock.share_dvc_lock() is None
    result = subprocess.run(["dvc", "repro"], cwd=root, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Unable to acquire lock" in output, output
    assert "Running stage" not in output and not (root / "data").exists()
