"""The report's figures (matplotlib, Agg, PNG), each from what exists; absent data, no figure.

- training curves: loss, tau and STS-B dev Spearman against the step (lines: one colour per
  method, one line style per seed, ``styles.py``);
- alignment-uniformity trajectories on STS-B dev over training (cool-down paper Figs. 2-3);
- gradient-norm curves: per-anchor InfoNCE gradient norms w.r.t. the positive and the
  negatives on each training batch (paper 003 eq. 6) and the total pre-clip norm;
- batch angles over training (SimACE Figs. 4, 7) and angle distributions of positives and
  negatives (SimACE Figs. 5, 8) from the final model's STS-B dev embeddings;
- sweeps: STS avg. against a hyper-parameter for runs whose resolved settings differ only in
  it (the temperature sweep: objective.tau; the margin ablation: the objective's margin),
  published values overlaid.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import polars as pl
from matplotlib.figure import Figure

from stages.reporting.collect import Planned
from stages.reporting.styles import RunStyles
from stages.reporting.tables import sweep_values

SWEEPS = {"temperature_sweep": "tau", "margin_ablation": "margin"}


@dataclass(frozen=True)
class Plot:
    name: str  # file stem
    caption: str
    figure: Figure


def _smooth(values: np.ndarray) -> np.ndarray:
    window = max(1, len(values) // 50)
    return np.convolve(values, np.ones(window) / window, mode="valid") if window > 1 else values


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
    fig, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 3.6), squeeze=False)
    styles = RunStyles(curves)
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
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
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
        "temperature and STS-B dev Spearman against the step.",
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
        "and the model's total gradient norm, per training step.",
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
        "training batch (SimACE Figs. 4, 7).",
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
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    styles = RunStyles(runs)
    for experiment, dev in runs.items():
        x, y = dev["uniformity"].to_numpy(), dev["alignment"].to_numpy()
        style = styles(experiment)
        marker = style.pop("marker", None) or "o"
        (line,) = ax.plot(x, y, marker=marker, markersize=3, label=experiment, **style)
        ax.annotate(
            "",
            xy=(x[-1], y[-1]),
            xytext=(x[0], y[0]),
            arrowprops={"arrowstyle": "->", "color": line.get_color(), "alpha": 0.4},
        )
    ax.set_xlabel("uniformity (STS-B dev)")
    ax.set_ylabel("alignment (STS-B dev)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return Plot(
        "alignment_uniformity",
        "Alignment against uniformity on STS-B dev at every "
        "dev evaluation (cool-down paper Figs. 2-3; lower is better on both axes; the "
        "arrow goes from the first to the last evaluation).",
        fig,
    )


def angle_distributions(angles: dict[str, dict[str, np.ndarray]]) -> Plot | None:
    if not angles:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=False)
    bins = np.linspace(0, 180, 91)
    styles = RunStyles(angles)
    for experiment, samples in angles.items():
        style = {k: v for k, v in styles(experiment).items() if k != "marker"}
        for ax, kind in zip(axes, ("positive", "negative"), strict=True):
            ax.hist(
                samples[kind], bins=bins, density=True, histtype="step", label=experiment, **style
            )
    for ax, kind in zip(axes, ("positive pairs (gold > 4)", "negative pairs"), strict=True):
        ax.set_xlabel("angle (degrees)")
        ax.set_title(kind)
    axes[0].set_ylabel("density")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return Plot(
        "angle_distributions",
        "Angles between the final model's embeddings of STS-B "
        "dev pairs: positives (gold > 4) and negatives (each first sentence with every "
        "other pair's second; SimACE Figs. 5, 8).",
        fig,
    )


@dataclass(frozen=True)
class Sweep:
    parameter: str  # settings key, e.g. objective.tau
    backbone: str
    points: dict[float, list[str]]  # swept value -> methods
    method_keys: frozenset[str]  # the published rows the methods stand for


def detect_sweeps(planned: Iterable[Planned], fragment: str) -> list[Sweep]:
    """Groups of methods whose resolved settings differ only in one objective setting whose
    name contains ``fragment`` (tau, margin), with at least two values, per backbone."""
    runs = [p for p in planned if p.kind == "run"]
    methods = {(p.method, p.backbone): p.settings for p in runs}
    key_of = {p.method: p.method_key for p in runs}
    groups: dict[tuple, dict[float, list[str]]] = {}
    for (method, backbone), settings in methods.items():
        for key, value in settings.items():
            last = key.rsplit(".", 1)[-1]
            if not key.startswith("objective.") or fragment not in last:
                continue
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            rest = tuple(sorted((k, repr(v)) for k, v in settings.items() if k != key))
            groups.setdefault((key, backbone, rest), {}).setdefault(float(value), []).append(method)
    return [
        Sweep(key, backbone, points, frozenset(key_of[m] for ms in points.values() for m in ms))
        for (key, backbone, _), points in groups.items()
        if len(points) >= 2
    ]


def sweep_plot(
    name: str, sweeps: list[Sweep], results: pl.DataFrame, published: pl.DataFrame
) -> Plot | None:
    if not sweeps:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    sts = results.filter(pl.col("task") == "STS_avg", pl.col("metric") == "spearman")
    for sweep in sweeps:
        xs, means, stds = [], [], []
        for value, methods in sorted(sweep.points.items()):
            values = sts.filter(
                pl.col("method").is_in(methods), pl.col("backbone") == sweep.backbone
            )["value"]
            if values.len():
                xs.append(value)
                means.append(values.mean())
                stds.append(values.std(ddof=1) if values.len() > 1 else 0.0)
        label = f"ours, {sweep.backbone} ({sweep.parameter})"
        if xs:
            ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=label)
        else:
            ax.plot([], [], marker="o", label=f"{label}: no finished run")
        swept = sweep.parameter.rsplit(".", 1)[-1]
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
        for label, xy in points.items():
            px, py = zip(*sorted(xy), strict=True)
            ax.plot(px, py, linestyle="--", marker="x", label=f"published, {label}")
    ax.set_xlabel(SWEEPS[name])
    ax.set_ylabel("STS avg. Spearman x100")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    caption = (
        f"STS avg. against the swept {SWEEPS[name]} (ours: mean ± std over seeds; "
        "published values dashed)."
    )
    return Plot(name, caption, fig)


def save(plot: Plot, folder: Path) -> Path:
    path = folder / f"{plot.name}.png"
    plot.figure.savefig(path, dpi=110)
    plt.close(plot.figure)
    return path
