"""Stage train: train one experiment of the matrix (SimCSE protocol) into runs/<run_id>/.

    python -m stages.train EXPERIMENT [--params params.yaml]
    torchrun --nproc_per_node=4 -m stages.train EXPERIMENT      # data-parallel

A run trains in runs/<run_id>.partial/ (resumed from its latest checkpoint if one is there)
and is renamed to runs/<run_id>/ when finished; a finished run is a cache hit. Either way the
stage then writes experiments/<name>/train.json, the small pointer the orchestrators track.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from stages import cli, layout
from stages.atomic import write_json, write_text
from stages.cli import StageError, parser
from stages.experiments import Run, plan_runs
from stages.params import Params, load_params
from stages.senteval_protocol.dev import StsbDevEvaluation
from stages.senteval_protocol.loaders import DataFormatError
from stages.training.dev import DevEvaluator, Encode
from stages.training.distributed import Distributed, from_environment
from stages.training.loop import LOG_FILE, METRICS_FILE, TrainJob, train
from stages.training.records import read_log
from stages.training.resume import remove_checkpoints

POINTER_FILE = "train.json"


def stsb_dev_evaluator(data_dir: Path) -> DevEvaluator:
    """STS-B dev exactly as the SentEval stage scores it (``StsbDevEvaluation``): Spearman x100
    of cosine vs gold, plus alignment and uniformity of the same embeddings. The trainer's
    encoder batches by token length itself, so it gets all distinct sentences in one call."""
    try:
        evaluation = StsbDevEvaluation(data_dir, batch_size=None)
    except (DataFormatError, OSError) as error:
        raise StageError(f"STS-B dev set (checkpoint selection): {error}") from error

    def evaluate(encode: Encode) -> dict[str, float]:
        scores = evaluation(encode)
        return {
            "spearman": scores.spearman,
            "alignment": scores.alignment,
            "uniformity": scores.uniformity,
        }

    return evaluate


def run_config(run: Run, params: Params) -> dict[str, Any]:
    """config.json of a run: its identity (what the run id hashes) and resolved settings."""
    return {
        "run_id": run.run_id,
        "experiment": run.name,
        "method": run.method,
        "backbone": run.backbone,
        "seed": run.seed,
        "identity": run.identity,
        "settings": run.settings.model_dump(mode="json"),
        "backbone_spec": run.backbone_spec.model_dump(mode="json"),
        "corpus": str(layout.corpus_file(params.data.corpus)),
        "triplets": str(layout.triplets_file(run.backbone)) if run.needs_triplets else None,
        "triplets_id": run.triplets_id,
    }


def make_job(run: Run, params: Params, out_dir: Path) -> TrainJob:
    return TrainJob(
        run_id=run.run_id,
        objective=run.settings.objective,
        temperature=run.settings.temperature,
        train=run.settings.train,
        backbone=run.backbone_spec,
        backbone_name=run.backbone,
        seed=run.seed,
        corpus=layout.corpus_file(params.data.corpus),
        max_sentences=params.data.max_sentences,
        triplets=layout.triplets_file(run.backbone) if run.needs_triplets else None,
        out_dir=out_dir,
        cache_dir=layout.CACHE / "tokenized",
        config=run_config(run, params),
        eval_batch_size=params.senteval.batch_size,
        live_dir=layout.live_dir(run.name),
    )


def train_run(run: Run, params: Params, ctx: Distributed | None = None) -> Path:
    """The finished run folder of ``run``, training (or resuming) it unless it is cached."""
    ctx = ctx or from_environment()
    final = layout.run_dir(run.run_id)
    if (final / METRICS_FILE).is_file():
        return final
    partial = final.with_name(final.name + ".partial")
    if not (partial / METRICS_FILE).is_file():
        evaluate = stsb_dev_evaluator(layout.senteval_dir())
        train(make_job(run, params, partial), evaluate, ctx)
    if ctx.is_main:
        remove_checkpoints(partial)
        if final.exists():  # an unfinished leftover without metrics.json
            shutil.rmtree(final)
        os.replace(partial, final)
    return final


def write_pointer(run: Run, folder: Path) -> dict[str, Any]:
    """experiments/<name>/train.json; rewritten only when its content changes."""
    metrics = json.loads((folder / METRICS_FILE).read_text(encoding="utf-8"))
    pointer = {
        "experiment": run.name,
        "method": run.method,
        "backbone": run.backbone,
        "seed": run.seed,
        "run_id": run.run_id,
        "run_dir": str(folder),
        "best_model": str(folder / "best"),
        "best_dev_spearman": metrics["best"]["spearman"],
        "best_step": metrics["best"]["step"],
        "steps": metrics["steps"],
        "wall_time_s": metrics["timing"]["wall_s"],
    }
    dest = layout.experiment_dir(run.name) / POINTER_FILE
    if not dest.is_file() or json.loads(dest.read_text(encoding="utf-8")) != pointer:
        write_json(dest, pointer)
    return pointer


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


def write_curves(run: Run, folder: Path) -> None:
    """experiments/<name>/{train_steps,dev_evals}.csv from the run's log; rewritten only when
    their content changes."""
    tables = curve_tables(read_log(folder / LOG_FILE))
    for dest, text in (
        (layout.train_steps_file(run.name), tables["train"]),
        (layout.dev_curve_file(run.name), tables["eval"]),
    ):
        if not dest.is_file() or dest.read_text(encoding="utf-8") != text:
            write_text(dest, text)


def main(argv: Sequence[str] | None = None) -> None:
    p = parser("Train one experiment (method.backbone.seed) with the SimCSE protocol.")
    p.add_argument("experiment", help="experiment name, e.g. simcse.bert-base.s42")
    args = p.parse_args(argv)
    params = load_params(args.params)
    runs = plan_runs(params)
    if args.experiment not in runs:
        raise StageError(
            f"unknown experiment '{args.experiment}'; planned: {', '.join(runs) or '(none)'}"
        )
    selected = runs[args.experiment]
    ctx = from_environment()
    folder = train_run(selected, params, ctx)
    if ctx.is_main:
        write_curves(selected, folder)
        write_pointer(selected, folder)


if __name__ == "__main__":
    cli.run(main)
