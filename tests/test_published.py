"""The published numbers (stages/reference/published.csv): schema, validation, and checks that
catch transcription errors: printed averages against their rows, every number against the paper
texts, numbers shared between papers against each other, and the expected size of every table."""

from __future__ import annotations

import os
import re
from pathlib import Path

import polars as pl
import pytest

from stages.core.schema.evaluation_settings import SENTEVAL_STS_TASKS, SENTEVAL_TRANSFER_TASKS
from stages.reference import (
    COLUMNS,
    MTEB_CATEGORIES,
    MTEB_DATASETS,
    PAPER_FILES,
    PUBLISHED_CSV,
    SCHEMA,
    PublishedDataError,
    published,
)

REPO = Path(__file__).resolve().parents[1]
PAPERS_DIR = Path(os.environ.get("CSE_PAPERS_DIR", REPO.parent / "shared" / "papers"))

# Cells per transcribed table, with the arithmetic that gives them: a lost row changes a count.
EXPECTED_CELLS = {
    ("arccse", "Table 1"): 20 * 8,  # 20 rows x (7 STS + Avg.)
    ("arccse", "Table 2"): 9 * 8,  # 9 rows x (7 transfer + Avg.)
    ("arccse", "Table 3"): 3 * 8,
    ("arccse", "Text §4.4 (Figure 6)"): 1,
    ("arccse", "Text §4.4 (Figure 7)"): 1,
    ("align_uniform", "Table 1"): 8 * 4 * 2,  # 8 objectives x 4 backbones x (STS.Avg, TR.Avg)
    ("unified_gradient", "Table 3"): 2 * (2 * 8 + 2 + 4 * 8),  # per backbone: 2 quoted rows,
    ("unified_gradient", "Table 4"): 2 * (2 * 8 + 2 + 4 * 8),  # MPT/MET Avg. only, 4 modified
    ("unified_gradient", "Table 3 (derived)"): 2 * 4 * 8,  # 2 backbones x 4 originals x 8
    ("unified_gradient", "Table 4 (derived)"): 2 * 4 * 8,
    ("unified_gradient", "Table 5"): 4 * 4 - 1,  # MHS '+ W' is printed '-*' (not modified)
    ("simace", "Table 1"): 14 * 8,
    ("simace", "Text §4.3"): 4,
    ("simace", "Table 2"): 4 * 3 * 2,  # 4 backbones x 3 methods x (mean, std)
    ("simace", "Table 3"): 4 * 2 * 2,
    ("simace", "Table 4"): 20 * 8,
    ("simace", "Table 9"): 4 * 5,  # 4 backbones x 5 comparisons
    ("simace", "Table 10"): 4 * 6 * 2,
    ("simace", "Table 11"): 6 * 4,
    ("simace", "Table 12"): 9 * 8,  # 9 rows x (7 MTEB categories + Avg.)
    ("simace", "Table 13"): 24 * 8,
    ("simace", "Table 14"): 12 * 8,
    ("simace", "Figure 4 caption"): 4,
    ("simace", "Figure 7 caption"): 4,
    ("simace", "Figure 9 caption"): 3,
    ("cooldown", "Table 1"): 2 * 6,  # 2 backbones x 6 temperatures
    ("cooldown", "Table 2"): 14 * 8,
    ("cooldown", "Table 3"): 8,
    ("cooldown", "Table 7"): 12 * 2,  # 12 rows x (uniformity, alignment)
    ("cooldown", "Table 8"): 12 * 2,
    ("cooldown", "Table 9"): 8 * 8,
    ("cooldown", "Table 10"): 12 * 8,
    ("cooldown", "Text §5 (Limitation)"): 4,
}

# Cells per flag: the inconsistencies the specs list, so a dropped flag is noticed.
EXPECTED_FLAG_CELLS = {
    "caption-misattributed": 16,  # cooldown Table 9's two ArcCSE rows
    "conflicts-with-table": 2,  # SimACE Fig. 9's 76.69; Table 9's p for RoBERTa-large ArcCon
    "conflicts-with-text": 1,  # SimACE Table 14's 77.08
    "degenerate-run": 8,  # SimACE Table 13 RoBERTa-large ArcCon with MLM
    "derived": 128,
    "garbled-in-extraction": 24,  # three rows shifted by one column
    "impossible-value": 1,  # cooldown Table 10 TREC 87.47
    "missing-in-extraction": 3,
    "not-in-cited-source": 24,  # paper 002's ArcCon rows not in ArcCSE
    "printed-na": 12,
    "row-average-mismatch": 8,
    "row-label-inferred": 64,
    "sign-inferred": 4,
    "suspect-duplicate": 18,
    "suspect-swapped-rows": 8,
    "suspect-value": 3,
}

