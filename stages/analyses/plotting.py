"""Matplotlib (Agg) renderings of the analyses' tidy frames, in the report's style
(``stages.reporting.styles``); the frames, not the pixels, are what the tests check."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import polars as pl
from matplotlib.artist import Artist
from matplotlib.figure import Figure

from stages.reporting.styles import FONT_SIZE, HEATMAP_FONT_SIZE, HEATMAP_PANEL_SIZE


def _grid(frame: pl.DataFrame, y: str, x: str, column: str) -> np.ndarray:
    ys, xs = frame[y].unique(maintain_order=True), frame[x].unique(maintain_order=True)
    return frame[column].to_numpy().reshape(len(ys), len(xs))


def heatmap_figure(
    frame: pl.DataFrame,
    *,
    x: str,
    y: str,
    x_label: str,
    y_label: str,
    columns: int = 4,
    value_range: tuple[float, float] | None = None,
    shade: str | None = None,
) -> Figure:
    """One heat-map per panel (rows y, columns x, both in units of pi); ``shade`` names a bool
    column whose False cells are greyed out."""
    panels = frame["panel"].unique(maintain_order=True).to_list()
    rows = math.ceil(len(panels) / columns)
    width = min(columns, len(panels))
    fig, axes = plt.subplots(
        rows,
        width,
        figsize=(HEATMAP_PANEL_SIZE[0] * width, HEATMAP_PANEL_SIZE[1] * rows),
        squeeze=False,
        constrained_layout=True,
    )
    for ax, panel in zip(axes.flat, panels, strict=False):
        part = frame.filter(pl.col("panel") == panel)
        xs = part[x].unique(maintain_order=True).to_numpy() / math.pi
        ys = part[y].unique(maintain_order=True).to_numpy() / math.pi
        vmin, vmax = value_range or (None, None)
        mesh = ax.pcolormesh(
            xs, ys, _grid(part, y, x, "value"), shading="auto", cmap="viridis", vmin=vmin,
            vmax=vmax,
        )  # fmt: skip
        if shade:
            hidden = ~_grid(part, y, x, shade).astype(bool)
            ax.pcolormesh(
                xs, ys, np.ma.masked_where(~hidden, hidden.astype(float)), shading="auto",
                cmap="Greys", vmin=0, vmax=2.5, alpha=0.55,
            )  # fmt: skip
        fig.colorbar(mesh, ax=ax)
        ax.set_title(panel, fontsize=HEATMAP_FONT_SIZE)
        ax.set_xlabel(x_label, fontsize=HEATMAP_FONT_SIZE)
        ax.set_ylabel(y_label, fontsize=HEATMAP_FONT_SIZE)
        ax.tick_params(labelsize=HEATMAP_FONT_SIZE - 1)
    for ax in axes.flat[len(panels) :]:
        ax.set_axis_off()
    return fig


def share_figure(frame: pl.DataFrame) -> Figure:
    """Paper 002 Fig. 3: the hardest negative's share against mu_neg, one line per tau; the
    legend beside the panel."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6), layout="constrained")
    for (tau,), part in frame.group_by("temperature", maintain_order=True):
        ax.plot(part["mu_neg"] / math.pi, part["value"], label=f"tau = {tau:g}")
    ax.set_xlabel("mu_neg / pi")
    ax.set_ylabel("mean share of the hardest negative")
    ax.set_ylim(0, 1.02)
    fig.legend(loc="outside right upper", fontsize=FONT_SIZE, frameon=False)
    return fig


def norm_figure(frame: pl.DataFrame, fixed: dict[str, str]) -> Figure:
    """Closed-form lines with autograd markers, one panel per part (positive, negative), the
    series (the same in both) in one legend below the panels."""
    parts = frame["part"].unique(maintain_order=True).to_list()
    fig, axes = plt.subplots(
        1, len(parts), figsize=(5.5 * len(parts), 4.4), squeeze=False, layout="constrained"
    )
    for ax, part in zip(axes.flat, parts, strict=True):
        rows = frame.filter(pl.col("part") == part)
        lines = rows.filter(pl.col("source") == "closed form")
        for (series,), line in lines.group_by("series", maintain_order=True):
            (drawn,) = ax.semilogy(line["angle"] / math.pi, line["value"], label=series)
            dots = rows.filter((pl.col("source") == "autograd") & (pl.col("series") == series))
            if len(dots):
                ax.semilogy(
                    dots["angle"] / math.pi, dots["value"], "o", color=drawn.get_color(),
                    markerfacecolor="none",
                )  # fmt: skip
        ax.set_xlabel(("theta_ii'" if part == "positive" else "theta_ij'") + " / pi")
        ax.set_ylabel(f"||grad^{'pos' if part == 'positive' else 'neg_j'}|| * ||h_i||")
        ax.set_title(f"{part} part, {fixed[part]} (circles: autograd)", fontsize=FONT_SIZE)
        ax.set_ylim(1e-6, None)
    series: dict[str, Artist] = {}  # label -> line: each series once, whichever panels draw it
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            series.setdefault(label, handle)
    fig.legend(
        list(series.values()),
        list(series),
        loc="outside lower center",
        ncols=min(len(series), 3),
        fontsize=FONT_SIZE,
        frameon=False,
    )
    return fig
