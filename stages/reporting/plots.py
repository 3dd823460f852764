"""The report's figures (matplotlib, Agg, PNG), each from what exists; absent data, no figure.
``registry.py`` lists them, with the papers' analyses, under their titles.

- training curves: loss, tau and STS-B dev Spearman against the step (lines: one colour per
  method, one line style per seed, ``styles.py``);
- alignment-uniformity trajectories on STS-B dev over training (cool-down paper Figs. 2-3);
- gradient-norm curves: per-anchor InfoNCE gradient norms w.r.t. the positive and the
  negatives on each training batch (paper 003 eq. 6) and the total pre-clip norm;
- batch angles over training (SimACE Figs. 4, 7) and angle distributions of positives and
  negatives (SimACE Figs. 5, 8) from the final model's STS-B dev embeddings, one panel per
  method;
- sweeps: STS avg. against each swept setting, one figure per setting, for the methods whose
  resolved settings differ only in it (a grid, ``stages/core/schema/sweeps.py``, or methods
  written out by hand), the method's published values overlaid where the paper has them;
- paper 003 Fig. 3a: STS avg. and transfer avg. against the final batch gap d_ij of the runs of
  a margin sweep (its L_mpt margins), each point labelled with its margin.

Every legend sits outside the panels, below or beside them, in ``styles.FONT_SIZE``; figures
are at most the page's width, so the page shows them at their own size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import polars as pl
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from stages.core.schema.sweeps import SECTIONS
from stages.reporting.collect import FINAL_GAP_STEPS, Planned
from stages.reporting.order import sorted_names
from stages.reporting.styles import DPI, FIGURE_WIDTH, FONT_SIZE, SEED_COLOUR, RunStyles, parse
from stages.reporting.tables import sweep_values

# The sweeps the papers print, under the names their figures had; any other setting's sweep is
# drawn as sweep_<setting>.
SWEEP_FIGURES = {"objective.tau": "temperature_sweep", "objective.margin_deg": "margin_ablation"}
# Sweeps drawn also against the final d_ij (paper 003 Fig. 3a: L_mpt trained with different m).
FINAL_GAP_FIGURES = {"objective.margin": "final_gap_sweep"}
LEGEND_COLUMNS = 6
ANGLE_BINS = 60
ANGLE_COLUMNS = 4
# Panels whose typical angles (99th percentile) differ by more than this factor get their own
# angle axis.
ANGLE_SCALE_GAP = 10
# Positives and negatives in the angle histograms: matplotlib's first two default colours.
PAIR_COLOURS = {"positive": "tab:blue", "negative": "tab:orange"}


@dataclass(frozen=True)
class Plot:
    """A drawn figure: its file stem, a caption true of what it draws, and the tidy data it was
    drawn from where that is worth keeping beside the PNG (the analyses' CSVs)."""

    name: str  # file stem
    caption: str
    figure: Figure
    data: pl.DataFrame | None = None
    dpi: int = DPI


def _smooth(values: np.ndarray) -> np.ndarray:
    window = max(1, len(values) // 50)
    return np.convolve(values, np.ones(window) / window, mode="valid") if window > 1 else values


def _legend_rows(entries: int, columns: int = LEGEND_COLUMNS) -> int:
    return math.ceil(entries / min(entries, columns)) if entries else 0


def _legend(fig: Figure, handles: list[Artist], where: str = "lower center") -> None:
    """One legend for the whole figure, outside every panel (constrained layout makes room)."""
    if not handles:
        return
    columns = 1 if where.startswith("right") else min(len(handles), LEGEND_COLUMNS)
    fig.legend(
        handles=handles,
        loc=f"outside {where}",
        ncols=columns,
        fontsize=FONT_SIZE,
        frameon=False,
    )


def _curve_axes(
    curves: dict[str, dict[str, pl.DataFrame]],
    panels: list[tuple[str, str, str]],
    title: str,
) -> Figure | None:
    """One panel per (curve kind, column, label), one line per experiment that has it."""
    shown = [
        (k, c, label)
        for k, c, label in panels
        if any(k in e and c in e[k].columns for e in curves.values())
    ]
    if not shown:
        return None
    styles = RunStyles(curves)
    handles = styles.legend()
    height = 3.2 + 0.3 * _legend_rows(len(handles))
    fig, axes = plt.subplots(
        1, len(shown), figsize=(FIGURE_WIDTH, height), squeeze=False, layout="constrained"
    )
    for ax, (kind, column, label) in zip(axes[0], shown, strict=True):
        for experiment, frames in curves.items():
            frame = frames.get(kind)
            if frame is None or column not in frame.columns:
                continue
            frame = frame.select("step", column).drop_nulls()
            y = frame[column].to_numpy()
            smooth = _smooth(y) if kind == "steps" else y
            style = styles(experiment)
            marker = style.pop("marker", None) or ("o" if kind == "dev" else None)
            ax.plot(
                frame["step"].to_numpy()[len(y) - len(smooth) :],
                smooth,
                label=experiment,
                marker=marker,
                markersize=3,
                markevery=None if kind == "dev" else max(1, len(smooth) // 10),
                **style,
            )
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    _legend(fig, handles)
    fig.suptitle(title)
    return fig


def training_curves(curves: dict[str, dict[str, pl.DataFrame]]) -> Plot | None:
    fig = _curve_axes(
        curves,
        [
            ("steps", "loss", "loss"),
            ("steps", "tau", "tau"),
            ("dev", "spearman", "STS-B dev Spearman x100"),
        ],
        "Training curves",
    )
    return fig and Plot(
        "training_curves",
        "Loss (moving average over 2% of the steps), "
        "temperature and STS-B dev Spearman against the step; colour: method, line style: "
        "seed (legend below the panels).",
        fig,
    )


def gradient_norms(curves: dict[str, dict[str, pl.DataFrame]]) -> Plot | None:
    fig = _curve_axes(
        curves,
        [
            ("steps", "batch_infonce_grad_pos", "InfoNCE ||grad wrt positive||"),
            ("steps", "batch_infonce_grad_neg", "InfoNCE ||sum grad wrt negatives||"),
            ("steps", "grad_norm", "total gradient norm (pre-clip)"),
        ],
        "Gradient norms",
    )
    return fig and Plot(
        "gradient_norms",
        "Per-anchor InfoNCE gradient norms w.r.t. the positive "
        "and the negatives (paper 003 eq. 6; batch mean, at the step's tau or 0.05) "
        "and the model's total gradient norm, per training step (moving average over 2% of "
        "the steps); colour: method, line style: seed.",
        fig,
    )


def batch_angles(curves: dict[str, dict[str, pl.DataFrame]]) -> Plot | None:
    fig = _curve_axes(
        curves,
        [
            ("steps", "batch_pos_angle_deg", "anchor-positive angle (deg)"),
            ("steps", "batch_neg_angle_deg", "anchor-negative angle (deg)"),
        ],
        "Angles in training batches",
    )
    return fig and Plot(
        "batch_angles",
        "Mean anchor-positive and anchor-negative angle of each "
        "training batch (SimACE Figs. 4, 7; moving average over 2% of the steps); colour: "
        "method, line style: seed.",
        fig,
    )


def alignment_uniformity(curves: dict[str, dict[str, pl.DataFrame]]) -> Plot | None:
    runs = {
        e: f["dev"]
        for e, f in curves.items()
        if "dev" in f and {"alignment", "uniformity"} <= set(f["dev"].columns)
    }
    if not runs:
        return None
    styles = RunStyles(runs)
    fig, ax = plt.subplots(figsize=(0.7 * FIGURE_WIDTH, 5.0), layout="constrained")
    for experiment, dev in runs.items():
        x, y = dev["uniformity"].to_numpy(), dev["alignment"].to_numpy()
        style = styles(experiment)
        marker = style.pop("marker", None) or "o"
        (line,) = ax.plot(x, y, marker=marker, markersize=3, label=experiment, **style)
        # where the trajectory starts (an open marker) and where it ends (an arrowhead)
        ax.plot(x[:1], y[:1], marker=marker, markersize=7, markerfacecolor="white",
                color=line.get_color(), linestyle="")  # fmt: skip
        if len(x) > 1:
            ax.annotate(
                "",
                xy=(x[-1], y[-1]),
                xytext=(x[-2], y[-2]),
                arrowprops={
                    "arrowstyle": "-|>",
                    "color": line.get_color(),
                    "mutation_scale": 16,
                    "shrinkA": 0,
                    "shrinkB": 0,  # the head's tip on the last evaluation
                },
            )
    ax.set_xlabel("uniformity (STS-B dev)")
    ax.set_ylabel("alignment (STS-B dev)")
    ax.grid(alpha=0.3)
    ends = [
        Line2D([], [], color=SEED_COLOUR, marker="o", markerfacecolor="white", linestyle="",
               label="first evaluation"),
        Line2D([], [], color=SEED_COLOUR, marker=">", linestyle="", label="last evaluation"),
    ]  # fmt: skip
    _legend(fig, [*styles.legend(), *ends], where="right upper")
    return Plot(
        "alignment_uniformity",
        "Alignment against uniformity on STS-B dev at every "
        "dev evaluation (cool-down paper Figs. 2-3; lower is better on both axes): each run's "
        "line starts at an open marker (its first evaluation) and ends in an arrowhead (its "
        "last); colour: method, line style: seed.",
        fig,
    )


def _angle_panels(experiments: Iterable[str]) -> dict[str, list[str]]:
    """Panel title -> its experiments: one panel per method (and backbone, where there are
    several), its seeds together; an experiment of another name (a baseline) alone."""
    names = list(experiments)
    backbones = {p[1] for p in map(parse, names) if p is not None}
    panels: dict[str, list[str]] = {}
    for name in names:
        parsed = parse(name)
        if parsed is None:
            title = name
        else:
            title = parsed[0] if len(backbones) == 1 else f"{parsed[0]} · {parsed[1]}"
        panels.setdefault(title, []).append(name)
    return {title: panels[title] for title in sorted_names(panels)}


def angle_bins(samples: Iterable[np.ndarray], bins: int = ANGLE_BINS) -> np.ndarray:
    """``bins`` bin edges over the range of the angles (within [0, 180])."""
    pooled = np.concatenate([np.asarray(s, dtype=np.float64).ravel() for s in samples])
    low, high = float(pooled.min()), float(pooled.max())
    pad = 0.02 * (high - low) or 0.5
    return np.linspace(max(0.0, low - pad), min(180.0, high + pad), bins + 1)


def angle_scales(panels: dict[str, list[np.ndarray]]) -> list[list[str]]:
    """Panels grouped by the scale of their angles, smallest first: a panel joins the group of
    the smallest typical angle (99th percentile) within ``ANGLE_SCALE_GAP`` times it. One group
    where the methods are alike; a collapsed encoder's angles (below one degree) and a trained
    one's (tens of degrees) in two, since one axis for both would put the former in one bin."""
    typical = {t: float(np.percentile(np.concatenate(s), 99)) for t, s in panels.items()}
    groups: list[list[str]] = []
    anchor = 0.0
    for title in sorted(typical, key=lambda t: typical[t]):
        if not groups or typical[title] > ANGLE_SCALE_GAP * anchor:
            groups.append([])
            anchor = typical[title]
        groups[-1].append(title)
    return groups


def angle_distributions(angles: dict[str, dict[str, np.ndarray]]) -> Plot | None:
    if not angles:
        return None
    panels = _angle_panels(angles)
    styles = RunStyles(angles)
    samples = {t: [angles[e][k] for e in runs for k in PAIR_COLOURS] for t, runs in panels.items()}
    scales = angle_scales(samples)
    edges = {t: angle_bins(s for u in group for s in samples[u]) for group in scales for t in group}
    columns = min(ANGLE_COLUMNS, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(FIGURE_WIDTH * columns / ANGLE_COLUMNS, 0.6 + 2.5 * rows),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    drawn = dict(zip(panels, axes.flat, strict=False))
    for title, ax in drawn.items():
        for experiment in panels[title]:
            dash = styles(experiment)["linestyle"]
            for kind, colour in PAIR_COLOURS.items():
                values = angles[experiment][kind]
                ax.hist(values, bins=edges[title], weights=np.full(len(values), 1 / len(values)),
                        histtype="step", color=colour, linestyle=dash, linewidth=1.3)  # fmt: skip
        medians = [
            float(np.median(np.concatenate([angles[e][kind] for e in panels[title]])))
            for kind in PAIR_COLOURS
        ]
        ax.set_title(f"{title}\nmedian {medians[0]:.3g}° / {medians[1]:.3g}°", fontsize=FONT_SIZE)
        ax.set_xlim(edges[title][0], edges[title][-1])
        ax.grid(alpha=0.3)
    for group in scales:  # one angle axis per scale
        for title in group[1:]:
            drawn[title].sharex(drawn[group[0]])
    for i, ax in enumerate(axes.flat):
        if i >= len(panels):
            ax.set_visible(False)
        elif i + columns >= len(panels):  # the lowest panel of its column
            ax.set_xlabel("angle (degrees)")
    fig.supylabel("share of pairs per bin")
    handles: list[Artist] = [
        Line2D([], [], color=PAIR_COLOURS["positive"], label="positive pairs (gold > 4)"),
        Line2D([], [], color=PAIR_COLOURS["negative"], label="negative pairs"),
    ]
    if len(styles.dash) > 1:
        handles += [h for h in styles.legend() if h.get_label().startswith("seed ")]
    _legend(fig, handles)
    if len(scales) > 1:
        axis = (
            "the y axis shared; the angle axis shared by the panels of one scale, fitted to "
            f"their angles: {len(scales)} scales, orders of magnitude apart, so read the ticks"
        )
    else:
        axis = "shared axes, fitted to the angles"
    return Plot(
        "angle_distributions",
        "Angles between the final model's embeddings of STS-B dev pairs, one panel per method "
        f"({axis}; {ANGLE_BINS} bins, the share of each run's pairs in each; the panel title "
        "gives the median positive / negative angle): positives (gold > 4) and negatives (each "
        "first sentence with every other pair's second; SimACE Figs. 5, 8); line style: seed.",
        fig,
    )


@dataclass(frozen=True)
class Sweep:
    parameter: str  # settings key, e.g. objective.tau
    backbone: str
    points: dict[float, list[str]]  # swept value -> methods
    method_keys: frozenset[str]  # the published rows the methods stand for
    fixed: tuple[tuple[str, str], ...]  # the other settings, (key, repr(value)), shared


def _sweepable(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def detect_sweeps(planned: Iterable[Planned]) -> list[Sweep]:
    """Groups of methods whose resolved settings differ only in one numeric setting (any
    objective, temperature or train key), with at least two values, per backbone; sorted by
    setting, backbone and methods."""
    runs = [p for p in planned if p.kind == "run"]
    methods = {(p.method, p.backbone): p.settings for p in runs}
    key_of = {p.method: p.method_key for p in runs}
    groups: dict[tuple, dict[float, list[str]]] = {}
    for (method, backbone), settings in methods.items():
        for key, value in settings.items():
            if key.split(".", 1)[0] not in SECTIONS or not _sweepable(value):
                continue
            rest = tuple(sorted((k, repr(v)) for k, v in settings.items() if k != key))
            groups.setdefault((key, backbone, rest), {}).setdefault(float(value), []).append(method)
    sweeps = [
        Sweep(
            key,
            backbone,
            dict(sorted(points.items())),
            frozenset(key_of[m] for ms in points.values() for m in ms),
            rest,
        )
        for (key, backbone, rest), points in groups.items()
        if len(points) >= 2
    ]
    return sorted(sweeps, key=lambda s: (s.parameter, s.backbone, sorted(s.method_keys)))


def sweep_name(parameter: str) -> str:
    """The figure's file stem for a swept setting."""
    return SWEEP_FIGURES.get(parameter, "sweep_" + parameter.replace(".", "_"))


def _line_labels(sweeps: list[Sweep]) -> list[str]:
    """'ours: simcse, bert-base', plus the settings that tell apart sweeps of the same methods
    and backbone (a grid over two keys: one line per value of the other)."""
    labels = []
    for sweep in sweeps:
        label = f"ours: {', '.join(sorted(sweep.method_keys))}, {sweep.backbone}"
        twins = [
            s for s in sweeps if (s.method_keys, s.backbone) == (sweep.method_keys, sweep.backbone)
        ]
        if len(twins) > 1:
            fixed = dict(sweep.fixed)
            differ = [k for k in fixed if len({dict(t.fixed).get(k) for t in twins}) > 1]
            label += " (" + ", ".join(f"{k.rsplit('.', 1)[-1]}={fixed[k]}" for k in differ) + ")"
        labels.append(label)
    return labels


def sweep_plot(sweeps: list[Sweep], results: pl.DataFrame, published: pl.DataFrame) -> Plot | None:
    """STS avg. against one swept setting: every sweep of it (on any backbone, of any
    methods), each with its methods' published points where the paper has them."""
    if not sweeps:
        return None
    (parameter,) = {s.parameter for s in sweeps}
    swept = parameter.rsplit(".", 1)[-1]  # the name a published sweep point uses
    fig, ax = plt.subplots(figsize=(0.7 * FIGURE_WIDTH, 4.2), layout="constrained")
    sts = results.filter(pl.col("task") == "STS_avg", pl.col("metric") == "spearman")
    drew_published = False
    for sweep, label in zip(sweeps, _line_labels(sweeps), strict=True):
        xs, means, stds = [], [], []
        for value, methods in sweep.points.items():
            values = sts.filter(
                pl.col("method").is_in(methods), pl.col("backbone") == sweep.backbone
            )["value"]
            if values.len():
                xs.append(value)
                means.append(values.mean())
                stds.append(values.std(ddof=1) if values.len() > 1 else 0.0)
        if xs:
            ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=label)
        else:
            ax.plot([], [], marker="o", label=f"{label}: no finished run")
        rows = published.filter(  # the same method's published sweep, no other's
            pl.col("method_key").is_in(sweep.method_keys),
            pl.col("backbone") == sweep.backbone,
            pl.col("task") == "STS_avg",
            pl.col("metric") == "spearman",
            pl.col("value").is_not_null(),
            pl.col("sweep").is_not_null(),
        )
        points: dict[str, list[tuple[float, float]]] = {}
        for r in rows.iter_rows(named=True):
            at = sweep_values(r["sweep"]).get(swept)
            if at is not None and len(sweep_values(r["sweep"])) == 1:
                points.setdefault(f"{r['paper']} {r['table']}: {r['method']}", []).append(
                    (at, r["value"])
                )
        for source, xy in points.items():
            px, py = zip(*sorted(xy), strict=True)
            ax.plot(px, py, linestyle="--", marker="x", label=f"published, {source}")
            drew_published = True
    ax.set_xlabel(parameter)
    ax.set_ylabel("STS avg. Spearman x100")
    ax.grid(alpha=0.3)
    _legend(fig, ax.get_legend_handles_labels()[0])
    caption = (
        f"STS avg. against {parameter}, the only setting in which the methods of a line differ "
        "(ours: the mean over seeds, bars ± std where two or more seeds finished"
    )
    caption += "; published: dashed lines, x markers)." if drew_published else ")."
    return Plot(sweep_name(parameter), caption, fig)


FINAL_GAP_PANELS = (
    ("STS_avg", "spearman", "STS avg. Spearman x100"),
    ("TR_avg", "accuracy", "transfer avg. accuracy %"),
)


def final_gap_points(sweep: Sweep, results: pl.DataFrame, task: str, metric: str) -> pl.DataFrame:
    """One row per swept value whose runs have both numbers: the value, the mean final d_ij and
    the mean score over those runs (each run's pair joined by experiment)."""
    runs = results.filter(pl.col("backbone") == sweep.backbone)
    gap = runs.filter(pl.col("task") == "train_batch", pl.col("metric") == "final_euclidean_gap")
    score = runs.filter(pl.col("task") == task, pl.col("metric") == metric)
    pairs = gap.select("experiment", "method", gap="value").join(
        score.select("experiment", score="value"), on="experiment"
    )
    rows = []
    for value, methods in sweep.points.items():
        found = pairs.filter(pl.col("method").is_in(methods))
        if found.height:
            rows.append((value, found["gap"].mean(), found["score"].mean(), found.height))
    schema = {"value": pl.Float64, "gap": pl.Float64, "score": pl.Float64, "runs": pl.Int64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def final_gap_plot(sweeps: list[Sweep], results: pl.DataFrame) -> Plot | None:
    """Paper 003 Fig. 3a: STS avg. and transfer avg. (y) against the final d_ij (x) of the runs
    at each value of one swept setting, one line per sweep through its values in order, each
    point labelled with its value; None where no run has both numbers."""
    if not sweeps:
        return None
    (parameter,) = {s.parameter for s in sweeps}
    swept = parameter.rsplit(".", 1)[-1]
    fig, axes = plt.subplots(1, 2, figsize=(FIGURE_WIDTH, 4.2), layout="constrained")
    drew = False
    for sweep, label in zip(sweeps, _line_labels(sweeps), strict=True):
        for ax, (task, metric, _) in zip(axes, FINAL_GAP_PANELS, strict=True):
            points = final_gap_points(sweep, results, task, metric)
            if not points.height:
                continue
            ax.plot(points["gap"], points["score"], marker="o", label=label)
            for value, x, y in points.select("value", "gap", "score").iter_rows():
                ax.annotate(
                    f"{swept}={value:g}", (x, y), xytext=(4, 4), textcoords="offset points",
                    fontsize=FONT_SIZE - 1,
                )  # fmt: skip
            drew = True
    if not drew:
        plt.close(fig)
        return None
    for ax, (_, _, ylabel) in zip(axes, FINAL_GAP_PANELS, strict=True):
        ax.set_xlabel("final d_ij (mean of the last training batches)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    _legend(fig, list(handles.values()))
    caption = (
        f"STS avg. and transfer avg. against the final d_ij of runs that differ only in "
        f"{parameter} (paper 003 Fig. 3a, its L_mpt margins): d_ij = mean_i [mean_(j != i) "
        "||h_i - h'_j|| - ||h_i - h'_i||] of a training batch, averaged over the last "
        f"{FINAL_GAP_STEPS} steps; scores of the selected checkpoint; means over seeds."
    )
    return Plot(FINAL_GAP_FIGURES[parameter], caption, fig)


def sweeps_by_parameter(planned: Iterable[Planned]) -> dict[str, list[Sweep]]:
    """The plan's sweeps grouped by their swept setting, in ``detect_sweeps``'s order."""
    by_parameter: dict[str, list[Sweep]] = {}
    for sweep in detect_sweeps(planned):
        by_parameter.setdefault(sweep.parameter, []).append(sweep)
    return by_parameter


def sweep_plots(
    planned: Iterable[Planned], results: pl.DataFrame, published: pl.DataFrame
) -> list[Plot]:
    """One figure per swept setting of the plan."""
    plots = [
        sweep_plot(sweeps, results, published) for sweeps in sweeps_by_parameter(planned).values()
    ]
    return [p for p in plots if p is not None]


def final_gap_plots(planned: Iterable[Planned], results: pl.DataFrame) -> list[Plot]:
    """Paper 003 Fig. 3a's figure against the final d_ij for each swept setting of
    ``FINAL_GAP_FIGURES`` the plan has."""
    plots = [
        final_gap_plot(sweeps, results)
        for parameter, sweeps in sweeps_by_parameter(planned).items()
        if parameter in FINAL_GAP_FIGURES
    ]
    return [p for p in plots if p is not None]


def save(plot: Plot, folder: Path) -> Path:
    """Write ``<name>.png`` (and ``<name>.csv``, float64 to 12 significant digits, where the plot
    keeps its data) into ``folder``; return the PNG's path."""
    path = folder / f"{plot.name}.png"
    if plot.data is not None:
        plot.data.write_csv(folder / f"{plot.name}.csv", float_precision=12)
    plot.figure.savefig(path, dpi=plot.dpi)
    plt.close(plot.figure)
    return path