STS7, TR7 = list(SENTEVAL_STS_TASKS), list(SENTEVAL_TRANSFER_TASKS)
ROUNDING = 0.01 + 1e-9  # two-decimal cells and a two-decimal average
DERIVED_ROUNDING = 0.1  # each derived number carries +-0.05


@pytest.fixture(scope="module")
def table() -> pl.DataFrame:
    return published()


@pytest.fixture(scope="module")
def printed() -> pl.DataFrame:
    """The CSV as text, with the row order of the file: values exactly as printed."""
    return pl.read_csv(PUBLISHED_CSV, infer_schema=False).fill_null("").with_row_index("row")


@pytest.fixture(scope="module")
def paper_text() -> dict[str, str]:
    if not PAPERS_DIR.is_dir():
        pytest.fail(f"paper texts not found at {PAPERS_DIR}; set CSE_PAPERS_DIR")
    return {p: (PAPERS_DIR / f).read_text(encoding="utf-8") for p, f in PAPER_FILES.items()}


def select(frame: pl.DataFrame, **criteria: str | list[str]) -> pl.DataFrame:
    for column, wanted in criteria.items():
        wanted = wanted if isinstance(wanted, list) else [wanted]
        frame = frame.filter(pl.col(column).is_in(wanted))
    return frame


def cell(frame: pl.DataFrame, **criteria: str) -> float | None:
    rows = select(frame, **criteria)
    assert rows.height == 1, f"{criteria} selects {rows.height} rows"
    return rows["value"][0]


def number(value: str) -> str:
    """A regex for a printed number standing alone (not part of a longer number)."""
    return rf"(?<![\d.]){re.escape(value)}(?!\d)"


# ---------------------------------------------------------------- schema and validation


def test_loads_with_the_schema(table: pl.DataFrame) -> None:
    assert table.schema == SCHEMA
    assert table.height == sum(EXPECTED_CELLS.values())
    assert table.filter(pl.col("value").is_null()).height == 15


def test_counts_per_table(table: pl.DataFrame) -> None:
    counts = {
        (paper, name): n for paper, name, n in table.group_by("paper", "table").len().iter_rows()
    }
    assert counts == EXPECTED_CELLS


def test_flag_counts(table: pl.DataFrame) -> None:
    counts = dict(table.explode("flags").drop_nulls("flags").group_by("flags").len().iter_rows())
    assert counts == EXPECTED_FLAG_CELLS


def _rewrite(tmp_path: Path, edit) -> Path:
    frame = pl.read_csv(PUBLISHED_CSV, infer_schema=False).fill_null("")
    path = tmp_path / "published.csv"
    edit(frame).write_csv(path)
    return path


def _set(column: str, value: str):
    """An edit of the first data row (CSV line 2)."""
    first_row = pl.int_range(pl.len()) == 0
    return lambda frame: frame.with_columns(
        pl.when(first_row).then(pl.lit(value)).otherwise(pl.col(column)).alias(column)
    )


