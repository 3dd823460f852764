"""The one style of every figure, the report's and the papers' analyses' (``registry.py``):
sizes, resolutions, fonts, and distinct line styles for many runs: one colour per method, one
line style per seed, one marker per backbone, so a figure with more than ten runs still tells
every line apart (a matplotlib default cycle repeats its ten colours); the legend names the
methods, the seeds and the backbones once each, not every run.

Experiments are named ``method.backbone.s<seed>`` (``stages.experiments.experiment_name``);
anything else (a baseline) is drawn grey.

Sizes: the report's page is ``PAGE_WIDTH_PX`` wide (``render.py``); a figure at most that wide
at ``DPI`` is shown at its own size, so its ``FONT_SIZE`` text stays ``FONT_SIZE * DPI / 72``
pixels (13.75 px) on screen. The analyses' heat-maps are grids of small panels
(``HEATMAP_PANEL_SIZE``) written at ``HEATMAP_DPI``, with ``HEATMAP_FONT_SIZE`` labels.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import matplotlib as mpl
from matplotlib.lines import Line2D

from stages.reporting.order import name_key

DASHES: list[Any] = [
    "-",
    "--",
    ":",
    "-.",
    (0, (5, 1)),
    (0, (3, 1, 1, 1, 1, 1)),
    (0, (1, 3)),
    (0, (8, 2, 2, 2)),
    (0, (5, 5)),
    (0, (3, 5, 1, 5, 1, 5)),
]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
BASELINE_COLOUR = "0.45"
SEED_COLOUR = "0.3"  # the seeds' legend entries: a line style, no method's colour
PAGE_WIDTH_PX = 1400
DPI = 110
FIGURE_WIDTH = PAGE_WIDTH_PX / DPI  # inches
FONT_SIZE = 9  # points: legends and panel titles
HEATMAP_PANEL_SIZE = (3.2, 2.7)  # inches, one heat-map with its colour bar
HEATMAP_DPI = 80
HEATMAP_FONT_SIZE = 8  # points: a heat-map's title and axis labels (its ticks one point less)
# A method's name may end in its grid point, whose values hold dots: arccon[margin_deg=0.5].
_NAME = re.compile(r"^(?P<method>[^.\[]+(?:\[[^\]]*\])?)\.(?P<backbone>.+)\.s(?P<seed>-?\d+)$")


def parse(experiment: str) -> tuple[str, str, int] | None:
    match = _NAME.match(experiment)
    if match is None:
        return None
    return match["method"], match["backbone"], int(match["seed"])


def _colours(n: int) -> list[Any]:
    """n distinct colours: tab10, then tab20's light shades, then evenly spaced hues."""
    base = list(mpl.colormaps["tab10"].colors)
    base += list(mpl.colormaps["tab20"].colors)[1::2]
    if n <= len(base):
        return base[:n]
    return [mpl.colormaps["hsv"](i / n) for i in range(n)]


def _dash(i: int) -> Any:
    if i < len(DASHES):
        return DASHES[i]
    return (0, (1 + i % 7, 1 + i // 7))  # further seeds: more dash patterns


class RunStyles:
    """``styles(experiment)`` -> matplotlib kwargs (color, linestyle, marker)."""

    def __init__(self, experiments: Iterable[str]) -> None:
        names = list(dict.fromkeys(experiments))
        parsed = [p for p in map(parse, names) if p is not None]
        methods = sorted({p[0] for p in parsed}, key=name_key)
        seeds = sorted({p[2] for p in parsed})
        backbones = sorted({p[1] for p in parsed})
        self.colour = dict(zip(methods, _colours(len(methods)), strict=True))
        self.dash = {seed: _dash(i) for i, seed in enumerate(seeds)}
        self.marker = {b: MARKERS[i % len(MARKERS)] for i, b in enumerate(backbones)}
        self.others = [e for e in names if parse(e) is None]

    def __call__(self, experiment: str) -> dict[str, Any]:
        parsed = parse(experiment)
        if parsed is None:
            return {"color": BASELINE_COLOUR, "linestyle": "-"}
        method, backbone, seed = parsed
        return {
            "color": self.colour[method],
            "linestyle": self.dash[seed],
            "marker": self.marker[backbone] if len(self.marker) > 1 else None,
        }

    def legend(self) -> list[Line2D]:
        """One entry per method (its colour), per seed (its line style) where there are
        several, per backbone (its marker) where there are several, and per other line."""
        handles = [
            Line2D([], [], color=colour, label=method) for method, colour in self.colour.items()
        ]
        if len(self.dash) > 1:
            handles += [
                Line2D([], [], color=SEED_COLOUR, linestyle=dash, label=f"seed {seed}")
                for seed, dash in self.dash.items()
            ]
        if len(self.marker) > 1:
            handles += [
                Line2D([], [], color=SEED_COLOUR, marker=marker, linestyle="", label=backbone)
                for backbone, marker in self.marker.items()
            ]
        handles += [Line2D([], [], **self(other), label=other) for other in self.others]
        return handles
