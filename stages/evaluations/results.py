"""What every evaluation stage shares: its target (a planned experiment, or any model with
``--model``; the flags are ``stages.core.cli.add_target_arguments``), the stored result of the same
evaluation, and the results JSON.

A registered evaluation (``stages.core.schema.evaluation_settings``) run for a planned experiment
with its params as written is stored under its id
(``stages.core.identity.experiments.evaluation_id``) and reused from there when it is asked for
again; with flags that change what it computes it is an ad hoc run, written only where ``--output``
says."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stages.core.errors import StageError
from stages.core.identity.environment import software
from stages.core.identity.experiments import plan_baselines, plan_runs
from stages.core.planning.evaluation_store import reuse_evaluation, store_evaluation
from stages.core.schema.evaluation_settings import output_file
from stages.core.schema.params import Params
from stages.core.storage.atomic import write_json

if TYPE_CHECKING:
    from stages.modeling.encoder import SentenceEncoder

# (encoder, output path) -> the results the stage computes
Evaluate = Callable[["SentenceEncoder", Path], dict[str, Any]]


def require_planned(name: str, params: Params) -> None:
    """Refuse an experiment that is neither a planned run nor a baseline, listing them."""
    planned = [*plan_runs(params), *plan_baselines(params)]
    if name not in planned:
        raise StageError(f"unknown experiment '{name}'; planned: {', '.join(planned) or '(none)'}")


def run_evaluation(
    evaluation: str,
    args: argparse.Namespace,
    params: Params | None,
    evaluate: Evaluate,
    *,
    as_planned: bool,
    batch_size: int,
    beside: Sequence[str] = (),
) -> tuple[Path, dict[str, Any] | None]:
    """Score the target of ``args`` and write the results JSON (with the environment; stored
    under the evaluation's id when ``as_planned``, with the folders named ``beside`` that
    ``evaluate`` writes next to it). Returns the output and the results, or None for the
    results when the stored result of the same evaluation was written instead."""
    # stages.evaluations.target is imported only once a model is needed: it loads torch and
    # transformers (~8 s of a stage's start), and a result reused from the store needs neither.
    if args.experiment:
        if params is None:
            raise StageError(f"--experiment needs a params file; {args.params} not found")
        require_planned(args.experiment, params)
        output = Path(args.output or output_file(evaluation, args.experiment))
        folders = [output.parent / name for name in beside]
        if as_planned and reuse_evaluation(evaluation, args.experiment, params, output, folders):
            return output, None
        from stages.evaluations.target import encoder_for

        encoder = encoder_for(args.experiment, params, batch_size=batch_size, device=args.device)
    elif not args.output:
        raise StageError("--output is required with --model (where to write the results JSON)")
    else:
        from stages.evaluations.target import load_encoder

        output = Path(args.output)
        options = {"max_length": args.max_length} if args.max_length else {}
        encoder = load_encoder(
            args.model,
            args.pooler,
            revision=args.revision,
            batch_size=batch_size,
            device=args.device,
            precision=args.precision,
            **options,
        )
    results = evaluate(encoder, output)
    record = {**results, "environment": software()}
    if as_planned and params is not None:
        folders = [output.parent / name for name in beside]
        record = store_evaluation(evaluation, args.experiment, params, record, folders)
    write_json(output, record)
    return output, results
