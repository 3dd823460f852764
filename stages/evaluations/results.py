"""What every evaluation shares: its target (a planned experiment, or any model with ``--model``;
the flags are ``stages.core.cli.add_target_arguments``), the stored result of the same evaluation,
and the results JSON.

A registered evaluation (``stages.core.schema.evaluation_settings``) run for a planned experiment
with its params as written is stored under its id (``Plan.evaluation_id``) and reused from there
when it is asked for again; with flags that change what it computes it is an ad hoc run, written
only where ``--output`` says.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stages.core.errors import StageError
from stages.core.identity.environment import software
from stages.core.identity.experiments import Experiment, Plan
from stages.core.planning.evaluation_store import reuse_evaluation, store_evaluation
from stages.core.schema.evaluation_settings import output_file
from stages.core.schema.params import DEFAULT_PARAMS, Params, load_params
from stages.core.storage.atomic import write_json

if TYPE_CHECKING:
    from stages.modeling.encoder import SentenceEncoder

# (encoder, output path) -> the results the stage computes
Evaluate = Callable[["SentenceEncoder", Path], dict[str, Any]]


@dataclass(frozen=True)
class Target:
    """What an evaluation scores, and where its results JSON goes: a planned experiment of
    ``plan``, or any ``model`` loaded with ``model_options`` (pooler, revision, precision,
    max_length)."""

    output: Path
    device: str = "auto"
    plan: Plan | None = None
    experiment: Experiment | None = None
    model: str | None = None
    model_options: dict[str, Any] = field(default_factory=dict)


def project_params(params_file: str) -> Params | None:
    """The params file an evaluation reads: ``params_file`` when it exists or was named
    (``--params``: a missing one is an error); None outside a project (ad hoc ``--model``
    evaluations take the schema's defaults)."""
    if Path(params_file).is_file() or params_file != str(DEFAULT_PARAMS):
        return load_params(params_file)
    return None


def target_from_arguments(args: argparse.Namespace, evaluation: str, plan: Plan | None) -> Target:
    """The target the parsed flags name (``plan``: the params file's, if there is one)."""
    if args.experiment:
        if plan is None:
            raise StageError(f"--experiment needs a params file; {args.params} not found")
        experiment = plan.experiment(args.experiment)
        output = Path(args.output or output_file(evaluation, experiment.name))
        return Target(output, args.device, plan, experiment)
    if not args.output:
        raise StageError("--output is required with --model (where to write the results JSON)")
    options = {"pooler": args.pooler, "revision": args.revision, "precision": args.precision}
    if args.max_length:
        options["max_length"] = args.max_length
    return Target(Path(args.output), args.device, model=args.model, model_options=options)


def run_evaluation(
    evaluation: str,
    target: Target,
    evaluate: Evaluate,
    *,
    stored: bool,
    batch_size: int,
    beside: Sequence[str] = (),
) -> tuple[Path, dict[str, Any] | None]:
    """Score ``target`` and write the results JSON (with the environment). ``stored``: the
    matrix's own evaluation of a planned experiment, reused from its id when stored and stored
    under it when computed, with the folders named ``beside`` that ``evaluate`` writes next to
    it. Returns the output and the results, or None for the results when the stored result of
    the same evaluation was written instead."""
    output, plan, experiment = target.output, target.plan, target.experiment
    folders = [output.parent / name for name in beside]
    # stages.evaluations.target is imported only once a model is needed: it loads torch and
    # transformers (~8 s of a stage's start), and a result reused from the store needs neither.
    if experiment is not None and plan is not None:
        if stored and reuse_evaluation(plan, evaluation, experiment, output, folders):
            return output, None
        from stages.evaluations.target import encoder_for

        encoder = encoder_for(experiment, batch_size=batch_size, device=target.device)
    else:
        from stages.evaluations.target import load_encoder

        assert target.model is not None
        encoder = load_encoder(
            target.model, batch_size=batch_size, device=target.device, **target.model_options
        )
    results = evaluate(encoder, output)
    record = {**results, "environment": software()}
    if stored and experiment is not None and plan is not None:
        record = store_evaluation(plan, evaluation, experiment, record, folders)
    write_json(output, record)
    return output, results