LINE2 = "published.csv line 2 (arccse Table 1 'GloVe (avg.)' glove STS12): "


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("paper", "simcse"), LINE2.replace("arccse", "simcse") + "unknown paper 'simcse'"),
        (_set("paper_file", "000_1238e3534f087b8a.txt"), "is not 'arccse''s file"),
        (_set("value", "55,14"), LINE2 + "value '55,14' is not a number"),
        (_set("value", ""), LINE2 + "empty value needs"),
        (_set("task", "STS-B"), LINE2.replace("STS12", "STS-B") + "unknown task 'STS-B'"),
        (_set("metric", "accuracy"), LINE2 + "metric 'accuracy' is not reported on 'STS12'"),
        (_set("unit", "degrees"), LINE2 + "unit 'degrees' is not one of ['raw', 'x100']"),
        (_set("method_key", "simcse_base"), LINE2 + "unknown method_key 'simcse_base'"),
        (_set("backbone", "bert"), LINE2.replace("glove", "bert") + "unknown backbone 'bert'"),
        (_set("flags", "garbled"), LINE2 + "unknown flag(s) ['garbled']"),
        (_set("flags", "derived"), LINE2 + "flag 'derived' <=> derived"),
        (_set("provenance", "own"), LINE2 + "quoted_from must be given exactly for quoted rows"),
        (_set("sweep", "tau:0.05"), LINE2 + "bad sweep 'tau:0.05'"),
        (_set("n_seeds", "three"), LINE2 + "bad n_seeds 'three'"),
        (lambda f: pl.concat([f, f.head(1)]), "published.csv lines [2, 1790]: duplicate key"),
    ],
)
def test_validation_names_the_bad_row(tmp_path: Path, edit, message: str) -> None:
    with pytest.raises(PublishedDataError) as error:
        published(_rewrite(tmp_path, edit))
    assert str(error.value).startswith("1 problem(s)")
    assert message in str(error.value)


def test_validation_rejects_other_columns(tmp_path: Path) -> None:
    path = _rewrite(tmp_path, lambda f: f.rename({"value": "score"}))
    with pytest.raises(PublishedDataError, match=r"expected .*'value'"):
        published(path)


# ---------------------------------------------------------------- internal consistency


def _cell_means(frame: pl.DataFrame, cells: list[str], weights: list[float]) -> pl.DataFrame:
    keys = ["paper", "table", "method", "backbone", "aggregation", "sweep"]
    weight = pl.col("task").replace_strict(dict(zip(cells, weights, strict=True)), default=None)
    return (
        select(frame, task=cells)
        .group_by(keys)
        .agg(
            ((pl.col("value") * weight).sum() / weight.sum()).alias("cells_mean"),
            pl.col("value").count().alias("n"),
        )
        .join(frame, on=keys, nulls_equal=True)
    )


def _average_mismatches(table: pl.DataFrame) -> set[tuple[str, ...]]:
    checks = (
        ("STS_avg", STS7, [1.0] * 7),
        ("TR_avg", TR7, [1.0] * 7),
        ("MTEB_avg", list(MTEB_CATEGORIES), [float(MTEB_DATASETS[c]) for c in MTEB_CATEGORIES]),
    )
    mismatches = set()
    checked = 0
    for average, cells, weights in checks:
        rows = _cell_means(table, cells, weights).filter(pl.col("task") == average)
        assert rows["n"].unique().to_list() == [len(cells)], f"{average}: rows with lost cells"
        rows = rows.drop_nulls("value")
        checked += rows.height
        derived = pl.col("aggregation") == "derived"
        tolerance = pl.when(derived).then(DERIVED_ROUNDING).otherwise(ROUNDING)
        off = rows.filter((pl.col("value") - pl.col("cells_mean")).abs() > tolerance)
        mismatches |= set(off.select("paper", "table", "method", "backbone", "task").iter_rows())
    assert checked == 108 + 65 + 9  # every printed average with its row of cells
    return mismatches


def test_printed_averages_equal_their_rows_except_where_flagged(table: pl.DataFrame) -> None:
    """Every printed Avg. is the mean of its row within rounding (MTEB: the 56-dataset weighted
    mean), except exactly the cells flagged as inconsistent in the paper itself."""
    flagged = table.filter(pl.col("flags").list.contains("row-average-mismatch"))
    assert _average_mismatches(table) == set(
        flagged.select("paper", "table", "method", "backbone", "task").iter_rows()
    )


def test_missing_averages_are_the_quoted_values(table: pl.DataFrame) -> None:
    """The averages lost in the extraction are, recomputed, Gao et al.'s printed numbers."""
    missing = _cell_means(table, STS7, [1.0] * 7).filter(
        pl.col("flags").list.contains("missing-in-extraction")
    )
    assert sorted(round(m, 2) for m in missing["cells_mean"]) == [56.57, 56.57, 78.9]


# ---------------------------------------------------------------- against the paper texts


