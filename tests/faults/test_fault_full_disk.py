"""Fault 5: the disk fills up while a checkpoint is written. The stage stops with a clear error;
the previous checkpoint is intact and stays the latest; nothing half-written is taken for a
checkpoint; a rerun resumes from it to the very weights of an uninterrupted run."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest
import torch
from fault_helpers import (
    CHECKPOINTS,
    EXPERIMENT,
    assert_same_run,
    make_workspace,
    no_finished_outputs,
    run_id,
)

import stages.train as train_stage
from stages.core.errors import StageError
from stages.training.checkpoints import latest_checkpoint, load_checkpoint

pytestmark = pytest.mark.faults


def test_full_disk_while_checkpointing_keeps_the_previous_one_and_resumes(
    reference: Path, shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_workspace(tmp_path, shared_data)
    monkeypatch.chdir(root)
    partial = root / "runs" / f"{run_id(root)}.partial"
    first, second = (partial / f"checkpoint-{step}" for step in CHECKPOINTS)
    save = torch.save
    seen: dict[str, bytes] = {}

    def disk_full_once(obj, f, *args, **kwargs):
        if isinstance(f, Path) and f"{second.name}." in str(f) and not seen:
            # the previous checkpoint as it is when the next one fails
            seen.update({p.name: p.read_bytes() for p in first.iterdir()})
            buffer = io.BytesIO()
            save(obj, buffer, *args, **kwargs)
            f.write_bytes(buffer.getvalue()[: buffer.tell() // 2])  # what fitted on the disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_once)
    with pytest.raises(StageError) as err:
        train_stage.main([EXPERIMENT])
    message = str(err.value)
    assert message.startswith(f"could not write the checkpoint of step {CHECKPOINTS[1]} (")
    assert "[Errno 28] No space left on device" in message
    assert (
        f"the previous checkpoint {Path('runs') / partial.name / first.name} is intact" in message
    )
    assert f"The unfinished run is in {Path('runs') / partial.name}: a rerun resumes it" in message

    assert seen, "the second checkpoint was never written"
    assert latest_checkpoint(partial) == first
    assert sorted(p.name for p in partial.iterdir() if "checkpoint" in p.name) == [first.name]
    assert {p.name: p.read_bytes() for p in first.iterdir()} == seen  # intact
    state, _ = load_checkpoint(partial)
    assert state["step"] == CHECKPOINTS[0]
    assert not (root / "runs" / run_id(root)).exists()
    assert not (root / "runs" / f"{run_id(root)}.lock").exists()
    assert no_finished_outputs(root)  # no pointer, no curves, no results

    monkeypatch.setattr(torch, "save", save)  # space freed
    train_stage.main([EXPERIMENT])
    assert_same_run(root, reference, resumes=1)
