"""The report's figures say what their captions say: legends outside the data and readable at
the page's width, angle histograms one panel per method on axes fitted to the angles, the
alignment-uniformity trajectories with the arrowheads the caption names, one sweep figure per
swept setting under its own name, grid points in numeric order."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

from stages.core.schema.params import parse_params
from stages.reference import published
from stages.reporting.collect import RESULT_SCHEMA, Planned, collect
from stages.reporting.comparison import compare
from stages.reporting.order import name_key, sorted_names
from stages.reporting.plots import (
    alignment_uniformity,
    angle_bins,
    angle_distributions,
    angle_scales,
    batch_angles,
    detect_sweeps,
    gradient_norms,
    sweep_plots,
    training_curves,
)
from stages.reporting.styles import DPI, PAGE_WIDTH_PX, RunStyles
from stages.reporting.tables import seed_summary

REPO = Path(__file__).resolve().parents[2]
METHODS = ["simcse", "simace", "arccse", "dcl", "mpt", "met"]
RUNS = [f"{m}.bert.s{seed}" for m in METHODS for seed in (1, 2)]  # 12 runs, as the smoke preset
READABLE_PX = 13  # legend text on the page, in pixels


def curves(runs: list[str]) -> dict[str, dict[str, pl.DataFrame]]:
    """Training curves that fill their panels: loss high at the start, angles everywhere."""
    rng = np.random.default_rng(0)
    steps = np.arange(1, 201)
    out = {}
    for i, run in enumerate(runs):
        noise = rng.normal(0, 0.05, len(steps))
        out[run] = {
            "steps": pl.DataFrame({
                "step": steps, "loss": 7 / (1 + steps / 20) + i * 0.1 + noise,
                "tau": np.full(len(steps), 0.05), "grad_norm": 80 / np.sqrt(steps) + noise,
                "batch_infonce_grad_pos": 12 / np.sqrt(steps),
                "batch_infonce_grad_neg": 7 / np.sqrt(steps),
                "batch_pos_angle_deg": 25 - steps / 10 + i * 0.3 + noise,
                "batch_neg_angle_deg": 24 - steps / 12 + i * 0.3 + noise,
            }),
            "dev": pl.DataFrame({
                "step": [50, 100, 150, 200], "spearman": [41.0 + i / 5, 43.0, 42.5, 42.0],
                "alignment": [4.3e-6, 3.9e-6, 3.2e-6, 2.2e-6 + i * 1e-8],
                "uniformity": [-2.6e-5, -2.3e-5, -1.9e-5, -1.4e-5 + i * 1e-7],
            }),
        }  # fmt: skip
    return out


def legend_outside_and_readable(figure: Figure) -> list[str]:
    """The figure's one legend: outside every panel, its text readable on the page, the figure
    no wider than the page (shown at its own size); returns its labels."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    assert all(ax.get_legend() is None for ax in figure.axes), "a legend inside a panel"
    (legend,) = figure.legends
    box = legend.get_window_extent(renderer)
    for ax in figure.axes:
        if ax.get_visible():
            assert not box.overlaps(ax.get_window_extent(renderer)), "the legend covers a panel"
    assert figure.get_figwidth() * DPI <= PAGE_WIDTH_PX
    texts = legend.get_texts()
    assert all(t.get_fontsize() * DPI / 72 >= READABLE_PX for t in texts)
    return [t.get_text() for t in texts]


@pytest.mark.parametrize("draw", [training_curves, gradient_norms, batch_angles])
def test_curve_legends_sit_below_the_panels_and_name_methods_and_seeds(draw) -> None:
    plot = draw(curves(RUNS))
    labels = legend_outside_and_readable(plot.figure)
    assert labels == [*sorted_names(METHODS), "seed 1", "seed 2"]
    assert all(len(ax.lines) == len(RUNS) for ax in plot.figure.axes)
    assert "line style: seed" in plot.caption


def test_alignment_uniformity_draws_the_arrowheads_its_caption_names() -> None:
    plot = alignment_uniformity(curves(RUNS))
    assert plot is not None
    labels = legend_outside_and_readable(plot.figure)
    assert {"first evaluation", "last evaluation"} <= set(labels)
    (ax,) = plot.figure.axes
    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)] + [
        t.arrow_patch for t in ax.texts if getattr(t, "arrow_patch", None) is not None
    ]
    assert len(arrows) == len(RUNS)
    styles = RunStyles(RUNS)
    for run, arrow in zip(RUNS, arrows, strict=True):
        assert arrow.get_arrowstyle().__class__.__name__ == "CurveFilledB"  # '-|>': a head
        assert np.allclose(arrow.get_facecolor()[:3], styles(run)["color"][:3])
    # a trajectory's start: an open marker per run
    starts = [line for line in ax.lines if line.get_markerfacecolor() == "white"]
    assert len(starts) == len(RUNS)
    assert "arrowhead" in plot.caption and "open marker" in plot.caption