def test_every_printed_number_occurs_in_its_paper(
    printed: pl.DataFrame, paper_text: dict[str, str]
) -> None:
    rows = printed.filter((pl.col("value") != "") & (pl.col("aggregation") != "derived"))
    absent = [
        (paper, name, method, value)
        for paper, name, method, value in rows.select("paper", "table", "method", "value").rows()
        if not re.search(number(value), paper_text[paper])
    ]
    assert rows.height == 1645 and absent == []


def _line_group(paper: str, name: str) -> list[str]:
    """The columns whose values the paper prints on one text line, in the file's row order."""
    by_table = {
        ("align_uniform", "Table 1"): ["method"],
        ("simace", "Table 2"): ["backbone"],
        ("simace", "Table 3"): ["backbone"],
        ("simace", "Table 9"): ["backbone"],
        ("simace", "Table 10"): ["backbone"],
        ("simace", "Table 11"): ["method"],
        ("cooldown", "Table 1"): ["sweep"],
        ("cooldown", "Table 7"): ["method", "backbone"],
        ("cooldown", "Table 8"): ["method", "backbone"],
        # paper 002 prints its tables column-wise: one line per task column and row block
        ("unified_gradient", "Table 3"): ["backbone", "task", "own"],
        ("unified_gradient", "Table 4"): ["backbone", "task", "own"],
        ("unified_gradient", "Table 5"): ["objective"],
    }
    return by_table.get((paper, name), ["method", "backbone", "aggregation", "sweep"])


def test_rows_read_in_order_on_one_line_of_the_paper(
    printed: pl.DataFrame, paper_text: dict[str, str]
) -> None:
    """Each printed row (or column, for paper 002) appears in order on one line of the paper:
    catches shifted, swapped or mistyped cells that a plain search would miss."""
    rows = printed.filter((pl.col("value") != "") & (pl.col("aggregation") != "derived"))
    rows = rows.with_columns(
        (pl.col("provenance") == "own").alias("own"),
        pl.col("method_key").str.replace(r"_(original|gd|gd_w|modified)$", "").alias("objective"),
    )
    lines = {paper: text.splitlines() for paper, text in paper_text.items()}
    not_found, groups = [], 0
    for (paper, name), rows_of_table in rows.group_by("paper", "table"):
        for _, group in rows_of_table.group_by(_line_group(paper, name)):
            values = group.sort("row")["value"].to_list()
            pattern = re.compile(".*?".join(number(v) for v in values))
            groups += 1
            if not any(pattern.search(line) for line in lines[paper]):
                not_found.append((paper, name, group["method"][0], values))
    assert groups == 300 and not_found == []  # 275 of them hold more than one number


def test_derived_originals_are_modified_minus_the_printed_improvement(
    table: pl.DataFrame, printed: pl.DataFrame, paper_text: dict[str, str]
) -> None:
    """Paper 002's 'before modification' numbers: the modified value minus the subscript printed
    next to it in the paper (whose sign is lost only where flagged sign-inferred)."""
    derived = table.filter(pl.col("aggregation") == "derived")
    text = paper_text["unified_gradient"]
    for row in derived.iter_rows(named=True):
        modified = select(
            printed,
            paper="unified_gradient",
            table=row["table"].removesuffix(" (derived)"),
            method_key=row["method_key"].replace("_original", "_modified"),
            backbone=row["backbone"],
            task=row["task"],
        )["value"].item()
        subscript = rf"{number(modified)}\s*_\s*\{{?\s*([+-]?)\s*(?:\\\s*)?(\d+\.\d)"
        printed_deltas = {(sign, float(d)) for sign, d in re.findall(subscript, text)}
        delta = round(float(modified) - row["value"], 2)
        sign = "" if "sign-inferred" in row["flags"] else ("-" if delta < 0 else "+")
        assert (sign, abs(delta)) in printed_deltas or (delta == 0 and ("-", 0.0) in printed_deltas)


