"""The report's first screen: each method against the baseline method per backbone (means and
spreads, the paired difference with its 95% interval and p), a forest plot, figures whose runs
stay distinguishable beyond ten, the detail tables folded; and the page in a real browser."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from matplotlib.colors import to_hex
from scipy import stats
from test_report import built, params, project  # noqa: F401  (the report fixtures)

from stages.reporting.collect import RESULT_SCHEMA
from stages.reporting.comparison import compare, comparison_table
from stages.reporting.forest import forest_plot
from stages.reporting.plots import training_curves
from stages.reporting.styles import RunStyles

SIMCSE = {1: 76.0, 2: 77.0, 3: 75.5, 4: 76.2}
SIMACE = {1: 77.1, 2: 77.9, 3: 76.0, 4: 77.5}


def rows(method: str, backbone: str, values: dict[int, float], task="STS_avg", metric="spearman"):
    return [
        {
            "experiment": f"{method}.{backbone}.s{seed}",
            "kind": "run",
            "run_id": "x",
            "method": method,
            "backbone": backbone,
            "seed": seed,
            "source": "senteval",
            "task": task,
            "metric": metric,
            "value": value,
        }
        for seed, value in values.items()
    ]


def results(*parts: list[dict]) -> pl.DataFrame:
    return pl.DataFrame([r for part in parts for r in part], schema=RESULT_SCHEMA)


def test_difference_interval_and_p_follow_the_paired_seeds() -> None:
    frame = results(rows("simcse", "bert", SIMCSE), rows("simace", "bert", SIMACE))
    (row,) = compare(frame, "simcse").iter_rows(named=True)
    diffs = [SIMACE[s] - SIMCSE[s] for s in SIMCSE]
    low, high = stats.t.interval(0.95, len(diffs) - 1, np.mean(diffs), stats.sem(diffs))
    assert row["diff"] == pytest.approx(np.mean(diffs))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high))
    assert row["p_value"] == pytest.approx(
        stats.ttest_rel(list(SIMACE.values()), list(SIMCSE.values())).pvalue
    )
    assert row["mean"] == pytest.approx(np.mean(list(SIMACE.values())))
    assert row["std"] == pytest.approx(np.std(list(SIMACE.values()), ddof=1))
    assert (row["n_seeds"], row["baseline_n_seeds"], row["n_pairs"]) == (4, 4, 4)
    table = comparison_table(compare(frame, "simcse"), "simcse")
    assert table.rows[0][:3] == ["bert", "simace", "STS avg"]
    assert table.rows[0][5].startswith(f"{np.mean(diffs):.2f} [{low:.2f}, {high:.2f}]")


def test_one_common_seed_gives_the_difference_without_interval_or_p() -> None:
    frame = results(
        rows("simcse", "bert", {1: 76.0, 2: 77.0}),
        rows("simace", "bert", {1: 78.0}),
        rows("simace", "roberta", {1: 70.0}),  # no baseline on this backbone: no row
        rows("simace", "bert", {1: 85.0}, task="TR_avg", metric="accuracy"),  # nor here
    )
    (row,) = compare(frame, "simcse").iter_rows(named=True)
    assert (row["diff"], row["n_pairs"]) == (pytest.approx(2.0), 1)  # over the common seed
    assert row["ci_low"] is None and row["p_value"] is None
    assert compare(frame, None).is_empty()


def test_forest_plot_has_one_interval_per_method_and_measure() -> None:
    frame = results(
        rows("simcse", "bert", SIMCSE),
        rows("simace", "bert", SIMACE),
        rows("arccse", "bert", {s: v + 0.3 + 0.1 * s for s, v in SIMCSE.items()}),
        rows("simcse", "bert", SIMCSE, task="TR_avg", metric="accuracy"),
        rows("simace", "bert", SIMACE, task="TR_avg", metric="accuracy"),
    )
    plot = forest_plot(compare(frame, "simcse"), "simcse")
    assert plot is not None
    sts, transfer = plot.figure.axes
    labels = [t.get_text() for t in sts.get_yticklabels()]
    assert labels == ["bert · arccse", "bert · simace"]
    assert len(sts.lines) == 2 * 2 + 1 and len(transfer.lines) == 2 + 1  # bar + point; zero line
    assert forest_plot(compare(results(), "simcse"), "simcse") is None


def test_more_than_ten_runs_keep_distinct_colours_and_line_styles() -> None:
    methods = ["simcse", "simace", "arccse", "dcl", "mpt", "met"]
    names = [f"{m}.bert.s{seed}" for m in methods for seed in (1, 2, 3)]  # 18 runs
    styles = RunStyles(names)
    looks = {(str(styles(n)["color"]), str(styles(n)["linestyle"])) for n in names}
    assert len(looks) == len(names)
    assert len({str(styles(f"{m}.bert.s1")["color"]) for m in methods}) == len(methods)
    assert len({str(styles(f"simcse.bert.s{s}")["linestyle"]) for s in (1, 2, 3)}) == 3
    many = RunStyles(f"m{i}.bert.s1" for i in range(25))  # beyond any default cycle
    assert len({str(many(f"m{i}.bert.s1")["color"]) for i in range(25)}) == 25
    # and the report's curves use them
    curve = pl.DataFrame({"step": [1, 2, 3], "loss": [3.0, 2.0, 1.0]})
    plot = training_curves({n: {"steps": curve} for n in names})
    lines = plot.figure.axes[0].lines
    assert len(lines) == len(names)
    for line in lines:
        expected = styles(line.get_label())
        assert to_hex(line.get_color()) == to_hex(expected["color"])
        assert line.get_linestyle() == ("-" if expected["linestyle"] == "-" else "--") or (
            expected["linestyle"] in (":", "-.") and line.get_linestyle() == expected["linestyle"]
        )


def summary_first(page: str) -> None:
    sections = re.findall(r"<section id='?\"?(\w+)", page)
    assert sections[:3] == ["summary", "figures", "tables"]
    summary = page[
        page.index("id='summary'") if "id='summary'" in page else page.index('id="summary"') :
    ]
    summary = summary[: summary.index("</section>")]
    assert "Summary: each method against simcse" in summary
    assert "data:image/png;base64," in summary  # the forest plot
    assert "<details" not in summary


def test_report_puts_the_summary_first_and_folds_the_tables(built, project: Path) -> None:  # noqa: F811
    out = project / "reports/results"
    page, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    summary_first(page)
    assert page.index("<details><summary>simace Table 1") > page.index("<section id='figures'")
    assert md.index("## Summary") < md.index("## Figures") < md.index("## Tables")
    assert "<details><summary>Runs</summary>" in md
    assert (out / "figures" / "summary_forest.png").is_file()
    assert pl.read_csv(out / "comparison.csv").height >= 1


def chromium(page: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """The DOM headless Chromium builds from ``page`` (file://, offline) and its console lines."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("chromium is not installed (CI installs the Debian package in .ci/run)")
    done = subprocess.run(
        [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--log-level=0",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


def test_the_browser_check_catches_a_console_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>no_such_function();</script></body></html>")
    _, console = chromium(bad, tmp_path)
    assert any("no_such_function" in line for line in console)


def test_report_opens_offline_in_chromium_without_console_errors(
    built,  # noqa: F811
    project: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    dom, console = chromium(project / "reports/results/report.html", tmp_path)
    assert console == []
    summary_first(dom)
    images = re.findall(r"<img src=\"([^\"]{0,30})", dom)
    assert images and all(src.startswith("data:image/png;base64,") for src in images)
