"""The summary's forest plot: per backbone and method, the difference to the baseline method
with its 95% interval, one panel per measure (STS avg, transfer avg), a line at no difference
and a band of +- report.min_effect (differences too small to matter)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import polars as pl

from stages.reporting.plots import Plot
from stages.reporting.styles import RunStyles


def forest_plot(comparison: pl.DataFrame, baseline: str | None, min_effect: float) -> Plot | None:
    shown = comparison.filter(pl.col("diff").is_not_null())
    if shown.is_empty():
        return None
    measures = list(dict.fromkeys(shown["measure"]))
    labels = list(dict.fromkeys(f"{b} · {m}" for b, m in shown.select("backbone", "method").rows()))
    # the colours of the other figures (their runs include the baseline method)
    styles = RunStyles(f"{m}.x.s0" for m in [*shown["method"], baseline])
    height = 1.2 + 0.35 * len(labels)
    fig, axes = plt.subplots(
        1, len(measures), figsize=(5 * len(measures), height), squeeze=False, layout="constrained"
    )
    for ax, measure in zip(axes[0], measures, strict=True):
        for r in shown.filter(pl.col("measure") == measure).iter_rows(named=True):
            y = labels.index(f"{r['backbone']} · {r['method']}")
            colour = styles(f"{r['method']}.x.s0")["color"]
            if r["ci_low"] is not None:
                ax.plot([r["ci_low"], r["ci_high"]], [y, y], color=colour, linewidth=2)
            ax.plot([r["diff"]], [y], marker="o", color=colour)
        ax.axvline(0, color="0.3", linewidth=1, linestyle="--")
        ax.axvspan(-min_effect, min_effect, color="0.85", zorder=0)
        ax.set_yticks(range(len(labels)), labels)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.set_xlabel(f"{measure}: difference to {baseline}")
        ax.grid(axis="x", alpha=0.3)
    return Plot(
        "summary_forest",
        f"Difference to {baseline} (points) with its 95% interval over the paired seeds (bars; "
        "a point without a bar: one paired seed); right of the dashed line: better than the "
        f"baseline; grey band: within ± report.min_effect = {min_effect:.2f} points.",
        fig,
    )
