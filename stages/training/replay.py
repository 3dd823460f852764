"""For ``cse carry-over``: a planned run's first steps trained again under the current code (its
log records, to compare bit for bit with those a stored run of the same settings wrote), and the
values the current code's schedules give every update of the run (to compare with the whole
stored log; ``stages.core.planning.carry_over``)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from stages.core.identity.experiments import Run
from stages.core.schema.params import Params
from stages.core.storage import layout
from stages.core.storage.run_folders import LOG_FILE, read_config, read_log
from stages.objectives.temperature import tau_at
from stages.training.loop import train
from stages.training.optim import build_optimizer, build_scheduler
from stages.training.run_folder import make_job, stsb_dev_evaluator

# How a stored run executed (its config.json's `execution`) -> the train setting that makes the
# replay execute alike: another device or precision draws other numbers, bit for bit.
EXECUTION_SETTINGS = {"device": "device", "precision": "precision", "unpadded": "unpad",
                      "compile": "compile"}  # fmt: skip


def replay_run(
    run: Run, params: Params, steps: int, execution: dict[str, Any], scratch: Path
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The log records of ``run``'s first ``steps`` updates, trained in ``scratch`` (removed
    afterwards) as the stored run's ``execution`` says it ran: on its device, in its precision,
    with its forward and as many CPU threads (runs from before the thread count was recorded:
    this process's); and the replay's own ``execution`` (its updates in all and per epoch, as
    the current code counts them)."""
    recorded = {
        setting: execution[key] for key, setting in EXECUTION_SETTINGS.items() if key in execution
    }
    if "device" in recorded:
        recorded["device"] = str(recorded["device"]).split(":")[0]
    train_settings = run.settings.train.model_copy(update=recorded)
    replayed = replace(run, settings=run.settings.model_copy(update={"train": train_settings}))
    job = replace(make_job(replayed, params, scratch), live_dir=None)
    threads = torch.get_num_threads()
    if "threads" in execution:
        torch.set_num_threads(execution["threads"])
    try:
        train(job, stsb_dev_evaluator(layout.senteval_dir()), until_step=steps)
        return read_log(scratch / LOG_FILE), (read_config(scratch) or {}).get("execution", {})
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(scratch, ignore_errors=True)


def schedule_values(
    run: Run, params: Params, total_steps: int, steps_per_epoch: int
) -> dict[int, dict[str, Any]]:
    """Update (1-based) -> the learning rate, temperature and epoch the training loop logs for
    it, from the current code's schedules over ``total_steps`` updates: the optimizer and
    scheduler the loop builds (the rate read before the update's scheduler step), the
    temperature schedule the loop calls, ``steps_per_epoch`` updates per epoch. No data, no
    forward: about 30 microseconds an update."""
    job = make_job(run, params, layout.run_dir(run.run_id))
    objective, settings = job.objective, job.train
    optimizer = build_optimizer(torch.nn.Linear(1, 1), settings)
    scheduler = build_scheduler(optimizer, settings, total_steps)
    optimizer.step()  # no gradients, no change; torch warns of a scheduler stepped before it
    values = {}
    for t in range(1, total_steps + 1):
        tau = (
            tau_at(job.temperature, t, total_steps, objective.initial_tau)
            if objective.uses_temperature and objective.initial_tau is not None
            else None
        )
        values[t] = {"lr": scheduler.get_last_lr()[0], "tau": tau, "epoch": t / steps_per_epoch}
        scheduler.step()
    return values