# (paper, table, method, backbone, task, metric), the value, and the paper's line holding it
SPOT_CHECKS = [
    (
        ("arccse", "Table 1", "ArcCSE-BERT_base", "bert-base", "STS_avg", "spearman"),
        78.11,
        "ArcCSE-BERT 72.08 84.27 76.25 82.32 79.54 79.92 72.39 78.11",
    ),
    (
        ("arccse", "Table 2", "ArcCSE-BERT_large", "bert-large", "SUBJ", "accuracy"),
        99.58,
        "ArcCSE-BERT 84.34 88.82 99.58 89.79 90.50 92.00 74.78 88.54",
    ),
    (
        ("simace", "Table 1", "SimACE", "roberta-base", "STS13", "spearman"),
        84.16,
        "| | SimACE [*] | 70.50 | 84.16 | 76.33 | 83.38 | 82.45 | 82.24 | 69.69 | 78.39 |",
    ),
    (
        ("simace", "Table 12", "SimACE", "bert-base", "MTEB_avg", "mteb_main_score"),
        48.19,
        "| | SimACE | 63.56 | 33.87 | 75.25 | 54.92 | 22.09 | 75.70 | 29.51 | 48.19 |",
    ),
    (
        ("align_uniform", "Table 1", "L_met", "bert-large", "STS_avg", "spearman"),
        78.38,
        "78.38\t87.94\t78.38\t87.94\t77.38\t85.74\t78.71\t86.42",
    ),
    (
        ("cooldown", "Table 7", "SimCSE", "bert-base", "STSBenchmark_dev", "alignment"),
        0.2073,
        "BERT _{base}\tSimCSE\t-2.101\t0.2073",
    ),
    (
        ("unified_gradient", "Table 3", "L^mMHE", "bert-base", "STS12", "spearman"),
        71.48,
        r"$71.48_{+18.2} \\ 70.93_{+\ 7.8} \\ 71.22_{+15.3} \\ 71.42_{+15.8}$",
    ),
]


@pytest.mark.parametrize(("where", "value", "line"), SPOT_CHECKS)
def test_spot_checks_against_the_paper_lines(
    table: pl.DataFrame, paper_text: dict[str, str], where: tuple, value: float, line: str
) -> None:
    columns = ("paper", "table", "method", "backbone", "task", "metric")
    assert cell(table, **dict(zip(columns, where, strict=True))) == value
    assert line in paper_text[where[0]]


def test_derived_spot_checks_match_the_spec(table: pl.DataFrame) -> None:
    """'Before modification' cells as spec-unified-gradient.md section 9.4 lists them."""
    derived = select(table, table="Table 3 (derived)", backbone="bert-base")
    mhe = select(derived, method_key="align_mhe_original", task=STS7)
    assert dict(zip(mhe["task"], mhe["value"], strict=True)) == {
        "STS12": 53.28, "STS13": 68.12, "STS14": 56.94, "STS15": 66.31, "STS16": 67.72,
        "STSBenchmark": 62.31, "SICKRelatedness": 63.81,
    }  # fmt: skip
    assert cell(derived, method_key="vicreg_original", task="STS12") == 55.62
    # the average is the modified average minus its own subscript: 78.40 - 15.8
    assert cell(derived, method_key="align_mhe_original", task="STS_avg") == 62.60


# ---------------------------------------------------------------- across papers

# Pairs of selections that print the same numbers: quoted rows in several papers, and runs two
# papers of the same group share. Joined on (method_key, backbone, task, metric), or without the
# method key where the two papers name the method differently; every value must agree.
BY_CELL = ("backbone", "task", "metric")
BY_METHOD_AND_CELL = ("method_key", *BY_CELL)


BERT_BASE_AND_LARGE = ["bert-base", "bert-large"]


def same(left: dict, right: dict, on: tuple[str, ...] = BY_METHOD_AND_CELL) -> tuple:
    return left, right, list(on)


