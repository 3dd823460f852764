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
The figures are the registry's (``stages.reporting.registry``), each under its title and
caption: the report's drawn here, the figures stage's embedded from reports/analyses/.
docs/report.md explains it all.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from stages.core import cli
from stages.core.errors import StageError
from stages.core.planning.jobs import stage_fingerprint
from stages.core.schema.evaluation_settings import EVALUATIONS
from stages.core.schema.params import Params, load_params
from stages.core.storage import layout
from stages.core.storage.atomic import atomic_path, write_json
from stages.core.storage.input_guard import watch
from stages.reference import published
from stages.reporting import registry
from stages.reporting.collect import Collected, collect
from stages.reporting.comparison import compare, comparison_table
from stages.reporting.plots import save
from stages.reporting.registry import ReportData
from stages.reporting.render import ShownFigure, html_page, markdown
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

ANALYSES = layout.analyses_dir()  # the figures stage's output, embedded when present
RESULTS = layout.REPORTS / "results"


def analysis_captions(root: Path) -> dict[str, str]:
    """figure name -> the caption the figures stage wrote for it (its index.json: the caption of
    the params it drew with); empty when the stage has not run."""
    path = root / ANALYSES / "index.json"
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["figures"]
        return {entry["name"]: str(entry["caption"]) for entry in entries}
    except (ValueError, KeyError, TypeError) as e:
        raise StageError(
            f"{path}: not an index written by the figures stage ({type(e).__name__}: {e}); "
            "run that stage again: python -m stages.figures"
        ) from e


def shown_figures(data: ReportData, folder: Path) -> list[ShownFigure]:
    """Every registered figure whose data exist, in the registry's order, under its heading:
    the report's drawn into ``folder``, the figures stage's from reports/analyses/ as that stage
    wrote them."""
    captions = analysis_captions(data.root)
    shown = []
    for figure in registry.FIGURES:
        if figure.stage == "report":
            for plot in figure.plots(data):
                path = save(plot, folder)
                link = f"{folder.name}/{path.name}"
                shown.append(ShownFigure(path, link, figure.heading, plot.caption, figure.section))
            continue
        path = data.root / ANALYSES / f"{figure.name}.png"
        if figure.name in captions and path.is_file():
            link = Path(os.path.relpath(path, data.root / RESULTS)).as_posix()
            caption = captions[figure.name]
            shown.append(ShownFigure(path, link, figure.heading, caption, figure.section))
    return shown


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
    dest = root / RESULTS
    with atomic_path(dest) as tmp:
        (tmp / "figures").mkdir(parents=True)
        collected.results.write_parquet(tmp / "results.parquet")
        collected.results.write_csv(tmp / "results.csv")
        summary.with_columns(pl.col("seeds").cast(pl.List(pl.String)).list.join(" ")).write_csv(
            tmp / "summary.csv"
        )
        tests.write_csv(tmp / "significance.csv")
        comparison.write_csv(tmp / "comparison.csv")
        data = ReportData(collected, params, reference, comparison, root)
        figures = shown_figures(data, tmp / "figures")
        title = "Contrastive sentence embeddings: results"
        text = markdown(title, intro, summary_tables, figures, tables)
        (tmp / "report.md").write_text(text, encoding="utf-8")
        page = html_page(title, intro, summary_tables, figures, tables)
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
