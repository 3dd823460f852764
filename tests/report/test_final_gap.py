"""Paper 003 Fig. 3a: STS avg. and TR avg. against the final positive-negative distance gap d_ij
of L_mpt runs trained with different margins (spec-arccse-alignunif B.7: "record d_ij at the
end"), drawn by the report from the runs' logged batch gaps."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from matplotlib.figure import Figure

from stages.reference import published
from stages.reporting.collect import (
    FINAL_GAP_STEPS,
    RESULT_SCHEMA,
    Planned,
    curve_rows,
    final_gap,
)
from stages.reporting.plots import final_gap_plots, sweep_plots
from stages.reporting.styles import DPI, PAGE_WIDTH_PX

MARGINS = (0.1, 0.23, 0.8)
SEEDS = (1, 2)


def steps(gaps: np.ndarray) -> pl.DataFrame:
    return pl.DataFrame({"step": np.arange(1, len(gaps) + 1), "batch_euclidean_gap": gaps})


def test_the_final_gap_is_the_mean_of_the_last_logged_steps() -> None:
    gaps = np.linspace(0.0, 3.0, 400)
    shuffled = steps(gaps).sample(fraction=1.0, shuffle=True, seed=0)  # rows in any order
    assert final_gap(shuffled) == pytest.approx(gaps[-FINAL_GAP_STEPS:].mean())
    assert final_gap(steps(gaps[:30])) == pytest.approx(gaps[:30].mean())  # a short run: all
    assert final_gap(pl.DataFrame({"step": [1], "loss": [1.0]})) is None  # not logged
    assert final_gap(None) is None
    rows = curve_rows({"steps": steps(gaps)})
    assert ("train_batch", "final_euclidean_gap", final_gap(steps(gaps))) in rows


def mpt_runs() -> list[Planned]:
    """An L_mpt margin sweep on one backbone, two seeds, as presets/align_uniform.yaml's."""
    runs = []
    for margin in MARGINS:
        settings = {"objective.name": "mpt", "objective.margin": margin, "train.batch_size": 64}
        method = f"mpt[margin={margin}]"
        for seed in SEEDS:
            runs.append(
                Planned(f"{method}.bert.s{seed}", "run", method, "bert", seed, "r", settings, "mpt")
            )
    return runs


def results(runs: list[Planned], with_gap: bool = True) -> pl.DataFrame:
    """STS grows then falls with the gap (the paper: STS is sensitive to d_ij), TR flat."""
    rows = []
    for p in runs:
        margin = p.settings["objective.margin"]
        gap = 0.2 + 2 * margin + 0.01 * p.seed
        values = {
            ("senteval", "STS_avg", "spearman"): 77 - 10 * (gap - 0.7) ** 2 + p.seed / 10,
            ("senteval", "TR_avg", "accuracy"): 87.5 + p.seed / 10,
        }
        if with_gap:
            values[("train", "train_batch", "final_euclidean_gap")] = gap
        for (source, task, metric), value in values.items():
            rows.append(
                {"experiment": p.experiment, "kind": "run", "run_id": p.run_id,
                 "method": p.method, "backbone": p.backbone, "seed": p.seed, "source": source,
                 "task": task, "metric": metric, "value": value}
            )  # fmt: skip
    return pl.DataFrame(rows, schema=RESULT_SCHEMA)


def test_fig_3a_draws_sts_and_tr_against_the_final_gap_one_point_per_margin() -> None:
    runs = mpt_runs()
    sweeps = {p.name for p in sweep_plots(runs, results(runs), published().clear())}
    assert sweeps == {"sweep_objective_margin"}
    (plot,) = final_gap_plots(runs, results(runs))
    assert plot.name == "final_gap_sweep"
    figure: Figure = plot.figure
    sts, tr = figure.axes
    assert "STS" in sts.get_ylabel() and "transfer" in tr.get_ylabel()
    assert all("final d_ij" in ax.get_xlabel() for ax in (sts, tr))
    gaps = [0.2 + 2 * m + 0.015 for m in MARGINS]  # the mean over seeds 1 and 2
    (line,) = sts.lines
    np.testing.assert_allclose(line.get_xdata(), gaps)
    expected = [
        77 - 10 * ((g - 0.005 - 0.7) ** 2 + (g + 0.005 - 0.7) ** 2) / 2 + 0.15 for g in gaps
    ]
    np.testing.assert_allclose(line.get_ydata(), expected)
    np.testing.assert_allclose(tr.lines[0].get_ydata(), [87.65] * len(MARGINS))
    assert [t.get_text() for t in sts.texts] == [f"margin={m:g}" for m in MARGINS]
    (legend,) = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == ["ours: mpt, bert"]
    assert figure.get_figwidth() * DPI <= PAGE_WIDTH_PX
    assert f"last {FINAL_GAP_STEPS} steps" in plot.caption and "Fig. 3a" in plot.caption


def test_no_fig_3a_without_logged_gaps_or_for_other_settings() -> None:
    runs = mpt_runs()
    assert final_gap_plots(runs, results(runs, False)) == []
    taus = [
        Planned(f"x[tau={t}].bert.s1", "run", f"x[tau={t}]", "bert", 1, "r",
                {"objective.name": "x", "objective.tau": t}, "x")
        for t in (0.05, 0.07)
    ]  # fmt: skip
    names = {p.name for p in sweep_plots(taus, results_for_tau(taus), published().clear())}
    assert names == {"temperature_sweep"}
    assert final_gap_plots(taus, results_for_tau(taus)) == []


def results_for_tau(runs: list[Planned]) -> pl.DataFrame:
    rows = [
        {"experiment": p.experiment, "kind": "run", "run_id": "r", "method": p.method,
         "backbone": "bert", "seed": 1, "source": source, "task": task, "metric": metric,
         "value": value}
        for p in runs
        for source, task, metric, value in (
            ("senteval", "STS_avg", "spearman", 76.0),
            ("train", "train_batch", "final_euclidean_gap", 0.9),
        )
    ]  # fmt: skip
    return pl.DataFrame(rows, schema=RESULT_SCHEMA)
