"""Paired significance tests over seeds: each method against the baseline method.

SimACE (Table 9) reports p-values "across different random seeds" without naming the test
(spec-simace-cooldown.md A.8); the default here is the paired t-test (``scipy.stats.ttest_rel``,
two-sided) over the seeds both methods ran on the same backbone, the usual reading for a
handful of seeds; ``wilcoxon`` (signed-rank, exact for small n) is the non-parametric option.
Fewer than two common seeds give no p-value (the row says so through n_pairs).

A method is tested on every task and metric at once, so ``p_fdr`` adjusts its p-values on a
backbone for the number of those tests (Benjamini-Hochberg, ``scipy.stats
.false_discovery_control``): read a single task's p-value against it. With n seeds the exact
Wilcoxon test cannot go below p = 2 / 2^n (0.25 at 3 seeds, 0.0625 at 5), so there "not
significant" says nothing about the size of a difference.
"""

from __future__ import annotations

import math
from typing import Literal

import polars as pl
from scipy import stats

from stages.core.schema.evaluation_settings import EVALUATIONS
from stages.reporting.order import sort_by_method

Test = Literal["paired_t", "wilcoxon"]
SCHEMA = {
    "method": pl.String,
    "baseline": pl.String,
    "backbone": pl.String,
    "task": pl.String,
    "metric": pl.String,
    "n_pairs": pl.Int64,
    "mean_diff": pl.Float64,
    "statistic": pl.Float64,
    "p_value": pl.Float64,
    "p_fdr": pl.Float64,
    "test": pl.String,
}


def paired_test(a: list[float], b: list[float], test: Test) -> tuple[float | None, float | None]:
    """(statistic, two-sided p) of a vs b paired, or (None, None) when undefined."""
    if len(a) < 2:
        return None, None
    if test == "wilcoxon":
        if all(x == y for x, y in zip(a, b, strict=True)):
            return None, None
        result = stats.wilcoxon(a, b)
    else:
        result = stats.ttest_rel(a, b)
    statistic, p = float(result.statistic), float(result.pvalue)
    return (statistic if math.isfinite(statistic) else None), (p if math.isfinite(p) else None)


def significance(
    results: pl.DataFrame, baseline: str | None, test: Test = "paired_t"
) -> pl.DataFrame:
    """One row per method x backbone x task x metric that the baseline method also has."""
    # evaluation results only: training bookkeeping (wall time, best step) is not a finding
    runs = results.filter(
        pl.col("kind") == "run",
        pl.col("seed").is_not_null(),
        pl.col("source").is_in(list(EVALUATIONS)),
    )
    if baseline is None or runs.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    base = runs.filter(pl.col("method") == baseline).select(
        "backbone", "task", "metric", "seed", pl.col("value").alias("baseline_value")
    )
    paired = runs.filter(pl.col("method") != baseline).join(
        base, on=["backbone", "task", "metric", "seed"], how="inner"
    )
    rows = []
    for (method, backbone, task, metric), part in paired.group_by(
        "method", "backbone", "task", "metric", maintain_order=True
    ):
        part = part.sort("seed")
        a, b = part["value"].to_list(), part["baseline_value"].to_list()
        statistic, p = paired_test(a, b, test)
        rows.append(
            {
                "method": method,
                "baseline": baseline,
                "backbone": backbone,
                "task": task,
                "metric": metric,
                "n_pairs": len(a),
                "mean_diff": sum(a) / len(a) - sum(b) / len(b),
                "statistic": statistic,
                "p_value": p,
                "p_fdr": None,
                "test": test,
            }
        )
    for family in _families(rows):
        adjusted = stats.false_discovery_control([rows[i]["p_value"] for i in family])
        for i, p_fdr in zip(family, adjusted, strict=True):
            rows[i]["p_fdr"] = float(p_fdr)
    return sort_by_method(pl.DataFrame(rows, schema=SCHEMA), "backbone", "task", "metric")


def _families(rows: list[dict]) -> list[list[int]]:
    """Indices of the rows with a p-value, grouped by (method, backbone): one method's tests."""
    families: dict[tuple[str, str], list[int]] = {}
    for i, row in enumerate(rows):
        if row["p_value"] is not None:
            families.setdefault((row["method"], row["backbone"]), []).append(i)
    return list(families.values())
