"""Stage: evaluate a sentence encoder on MTEB with the official mteb package.

    python -m stages.evaluate mteb --experiment NAME [--params FILE]
    python -m stages.evaluate mteb --model NAME_OR_DIR [--pooler P] [--tasks SET | TASK ...]
        [--name LABEL] --output results.json

``--experiment`` evaluates a run of the matrix (or a ``baseline.<key>``) and writes
``experiments/<NAME>/mteb.json``. ``--model`` is a Hugging Face id, a local model directory,
``package:<module>`` or a trained checkpoint directory (its ``encoder.json`` gives the pooler).
Settings come from params.yaml's ``evaluations.mteb`` (when there is one); flags override them.
mteb's own result files stay under the cache folder, keyed by model name and revision, and are
copied in mteb's results layout to ``mteb_results/`` beside the output (``mteb.ResultCache`` reads
it: compare with published models using mteb's tooling); a stored evaluation keeps a copy of it,
which reusing the evaluation writes back.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from stages.core.cli import add_target_arguments, parse_target_arguments, parser, positive_int
from stages.core.errors import StageError
from stages.core.identity.experiments import plan_experiments
from stages.core.planning.carry_over import ENCODER_IDENTITY_KEYS, only, without
from stages.core.schema.data_check import verify_workspace_data
from stages.core.schema.evaluation_settings import MtebParams
from stages.core.schema.mteb_task_sets import TASK_SETS, task_names
from stages.evaluations.results import project_params, run_evaluation, target_from_arguments
from stages.mteb_protocol.native_results import NATIVE_DIR, native_results_dir

if TYPE_CHECKING:
    from stages.modeling.encoder import SentenceEncoder


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0], prog="python -m stages.evaluate mteb")
    add_target_arguments(
        p,
        max_length_help="truncation in tokens (default: the model's sentence-transformers "
        "max_seq_length if it declares one, else the longest it takes, at most 512)",
    )
    p.add_argument("--name", help="label in mteb's cache (default: from --model)")
    p.add_argument(
        "--tasks", nargs="+", metavar="TASK", help=f"{' | '.join(TASK_SETS)} or mteb task names"
    )
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction, help="default: params")
    p.add_argument("--local-source", choices=("senteval", "sts_raw"), help="default: params")
    p.add_argument("--sts-raw-dir", help="raw SemEval STS + stsbenchmark/ (default: params)")
    p.add_argument("--senteval-dir", help="SentEval data root (default: params)")
    p.add_argument("--no-local-data", action="store_true", help="take every task from the hub")
    p.add_argument("--cache-dir", help="mteb's result cache (default: params)")
    p.add_argument("--batch-size", type=positive_int, help="default: params")
    args = parse_target_arguments(p, argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    params = project_params(args.params)
    if args.model and args.output and not args.max_length:
        args.max_length = _declared_max_length(args.model, args.revision)
    plan = plan_experiments(params) if params and args.experiment else None
    target = target_from_arguments(args, "mteb", plan)
    method = target.experiment.method if target.experiment else None
    planned = params.evaluation_settings("mteb", method) if params else MtebParams()
    assert isinstance(planned, MtebParams)
    settings = _settings(planned, args)
    label = args.experiment or args.name or args.model
    output, results = run_evaluation(
        "mteb",
        target,
        lambda encoder, out: evaluate_encoder(
            encoder, label, settings, native_results_dir(out), params_file=args.params
        ),
        # the matrix's own evaluation (settings as params give them) is stored under its id
        stored=bool(args.experiment) and settings == planned,
        batch_size=settings.batch_size,
        beside=(NATIVE_DIR,),
    )
    if results is None:
        print(f"wrote {output} (the stored result of the same evaluation)")
    else:
        _print_summary(results, output)


def evaluate_encoder(
    encoder: SentenceEncoder,
    label: str,
    settings: MtebParams,
    native_dir: Path | None = None,
    params_file: str | None = None,
) -> dict[str, Any]:
    """The MTEB results of ``encoder`` under ``settings`` (expected failures: StageError); with
    ``native_dir``, also in mteb's own results layout there (``native_results.py``);
    ``params_file`` names the data source in the message of local data gone bad."""
    # Imported here, not at the top: a stage that reuses its stored result loads no torch or mteb.
    from stages.modeling.encoder import EncoderError
    from stages.mteb_protocol.benchmark import LocalData, NoTaskEvaluated, evaluate_mteb
    from stages.mteb_protocol.local_data import LocalDataError, local_paths, local_tasks
    from stages.mteb_protocol.mteb_encoder import MtebEncoder
    from stages.mteb_protocol.native_results import write_native_results

    local = (
        LocalData(settings.local_source, Path(settings.sts_raw_dir), Path(settings.senteval_dir))
        if settings.local_data
        else None
    )
    if local is not None:
        fed = [t for t in task_names(settings.tasks) if t in local_tasks(local.source)]
        verify_workspace_data(
            *(
                p
                for t in fed
                for p in local_paths(t, local.source, local.sts_raw_dir, local.senteval_dir)
            ),
            params_file=params_file,
        )
    model = MtebEncoder(encoder, label, normalize=settings.normalize)
    try:
        results = evaluate_mteb(
            model,
            settings.tasks,
            cache_dir=settings.cache_dir,
            local=local,
            batch_size=settings.batch_size,
        )
    except (NoTaskEvaluated, LocalDataError, EncoderError) as err:
        raise StageError(str(err)) from None
    if native_dir is not None:
        folder = write_native_results(
            settings.cache_dir, model.mteb_model_meta, results["evaluated"], native_dir
        )
        # relative to the results JSON's folder: true wherever a stored result is written back
        results["mteb_native_results"] = str(folder.relative_to(native_dir.parent))
    return results


def _settings(base: MtebParams, args: argparse.Namespace) -> MtebParams:
    overrides: dict[str, Any] = {
        "normalize": args.normalize,
        "local_source": args.local_source,
        "sts_raw_dir": args.sts_raw_dir,
        "senteval_dir": args.senteval_dir,
        "cache_dir": args.cache_dir,
        "batch_size": args.batch_size,
    }
    if args.tasks:
        named = len(args.tasks) == 1 and args.tasks[0] in TASK_SETS
        overrides["tasks"] = args.tasks[0] if named else args.tasks
    if args.no_local_data:
        overrides["local_data"] = False
    merged = base.model_dump() | {k: v for k, v in overrides.items() if v is not None}
    try:
        return MtebParams.model_validate(merged)
    except ValidationError as err:
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in err.errors())
        raise StageError(f"invalid MTEB settings: {problems}") from None


def _declared_max_length(model: str, revision: str) -> int | None:
    from stages.mteb_protocol.mteb_encoder import declared_max_length

    try:
        return declared_max_length(model, revision)
    except ValueError as err:
        raise StageError(str(err)) from None


def _print_summary(results: dict[str, Any], output: Path) -> None:
    for name in results["evaluated"]:
        row = results["tasks"][name]
        print(f"{name:40s} {row['main_score']:6.2f}  {row['metric']}  ({row['data']})")
    for name, reason in results["skipped"].items():
        print(f"{name:40s} skipped: {reason}")
    for category, row in results["categories"].items():
        print(f"{category} mean over {row['tasks']}/{row['requested']}: {row['mean']:.2f}")
    print(f"average over {len(results['evaluated'])} tasks: {results['average']:.2f}")
    print(f"wrote {output}; mteb's result files: {results['mteb_results_dir']}")
    if "mteb_native_results" in results:
        native = output.parent / results["mteb_native_results"]
        print(f"in mteb's results layout (mteb.ResultCache): {native}")


# What ``cse carry-over`` asks of an evaluation (the contract: stages/evaluations/__init__.py):
# a sample of its settings that reaches each of its code paths, its score under them, whether a
# record computed what the settings would, the part of a record that scoring given tasks
# determines, and the summary the current code computes from a record's task results.

# What a record holds besides what its tasks' scoring gives: timings, environment, its ids, where
# mteb's result files are (under the encoder's revision, which names its run), and the summary.
UNCOMPARED = ("timing", "environment", "evaluation_id", "carried_over", "mteb_results_dir",
              "mteb_native_results", "average", "categories", "complete")  # fmt: skip
# A task's entry besides its scores: whether it came from mteb's cache, where and how fast it ran.
UNCOMPARED_TASK_FIELDS = ("from_cache", "wall_s", "encode_s", "texts_encoded", "texts_per_s",
                          "mteb_evaluation_time_s", "result_file")  # fmt: skip


def sample(settings: MtebParams) -> tuple[str, ...]:
    """One task per category (mteb's task type) the settings request: the first with a local
    copy where local data is on (offline), else the category's first; in the settings' order."""
    import mteb

    from stages.mteb_protocol.local_data import local_tasks

    local = local_tasks(settings.local_source) if settings.local_data else ()
    by_category: dict[str, list[str]] = {}
    for name in task_names(settings.tasks):
        by_category.setdefault(mteb.get_task(name).metadata.type, []).append(name)
    chosen = {next((n for n in names if n in local), names[0]) for names in by_category.values()}
    return tuple(name for name in task_names(settings.tasks) if name in chosen)


def score(
    encoder: SentenceEncoder, settings: MtebParams, tasks: Sequence[str], label: str, workdir: Path
) -> dict:
    """The results of ``encoder`` on ``tasks`` under ``settings``, computed afresh (mteb's
    result cache in ``workdir``, empty; each task is encoded and scored on its own)."""
    fresh = settings.model_copy(
        update={"tasks": tuple(tasks), "cache_dir": str(workdir / "mteb-cache")}
    )
    return evaluate_encoder(encoder, label, fresh)


def mismatches(record: dict[str, Any], settings: MtebParams) -> list[str]:
    """What a results record says it computed that ``settings`` would not."""
    recorded = {
        "tasks": tuple(record.get("requested", ())),
        "normalize": record.get("encoder", {}).get("normalize"),
        "local_source": record.get("data", {}).get("local_source"),
    }
    planned = {
        "tasks": task_names(settings.tasks),
        "normalize": settings.normalize,
        "local_source": settings.local_source if settings.local_data else None,
    }
    return [
        f"{k}: {recorded[k]!r}, not {planned[k]!r}" for k in planned if recorded[k] != planned[k]
    ]


def comparable(record: dict[str, Any], tasks: Sequence[str]) -> dict[str, Any]:
    """What of ``record`` scoring ``tasks`` alone gives: every key but ``UNCOMPARED``, with
    the per-task parts cut to ``tasks`` (each task's entry without ``UNCOMPARED_TASK_FIELDS``)
    and the data's source without whether the hub was reachable."""
    part = without(record, UNCOMPARED)
    part["encoder"] = without(record.get("encoder", {}), ENCODER_IDENTITY_KEYS)
    # whether the hub could be reached where it ran: a sampled hub task offline is skipped
    part["data"] = without(record.get("data", {}), ("hub_offline",))
    part["tasks"] = {
        name: without(entry, UNCOMPARED_TASK_FIELDS)
        for name, entry in only(record.get("tasks", {}), tasks).items()
    }
    for key in ("requested", "evaluated"):
        part[key] = [name for name in record.get(key, ()) if name in tasks]
    part["skipped"] = only(record.get("skipped", {}), tasks)
    return part


def recomputed_summary(record: dict[str, Any]) -> dict[str, Any]:
    """The record's means (overall, per category) and completeness as the current code
    computes them from the record's task results."""
    from stages.mteb_protocol.benchmark import score_summary

    return score_summary(
        record.get("requested", ()), record.get("tasks", {}), record.get("skipped", {})
    )
