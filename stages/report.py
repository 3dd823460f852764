"""Stage report: aggregate every finished run into tables, figures and a report.

    python -m stages.report [--params params.yaml]

Reads experiments/<name>/train.json, each planned evaluation's <evaluation>.json
(``stages.core.schema.evaluation_settings``) and the curves beside them for every planned
experiment and baseline (what is missing is marked, never an error) and writes reports/results/ as
a whole (a temporary folder renamed into place): results.parquet and results.csv (one row per
experiment x task x metric), summary.csv (mean ± std over seeds), significance.csv, comparison.csv
(the summary: each method against report.baseline_method on STS avg and transfer avg, difference
with 95% interval and p, a verdict, the smallest difference the seeds detect and the seeds that
would detect report.min_effect, collapsed seeds), report.md and report.html (self-contained: the
summary table and forest plot first, then the figures, then the detail tables in collapsible
<details>: the runs, the tables each planned evaluation declares, the papers' tables,
significance), figures/*.png; then reports/metrics.json, a flat summary for `dvc metrics show`.
docs/report.md explains it all.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from stages.core import cli
from stages.core.planning.jobs import stage_fingerprint
from stages.core.schema.evaluation_settings import EVALUATIONS
from stages.core.schema.params import Params, load_params
from stages.core.storage import layout
from stages.core.storage.atomic import atomic_path, write_json
from stages.core.storage.input_guard import watch
from stages.reference import published
from stages.reporting import plots as fig
from stages.reporting.collect import Collected, collect, stsb_dev_angles
from stages.reporting.comparison import compare, comparison_table
from stages.reporting.forest import forest_plot
from stages.reporting.render import html_page, markdown
from stages.reporting.significance import significance
from stages.reporting.tables import (
    Table,
    environment_warning,
    paper_tables,
    results_table,
    seed_summary,
    significance_table,
    status_table,
)

ANALYSES = layout.analyses_dir()  # the figures stage's PNGs, embedded when present
EMBEDDING_CACHE = layout.embedding_cache_dir()


def make_plots(
    collected: Collected, params: Params, reference: pl.DataFrame, root: Path
) -> list[fig.Plot]:
    angles = {}
    data_dir = root / params.evaluations.senteval.data_dir
    for experiment, fingerprint in collected.encoders.items():
        found = stsb_dev_angles(data_dir, root / EMBEDDING_CACHE, fingerprint)
        if found is not None:
            angles[experiment] = found
    plots = [
        fig.training_curves(collected.curves),
        fig.alignment_uniformity(collected.curves),
        fig.gradient_norms(collected.curves),
        fig.batch_angles(collected.curves),
        fig.angle_distributions(angles),
    ]
    shown = [p for p in plots if p is not None]
    return shown + fig.sweep_plots(collected.planned, collected.results, reference)


def evaluation_tables(params: Params, summary: pl.DataFrame, collected: Collected) -> list[Table]:
    """The tables the planned evaluations declare (stages/core/schema/evaluation_settings.py), in
    their order; a table that names no tasks gets one column per task its evaluation reported."""
    tables, results = [], collected.results
    for name in params.planned_evaluations():
        for table in EVALUATIONS[name].tables:
            reported = results.filter(pl.col("source") == name, pl.col("metric") == table.metric)
            columns = table.columns or reported["task"].unique(maintain_order=True).to_list()
            tables.append(
                results_table(summary, columns, table.metric, table.title, collected.majority)
            )
    return tables


def flat_metrics(summary: pl.DataFrame, collected: Collected) -> dict[str, Any]:
    """method/backbone/task/metric -> mean over seeds, plus counts of finished outputs."""
    metrics: dict[str, Any] = {}
    for r in summary.iter_rows(named=True):
        metrics[f"{r['method']}/{r['backbone']}/{r['task']}/{r['metric']}"] = r["mean"]
    status = collected.status
    for source in ("train", *EVALUATIONS):
        if source in status.columns:
            metrics[f"finished/{source}"] = int((status[source] == "done").sum())
    metrics["planned"] = status.height
    return metrics


def build_report(params: Params, root: Path = Path(".")) -> dict[str, Any]:
    """Write reports/results/ and reports/metrics.json under ``root``; return the metrics."""
    collected = collect(params, root)
    reference = published()
    summary = seed_summary(collected.results)
    tests = significance(
        collected.results, params.report.baseline_method, params.report.significance_test
    )
    comparison = compare(
        collected.results,
        params.report.baseline_method,
        params.report.significance_test,
        min_effect=params.report.min_effect,
        majority=collected.majority,
    )
    summary_tables = [comparison_table(comparison, params.report.baseline_method)]
    tables = [
        status_table(collected.status, params.planned_evaluations()),
        *evaluation_tables(params, summary, collected),
        *paper_tables(summary, reference, collected.planned, tests),
        significance_table(tests),
    ]
    done = int((collected.status["senteval"] == "done").sum()) if collected.status.height else 0
    intro = (
        f"{done} of {collected.status.height} planned experiments have SentEval results; "
        "the Runs table says what exists of each. Values: Spearman x100 and accuracy %."
    )
    warning = environment_warning(collected.status)
    if warning:
        intro += f" {warning}"
    dest = root / layout.REPORTS / "results"
    with atomic_path(dest) as tmp:
        (tmp / "figures").mkdir(parents=True)
        collected.results.write_parquet(tmp / "results.parquet")
        collected.results.write_csv(tmp / "results.csv")
        summary.with_columns(pl.col("seeds").cast(pl.List(pl.String)).list.join(" ")).write_csv(
            tmp / "summary.csv"
        )
        tests.write_csv(tmp / "significance.csv")
        comparison.write_csv(tmp / "comparison.csv")
        forest = forest_plot(comparison, params.report.baseline_method, params.report.min_effect)
        summary_figures = [(fig.save(forest, tmp / "figures"), forest.caption)] if forest else []
        shown = [
            (fig.save(p, tmp / "figures"), p.caption)
            for p in make_plots(collected, params, reference, root)
        ]
        for png in sorted((root / ANALYSES).glob("*.png")):
            shown.append((png, f"Analysis (figures stage): {png.stem}"))
        title = "Contrastive sentence embeddings: results"
        md_figures = [(p, c) for p, c in shown if p.is_relative_to(tmp)]
        text = markdown(title, intro, summary_tables, summary_figures, md_figures, tables, tmp)
        extra = [p for p, _ in shown if not p.is_relative_to(tmp)]
        text += "".join(f"\n![{p.stem}](../analyses/{p.name})\n" for p in extra)
        (tmp / "report.md").write_text(text, encoding="utf-8")
        page = html_page(title, intro, summary_tables, summary_figures, shown, tables)
        (tmp / "report.html").write_text(page, encoding="utf-8")
        job = {"job_fingerprint": stage_fingerprint(params, "report")}
        write_json(tmp / layout.report_job_file().name, job)
    metrics = flat_metrics(summary, collected)
    write_json(root / layout.report_metrics_file(), metrics)
    return metrics


def main(argv: Sequence[str] | None = None) -> None:
    p = cli.parser("Aggregate every finished run into tables, figures and a report.")
    args = p.parse_args(argv)
    inputs = watch(Path(args.params))
    params = load_params(args.params)
    with inputs.guarding():
        metrics = build_report(params)
    print(f"wrote {layout.REPORTS / 'results'} ({metrics['planned']} planned experiments)")


if __name__ == "__main__":
    cli.run(main)