SAME_NUMBERS = {
    "SimCSE BERT-base STS (Gao et al.) in 001 and 000": same(
        dict(paper="arccse", table="Table 1", method="SimCSE-BERT_base"),
        dict(paper="simace", table="Table 1", method="SimCSE", backbone="bert-base"),
    ),
    "SimCSE BERT-base STS (Gao et al.) in 001 and 002": same(
        dict(paper="arccse", table="Table 1", method="SimCSE-BERT_base"),
        dict(paper="unified_gradient", table="Table 3", method="L^info", backbone="bert-base"),
    ),
    "SimCSE BERT-large STS (Gao et al.) in 001 and 000": same(
        dict(paper="arccse", table="Table 1", method="SimCSE-BERT_large"),
        dict(paper="simace", table="Table 1", method="SimCSE", backbone="bert-large"),
    ),
    "SimCSE RoBERTa-base STS (Gao et al.) in 000 and 002": same(
        dict(paper="simace", table="Table 1", method="SimCSE", backbone="roberta-base"),
        dict(paper="unified_gradient", table="Table 3", method="L^info", backbone="roberta-base"),
    ),
    "SimCSE BERT-base transfer (Gao et al.) in 001 and 002": same(
        dict(paper="arccse", table="Table 2", method="SimCSE-BERT_base"),
        dict(paper="unified_gradient", table="Table 4", method="L^info", backbone="bert-base"),
    ),
    "first-last avg. (Gao et al.) in 000 and 004": same(
        dict(paper="simace", table="Table 1", method="first-last"),
        dict(paper="cooldown", table="Table 2", method="first-last"),
    ),
    "paper 003's 'Pretrained' BERT-base STS.Avg is the first-last avg.": same(
        dict(paper="align_uniform", method="Pretrained", backbone="bert-base", task="STS_avg"),
        dict(paper="simace", table="Table 1", method="first-last", task="STS_avg"),
        on=BY_CELL,
    ),
    "ArcCSE (Zhang et al.) in 001 and 004 Table 9": same(
        dict(paper="arccse", table="Table 1", method=["ArcCSE-BERT_base", "ArcCSE-BERT_large"]),
        dict(paper="cooldown", table="Table 9", method="ArcCSE"),
    ),
    "ArcCSE (Zhang et al.) in 001 and 004 Table 3": same(
        dict(paper="arccse", table="Table 1", method=["ArcCSE-BERT_base", "ArcCSE-BERT_large"]),
        dict(paper="cooldown", table="Table 3", method="ArcCSE"),
    ),
    "ArcCSE default dropout row of 001 Table 3 is Table 1's": same(
        dict(paper="arccse", table="Table 1", method="ArcCSE-BERT_base"),
        dict(paper="arccse", table="Table 3", method="w/ Dropout (ArcCon on, triplet off)"),
    ),
    "ArcCSE w/o Triplet loss (Zhang et al.) in 001 and 002": same(
        dict(paper="arccse", table="Table 1", method="w/o Triplet loss"),
        dict(paper="unified_gradient", table="Table 3", method="L^arc", backbone="bert-base"),
        on=BY_CELL,
    ),
    **{
        f"Nie et al. {label} in 003 and 000 Table 11": same(
            dict(paper="align_uniform", method=f"L_{label.lower()}", task="STS_avg"),
            dict(paper="simace", table="Table 11", method=label),
        )
        for label in ("DCL", "MPT", "MET", "MAT")
    },
    **{
        f"Nie et al. {label} in 003 and 002": same(
            dict(paper="align_uniform", method=f"L_{label}"),
            dict(paper="unified_gradient", method=f"L^{label}"),
        )
        for label in ("mpt", "met")
    },
    "shared run: ArcCon in 000 and 'ArcCSE w/o Triplet loss' in 004": same(
        dict(paper="simace", table="Table 1", method="ArcCon", backbone=BERT_BASE_AND_LARGE),
        dict(paper="cooldown", table="Table 9", method="ArcCSE w/o Triplet loss"),
    ),
    "shared run: SimCSE transfer in 000 and 004": same(
        dict(paper="simace", table="Table 13", method="SimCSE"),
        dict(paper="cooldown", table="Table 10", method="SimCSE"),
    ),
    "shared run: 000's text baselines are 004's SimCSE": same(
        dict(paper="simace", table="Text §4.3"),
        dict(paper="cooldown", table="Table 2", method="SimCSE", task="STS_avg"),
    ),
    "000: Table 11's SimACE is Table 2's mean": same(
        dict(paper="simace", table="Table 2", method="SimACE", aggregation="mean"),
        dict(paper="simace", table="Table 11", method="Ours (SimACE)"),
    ),
    "000: Table 3's MTEB means are Table 12's Avg.": same(
        dict(paper="simace", table="Table 3", aggregation="mean"),
        dict(paper="simace", table="Table 12", method=["SimCSE", "SimACE"], task="MTEB_avg"),
    ),
    **{
        f"000: Table 4's {label} is Table 10's mean": same(
            dict(paper="simace", table="Table 4", method=label, task="STS_avg"),
            dict(paper="simace", table="Table 10", method=t10, aggregation="mean"),
        )
        for label, t10 in (
            ("PCL", "PCL Original"),
            ("PCL + angle", "PCL Ours"),
            ("RankCSE_listNet", "RankCSE_listNet Original"),
            ("RankCSE_listNet + angle", "RankCSE_listNet Ours"),
            ("RankCSE_listMLE", "RankCSE_listMLE Original"),
            ("RankCSE_listMLE + angle", "RankCSE_listMLE Ours"),
        )
    },
    "000: Table 14's m = 10 rows are Table 1's SimACE": same(
        dict(paper="simace", table="Table 14", method="SimACE"),
        dict(paper="simace", table="Table 1", method="SimACE"),
    ),
    "000: Figure 9's caption for m = 10 and -10": same(
        dict(paper="simace", table="Figure 9 caption", method=["SimACE", "+ m = -10"]),
        dict(
            paper="simace",
            table="Table 14",
            method=["SimACE", "+ m = -10"],
            task="STS_avg",
            backbone="bert-base",
        ),
    ),
    "004: Table 3 is Table 9's Avg. column": same(
        dict(paper="cooldown", table="Table 3"),
        dict(paper="cooldown", table="Table 9", task="STS_avg"),
    ),
    "004: Table 1 at tau = 0.05 is Table 2's SimCSE": same(
        dict(paper="cooldown", table="Table 1", sweep="tau=0.05"),
        dict(paper="cooldown", table="Table 2", method="SimCSE", task="STS_avg"),
    ),
}


