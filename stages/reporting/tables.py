"""Seed statistics and the papers' tables: our value next to the published one.

Means and standard deviations are over seeds with ddof = 1 (the sample standard deviation, as
"mean and standard deviation across 5 runs" is usually computed); one seed has no std.
A published cell joins our runs on (method key = params method name, backbone, task, metric);
a published row with a sweep value (``tau=0.07``) joins only runs whose resolved settings have
that value. Published ``std`` rows compare with our std over seeds, ``std_over_steps`` rows with
nothing (the report keeps per-step means only), every other aggregation with our mean; a
published average only with ours over the same tasks (every task the paper averages, scored);
ArcCSE's best STS-B dev Spearman, printed on a 0-1 scale, with our best checkpoint's, x100.
Cells whose published number is flagged as no target (suspect, impossible, derived, an average
that does not match its row) are marked †.
Each row names the ``implementation`` (paper equations or the authors' released code) of the run
it compares, for the objectives that have both: a published number is what one of them produced.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from stages.core.schema.evaluation_settings import SENTEVAL_STS_TASKS, SENTEVAL_TRANSFER_TASKS
from stages.core.schema.mteb_task_sets import SIMACE56, TASK_SETS
from stages.reporting.collect import Planned
from stages.reporting.order import sort_by_method

STD_DDOF = 1
KEY = ("method", "backbone", "task", "metric")
MISSING = "–"
# The tasks a published average runs over (the MTEB ones: SimACE's 56 datasets).
AVERAGED_TASKS: dict[str, tuple[str, ...]] = {
    "STS_avg": SENTEVAL_STS_TASKS,
    "TR_avg": SENTEVAL_TRANSFER_TASKS,
    "MTEB_avg": TASK_SETS["simace56"],
    **{f"MTEB_{category}": tasks for category, tasks in SIMACE56.items()},
}
# Published (task, metric) that ours records under another metric name.
OUR_METRIC = {("STSBenchmark_dev", "spearman"): "best_spearman"}  # the best checkpoint's
# published.csv flags that make a number no target (docs/published.md).
NOT_A_TARGET = ("suspect-", "impossible-value", "derived", "row-average-mismatch")
FLAGGED = "†"
# A seed's accuracy this close to the majority-class rate (or below it) is marked as at chance:
# the classifier learned nothing from the encoder's embeddings (a collapsed encoder).
CHANCE_POINTS = 0.5
AT_CHANCE = "‡"


def seed_summary(results: pl.DataFrame) -> pl.DataFrame:
    """Mean, std (ddof 1), lowest value, number of seeds and the seeds, per method x backbone x
    task x metric."""
    summary = results.group_by(*KEY, maintain_order=True).agg(
        pl.col("value").mean().alias("mean"),
        pl.col("value").std(ddof=STD_DDOF).alias("std"),
        pl.col("value").min().alias("min"),
        pl.len().alias("n_seeds"),
        pl.col("seed").sort().alias("seeds"),
    )
    return sort_by_method(summary, *KEY[1:])


def at_chance(accuracy: float, majority: float) -> bool:
    """Whether an accuracy is the majority-class rate's (within ``CHANCE_POINTS``) or below."""
    return accuracy <= majority + CHANCE_POINTS


def chance_scores(results: pl.DataFrame, majority: dict[str, float]) -> pl.DataFrame:
    """The transfer scores at their task's majority-class rate (``at_chance``): one row per
    experiment x task, with its method, backbone, seed, value and the task's rate."""
    scores = results.filter(
        pl.col("metric") == "accuracy", pl.col("task").is_in(list(majority))
    ).with_columns(
        pl.col("task").replace_strict(majority, return_dtype=pl.Float64).alias("majority")
    )
    chance = [at_chance(value, rate) for value, rate in scores.select("value", "majority").rows()]
    return scores.filter(pl.Series(chance, dtype=pl.Boolean)).select(
        "experiment", "method", "backbone", "seed", "task", "value", "majority"
    )


def sweep_values(sweep: str | None) -> dict[str, float]:
    """'tau=0.07;margin_deg=-10' -> {'tau': 0.07, 'margin_deg': -10.0}."""
    values = {}
    for part in (sweep or "").split(";"):
        name, _, value = part.partition("=")
        try:
            values[name.strip()] = float(value.rstrip("%"))
        except ValueError:
            continue
    return values


def settings_match(sweep: str | None, settings: dict[str, object]) -> bool:
    """Every swept name is a setting of the run (by its last dotted part) with that value."""
    for name, value in sweep_values(sweep).items():
        found = [v for k, v in settings.items() if k.rsplit(".", 1)[-1] == name]
        if not found or not isinstance(found[0], int | float) or abs(found[0] - value) > 1e-9:
            return False
    return True


@dataclass(frozen=True)
class Table:
    """A rendered table: a title, a note, column headers and rows of cell strings."""

    title: str
    note: str
    header: list[str]
    rows: list[list[str]]


def fmt(value: float | None, digits: int = 2) -> str:
    return MISSING if value is None else f"{value:.{digits}f}"