def collapsed_angles(runs: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """A collapsed encoder's angles (the smoke preset's tiny model): all below 0.6 degrees."""
    rng = np.random.default_rng(1)
    return {
        run: {
            "positive": np.abs(rng.normal(0.1, 0.04, 300)),
            "negative": np.abs(rng.normal(0.19, 0.05, 5000)),
        }
        for run in runs
    }


def most_in_one_bin(samples: np.ndarray, edges: np.ndarray) -> float:
    counts, _ = np.histogram(samples, edges)
    return counts.max() / counts.sum()


def test_angle_distributions_one_panel_per_method_on_fitted_shared_axes() -> None:
    angles = collapsed_angles(RUNS)
    plot = angle_distributions(angles)
    assert plot is not None
    labels = legend_outside_and_readable(plot.figure)
    assert labels[:2] == ["positive pairs (gold > 4)", "negative pairs"]
    panels = [ax for ax in plot.figure.axes if ax.get_visible()]
    assert [ax.get_title().split("\n")[0] for ax in panels] == sorted_names(METHODS)
    for ax in panels:
        assert len(ax.patches) == 2 * 2  # positives and negatives of two seeds
        assert ax.get_shared_x_axes().joined(ax, panels[0])
        assert ax.get_shared_y_axes().joined(ax, panels[0])
    low, high = panels[0].get_xlim()
    assert low >= 0 and high < 1  # fitted to the angles, not 0-180
    edges = angle_bins(s for a in angles.values() for s in a.values())
    for samples in angles.values():
        for kind in ("positive", "negative"):
            assert most_in_one_bin(samples[kind], edges) < 0.25  # spread, not one bin
    assert "one panel per method" in plot.caption and "shared axes" in plot.caption


def test_a_trained_encoder_beside_collapsed_ones_gets_its_own_angle_axis() -> None:
    """The smoke preset's pretrained baseline (tens of degrees) beside its collapsed tiny runs
    (below one degree): on one angle axis the tiny runs would fill one bin; each scale gets
    its own, the y axis stays shared, every histogram spreads."""
    rng = np.random.default_rng(3)
    angles = collapsed_angles(RUNS[:4])
    angles["minilm-mean"] = {"positive": rng.normal(35, 8, 300).clip(1, 180),
                             "negative": rng.normal(80, 10, 5000).clip(1, 180)}  # fmt: skip
    plot = angle_distributions(angles)
    assert plot is not None
    legend_outside_and_readable(plot.figure)
    trained, simace, simcse = (ax for ax in plot.figure.axes if ax.get_visible())
    assert [ax.get_title().split("\n")[0] for ax in (trained, simace, simcse)] == [
        "minilm-mean", "simace", "simcse"
    ]  # fmt: skip
    assert simace.get_shared_x_axes().joined(simace, simcse)
    assert not trained.get_shared_x_axes().joined(trained, simace)
    assert trained.get_shared_y_axes().joined(trained, simace)
    assert simace.get_xlim()[1] < 1 and trained.get_xlim()[1] > 90
    assert "2 scales" in plot.caption and "read the ticks" in plot.caption
    collapsed = [s for run in RUNS[:4] for s in angles[run].values()]
    assert angle_scales({"a": collapsed[:4], "b": collapsed[4:], "m": [angles["minilm-mean"][
        "negative"]]}) == [["a", "b"], ["m"]]  # fmt: skip
    for group in (collapsed, list(angles["minilm-mean"].values())):
        edges = angle_bins(group)
        assert all(most_in_one_bin(samples, edges) < 0.25 for samples in group)


def smoke_with_grids() -> dict:
    """The smoke preset with grids over an objective's exponent and ratio, a train key (written
    unordered: 0.1, 0.05, 0.0) and a margin (0, 0.5, 5, 10 as 10, 5, 0.5, 0)."""
    raw = copy.deepcopy(yaml.safe_load((REPO / "presets" / "smoke.yaml").read_text()))
    methods = raw["methods"]
    raw["methods"] = {
        "align_uniform": {**methods["align_uniform"], "grid": {"objective.alpha": [2, 3]}},
        "barlow": {**methods["barlow_twins_modified"], "grid": {"objective.ratio": [1.25, 1.5]}},
        "simcse": {**methods["simcse"], "grid": {"train.weight_decay": [0.1, 0.05, 0.0]}},
        "arccon": {**methods["arccon"], "grid": {"objective.margin_deg": [10, 5, 0.5, 0]}},
    }
    raw["experiments"] = [{"methods": list(raw["methods"]), "backbones": ["tiny-bert"],
                           "seeds": [42, 43]}]  # fmt: skip
    raw["report"]["baseline_method"] = "simcse[weight_decay=0.0]"
    return raw


def sts_rows(planned: list[Planned]) -> pl.DataFrame:
    noise = np.random.default_rng(2).normal(0, 0.3, len(planned))
    rows = [
        {"experiment": p.experiment, "kind": "run", "run_id": p.run_id, "method": p.method,
         "backbone": p.backbone, "seed": p.seed, "source": "senteval", "task": "STS_avg",
         "metric": "spearman", "value": 70.0 + i / 10 + noise[i]}
        for i, p in enumerate(planned)
    ]  # fmt: skip
    return pl.DataFrame(rows, schema=RESULT_SCHEMA)


def test_every_swept_setting_gets_its_own_figure_under_its_own_name() -> None:
    planned = collect(parse_params(smoke_with_grids()), Path("/nonexistent")).planned
    results = sts_rows(planned)
    plots = {p.name: p for p in sweep_plots(planned, results, published().clear())}
    assert set(plots) == {
        "sweep_objective_alpha",
        "sweep_objective_ratio",
        "sweep_train_weight_decay",
        "margin_ablation",  # objective.margin_deg: SimACE's and ArcCSE's margin tables
    }
    for plot in plots.values():
        legend_outside_and_readable(plot.figure)
        (ax,) = plot.figure.axes
        assert ax.get_xlabel() in plot.caption
        assert "published" not in plot.caption  # none drawn: the caption does not say so
    assert plots["sweep_objective_alpha"].figure.axes[0].get_xlabel() == "objective.alpha"
    # grid points in numeric order on the axis: 0, 0.05, 0.1 (as text 0.05 sorts before 0.0)
    (line,) = plots["sweep_train_weight_decay"].figure.axes[0].lines[:1]
    assert list(line.get_xdata()) == [0.0, 0.05, 0.1]
    (margins,) = [s for s in detect_sweeps(planned) if s.parameter == "objective.margin_deg"]
    assert list(margins.points) == [0.0, 0.5, 5.0, 10.0]


def test_a_grid_over_two_keys_draws_one_line_per_value_of_the_other() -> None:
    raw = smoke_with_grids()
    raw["methods"]["arccon"]["grid"] = {
        "objective.margin_deg": [5, 10],
        "objective.tau": [0.05, 0.07],
    }
    planned = collect(parse_params(raw), Path("/nonexistent")).planned
    plots = {p.name: p for p in sweep_plots(planned, sts_rows(planned), published().clear())}
    margin = plots["margin_ablation"].figure.axes[0].get_legend_handles_labels()[1]
    assert margin == ["ours: arccon, tiny-bert (tau=0.05)", "ours: arccon, tiny-bert (tau=0.07)"]
    tau = plots["temperature_sweep"].figure.axes[0].get_legend_handles_labels()[1]
    assert tau == [
        "ours: arccon, tiny-bert (margin_deg=5.0)",
        "ours: arccon, tiny-bert (margin_deg=10.0)",
    ]


def test_a_key_that_merely_contains_tau_is_not_the_temperature() -> None:
    """objective.tau_plus is its own setting: its own figure, labelled with its name; the
    temperature figure is objective.tau's alone."""

    def planned(method: str, tau_plus: float) -> Planned:
        settings = {"objective.name": "x", "objective.tau": 0.05, "objective.tau_plus": tau_plus}
        return Planned(f"{method}.b.s1", "run", method, "b", 1, "r", settings, "x")

    runs = [planned("x[tau_plus=0.1]", 0.1), planned("x[tau_plus=0.2]", 0.2)]
    (plot,) = sweep_plots(runs, sts_rows(runs), published().clear())
    assert plot.name == "sweep_objective_tau_plus"
    assert plot.figure.axes[0].get_xlabel() == "objective.tau_plus"


def test_methods_of_a_grid_sort_by_their_numbers() -> None:
    """simcse[weight_decay=0.0] < 0.05 < 0.1, arccon[margin_deg=0] < 0.5 < 5 < 10 in the
    tables, the summary and the legends (as text: 0.05 before 0.0, 10 before 5)."""
    assert sorted(["s[t=0.05]", "s[t=0.0]", "s[t=0.1]"], key=name_key) == [
        "s[t=0.0]", "s[t=0.05]", "s[t=0.1]"
    ]  # fmt: skip
    assert sorted_names(["a[m=-10]", "a[m=5]", "a", "a-tau-0_1"]) == [
        "a", "a-tau-0_1", "a[m=-10]", "a[m=5]"
    ]  # fmt: skip
    planned = collect(parse_params(smoke_with_grids()), Path("/nonexistent")).planned
    results = sts_rows(planned)
    summary_methods = seed_summary(results)["method"].unique(maintain_order=True).to_list()
    margins = [m for m in summary_methods if m.startswith("arccon")]
    assert margins == [f"arccon[margin_deg={m}]" for m in ("0", "0.5", "5", "10")]
    decays = [m for m in summary_methods if m.startswith("simcse")]
    assert decays == [f"simcse[weight_decay={w}]" for w in ("0.0", "0.05", "0.1")]
    compared = compare(results, "simcse[weight_decay=0.0]", min_effect=0.5)["method"].to_list()
    assert [m for m in compared if m.startswith("simcse")] == decays[1:]
    assert [m for m in compared if m.startswith("arccon")] == margins
    legend = RunStyles(p.experiment for p in planned).legend()
    names = [h.get_label() for h in legend if h.get_label().startswith("arccon")]
    assert names == margins
