"""The five papers' published numbers, as one tidy validated table.

``published.csv`` (next to this module) holds one row per printed number: paper, table, row label,
backbone, task, metric, aggregation and value, with where the number comes from (the authors' own
run or quoted from another paper) and flags for cells that are garbled, missing or inconsistent in
the paper itself. docs/published.md describes the columns and conventions; the report stage puts
the pipeline's numbers next to these.

``published()`` reads the file with an explicit schema and validates every row against the
closed vocabularies below, so a typo in a transcription fails loudly with the CSV line it is on.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import polars as pl

from stages.core.schema.evaluation_settings import (
    SENTEVAL_STS_TASKS,
    SENTEVAL_TRANSFER_TASKS,
    STSB_DEV_TASK,
)

PUBLISHED_CSV = Path(__file__).with_name("published.csv")

PAPER_FILES = {
    "simace": "000_1238e3534f087b8a.txt",
    "arccse": "001_3c852ccffa6dbdef.txt",
    "unified_gradient": "002_e64269d45a39291b.txt",
    "align_uniform": "003_3b0fbb536a1f2bcc.txt",
    "cooldown": "004_b7c08da38ce77dde.txt",
}

MTEB_CATEGORIES = (
    "MTEB_Classification", "MTEB_Clustering", "MTEB_PairClassification", "MTEB_Reranking",
    "MTEB_Retrieval", "MTEB_STS", "MTEB_Summarization",
)  # fmt: skip
# Datasets per MTEB category in SimACE's 56-dataset English set: its "Avg." weighs by these.
MTEB_DATASETS = dict(zip(MTEB_CATEGORIES, (12, 11, 3, 4, 15, 10, 1), strict=True))
STS_AVG, TR_AVG, MTEB_AVG = "STS_avg", "TR_avg", "MTEB_avg"
# STS-B development set (alignment/uniformity, dev Spearman); training batches (angles, the
# uniformity of untrained checkpoints over in-batch samples).
STSB_DEV, TRAIN_BATCH = STSB_DEV_TASK, "train_batch"

# metric -> (tasks it is reported on, units it is printed in)
METRICS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "spearman": (frozenset((*SENTEVAL_STS_TASKS, STS_AVG, STSB_DEV)), frozenset(("x100", "raw"))),
    "accuracy": (frozenset((*SENTEVAL_TRANSFER_TASKS, TR_AVG)), frozenset(("x100",))),
    "mteb_main_score": (frozenset((*MTEB_CATEGORIES, MTEB_AVG)), frozenset(("x100",))),
    "p_value": (frozenset((STS_AVG,)), frozenset(("raw",))),
    "alignment": (frozenset((STSB_DEV,)), frozenset(("raw",))),
    "uniformity": (frozenset((STSB_DEV, TRAIN_BATCH)), frozenset(("raw",))),
    "positive_angle_deg": (frozenset((TRAIN_BATCH,)), frozenset(("degrees",))),
    "negative_angle_deg": (frozenset((TRAIN_BATCH,)), frozenset(("degrees",))),
}
TASKS = frozenset().union(*(tasks for tasks, _ in METRICS.values()))

BACKBONES = frozenset((
    "bert-base", "bert-large", "roberta-base", "roberta-large", "sbert-base", "sbert-large",
    "glove", "skip-thought",
))  # fmt: skip

# Keys of the methods the pipeline reproduces (rows it does not reproduce have no key). One key
# per paper's method as that paper's preset names it: e.g. ArcCSE's "w/o Triplet loss" ablation
# is arccse_no_triplet (ArcCSE's training setup), the other papers' ArcCon reruns are arccon.
METHOD_KEYS = frozenset((
    # untrained encoders: pooled as the paper says (first_last_avg, last_avg) or unstated
    "pretrained", "first_last_avg", "last_avg", "glove_avg",
    "simcse", "tcc", "tcs",
    "arccon", "arccon_tcc", "arccon_tcs",
    "arccse", "arccse_no_arccon", "arccse_no_triplet",
    "arccse_arccon_dropout_mixed", "arccse_triplet_dropout_on",
    "simace", "simace_no_margin", "simace_margin_neg",
    "align_uniform", "dcl", "dcl_plus", "mpt", "met", "mat",
    # paper 002: before (derived) / after modification, and the cumulative GD -> W -> R ablation
    *(
        f"{stem}_{stage}"
        for stem in ("align_mhe", "align_mhs", "barlow_twins", "vicreg")
        for stage in ("original", "gd", "gd_w", "modified")
    ),
))  # fmt: skip

AGGREGATIONS = frozenset((
    "single_run",       # one training run (n_seeds = 1 when the seed is stated)
    "mean", "std",      # over n_seeds training runs
    "as_printed",       # the paper does not say how many runs
    "derived",          # arithmetic on printed numbers (paper 002's "before modification")
    "mean_over_steps", "std_over_steps",  # a statistic over training steps of one run
))  # fmt: skip
PROVENANCES = frozenset(("own", "quoted", "quoted-confirmed", "unknown"))
UNITS = frozenset(("x100", "raw", "degrees"))
FLAGS = frozenset((
    "missing-in-extraction",  # the cell is absent from the extracted text: value empty
    "printed-na",             # the paper prints N/A: value empty
    "garbled-in-extraction",  # the row is shifted or broken in the extraction; cells readable
    "row-label-inferred",     # the row's label or backbone was lost and is inferred
    "row-average-mismatch",   # the printed average disagrees with the row's cells beyond rounding
    "suspect-duplicate",      # identical to another cell where a copy error is suspected
    "suspect-value",          # implausible value, probably a typo in the paper
    "impossible-value",       # a value the dataset cannot produce
    "suspect-swapped-rows",   # rows probably swapped in the paper
    "conflicts-with-text",    # a table cell that the paper's prose contradicts
    "conflicts-with-table",   # a number in prose or another table that contradicts a table
    "caption-misattributed",  # the caption names the wrong source
    "not-in-cited-source",    # claimed as quoted, but the cited paper does not contain it
    "derived",                # computed from printed numbers (+-0.05 from rounding)
    "sign-inferred",          # a printed sign is lost and was inferred
    "degenerate-run",         # a collapsed run the paper reports as is
))  # fmt: skip
EMPTY_VALUE_FLAGS = frozenset(("missing-in-extraction", "printed-na"))

COLUMNS = (
    "paper", "paper_file", "table", "method", "method_key", "backbone", "task", "metric",
    "aggregation", "n_seeds", "sweep", "value", "unit", "provenance", "quoted_from", "setting",
    "flags", "note",
)  # fmt: skip
# One row per printed number: no two rows share these.
KEY = ("paper", "table", "method", "backbone", "task", "metric", "aggregation", "sweep")
# The loaded frame's dtypes; optional text columns are null when empty, flags a list.
SCHEMA = pl.Schema(
    {
        **{column: pl.String for column in COLUMNS},
        "n_seeds": pl.Int64,
        "value": pl.Float64,
        "flags": pl.List(pl.String),
    }
)
OPTIONAL_TEXT = ("method_key", "sweep", "quoted_from", "note")

_SWEEP = re.compile(r"^[a-z_]+=-?\d+(\.\d+)?(;[a-z_]+=-?\d+(\.\d+)?)*$")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


class PublishedDataError(ValueError):
    """published.csv breaks its schema; the message lists every problem with its CSV line."""


def published(path: Path = PUBLISHED_CSV) -> pl.DataFrame:
    """The published numbers as a polars frame with ``SCHEMA``, validated row by row."""
    raw = pl.read_csv(path, infer_schema=False).fill_null("")
    if tuple(raw.columns) != COLUMNS:
        raise PublishedDataError(
            f"{path}: columns are {raw.columns}, expected {list(COLUMNS)} in that order"
        )
    problems = [
        f"{path.name} line {index + 2} ({_describe(row)}): {problem}"
        for index, row in enumerate(raw.iter_rows(named=True))
        for problem in row_problems(row)
    ]
    problems += _duplicate_keys(raw, path.name)
    if problems:
        raise PublishedDataError(
            f"{len(problems)} problem(s) in {path}:\n  " + "\n  ".join(problems)
        )
    return raw.with_columns(
        pl.col(*OPTIONAL_TEXT, "n_seeds", "value").replace("", None),
        pl.col("flags").str.split(";").list.filter(pl.element() != ""),
    ).cast(SCHEMA)


def row_problems(row: dict[str, str]) -> list[str]:
    """Everything wrong with one raw (all-text) row; empty when the row is valid."""
    problems = []

    def check(ok: bool, message: str) -> None:
        if not ok:
            problems.append(message)

    paper, metric, task = row["paper"], row["metric"], row["task"]
    if paper not in PAPER_FILES:
        problems.append(f"unknown paper {paper!r} (known: {sorted(PAPER_FILES)})")
    elif row["paper_file"] != PAPER_FILES[paper]:
        problems.append(f"paper_file {row['paper_file']!r} is not {paper!r}'s file")
    for column in ("table", "method", "setting"):
        check(row[column] != "", f"{column} is empty")
    key = row["method_key"]
    check(key == "" or key in METHOD_KEYS, f"unknown method_key {key!r}")
    check(row["backbone"] in BACKBONES, f"unknown backbone {row['backbone']!r}")
    check(task in TASKS, f"unknown task {task!r}")
    if metric not in METRICS:
        problems.append(f"unknown metric {metric!r} (known: {sorted(METRICS)})")
    else:
        tasks, units = METRICS[metric]
        check(task not in TASKS or task in tasks, f"metric {metric!r} is not reported on {task!r}")
        unit_ok = row["unit"] not in UNITS or row["unit"] in units
        check(unit_ok, f"unit {row['unit']!r} is not one of {sorted(units)}")
    check(row["unit"] in UNITS, f"unknown unit {row['unit']!r}")
    aggregation = row["aggregation"]
    check(aggregation in AGGREGATIONS, f"unknown aggregation {aggregation!r}")
    n_seeds = row["n_seeds"]
    check(n_seeds == "" or (n_seeds.isdigit() and int(n_seeds) > 0), f"bad n_seeds {n_seeds!r}")
    if aggregation == "single_run":
        check(n_seeds in ("", "1"), f"single_run with n_seeds {n_seeds}")
    check(row["sweep"] == "" or bool(_SWEEP.match(row["sweep"])), f"bad sweep {row['sweep']!r}")
    provenance = row["provenance"]
    check(provenance in PROVENANCES, f"unknown provenance {provenance!r}")
    check(
        provenance.startswith("quoted") == (row["quoted_from"] != ""),
        "quoted_from must be given exactly for quoted rows",
    )
    flags = [flag for flag in row["flags"].split(";") if flag]
    unknown = sorted(set(flags) - FLAGS)
    check(not unknown, f"unknown flag(s) {unknown}")
    check(len(flags) == len(set(flags)), f"repeated flag in {row['flags']!r}")
    check(("derived" in flags) == (aggregation == "derived"), "flag 'derived' <=> derived")
    value = row["value"]
    if value == "":
        check(
            bool(EMPTY_VALUE_FLAGS & set(flags)), f"empty value needs {sorted(EMPTY_VALUE_FLAGS)}"
        )
    elif not _NUMBER.match(value) or not math.isfinite(float(value)):
        problems.append(f"value {value!r} is not a number as printed")
    else:
        check(not EMPTY_VALUE_FLAGS & set(flags), "a printed value flagged as missing")
    return problems


def _duplicate_keys(raw: pl.DataFrame, name: str) -> list[str]:
    lines = (
        raw.with_row_index("line", offset=2)
        .group_by(KEY)
        .agg(pl.col("line"))
        .filter(pl.col("line").list.len() > 1)
    )
    return [
        f"{name} lines {row['line']}: duplicate key {dict((k, row[k]) for k in KEY)}"
        for row in lines.iter_rows(named=True)
    ]


def _describe(row: dict[str, str]) -> str:
    return f"{row['paper']} {row['table']} {row['method']!r} {row['backbone']} {row['task']}"
