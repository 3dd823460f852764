"""Stage: evaluate a sentence encoder with the SentEval protocol (STS and transfer tasks).

Scores STS12-16, STS-B, SICK-R and the seven transfer tasks, and writes a results JSON that
records the protocol next to the numbers.

    python -m stages.evaluate senteval --experiment NAME [--params FILE]
    python -m stages.evaluate senteval --model NAME_OR_DIR [--pooler P] [--tasks ...]
        [--data-dir DIR] [--mode fasttest|test] --output results.json

``--experiment`` evaluates a run of the matrix (its best checkpoint) or a ``baseline.<key>``
and writes ``experiments/<NAME>/senteval.json``.

``--model`` is a Hugging Face id, a local model directory, ``package:<module>``, or a trained
checkpoint directory (its ``encoder.json`` gives the pooler). Defaults come from params.yaml's
``evaluations.senteval`` when there is one. Embeddings are cached per (encoder, task) under
``--cache-dir``, so re-running with another mode only re-trains the classifiers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stages.core.cli import add_target_arguments, parse_target_arguments, parser, positive_int
from stages.core.errors import StageError
from stages.core.identity.experiments import plan_experiments
from stages.core.schema.data_check import verify_workspace_data
from stages.core.schema.evaluation_settings import (
    SENTEVAL_STS_TASKS,
    SENTEVAL_TASKS,
    SENTEVAL_TRANSFER_TASKS,
    SentEvalParams,
)
from stages.core.storage import layout
from stages.evaluations.results import project_params, run_evaluation, target_from_arguments
from stages.senteval_protocol.loaders import TASK_FOLDERS, DataFormatError, downstream_dir

if TYPE_CHECKING:
    from stages.modeling.encoder import SentenceEncoder

DEFAULT_CACHE = layout.embedding_cache_dir()


def evaluate_encoder(
    encoder: SentenceEncoder,
    settings: SentEvalParams,
    *,
    data_dir: str | Path | None = None,
    cache_dir: str | Path | None = DEFAULT_CACHE,
) -> dict[str, Any]:
    """Results of ``encoder`` on ``settings.tasks`` (bad data or embeddings: StageError)."""
    # Imported here, not at the top: a stage that reuses its stored result loads no torch.
    from stages.modeling.encoder import EncoderError
    from stages.senteval_protocol.cache import EmbeddingCache
    from stages.senteval_protocol.embeddings import EncoderOutputError
    from stages.senteval_protocol.protocol import evaluate

    senteval_batches = settings.encoding == "senteval_batches"
    # SentEval's batches are encoded per occurrence: nothing to cache per distinct sentence
    cache = EmbeddingCache(cache_dir, encoder.fingerprint) if cache_dir else None
    try:
        return evaluate(
            # each of SentEval's batches as one padded batch, as SimCSE's batcher encodes it
            encoder.encode_batch if senteval_batches else encoder,
            settings.tasks,
            data_dir or settings.data_dir,
            settings.mode,
            # distinct: the encoder batches by token length itself
            batch_size=settings.batch_size if senteval_batches else None,
            seed=settings.seed,
            device=encoder.device,
            cache=None if senteval_batches else cache,
            encoder=encoder.describe(),
            encoding=settings.encoding,
        )
    except (DataFormatError, EncoderOutputError, EncoderError) as err:
        raise StageError(str(err)) from None


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0], prog="python -m stages.evaluate senteval")
    add_target_arguments(p)
    p.add_argument(
        "--tasks", nargs="+", choices=SENTEVAL_TASKS, metavar="TASK", help="default: params"
    )
    p.add_argument("--data-dir", help="SentEval data root (holds downstream/); default: params")
    p.add_argument("--mode", choices=("fasttest", "test"), help="default: params")
    p.add_argument(
        "--batch-size", type=positive_int, help="sentences per encoder call; default: params"
    )
    p.add_argument(
        "--encoding",
        choices=("distinct", "senteval_batches"),
        help="distinct sentences once (fast) or SentEval's own batches; default: params",
    )
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="embedding cache root")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    args = parse_target_arguments(p, argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    params = project_params(args.params)
    settings = params.evaluations.senteval if params else SentEvalParams()
    overrides = {
        "tasks": args.tasks,
        "mode": args.mode,
        "batch_size": args.batch_size,
        "encoding": args.encoding,
    }
    settings = settings.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    data_dir = args.data_dir or settings.data_dir
    try:  # before loading a model, which can take a while
        downstream_dir(data_dir)
    except DataFormatError as err:
        raise StageError(str(err)) from None
    downstream = Path(data_dir) / "downstream"
    verify_workspace_data(
        *(downstream / TASK_FOLDERS[task] for task in settings.tasks), params_file=args.params
    )
    # the matrix's own evaluation (no command-line overrides) is stored under its id
    as_planned = args.experiment and not any(
        (
            args.tasks,
            args.mode,
            args.batch_size,
            args.encoding,
            args.data_dir,
            args.output,
            args.no_cache,
        )
    )
    cache_dir = None if args.no_cache else args.cache_dir
    plan = plan_experiments(params) if params and args.experiment else None
    output, results = run_evaluation(
        "senteval",
        target_from_arguments(args, "senteval", plan),
        lambda encoder, _: evaluate_encoder(
            encoder, settings, data_dir=data_dir, cache_dir=cache_dir
        ),
        stored=bool(as_planned),
        batch_size=settings.batch_size,
    )
    summary = results["summary"] if results else {}
    for key in ("sts_avg", "transfer_avg"):
        if key in summary:
            print(f"{key}: {summary[key]:.2f}")
    print(f"wrote {output}" + ("" if results else " (the stored result of the same evaluation)"))


# What ``cse carry-over`` asks of an evaluation (stages/commands/carry_over.py): a cheap sample
# of its settings, its score under them, and a record's results per task, to compare exactly.


def sample(settings: SentEvalParams) -> SentEvalParams:
    """The first STS task and the first transfer task the settings score."""
    sts = [t for t in settings.tasks if t in SENTEVAL_STS_TASKS][:1]
    transfer = [t for t in settings.tasks if t in SENTEVAL_TRANSFER_TASKS][:1]
    return settings.model_copy(update={"tasks": (*sts, *transfer)})


def score(encoder: SentenceEncoder, settings: SentEvalParams, label: str, workdir: Path) -> dict:
    """The results of ``encoder`` under ``settings``, encoded afresh (no embedding cache)."""
    return evaluate_encoder(encoder, settings, cache_dir=None)


def mismatches(record: dict[str, Any], settings: SentEvalParams) -> list[str]:
    """What a results record says it computed that ``settings`` would not."""
    protocol = record.get("protocol", {})
    recorded = {
        "tasks": tuple(protocol.get("tasks", ())),
        "mode": protocol.get("mode"),
        "seed": protocol.get("classifier", {}).get("seed"),
        # records from before the switch encoded distinct sentences
        "encoding": protocol.get("encoding", "distinct"),
    }
    planned = {
        "tasks": settings.tasks,
        "mode": settings.mode,
        "seed": settings.seed,
        "encoding": settings.encoding,
    }
    return [
        f"{k}: {recorded[k]!r}, not {planned[k]!r}" for k in planned if recorded[k] != planned[k]
    ]


def task_results(record: dict[str, Any]) -> dict[str, Any]:
    """A results record's scores per task (its timings are elsewhere)."""
    return record.get("tasks", {})
