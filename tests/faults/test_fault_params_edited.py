"""Fault: the params file edited while a stage runs. DVC records a stage's params as they are
when it ends (dvc.lock), so τ edited while `stages.train` trained had dvc.lock record the new τ
against the run of the old one, and every later `dvc repro` skip training. The stage now stops
before writing what the orchestrators track, naming the file; the run it trained stays stored
under the id of the params it read, and the rerun trains the edited one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fault_helpers import (
    EXPERIMENT,
    make_workspace,
    no_finished_outputs,
    run_id,
    stage,
    trainer_held_in_its_lock,
)

from stages.core.storage.run_folders import is_complete

pytestmark = pytest.mark.faults


def test_tau_edited_while_train_runs_stops_it_before_its_pointer(
    shared_data: Path, tmp_path: Path
) -> None:
    root = make_workspace(tmp_path / "ws", shared_data)
    read = run_id(root)
    release = tmp_path / "release"
    # held inside the run's lock just before it trains: the params were read, the run planned
    trainer = trainer_held_in_its_lock(root, release, read)
    raw = yaml.safe_load((root / "params.yaml").read_text())
    raw["methods"]["simcse"]["objective"]["tau"] = 0.07
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    release.touch()
    _, error = trainer.communicate(timeout=600)

    assert trainer.returncode == 2, error
    [line] = [line for line in error.splitlines() if line.startswith("error: ")]
    assert error.strip().endswith(line) and "Traceback" not in error  # one line, the last
    assert line.startswith("error: params.yaml changed while this stage ran, after it was read")
    assert f"experiments/{EXPERIMENT}/" in line and "was not written" in line
    assert no_finished_outputs(root)
    assert is_complete(root / "runs" / read)  # trained as read, kept under that id

    edited = run_id(root)
    assert edited != read
    rerun = stage(root, "stages.train", EXPERIMENT, "--params", "params.yaml")
    assert rerun.returncode == 0, rerun.stderr
    pointer = json.loads((root / "experiments" / EXPERIMENT / "train.json").read_text())
    assert pointer["run_id"] == edited and is_complete(root / "runs" / edited)
