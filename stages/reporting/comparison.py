"""The report's first answer: per backbone, does each method beat the baseline method?

For STS avg (Spearman x100) and transfer avg (accuracy %), each method against
``report.baseline_method`` (SimCSE by default) on the same backbone: both means and spreads
over seeds, the mean paired difference over the seeds both ran, its 95% confidence interval
(t distribution, n - 1 degrees of freedom) and the paired test's p-value (``significance.py``).
Fewer than two common seeds: the difference alone, no interval and no p-value.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
from scipy import stats

from stages.reporting.significance import Test, paired_test
from stages.reporting.tables import MISSING, Table, fmt

MEASURES = (("STS_avg", "spearman", "STS avg"), ("TR_avg", "accuracy", "transfer avg"))
SCHEMA = {
    "backbone": pl.String,
    "method": pl.String,
    "baseline": pl.String,
    "measure": pl.String,
    "mean": pl.Float64,
    "std": pl.Float64,
    "n_seeds": pl.Int64,
    "baseline_mean": pl.Float64,
    "baseline_std": pl.Float64,
    "baseline_n_seeds": pl.Int64,
    "n_pairs": pl.Int64,
    "diff": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "p_value": pl.Float64,
    "test": pl.String,
}


def _spread(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return float(np.mean(values)), (float(np.std(values, ddof=1)) if len(values) > 1 else None)


def confidence_interval(diffs: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """The t interval of the mean of paired differences; None for fewer than two pairs."""
    if len(diffs) < 2:
        return None
    mean, sem = float(np.mean(diffs)), float(stats.sem(diffs))
    if sem == 0:
        return mean, mean
    half = float(stats.t.ppf(0.5 + level / 2, len(diffs) - 1)) * sem
    return mean - half, mean + half


def compare(results: pl.DataFrame, baseline: str | None, test: Test = "paired_t") -> pl.DataFrame:
    """One row per backbone x method (not the baseline) x measure the baseline also has."""
    runs = results.filter(pl.col("kind") == "run", pl.col("seed").is_not_null())
    rows = []
    if baseline is None or runs.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    for task, metric, label in MEASURES:
        part = runs.filter(pl.col("task") == task, pl.col("metric") == metric)
        for backbone in sorted(set(part["backbone"])):
            on_backbone = part.filter(pl.col("backbone") == backbone)
            base = dict(
                on_backbone.filter(pl.col("method") == baseline).select("seed", "value").rows()
            )
            if not base:
                continue
            for method in sorted(set(on_backbone["method"]) - {baseline}):
                ours = dict(
                    on_backbone.filter(pl.col("method") == method).select("seed", "value").rows()
                )
                seeds = sorted(set(ours) & set(base))
                a, b = [ours[s] for s in seeds], [base[s] for s in seeds]
                _, p = paired_test(a, b, test)
                ci = confidence_interval([x - y for x, y in zip(a, b, strict=True)])
                mean, std = _spread(list(ours.values()))
                base_mean, base_std = _spread(list(base.values()))
                rows.append(
                    {
                        "backbone": backbone,
                        "method": method,
                        "baseline": baseline,
                        "measure": label,
                        "mean": mean,
                        "std": std,
                        "n_seeds": len(ours),
                        "baseline_mean": base_mean,
                        "baseline_std": base_std,
                        "baseline_n_seeds": len(base),
                        "n_pairs": len(seeds),
                        "diff": float(np.mean(a) - np.mean(b)) if seeds else None,
                        "ci_low": ci[0] if ci else None,
                        "ci_high": ci[1] if ci else None,
                        "p_value": p,
                        "test": test,
                    }
                )
    return pl.DataFrame(rows, schema=SCHEMA)


def _mean_std(mean: float | None, std: float | None, n: int) -> str:
    if mean is None:
        return MISSING
    spread = f" ± {std:.2f}" if std is not None and math.isfinite(std) else ""
    return f"{mean:.2f}{spread} (n={n})"


def comparison_table(comparison: pl.DataFrame, baseline: str | None) -> Table:
    header = ["backbone", "method", "measure", "method: mean ± std", f"{baseline}: mean ± std"]
    header += ["difference [95% CI]", "p", "seeds paired"]
    rows = []
    for r in comparison.iter_rows(named=True):
        diff = fmt(r["diff"])
        if r["ci_low"] is not None:
            diff += f" [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
        rows.append(
            [
                r["backbone"],
                r["method"],
                r["measure"],
                _mean_std(r["mean"], r["std"], r["n_seeds"]),
                _mean_std(r["baseline_mean"], r["baseline_std"], r["baseline_n_seeds"]),
                diff,
                fmt(r["p_value"], 3),
                str(r["n_pairs"]),
            ]
        )
    test = comparison["test"][0] if comparison.height else "paired_t"
    note = (
        f"Each method against {baseline} on the same backbone: means ± std over seeds; the "
        f"difference is the mean over the seeds both ran, with its 95% t interval; p from the "
        f"two-sided paired test ({test}). Fewer than two paired seeds: no interval, no p."
    )
    return Table(f"Summary: each method against {baseline}", note, header, rows)
