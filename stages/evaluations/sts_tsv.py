"""Stage: score your own STS-style data as SentEval scores STS (the worked example of
docs/extending.md, "Add an evaluation").

    python -m stages.evaluate sts_tsv --experiment NAME [--params FILE]
    python -m stages.evaluate sts_tsv --model NAME_OR_DIR [--pooler P] [--file NAME=TSV ...]
        --output results.json

Each file of params.yaml's ``evaluations.sts_tsv.files`` (or ``--file``) is a TSV whose first
line is the header ``sentence1<TAB>sentence2<TAB>score``, then one pair per line. The pairs are
encoded by the experiment's evaluation encoder (the pooler and precision SentEval's STS uses) and
scored with SentEval's arithmetic (``stages.senteval_protocol.sts``): the cosine of the two
embeddings against the gold score, Pearson and Spearman x100. ``--experiment`` writes
``experiments/<NAME>/sts_tsv.json``, whose ``scores`` ({task: {spearman, pearson}}) the report
reads.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ValidationError

from stages.core.cli import add_target_arguments, parse_target_arguments, parser
from stages.core.errors import StageError
from stages.core.identity.experiments import plan_experiments
from stages.core.planning.carry_over import ENCODER_IDENTITY_KEYS, only, without
from stages.core.schema.evaluation_settings import StsTsvParams
from stages.core.storage.hashing import sha256_of
from stages.evaluations.results import project_params, run_evaluation, target_from_arguments
from stages.senteval_protocol.loaders import DataFile, StsPairs, StsTask

if TYPE_CHECKING:
    from stages.modeling.encoder import SentenceEncoder

HEADER = ("sentence1", "sentence2", "score")


def read_pairs(name: str, path: Path) -> StsTask:
    """The scored pairs of one TSV file; a StageError naming the file and line of a problem."""
    try:
        # utf-8-sig: a spreadsheet's UTF-8 export starts with a byte order mark
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise StageError(f"{path}: cannot read it: {err}") from None
    if not lines or tuple(lines[0].split("\t")) != HEADER:
        raise StageError(f"{path}: line 1 must be the header {'<TAB>'.join(HEADER)}")
    rows = [parse_pair(path, number, line) for number, line in enumerate(lines[1:], start=2)]
    if len(rows) < 2:
        raise StageError(f"{path}: fewer than two pairs, so no correlation")
    sent1, sent2, scores = (list(column) for column in zip(*rows, strict=True))
    if len(set(scores)) == 1:
        raise StageError(
            f"{path}: every gold score is {scores[0]}: a correlation with constant scores is "
            "undefined"
        )
    pairs = StsPairs(name, sent1, sent2, np.array(scores, dtype=np.float64))
    return StsTask(name, (pairs,), (DataFile(str(path), sha256_of(path), len(lines)),))


def parse_pair(path: Path, number: int, line: str) -> tuple[str, str, float]:
    """Line ``number`` of ``path``: two non-empty sentences and a finite gold score."""
    fields = line.split("\t")
    if len(fields) != len(HEADER):
        raise StageError(f"{path}:{number}: {len(fields)} tab-separated columns, not 3")
    first, second, value = fields
    try:
        score = float(value)
    except ValueError:
        raise StageError(f"{path}:{number}: score {value!r} is not a number") from None
    if not math.isfinite(score):
        raise StageError(f"{path}:{number}: score {value!r} is not a finite number")
    for column, sentence in zip(HEADER, (first, second), strict=False):
        if not sentence.strip():
            raise StageError(f"{path}:{number}: {column} is empty")
    return first, second, score


def score_files(encoder: SentenceEncoder, files: dict[str, str]) -> dict[str, Any]:
    """Pearson and Spearman x100 of ``encoder`` on every file (all read before encoding)."""
    # Imported here, not at the top: a stage that reuses its stored result loads no torch.
    from stages.modeling.encoder import EncoderError
    from stages.senteval_protocol.sts import score_sts

    tasks = {name: read_pairs(name, Path(path)) for name, path in files.items()}
    try:
        scored = {name: score_sts(task, encoder)[name] for name, task in tasks.items()}
    except EncoderError as err:
        raise StageError(str(err)) from None
    return {
        "encoder": encoder.describe(),
        "tasks": {
            name: {**scored[name], "file": task.files[0].path, "sha256": task.files[0].sha256}
            for name, task in tasks.items()
        },
        "scores": report_scores(scored),
    }


def report_scores(tasks: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``scores``, what the report reads: each task's Spearman and Pearson."""
    return {
        name: {"spearman": result["spearman"], "pearson": result["pearson"]}
        for name, result in tasks.items()
    }


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0], prog="python -m stages.evaluate sts_tsv")
    add_target_arguments(p)
    p.add_argument("--file", action="append", metavar="NAME=TSV", help="default: params' files")
    args = parse_target_arguments(p, argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    params = project_params(args.params)
    planned = params.evaluations.sts_tsv if params else StsTsvParams()
    try:
        files = dict(f.split("=", 1) for f in args.file) if args.file else planned.files
        settings = planned.model_copy(update={"files": StsTsvParams(files=files).files})
    except (ValueError, ValidationError) as err:
        raise StageError(f"--file NAME=TSV: {err}") from None
    if not settings.files:
        raise StageError("no file to score: set evaluations.sts_tsv.files or pass --file NAME=TSV")
    plan = plan_experiments(params) if params and args.experiment else None
    output, results = run_evaluation(
        "sts_tsv",
        target_from_arguments(args, "sts_tsv", plan),
        lambda encoder, _: score_files(encoder, settings.files),
        # the matrix's own evaluation (its files as params give them) is stored under its id
        stored=bool(args.experiment) and not args.file and not args.output,
        batch_size=settings.batch_size,
    )
    for name, scores in (results or {}).get("scores", {}).items():
        print(f"{name}: Spearman {scores['spearman']:.2f}, Pearson {scores['pearson']:.2f}")
    print(f"wrote {output}" + ("" if results else " (the stored result of the same evaluation)"))


# What ``cse carry-over`` asks of an evaluation (the contract: stages/evaluations/__init__.py):
# a sample of its settings that reaches each of its code paths, its score under them, whether a
# record computed what the settings would, the part of a record that scoring given tasks
# determines, and the summary the current code computes from a record's task results.

# What a record holds besides what its tasks' scoring gives: environment, its ids, the summary.
UNCOMPARED = ("environment", "evaluation_id", "carried_over", "scores")


def sample(settings: StsTsvParams) -> tuple[str, ...]:
    """The first file (every file takes the one code path)."""
    return (next(iter(settings.files)),)


def score(
    encoder: SentenceEncoder,
    settings: StsTsvParams,
    tasks: Sequence[str],
    label: str,
    workdir: Path,
) -> dict:
    """The results of ``encoder`` on the files ``tasks`` (each encoded and scored on its own)."""
    return score_files(encoder, {name: settings.files[name] for name in tasks})


def mismatches(record: dict[str, Any], settings: StsTsvParams) -> list[str]:
    """What a results record says it computed that ``settings`` would not: other files, or
    files whose content changed since."""
    recorded = {name: task.get("sha256") for name, task in record.get("tasks", {}).items()}
    planned = {
        name: sha256_of(Path(path)) if Path(path).is_file() else None
        for name, path in settings.files.items()
    }
    return [] if recorded == planned else [f"files: {sorted(recorded)}, not {sorted(planned)}"]


def comparable(record: dict[str, Any], tasks: Sequence[str]) -> dict[str, Any]:
    """What of ``record`` scoring the files ``tasks`` alone gives: every key but
    ``UNCOMPARED``, the tasks cut to ``tasks``."""
    part = without(record, UNCOMPARED)
    part["encoder"] = without(record.get("encoder", {}), ENCODER_IDENTITY_KEYS)
    part["tasks"] = only(record.get("tasks", {}), tasks)
    return part


def recomputed_summary(record: dict[str, Any]) -> dict[str, Any]:
    """The record's ``scores`` (what the report reads) as the current code takes them from its
    task results."""
    return {"scores": report_scores(record.get("tasks", {}))}
