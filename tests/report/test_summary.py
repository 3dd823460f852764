"""The report's first screen: each method against the baseline method per backbone (means and
spreads, the paired difference with its 95% interval and p), a forest plot, figures whose runs
stay distinguishable beyond ten, the detail tables folded; and the page in a real browser."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from matplotlib.colors import to_hex
from matplotlib.image import imread
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
    (row,) = compare(frame, "simcse", min_effect=0.5).iter_rows(named=True)
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
    table = comparison_table(compare(frame, "simcse", min_effect=0.5), "simcse")
    assert table.rows[0][:4] == ["bert", "simace", "STS avg", "better"]
    assert table.rows[0][4].startswith(f"{np.mean(diffs):.2f} [{low:.2f}, {high:.2f}]")


def test_one_common_seed_gives_the_difference_without_interval_or_p() -> None:
    frame = results(
        rows("simcse", "bert", {1: 76.0, 2: 77.0}),
        rows("simace", "bert", {1: 78.0}),
        rows("simace", "roberta", {1: 70.0}),  # no baseline on this backbone: no row
        rows("simace", "bert", {1: 85.0}, task="TR_avg", metric="accuracy"),  # nor here
    )
    (row,) = compare(frame, "simcse", min_effect=0.5).iter_rows(named=True)
    assert (row["diff"], row["n_pairs"]) == (pytest.approx(2.0), 1)  # over the common seed
    assert row["ci_low"] is None and row["p_value"] is None
    assert row["verdict"] == "too few seeds" and row["detectable"] is None
    assert compare(frame, None, min_effect=0.5).is_empty()


def test_forest_plot_has_one_interval_per_method_and_measure() -> None:
    frame = results(
        rows("simcse", "bert", SIMCSE),
        rows("simace", "bert", SIMACE),
        rows("arccse", "bert", {s: v + 0.3 + 0.1 * s for s, v in SIMCSE.items()}),
        rows("simcse", "bert", SIMCSE, task="TR_avg", metric="accuracy"),
        rows("simace", "bert", SIMACE, task="TR_avg", metric="accuracy"),
    )
    plot = forest_plot(compare(frame, "simcse", min_effect=0.5), "simcse", 0.5)
    assert plot is not None
    sts, transfer = plot.figure.axes
    labels = [t.get_text() for t in sts.get_yticklabels()]
    assert labels == ["bert · arccse", "bert · simace"]
    assert len(sts.lines) == 2 * 2 + 1 and len(transfer.lines) == 2 + 1  # bar + point; zero line
    (band,) = sts.patches  # the differences too small to matter: +- min_effect
    assert band.get_x() == pytest.approx(-0.5) and band.get_width() == pytest.approx(1.0)
    assert "± report.min_effect = 0.50" in plot.caption
    assert forest_plot(compare(results(), "simcse", min_effect=0.5), "simcse", 0.5) is None


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


WINDOW = (1500, 1000)  # a laptop's browser window: the first screen


def chromium(page: Path, tmp_path: Path, *options: str) -> tuple[str, list[str]]:
    """The DOM headless Chromium builds from ``page`` (file://, offline, in a ``WINDOW``) and
    its console lines; ``options`` add to the command line (--screenshot=...)."""
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
            "--hide-scrollbars",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--log-level=0",
            *options,
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
    _, console = chromium(bad, tmp_path, "--dump-dom")
    assert any("no_such_function" in line for line in console)


def test_report_opens_offline_in_chromium_without_console_errors(
    built,  # noqa: F811
    project: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    dom, console = chromium(project / "reports/results/report.html", tmp_path, "--dump-dom")
    assert console == []
    summary_first(dom)
    images = re.findall(r"<img src=\"([^\"]{0,30})", dom)
    assert images and all(src.startswith("data:image/png;base64,") for src in images)


# Measures the page as laid out in the window and writes the numbers into it, for --dump-dom.
MEASURE = """<script>addEventListener('load', () => {
  const table = document.querySelector('#summary table').getBoundingClientRect();
  const images = [...document.images].map(i => [i.naturalWidth, i.getBoundingClientRect().width]);
  const out = document.createElement('pre');
  out.id = 'layout';
  out.textContent = JSON.stringify({window: innerWidth, page: document.documentElement.scrollWidth,
                                    table: [table.top, table.right], images});
  document.body.append(out);
});</script>"""


def cells(section: str, title: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the table titled ``title`` in ``section`` of the DOM."""
    start = section.index(f"<h3>{title}")
    table = section[start : section.index("</table>", start)]
    header = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", table)]
    rows = [
        [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", table)[1:]
    ]
    return header, rows


def test_the_first_screen_gives_verdicts_power_and_flags_in_a_browser(
    built,  # noqa: F811
    project: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The summary as Chromium shows it in a 1500 x 1000 window: the page no wider than the
    window, the summary table on the first screen, every figure at its own size (its text as
    drawn); the verdicts, the detectable difference with its underpowered mark, the seeds
    needed, the collapse mark in the summary and the majority-class flag in the Transfer
    table, the captions of what the figures draw."""
    page = project / "reports/results/report.html"
    shot = tmp_path / "first_screen.png"
    chromium(page, tmp_path, f"--screenshot={shot}")
    pixels = imread(shot)
    assert pixels.shape[:2] == (WINDOW[1], WINDOW[0])
    assert pixels[..., :3].std() > 0.05  # text and tables, not a blank page

    measured = tmp_path / "measured.html"
    measured.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    dom, console = chromium(measured, tmp_path, "--dump-dom", "--virtual-time-budget=5000")
    assert console == []
    layout = json.loads(html.unescape(re.search(r"<pre id=\"layout\">(.*?)</pre>", dom)[1]))
    assert layout["page"] <= layout["window"]  # no sideways scrolling
    top, right = layout["table"]
    assert top < WINDOW[1] and right <= layout["window"]  # the summary table on the first screen
    assert layout["images"] and all(shown == natural for natural, shown in layout["images"])

    summary = dom[dom.index('<section id="summary">') : dom.index('<section id="figures">')]
    header, rows = cells(summary, "Summary: each method against simcse")
    assert header[:4] == ["backbone", "method", "measure", "verdict"]
    assert {"detectable difference", "seeds to detect 0.50"} <= set(header)
    row = {(r[1], r[2]): dict(zip(header, r, strict=True)) for r in rows}
    assert set(r["verdict"] for r in row.values()) == {"worse", "too few seeds"}
    hot_sts, hot_transfer = row["simcse_hot", "STS avg"], row["simcse_hot", "transfer avg"]
    assert hot_sts["verdict"] == "worse" and hot_sts["seeds paired"] == "2"
    assert float(hot_sts["detectable difference"]) <= 0.5
    # seed 1 collapsed: transfer noisy, underpowered, "too few seeds" and not "no difference"
    assert hot_transfer["verdict"] == "too few seeds"
    assert hot_transfer["detectable difference"].endswith("(underpowered)")
    assert hot_transfer["seeds to detect 0.50"] == "more than 10000"
    assert hot_sts["method: mean ± std"].endswith("‡ seed 1")  # the collapse mark
    assert "‡" not in row["simace", "STS avg"]["method: mean ± std"]
    assert row["simace", "STS avg"]["detectable difference"] == "–"  # one paired seed
    assert "majority-class rate" in summary and "power 0.8" in summary

    tables = dom[dom.index('<section id="tables">') :]
    header, rows = cells(tables, "Transfer (accuracy %)")
    transfer = {r[0]: dict(zip(header, r, strict=True)) for r in rows}
    assert transfer["simcse_hot"]["MR"].endswith("‡")  # the majority-class flag
    assert not transfer["simcse"]["MR"].endswith("‡")
    assert "majority-class rates: MR 50.00" in tables

    captions = [html.unescape(c) for c in re.findall(r"<figcaption>(.*?)</figcaption>", dom)]
    assert any("grey band: within ± report.min_effect = 0.50" in c for c in captions)
    assert any("ends in an arrowhead" in c for c in captions)
    (sweep,) = [c for c in captions if c.startswith("STS avg. against")]
    assert "objective.tau" in sweep and "published: dashed lines" in sweep
    assert not any("arrow goes from" in c or "published values dashed" in c for c in captions)
