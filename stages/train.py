"""Stage train: train one experiment of the matrix (SimCSE protocol) into runs/<run_id>/.

    python -m stages.train EXPERIMENT [--params params.yaml]
    torchrun --nproc_per_node=4 -m stages.train EXPERIMENT      # data-parallel

A run trains in runs/<run_id>.partial/ (resumed from its latest checkpoint if one is there)
and is renamed to runs/<run_id>/ when finished; a finished run is a cache hit, found without
importing torch. Either way the stage then writes experiments/<name>/train.json, the small
pointer the orchestrators track, and the run's curves as CSV.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import polars as pl

from stages.core import cli
from stages.core.cli import parser
from stages.core.errors import StageError
from stages.core.identity.experiments import STSB_DEV, Plan, Run, plan_experiments
from stages.core.planning.cpu_guard import cpu_guard
from stages.core.planning.train_pointer import write_train_pointer
from stages.core.schema.data_check import verify_workspace_data
from stages.core.schema.params import load_params
from stages.core.storage import layout
from stages.core.storage.atomic import remove_temporaries, write_text
from stages.core.storage.input_guard import watch
from stages.core.storage.run_folders import (
    LOG_FILE,
    METRICS_FILE,
    is_complete,
    read_log,
)
from stages.core.storage.run_lock import run_lock
from stages.core.storage.shared_store import SharedStore, store_url


def curve_tables(log: list[dict[str, Any]]) -> dict[str, str]:
    """log.jsonl as two CSV tables DVC plots can read (it does not read JSONL): one row per
    optimizer step (loss, tau, lr, grad_norm, objective and batch statistics) and one per dev
    evaluation (spearman, alignment, uniformity)."""
    tables = {}
    for event, drop in (("train", {"event"}), ("eval", {"event", "best", "eval_s"})):
        rows = [{k: v for k, v in r.items() if k not in drop} for r in log if r["event"] == event]
        columns = list(dict.fromkeys(k for r in rows for k in r))
        frame = pl.DataFrame(rows, schema=columns, infer_schema_length=None, orient="row")
        tables[event] = frame.write_csv(float_precision=None)
    return tables


def write_if_changed(path: Path, text: str) -> None:
    """Rewrite only when the content changes, so unchanged outputs keep their bytes and mtime."""
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        write_text(path, text)


def write_outputs(run: Run) -> None:
    """The pointer and the curves of a finished run."""
    tables = curve_tables(read_log(run.run_dir / LOG_FILE))
    steps, dev = run.curve_files
    write_if_changed(steps, tables["train"])
    write_if_changed(dev, tables["eval"])
    write_train_pointer(run)


def main(argv: Sequence[str] | None = None) -> None:
    p = parser("Train one experiment (method.backbone.seed) with the SimCSE protocol.")
    p.add_argument("experiment", help="experiment name, e.g. simcse.bert-base.s42")
    args = p.parse_args(argv)
    inputs = watch(Path(args.params))
    params = load_params(args.params)
    plan = plan_experiments(params)
    run = plan.run(args.experiment)
    main_process = os.environ.get("RANK", "0") == "0"
    url = store_url(params.store.url)
    store = SharedStore(url, params.store.settings()) if url else None
    stored = is_complete(run.run_dir)
    if not stored:
        obtain(run, plan, args.params, store, main_process)
    if main_process:
        # the run is stored under the id of the params read; the pointer, which the
        # orchestrators record against the params file, only while that file is unchanged
        with inputs.guarding():
            write_outputs(run)
        if stored:  # said, so that the job's log tells where its result came from
            print(f"wrote {run.pointer_file} (the stored run {run.run_id}, trained before)")


def obtain(
    run: Run, plan: Plan, params_file: str, store: SharedStore | None, main_process: bool
) -> None:
    """Fetch the run from the shared store when it has it complete; otherwise train it here
    (holding the run's lock, and the store's lease) and publish it."""
    if store is not None and store.manifest(run.run_id) is not None:
        if main_process:  # other ranks of a torchrun have nothing to do
            store.fetch(run.run_id, run.run_dir)
        return
    stop = cpu_guard(plan, params_file)
    if stop:
        raise StageError(stop)
    verify_workspace_data(run.corpus, layout.DATA / STSB_DEV, params_file=params_file)
    from stages.training.run_folder import train_run  # torch: only when there is work to do

    if not main_process:
        train_run(run, plan.params)
        return
    with (
        run_lock(run.run_dir, run.name),
        store.lease(run.run_id, run.name) if store else nullcontext(),
    ):
        # the lock's holder is the run's only writer: temporaries in its folder are a killed
        # writer's, whichever host it ran on
        remove_temporaries(run.partial_dir)
        if store is not None and store.manifest(run.run_id) is not None:  # finished meanwhile
            store.fetch(run.run_id, run.run_dir)
            return
        try:
            train_run(run, plan.params)
        except (KeyboardInterrupt, cli.Terminated) as stop:
            stop.add_note(_resumption(run))
            raise
        if store is not None:
            try:
                store.publish(run.run_id, run.run_dir, run.name)
            except (KeyboardInterrupt, cli.Terminated) as stop:
                # a rerun finds the run complete here and does not publish it again
                stop.add_note(
                    f"run {run.run_id} ({run.name}) is complete here but not in the shared "
                    "store: `cse store push` publishes it"
                )
                raise


def _resumption(run: Run) -> str:
    """What an interrupted training run leaves for its rerun."""
    from stages.training.checkpoints import latest_checkpoint

    if (run.partial_dir / METRICS_FILE).is_file():  # trained; the final rename was cut short
        return f"run {run.run_id} ({run.name}) finished training: a rerun completes it"
    checkpoint = latest_checkpoint(run.partial_dir)
    if checkpoint is None:
        return f"run {run.run_id} ({run.name}) had no checkpoint yet: a rerun starts it afresh"
    return (
        f"run {run.run_id} ({run.name}) stays unfinished in {run.partial_dir}; a rerun resumes "
        f"it from {checkpoint.name}"
    )


if __name__ == "__main__":
    cli.run(main)