def _normalised(label: str) -> str:
    return re.sub(r"[^a-z0-9]", "", label.lower())


def paper_tables(
    summary: pl.DataFrame,
    published: pl.DataFrame,
    planned: list[Planned],
    significance: pl.DataFrame,
) -> list[Table]:
    """Every published table that holds a trained (method, backbone) of the plan (baselines,
    filed under their own names, are not joined here), in the paper's layout
    (its rows of the plan's methods as printed, on every backbone the paper prints, tasks as
    columns); a cell reads 'ours / paper (diff)', and ours is missing where the plan does not
    run that backbone. A table none of whose backbones the plan runs (a tiny test encoder)
    would be all missing: it is left out."""
    runs = [p for p in planned if p.kind == "run"]
    method_keys = {p.method_key for p in runs}
    planned_pairs = {(p.method_key, p.backbone) for p in runs}
    rows_of = published.filter(pl.col("method_key").is_not_null() & pl.col("value").is_not_null())
    ours = {tuple(r[k] for k in KEY): r for r in summary.iter_rows(named=True)}
    p_values = {
        (r["method"], r["baseline"], r["backbone"], r["task"]): r["p_value"]
        for r in significance.iter_rows(named=True)
    }
    tables = []
    for (paper, table), part in rows_of.group_by("paper", "table", maintain_order=True):
        part = part.filter(pl.col("method_key").is_in(method_keys))
        if planned_pairs.isdisjoint(part.select("method_key", "backbone").iter_rows()):
            continue
        tasks = list(dict.fromkeys(part["task"]))
        groups = part.group_by(
            "method",
            "method_key",
            "backbone",
            "metric",
            "aggregation",
            "sweep",
            maintain_order=True,
        )
        body = []
        for (label, key, backbone, metric, aggregation, sweep), cells in groups:
            by_task = {r["task"]: r for r in cells.iter_rows(named=True)}
            # Several methods filed under one key are readings of one published row (or, for
            # a 'best of' row, its candidates): one line each, named.
            matching = _matching_runs(runs, key, backbone, sweep) or [None]
            for planned_run in matching:
                shown = f"{label} [{planned_run.method}]" if len(matching) > 1 else str(label)
                row = [
                    shown,
                    str(key),
                    str(backbone),
                    f"{metric} ({aggregation})",
                    _implementation(planned_run),
                ]
                for task in tasks:
                    published_cell = by_task.get(task)
                    paper_value = published_value(published_cell) if published_cell else None
                    mine = _ours(ours, p_values, planned_run, str(label), backbone, task, metric,
                                 aggregation)  # fmt: skip
                    cell = _cell(mine, paper_value, 3 if metric == "p_value" else 2)
                    flagged = published_cell is not None and no_target(published_cell)
                    row.append(cell + FLAGGED if flagged else cell)
                body.append(row)
        tables.append(
            Table(
                title=f"{paper} {table}",
                note="cell: ours / published (ours - published); ours = mean over seeds "
                f"(std rows: std, ddof={STD_DDOF}); {MISSING}: no finished run, no number, or "
                "an average of other tasks than the paper's; "
                f"{FLAGGED}: the published number is flagged, no target (published.csv flags); "
                "implementation: the objective's (paper equations or released code) in our run",
                header=[
                    "method (as printed)",
                    "method key",
                    "backbone",
                    "metric",
                    "implementation",
                    *tasks,
                ],
                rows=body,
            )
        )
    return tables


def published_value(cell: dict) -> float:
    """The published number on our scale: Spearman printed on a 0-1 scale, x100."""
    value = float(cell["value"])
    return value * 100 if cell["unit"] == "raw" and cell["metric"] == "spearman" else value


def our_statistic(aggregation: str) -> str | None:
    """Which of our seed statistics a published aggregation compares with (None: none)."""
    if aggregation == "std_over_steps":
        return None
    return "std" if aggregation == "std" else "mean"


def covers(ours: dict, method: str, backbone: str, task: str, metric: str) -> bool:
    """Whether our number for ``task`` is comparable: a non-average, or an average over every
    task the published one averages (ours averages whatever ran)."""
    return all((method, backbone, part, metric) in ours for part in AVERAGED_TASKS.get(task, ()))


def no_target(cell: dict) -> bool:
    return any(flag.startswith(NOT_A_TARGET) for flag in cell.get("flags") or ())


def _ours(
    ours: dict,
    p_values: dict,
    run: Planned | None,
    label: str,
    backbone: str,
    task: str,
    metric: str,
    aggregation: str,
) -> float | None:
    """Our number for a published cell: the p-value against the method named after 'vs' for
    p-value rows, else the seed statistic the aggregation compares with (None: none)."""
    if run is None:
        return None
    if metric == "p_value":
        other = _normalised(label.partition(" vs ")[2])
        return next(
            (
                p
                for (m, b, bb, t), p in p_values.items()
                if (m, bb, t) == (run.method, backbone, task) and _normalised(b) == other
            ),
            None,
        )
    statistic = our_statistic(aggregation)
    if statistic is None or not covers(ours, run.method, backbone, task, metric):
        return None
    stats = ours.get((run.method, backbone, task, OUR_METRIC.get((task, metric), metric)))
    return None if stats is None else stats[statistic]


