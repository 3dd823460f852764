"""The report's first answer: per backbone, does each method beat the baseline method?

For STS avg (Spearman x100) and transfer avg (accuracy %), each method against
``report.baseline_method`` (SimCSE by default) on the same backbone: both means and spreads
over seeds, the mean paired difference over the seeds both ran, its 95% confidence interval
(t distribution, n - 1 degrees of freedom), the paired test's p-value (``significance.py``),
what the seeds could detect (``power.py``) and a verdict (``verdict``). Fewer than two common
seeds: the difference alone, no interval, no p-value, verdict "too few seeds".

A run whose transfer score sits at its task's majority-class rate learned nothing (a collapsed
encoder, ``tables.at_chance``): the row names such seeds on either side. Where neither side
learned anything on any paired seed, no test speaks to the methods, and the verdict says so
instead (``learned_nothing``): "collapsed" where both encoders map the STS-B dev sentences onto
nearly one point (their uniformity), on both measures; "floor" on transfer where both sit at
the majority-class rate of every transfer task.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
from scipy import stats

from stages.core.schema.evaluation_settings import STSB_DEV_TASK
from stages.reporting.order import sorted_names
from stages.reporting.power import (
    ALPHA,
    MAX_SEEDS,
    POWER,
    detectable_difference,
    exact_wilcoxon_floor,
    seeds_needed,
)
from stages.reporting.significance import Test, paired_test
from stages.reporting.tables import AT_CHANCE, CHANCE_POINTS, MISSING, Table, chance_scores, fmt

TRANSFER_AVG = "TR_avg"
MEASURES = (("STS_avg", "spearman", "STS avg"), (TRANSFER_AVG, "accuracy", "transfer avg"))
BETTER, WORSE = "better", "worse"
NO_DIFFERENCE, TOO_FEW = "no detectable difference", "too few seeds"
COLLAPSED = "collapsed: neither side's embeddings spread apart"
FLOOR = "floor: neither side above the majority class"
# Uniformity (log of the mean of exp(-2 |x - y|^2) over the STS-B dev sentences' pairs, unit
# vectors) at or above log 0.95: nearly every pair of sentences has nearly the same embedding, a
# collapsed encoder. Identical embeddings give 0; embeddings spread uniformly over the sphere of a
# wide encoder about -4.
COLLAPSED_UNIFORMITY = math.log(0.95)
Side = tuple[str, str]  # (method, backbone)
SeedsOf = dict[Side, set[int]]
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
    "sd_diff": pl.Float64,  # std (ddof 1) of the paired differences
    "detectable": pl.Float64,  # smallest true difference the pairs detect (power.py); inf: none
    "min_effect": pl.Float64,
    "seeds_needed": pl.Int64,  # paired seeds that detect min_effect; null: unknown or > MAX
    "verdict": pl.String,
    "collapsed_seeds": pl.String,  # the method's seeds at chance on a transfer task ("42 43")
    "baseline_collapsed_seeds": pl.String,
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


def verdict(
    diff: float | None,
    p_value: float | None,
    detectable: float | None,
    min_effect: float,
    alpha: float = ALPHA,
) -> str:
    """better / worse: the paired test rejects at ``alpha``, by the sign of the difference;
    no detectable difference: it does not, and the seeds would have detected ``min_effect``
    (``detectable`` <= ``min_effect``); too few seeds: no test (fewer than two pairs) or not
    significant with seeds that could miss a difference of ``min_effect`` (underpowered)."""
    if diff is not None and p_value is not None and p_value < alpha and diff != 0:
        return BETTER if diff > 0 else WORSE
    if detectable is None or detectable > min_effect:
        return TOO_FEW
    return NO_DIFFERENCE


def learned_nothing(
    seeds: list[int], task: str, sides: tuple[Side, Side], collapsed: SeedsOf, at_floor: SeedsOf
) -> str | None:
    """``COLLAPSED`` when both sides (the method's and the baseline's (method, backbone)) have
    encoders that collapsed (``collapsed_seeds``) on every paired seed; on transfer, ``FLOOR``
    when both scored every transfer task at its majority-class rate (``floor_seeds``) on every
    paired seed; else None: the paired test decides."""
    paired = set(seeds)

    def every_seed_of_both(found: SeedsOf) -> bool:
        return bool(paired) and all(paired <= found.get(side, set()) for side in sides)

    if every_seed_of_both(collapsed):
        return COLLAPSED
    if task == TRANSFER_AVG and every_seed_of_both(at_floor):
        return FLOOR
    return None


def collapsed_seeds(runs: pl.DataFrame) -> SeedsOf:
    """(method, backbone) -> the seeds whose STS-B dev uniformity says the encoder collapsed."""
    collapsed = runs.filter(
        pl.col("task") == STSB_DEV_TASK,
        pl.col("metric") == "uniformity",
        pl.col("value") >= COLLAPSED_UNIFORMITY,
    )
    found: SeedsOf = {}
    for method, backbone, seed in collapsed.select("method", "backbone", "seed").rows():
        found.setdefault((method, backbone), set()).add(seed)
    return found


def floor_seeds(runs: pl.DataFrame, majority: dict[str, float]) -> SeedsOf:
    """(method, backbone) -> the seeds that scored every transfer task with a known
    majority-class rate at that rate (``tables.at_chance``)."""
    key = ["method", "backbone", "seed"]
    scored = runs.filter(pl.col("metric") == "accuracy", pl.col("task").is_in(list(majority)))
    tasks = scored.group_by(key).agg(pl.len().alias("tasks"))
    at_chance = chance_scores(runs, majority).group_by(key).agg(pl.len().alias("at_chance"))
    floor = tasks.join(at_chance, on=key).filter(pl.col("tasks") == pl.col("at_chance"))
    found: SeedsOf = {}
    for method, backbone, seed in floor.select(key).rows():
        found.setdefault((method, backbone), set()).add(seed)
    return found


def _seeds(seeds: set[int]) -> str | None:
    return " ".join(str(s) for s in sorted(seeds)) or None


def compare(
    results: pl.DataFrame,
    baseline: str | None,
    test: Test = "paired_t",
    *,
    min_effect: float,
    majority: dict[str, float] | None = None,
) -> pl.DataFrame:
    """One row per backbone x method (not the baseline) x measure the baseline also has;
    ``majority``: each transfer task's majority-class rate, to name collapsed seeds."""
    runs = results.filter(pl.col("kind") == "run", pl.col("seed").is_not_null())
    rows = []
    if baseline is None or runs.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    collapsed: dict[tuple[str, str], set[int]] = {}
    for r in chance_scores(runs, majority or {}).iter_rows(named=True):
        collapsed.setdefault((r["method"], r["backbone"]), set()).add(r["seed"])
    geometry_collapsed = collapsed_seeds(runs)
    at_floor = floor_seeds(runs, majority or {})
    for task, metric, label in MEASURES:
        part = runs.filter(pl.col("task") == task, pl.col("metric") == metric)
        for backbone in sorted(set(part["backbone"])):
            on_backbone = part.filter(pl.col("backbone") == backbone)
            base = dict(
                on_backbone.filter(pl.col("method") == baseline).select("seed", "value").rows()
            )
            if not base:
                continue
            for method in sorted_names(set(on_backbone["method"]) - {baseline}):
                ours = dict(
                    on_backbone.filter(pl.col("method") == method).select("seed", "value").rows()
                )
                seeds = sorted(set(ours) & set(base))
                a, b = [ours[s] for s in seeds], [base[s] for s in seeds]
                diffs = [x - y for x, y in zip(a, b, strict=True)]
                _, p = paired_test(a, b, test)
                ci = confidence_interval(diffs)
                sd = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else None
                detectable = detectable_difference(sd, len(diffs), test)
                diff = float(np.mean(diffs)) if seeds else None
                sides = ((method, backbone), (baseline, backbone))
                nothing = learned_nothing(seeds, task, sides, geometry_collapsed, at_floor)
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
                        "diff": diff,
                        "ci_low": ci[0] if ci else None,
                        "ci_high": ci[1] if ci else None,
                        "p_value": p,
                        "test": test,
                        "sd_diff": sd,
                        "detectable": detectable,
                        "min_effect": min_effect,
                        "seeds_needed": seeds_needed(min_effect, sd, test),
                        "verdict": nothing or verdict(diff, p, detectable, min_effect),
                        "collapsed_seeds": _seeds(collapsed.get((method, backbone), set())),
                        "baseline_collapsed_seeds": _seeds(
                            collapsed.get((baseline, backbone), set())
                        ),
                    }
                )
    return pl.DataFrame(rows, schema=SCHEMA)