@pytest.mark.parametrize("name", SAME_NUMBERS)
def test_numbers_printed_in_several_places_agree(table: pl.DataFrame, name: str) -> None:
    left_criteria, right_criteria, on = SAME_NUMBERS[name]
    left, right = select(table, **left_criteria), select(table, **right_criteria)
    for side in (left, right):
        assert side.height > 0 and not side.select(on).is_duplicated().any()
    if left.height != right.height:  # a wider selection on one side: keep the matching cells
        left = left.join(right.select(on), on=on, nulls_equal=True)
        right = right.join(left.select(on), on=on, nulls_equal=True)
    joined = left.join(right, on=on, suffix="_other", nulls_equal=True)
    assert joined.height == left.height == right.height > 0
    disagree = joined.filter(pl.col("value").ne_missing(pl.col("value_other")))
    assert disagree.select(*on, "value", "value_other").rows() == []


def test_text_and_table_conflicts_are_the_flagged_ones(table: pl.DataFrame) -> None:
    """The two places where a paper contradicts its own numbers, both flagged: SimACE Fig. 9
    (76.69) vs Table 14 (77.08), and paper 002 Table 5's '+ R' cells for BT and VICReg."""
    fig9 = cell(table, table="Figure 9 caption", method="+ m = 0")
    table14 = cell(table, table="Table 14", method="+ m = 0", backbone="bert-base", task="STS_avg")
    assert (fig9, table14) == (76.69, 77.08)
    ug = select(table, paper="unified_gradient", backbone="bert-base", task="STS_avg")
    objectives = ("align_mhe", "align_mhs", "barlow_twins", "vicreg")
    final = {k: cell(ug, table="Table 5", method_key=f"{k}_modified") for k in objectives}
    table3 = {k: cell(ug, table="Table 3", method_key=f"{k}_modified") for k in final}
    assert {k for k in final if final[k] != table3[k]} == {"barlow_twins", "vicreg"}
    assert (final["barlow_twins"], final["vicreg"]) == (table3["vicreg"], table3["barlow_twins"])
    swapped = select(
        table, table="Table 5", method_key=["barlow_twins_modified", "vicreg_modified"]
    )
    assert all("suspect-swapped-rows" in flags for flags in swapped["flags"])


def test_columns_are_documented() -> None:
    docs = (REPO / "docs" / "published.md").read_text(encoding="utf-8")
    assert all(f"`{column}`" in docs for column in COLUMNS)