def _matching_runs(
    runs: list[Planned], method_key: str, backbone: str, sweep: str | None
) -> list[Planned]:
    """The planned methods a published row stands for: filed under ``method_key`` on
    ``backbone``; for a sweep row, those whose settings have the swept values (a sweep point
    or the plain method at that value); otherwise those that declare no sweep."""
    matching: dict[str, Planned] = {}  # one per method: the plan lists each seed
    for run in runs:
        if (run.method_key, run.backbone) == (method_key, backbone) and (
            settings_match(sweep, run.settings) if sweep else run.sweep is None
        ):
            matching.setdefault(run.method, run)
    return list(matching.values())


def _implementation(run: Planned | None) -> str:
    """The run's objective implementation ('paper' or 'code'); 'n/a' for objectives with only
    one, MISSING without a run."""
    if run is None:
        return MISSING
    return str(run.settings.get("objective.implementation", "n/a"))


def _cell(ours: float | None, paper: float | None, digits: int) -> str:
    if paper is None:
        return fmt(ours, digits)
    if ours is None:
        return f"{MISSING} / {paper:.{digits}f}"
    return f"{ours:.{digits}f} / {paper:.{digits}f} ({ours - paper:+.{digits}f})"


def results_table(
    summary: pl.DataFrame,
    source_tasks: Sequence[str],
    metric: str,
    title: str,
    majority: dict[str, float] | None = None,
) -> Table:
    """Our mean ± std over seeds for every method x backbone (published or not); a cell where
    some seed's accuracy is within ``CHANCE_POINTS`` of its task's ``majority`` rate (always
    predicting the most frequent class) is marked: the classifier learned nothing from that
    seed's embeddings, and the mean mixes a collapsed run with the others."""
    part = summary.filter(pl.col("metric") == metric, pl.col("task").is_in(source_tasks))
    tasks = [t for t in source_tasks if t in set(part["task"])]
    chance = majority if metric == "accuracy" and majority else {}
    rows, flagged = [], False
    for (method, backbone), cells in part.group_by("method", "backbone", maintain_order=True):
        by_task = {r["task"]: r for r in cells.iter_rows(named=True)}
        row = [str(method), str(backbone), str(max(cells["n_seeds"]))]
        for task in tasks:
            r = by_task.get(task)
            if r is None:
                row.append(MISSING)
                continue
            cell = fmt(r["mean"]) + ("" if r["std"] is None else f" ± {fmt(r['std'])}")
            if task in chance and at_chance(r["min"], chance[task]):
                cell, flagged = cell + AT_CHANCE, True
            row.append(cell)
        rows.append(row)
    note = f"mean ± std over seeds (ddof={STD_DDOF})"
    if flagged:
        rates = ", ".join(f"{task} {chance[task]:.2f}" for task in tasks if task in chance)
        note += (
            f"; {AT_CHANCE} a seed within {CHANCE_POINTS} points of always predicting the task's "
            f"most frequent class (or below; the majority-class rates: {rates}): the classifier "
            "learned nothing from its embeddings"
        )
    return Table(title, note, ["method", "backbone", "seeds", *tasks], rows)


def status_table(status: pl.DataFrame, evaluations: Sequence[str]) -> Table:
    columns = ["experiment", "run_id", "train", *evaluations, "origin", "environment"]
    rows = [
        [MISSING if r.get(c) is None else str(r[c]) for c in columns]
        for r in status.iter_rows(named=True)
    ]
    return Table("Runs", "what exists of each planned experiment", columns, rows)


def environment_warning(status: pl.DataFrame) -> str | None:
    """A warning when the trained runs were computed in different environments (torch or
    transformers version, device, precision): their comparison mixes software, not only
    objectives."""
    if "environment" not in status.columns:
        return None
    labels = sorted({e for e in status["environment"].to_list() if e})
    if len(labels) < 2:
        return None
    return (
        "Warning: the runs compared here were trained in different environments ("
        + "; ".join(labels)
        + "); see the Runs table. Set identity.environment: major_minor to keep them apart."
    )


def significance_table(significance: pl.DataFrame) -> Table:
    columns = [
        "method",
        "baseline",
        "backbone",
        "task",
        "metric",
        "n_pairs",
        "mean_diff",
        "statistic",
        "p_value",
        "test",
    ]
    rows = []
    for r in significance.iter_rows(named=True):
        rows.append(
            [
                fmt(r[c], 4)
                if isinstance(r[c], float)
                else (MISSING if r[c] is None else str(r[c]))
                for c in columns
            ]
        )
    return Table(
        "Significance",
        "paired over seeds, each method against the baseline method "
        "on the same backbone; p-value two-sided",
        columns,
        rows,
    )
