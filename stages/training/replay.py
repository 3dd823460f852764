"""A planned run's first steps trained again under the current code, for ``cse carry-over``: its
log records, to compare bit for bit with those a stored run of the same settings wrote
(``stages.core.planning.carry_over``)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from stages.core.identity.experiments import Run
from stages.core.schema.params import Params
from stages.core.storage import layout
from stages.core.storage.run_folders import LOG_FILE, read_log
from stages.training.loop import train
from stages.training.run_folder import make_job, stsb_dev_evaluator

# How a stored run executed (its config.json's `execution`) -> the train setting that makes the
# replay execute alike: another device or precision draws other numbers, bit for bit.
EXECUTION_SETTINGS = {"device": "device", "precision": "precision", "unpadded": "unpad",
                      "compile": "compile"}  # fmt: skip


def replay_run(
    run: Run, params: Params, steps: int, execution: dict[str, Any], scratch: Path
) -> list[dict[str, Any]]:
    """The log records of ``run``'s first ``steps`` updates, trained in ``scratch`` (removed
    afterwards) as the stored run's ``execution`` says it ran: on its device, in its precision,
    with its forward and as many CPU threads (runs from before the thread count was recorded:
    this process's)."""
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
        return read_log(scratch / LOG_FILE)
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(scratch, ignore_errors=True)
