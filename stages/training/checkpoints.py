"""Resumable checkpoints, saved and restored: everything a killed run needs to continue exactly
where it stopped, and the fresh start or the resumption from the latest one (``start_or_resume``).

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
from stages.core.storage.atomic import atomic_path, write_json
from stages.core.storage.run_folders import CONFIG_FILE, LOG_FILE
from stages.training.distributed import rank_seed
from stages.training.live import RunLog, open_run_log
from stages.training.parts import TrainingParts
from stages.training.progress import Progress
from stages.training.records import LogTooShort

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


def start_or_resume(run: TrainingParts) -> tuple[Progress, RunLog | None]:
    """A fresh start (config.json, each rank's own dropout stream, an empty log) or the run put
    back where its latest checkpoint left it (weights, optimizer, schedule, this rank's RNG state,
    step, progress; the log cut back to what the checkpoint had seen, then a resume event).
    The log is rank 0's; the other ranks get None."""
    job, ctx = run.job, run.ctx
    loaded = load_checkpoint(job.out_dir)
    if loaded is None:
        torch.manual_seed(rank_seed(job.seed, ctx.rank))
        if ctx.is_main:
            write_json(job.out_dir / CONFIG_FILE, {**job.config, "execution": run.execution()})
        return Progress(), _open_log(run, truncate_at=0) if ctx.is_main else None
    state, best_weights = loaded
    expected = (job.run_id, ctx.world_size, len(run.corpus))
    found = (state["run_id"], state["world_size"], state["n_rows"])
    if found != expected:
        raise StageError(
            f"{latest_checkpoint(job.out_dir)}: checkpoint of (run, processes, corpus rows) "
            f"{found} cannot resume {expected}; delete {job.out_dir} to start over"
        )
    run.encoder.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    restore_rng_state(state["rng"][ctx.rank], run.runtime.device)
    run.step = state["step"]
    progress = Progress(
        evaluations=state["evaluations"],
        best=state["best"],
        best_weights=best_weights,
        elapsed_before=state["elapsed_s"],
    )
    if not ctx.is_main:
        return progress, None
    try:
        log = _open_log(run, truncate_at=state["log_offset"])
    except LogTooShort as err:
        raise StageError(
            f"{err.path}: {err.size} bytes, but the checkpoint {latest_checkpoint(job.out_dir)} "
            f"counted {err.counted}: the log lost its end; delete that checkpoint to train the "
            "run from its start"
        ) from None
    log.write([{"event": "resume", "step": run.step}])
    return progress, log


def checkpoint_state(
    run: TrainingParts,
    progress: Progress,
    rngs: list[dict[str, torch.Tensor]],
    log_offset: int,
    elapsed: float,
) -> dict[str, Any]:
    """state.pt's content: what ``start_or_resume`` needs besides the best weights."""
    return {
        "run_id": run.job.run_id,
        "world_size": run.ctx.world_size,
        "n_rows": len(run.corpus),
        "step": run.step,
        "model": run.encoder.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "rng": rngs,
        "evaluations": progress.evaluations,
        "best": progress.best,
        "log_offset": log_offset,
        "elapsed_s": elapsed,
    }


def _open_log(run: TrainingParts, truncate_at: int) -> RunLog:
    job = run.job
    return open_run_log(
        job.out_dir / LOG_FILE,
        truncate_at,
        job.train.loggers if job.live_dir is not None else (),
        job.live_dir,
        str(job.config.get("experiment", job.run_id)),
        job.config,
    )