def _mean_std(mean: float | None, std: float | None, n: int, collapsed: str | None) -> str:
    if mean is None:
        return MISSING
    spread = f" ± {std:.2f}" if std is not None and math.isfinite(std) else ""
    mark = f" {AT_CHANCE} seed {collapsed}" if collapsed else ""
    return f"{mean:.2f}{spread} (n={n}){mark}"


def _detectable(detectable: float | None, min_effect: float) -> str:
    if detectable is None:
        return MISSING
    shown = "∞" if math.isinf(detectable) else f"{detectable:.2f}"
    return f"{shown} (underpowered)" if detectable > min_effect else shown


def _seeds_needed(needed: int | None, sd: float | None) -> str:
    if needed is not None:
        return str(needed)
    return MISSING if sd is None else f"more than {MAX_SEEDS}"


WILCOXON_NOTE = (
    " Wilcoxon's power is approximated: the paired t-test's with n x 3/pi seeds (the signed-rank "
    "test's asymptotic relative efficiency under normal differences) at the largest level the "
    f"exact test attains at or below {ALPHA}; with fewer than {exact_wilcoxon_floor()} seeds it "
    "attains none (its smallest p is 2 / 2^n): nothing is detectable (∞)."
)


def comparison_table(comparison: pl.DataFrame, baseline: str | None) -> Table:
    test = comparison["test"][0] if comparison.height else "paired_t"
    min_effect = comparison["min_effect"][0] if comparison.height else None
    effect = MISSING if min_effect is None else f"{min_effect:.2f}"
    header = ["backbone", "method", "measure", "verdict", "difference [95% CI]", "p"]
    header += ["seeds paired", "detectable difference", f"seeds to detect {effect}"]
    header += ["method: mean ± std", f"{baseline}: mean ± std"]
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
                r["verdict"],
                diff,
                fmt(r["p_value"], 3),
                str(r["n_pairs"]),
                _detectable(r["detectable"], r["min_effect"]),
                _seeds_needed(r["seeds_needed"], r["sd_diff"]),
                _mean_std(r["mean"], r["std"], r["n_seeds"], r["collapsed_seeds"]),
                _mean_std(
                    r["baseline_mean"],
                    r["baseline_std"],
                    r["baseline_n_seeds"],
                    r["baseline_collapsed_seeds"],
                ),
            ]
        )
    note = (
        f"Each method against {baseline} on the same backbone, paired over the seeds both ran. "
        f"Verdict: {BETTER} / {WORSE}: the two-sided paired test ({test}) gives p < {ALPHA}; "
        f"{NO_DIFFERENCE}: it does not, and these seeds detect a difference of "
        f"report.min_effect = {effect} points; {TOO_FEW}: fewer than two paired seeds, or "
        "(underpowered) the detectable difference exceeds min_effect, so 'not significant' "
        "does not rule out a difference of that size; before any of these, where neither side "
        "learned anything on any paired seed: collapsed: both encoders' STS-B dev uniformity "
        f"is at least {COLLAPSED_UNIFORMITY:.3f} (log 0.95: the sentences' embeddings nearly "
        f"coincide); floor (transfer): both sides score every transfer task within "
        f"{CHANCE_POINTS} points of its majority-class rate or below. Detectable difference: "
        "the smallest true "
        f"difference these seeds detect with power {POWER} at alpha {ALPHA} (paired t-test "
        "power, noncentral t, from the std of the paired differences); seeds to detect: the "
        "paired seeds that detect min_effect at that std. Difference: mean over the paired "
        f"seeds [95% t interval]; means ± std over each side's seeds. {AT_CHANCE} seed ...: "
        f"that seed scored a transfer task within {CHANCE_POINTS} points of the task's "
        "majority-class rate or below: the classifier learned nothing (a collapsed encoder; the "
        "Transfer table names the task)."
    )
    if test == "wilcoxon":
        note += WILCOXON_NOTE
    return Table(f"Summary: each method against {baseline}", note, header, rows)
