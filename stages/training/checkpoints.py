"""Resumable checkpoints: everything a killed run needs to continue exactly where it stopped.

A checkpoint is one folder, ``checkpoint-<step>/``, renamed into place when complete; older
ones are removed only after that, so at every moment at least one complete checkpoint exists:

- ``state.pt``: model, optimizer and scheduler state, every rank's RNG state, the data position
  (the number of completed steps; batch order is a function of the step), the evaluation
  history, the best dev score and step, and the log's length at that point;
- ``best.safetensors``: the best weights so far (hard-linked from the previous checkpoint when
  the best has not changed since, so an unchanged best costs nothing to keep).

A run killed at any moment finds either the previous checkpoint or the new one, never a mix;
so does one whose machine crashed (``atomic_path`` puts the files on the disk before the
folder's name, and the loop the log's bytes before the checkpoint that counts them).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from pickle import UnpicklingError
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from stages.core.errors import StageError
from stages.core.storage.atomic import atomic_path

CHECKPOINT_PREFIX = "checkpoint-"
STATE_FILE = "state.pt"
BEST_FILE = "best.safetensors"


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def save_checkpoint(
    run_dir: Path, step: int, state: dict[str, Any], best: dict[str, torch.Tensor] | None
) -> Path:
    """Write ``checkpoint-<step>/``; ``best`` None keeps the previous checkpoint's best."""
    previous = latest_checkpoint(run_dir)
    folder = run_dir / f"{CHECKPOINT_PREFIX}{step}"
    with atomic_path(folder) as tmp:
        tmp.mkdir()
        torch.save(state, tmp / STATE_FILE)
        if best is not None:
            save_file(best, tmp / BEST_FILE)
        elif previous is not None and (previous / BEST_FILE).is_file():
            _link_or_copy(previous / BEST_FILE, tmp / BEST_FILE)
    for old in _checkpoints(run_dir):
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)
    return folder


def unwritten_checkpoint_error(run_dir: Path, step: int, err: OSError) -> StageError:
    """What to say when ``save_checkpoint`` failed (a full disk, a quota): its half-written
    folder is already gone, the previous checkpoint is intact."""
    kept = latest_checkpoint(run_dir)
    where = f"the previous checkpoint {kept} is intact" if kept else "no checkpoint yet"
    return StageError(f"could not write the checkpoint of step {step} ({err}); {where}")


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = _checkpoints(run_dir)
    return found[-1] if found else None


def load_checkpoint(run_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None] | None:
    """(state, best weights) of the run's latest checkpoint, or None if it has none."""
    folder = latest_checkpoint(run_dir)
    if folder is None:
        return None
    try:
        state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
        best = load_file(folder / BEST_FILE) if (folder / BEST_FILE).is_file() else None
    except (EOFError, RuntimeError, UnpicklingError, SafetensorError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise StageError(
            f"{folder}: the checkpoint cannot be read ({reason}): it is damaged (a copy cut "
            f"short, a disk fault). It is the run's only checkpoint: delete {folder} to train "
            "the run from its start"
        ) from None
    return state, best


def remove_checkpoints(run_dir: Path) -> None:
    for folder in _checkpoints(run_dir):
        shutil.rmtree(folder, ignore_errors=True)


def _checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first (temporaries start with a dot)."""
    if not run_dir.is_dir():
        return []
    found = [
        p
        for p in run_dir.iterdir()
        if p.is_dir()
        and p.name.startswith(CHECKPOINT_PREFIX)
        and p.name.removeprefix(CHECKPOINT_PREFIX).isdigit()
    ]
    return sorted(found, key=lambda p: int(p.name.removeprefix(CHECKPOINT_PREFIX)))


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)
