"""How far a run got, and how a run gets back there: the dev evaluations, the best one and its
weights, the training time of earlier sessions (``Progress``); the fresh start or the resumption
from the latest checkpoint (``start_or_resume``); what a checkpoint's state.pt holds
(``checkpoint_state``; the files themselves: ``resume``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from stages.core.errors import StageError
from stages.core.storage.atomic import write_json
from stages.core.storage.run_folders import CONFIG_FILE, LOG_FILE
from stages.training.checkpoints import latest_checkpoint, load_checkpoint, restore_rng_state
from stages.training.distributed import rank_seed
from stages.training.live import RunLog, open_run_log
from stages.training.parts import TrainingParts


@dataclass
class Progress:
    """A run's progress besides its step; a checkpoint keeps it, a resumed run restores it."""

    evaluations: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None  # the best evaluation: its step and scores
    best_weights: dict[str, torch.Tensor] | None = None  # the encoder's then, on the host
    best_unsaved: bool = False  # the best weights changed since the last checkpoint
    elapsed_before: float = 0.0  # seconds trained by the earlier sessions of a resumed run

    def add_evaluation(
        self, step: int, scores: dict[str, float], key: str, encoder: PreTrainedModel
    ) -> bool:
        """Record the evaluation of ``step``; if it has the best finite ``key`` score so far (the
        earlier one wins a tie), keep ``encoder``'s weights as the best. Whether it has."""
        improved = math.isfinite(scores[key]) and (
            self.best is None or scores[key] > self.best[key]
        )
        if improved:
            self.best = {"step": step, **scores}
            self.best_weights = {
                k: v.detach().to("cpu", copy=True) for k, v in encoder.state_dict().items()
            }
            self.best_unsaved = True
        self.evaluations.append({"step": step, **scores})
        return improved


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
    log = _open_log(run, truncate_at=state["log_offset"])
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
