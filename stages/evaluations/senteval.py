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
from stages.core.planning.carry_over import ENCODER_IDENTITY_KEYS, only, without
from stages.core.schema.data_check import verify_workspace_data
from stages.core.schema.evaluation_settings import (
    SENTEVAL_TASKS,
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


# What ``cse carry-over`` asks of an evaluation (the contract: stages/evaluations/__init__.py):
# a sample of its settings that reaches each of its code paths, its score under them, whether a
# record computed what the settings would, the part of a record that scoring given tasks
# determines, and the summary the current code computes from a record's task results.

# One task per code path: an STS12-16 task (its subsets), STS-B or SICK-R (dev and test splits;
# STS-B also gives alignment and uniformity), a binary transfer task (SentEval's inner k-fold;
# the cheapest first), SST2 (its train/dev/test split), TREC (k-fold with a test set) and MRPC
# (pair features, k-fold, F1).
SAMPLED_PATHS = (
    ("STS12", "STS13", "STS14", "STS15", "STS16"),
    ("STSBenchmark", "SICKRelatedness"),
    ("CR", "SUBJ", "MPQA", "MR"),
    ("SST2",),
    ("TREC",),
    ("MRPC",),
)
# What a record holds besides what its tasks' scoring gives: timings, environment, its ids.
UNCOMPARED = ("timings", "environment", "evaluation_id", "carried_over")


def sample(settings: SentEvalParams) -> tuple[str, ...]:
    """The first task of each code path the settings score (``SAMPLED_PATHS``), in their order."""
    chosen = [
        next(task for task in path if task in settings.tasks)
        for path in SAMPLED_PATHS
        if any(task in settings.tasks for task in path)
    ]
    return tuple(task for task in settings.tasks if task in chosen)


def score(
    encoder: SentenceEncoder,
    settings: SentEvalParams,
    tasks: Sequence[str],
    label: str,
    workdir: Path,
) -> dict:
    """The results of ``encoder`` on ``tasks`` as the evaluation under ``settings`` scores
    them, computed afresh: with the distinct encoding a sentence is encoded with the first task
    that has it, in a batch of that task's sentences, so the tasks of ``settings`` up to the
    last of ``tasks`` are encoded first, in order (not scored), into a cache in ``workdir``
    that ``tasks`` are then read from."""
    from stages.senteval_protocol.cache import EmbeddingCache
    from stages.senteval_protocol.embeddings import EmbeddingTable
    from stages.senteval_protocol.loaders import load_task

    sampled = settings.model_copy(update={"tasks": tuple(tasks)})
    if settings.encoding != "distinct":  # SentEval's batches: each task's own
        return evaluate_encoder(encoder, sampled, cache_dir=None)
    cache = EmbeddingCache(workdir, encoder.fingerprint)
    table = EmbeddingTable(encoder, None, cache, empty_sentence="")  # as the protocol's
    downstream = downstream_dir(settings.data_dir)
    last = max(settings.tasks.index(task) for task in tasks)
    for name in settings.tasks[: last + 1]:
        table.add(name, load_task(downstream, name).texts)
    return evaluate_encoder(encoder, sampled, cache_dir=workdir)


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


def comparable(record: dict[str, Any], tasks: Sequence[str]) -> dict[str, Any]:
    """What of ``record`` scoring ``tasks`` alone gives: every key but ``UNCOMPARED``, with
    the per-task parts (results, table rows, data files, alignment and uniformity from STS-B
    dev) cut to ``tasks`` and the averages left to ``recomputed_summary``."""
    part = without(record, UNCOMPARED)
    part["encoder"] = without(record.get("encoder", {}), ENCODER_IDENTITY_KEYS)
    part["tasks"] = only(record.get("tasks", {}), tasks)
    summary = record.get("summary", {})
    part["summary"] = {table: only(summary.get(table, {}), tasks) for table in ("sts", "transfer")}
    protocol = without(record.get("protocol", {}), ("tasks",))
    data = protocol.get("data", {})
    protocol["data"] = {**data, "files": only(data.get("files", {}), tasks)}
    protocol["sts_years"] = only(protocol.get("sts_years", {}), tasks)
    part["protocol"] = protocol
    if "STSBenchmark" not in tasks:
        part.pop("alignment_uniformity", None)
    return part


def recomputed_summary(record: dict[str, Any]) -> dict[str, Any]:
    """The record's summary (the report's table rows and their averages) as the current code
    computes it from the record's task results."""
    from stages.senteval_protocol.protocol import _summary

    return {"summary": _summary(record.get("tasks", {}))}
