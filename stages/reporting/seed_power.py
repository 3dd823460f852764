"""Before anything trains: how many seeds a params file runs per method, and the smallest
difference from the baseline method those seeds can detect (the dry run, ``cse estimates``).

The spread of a method's STS average over seeds comes from the papers where they print one
(``published.csv``'s ``std`` rows of ``STS_avg``: SimACE's Tables 2 and 10, five seeds each;
the cool-down paper's Table 8, three seeds), the largest where several tables give one; else
SimCSE's on the same backbone, else SimCSE's on BERT-base, and the table says which. Two
methods' seeds are paired by seed; their differences have the standard deviation
sqrt(s_a^2 + s_b^2) where the two vary independently, which is what this assumes (seeds sharing
a batch order correlate, which makes the real figure smaller: the estimate errs towards more
seeds). The detectable difference and the seeds needed for ``report.min_effect`` are then
``stages.reporting.power``'s, with the report's test, as the report computes them from the
trained seeds' own spread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from stages.core.identity.experiments import Plan
from stages.reference import published
from stages.reporting.power import detectable_difference, seeds_needed

TASK = "STS_avg"
FALLBACK_METHOD = "simcse"
FALLBACK_BACKBONE = "bert-base"


@dataclass(frozen=True)
class Spread:
    sd: float  # of one method's STS average over seeds, in points
    source: str  # the table it comes from, and whose it is where it is another method's


@dataclass(frozen=True)
class SeedPower:
    method: str
    backbone: str
    seeds: int
    baseline_seeds: int
    spread: Spread
    baseline_spread: Spread
    detectable: float | None  # points; inf: the test cannot reject; None: under two pairs
    seeds_needed: int | None  # for report.min_effect; None: beyond any count


def published_spreads(table: pl.DataFrame) -> dict[tuple[str, str], Spread]:
    """(method key, backbone) -> the largest printed seed spread of its STS average."""
    rows = table.filter(
        (pl.col("aggregation") == "std")
        & (pl.col("task") == TASK)
        & pl.col("method_key").is_not_null()
        & pl.col("value").is_not_null()
    ).sort("value", descending=True)
    spreads: dict[tuple[str, str], Spread] = {}
    for row in rows.iter_rows(named=True):
        key = (row["method_key"], row["backbone"])
        source = f"{row['paper']} {row['table']}, {row['n_seeds']} seeds"
        spreads.setdefault(key, Spread(row["value"], source))
    return spreads


def spread_of(
    method_key: str, backbone: str, spreads: dict[tuple[str, str], Spread]
) -> Spread | None:
    for key, whose in (
        ((method_key, backbone), ""),
        ((FALLBACK_METHOD, backbone), f"{FALLBACK_METHOD}'s on {backbone}"),
        ((FALLBACK_METHOD, FALLBACK_BACKBONE), f"{FALLBACK_METHOD}'s on {FALLBACK_BACKBONE}"),
    ):
        if key in spreads:
            found = spreads[key]
            return Spread(found.sd, f"{whose}: {found.source}" if whose else found.source)
    return None


def seed_power(plan: Plan, table: pl.DataFrame | None = None) -> list[SeedPower]:
    """One row per method and backbone compared with ``report.baseline_method`` on that
    backbone, in the plan's order; none without a baseline method or a spread to go on."""
    params = plan.params
    baseline = params.report.baseline_method
    if baseline is None:
        return []
    spreads = published_spreads(published() if table is None else table)
    seeds: dict[tuple[str, str], int] = {}
    for run in plan.runs.values():
        seeds[run.method, run.backbone] = seeds.get((run.method, run.backbone), 0) + 1
    rows = []
    for (method, backbone), count in seeds.items():
        if method == baseline or (baseline, backbone) not in seeds:
            continue
        spread = spread_of(params.method_key(method), backbone, spreads)
        baseline_spread = spread_of(params.method_key(baseline), backbone, spreads)
        if spread is None or baseline_spread is None:
            continue
        pairs = min(count, seeds[baseline, backbone])
        sd = math.hypot(spread.sd, baseline_spread.sd)
        test = params.report.significance_test
        rows.append(
            SeedPower(
                method, backbone, count, seeds[baseline, backbone], spread, baseline_spread,
                detectable_difference(sd, pairs, test) if pairs >= 2 else None,
                seeds_needed(params.report.min_effect, sd, test),
            )
        )  # fmt: skip
    return rows


def format_seed_power(plan: Plan, rows: list[SeedPower]) -> str:
    report = plan.params.report
    if not rows:
        return (
            "seeds: no comparison to judge (no report.baseline_method, or no method shares a "
            "backbone with it)"
        )
    width = max(len("method"), *(len(r.method) for r in rows))
    lines = [
        f"seeds against {report.baseline_method} ({report.significance_test}, alpha 0.05, "
        f"power 0.8; the STS average's spread over seeds from the papers: "
        f"stages/reporting/seed_power.py)",
        f"{'method'.ljust(width)}  {'backbone':<14} seeds  {'detectable':>10}  "
        f"seeds for {report.min_effect:g}  spread (its source)",
    ]
    for r in rows:
        if r.detectable is None:
            detectable = "no test"
        elif math.isinf(r.detectable):
            detectable = "none"
        else:
            detectable = f"{r.detectable:.2f}"
        needed = str(r.seeds_needed) if r.seeds_needed is not None else "-"
        lines.append(
            f"{r.method.ljust(width)}  {r.backbone:<14} {r.seeds:>2}/{r.baseline_seeds:<2} "
            f"{detectable:>10}  {needed:>12}  {r.spread.sd:.2f} ({r.spread.source}); "
            f"{report.baseline_method} {r.baseline_spread.sd:.2f} ({r.baseline_spread.source})"
        )
    lines.append(
        "detectable: the smallest true difference (points) the paired seeds detect; 'no test' "
        "under two pairs. The spread is a guess before training: the report recomputes both "
        "from the seeds' own differences."
    )
    return "\n".join(lines)
