"""The papers' analyses that need no training, as tidy data plus a renderer per figure.

One module per paper: ``gradient_dissipation`` (paper 002, Section 3.1 simulations) and
``gradient_norms`` (paper 003, gradient norms against the angles). ``figures(params)`` lists
every figure the ``figures`` stage writes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import polars as pl

from stages.analyses import gradient_dissipation, gradient_norms, plotting
from stages.core.schema.params import FiguresParams


@dataclass(frozen=True)
class Figure:
    name: str  # file stem: <name>.png, <name>.csv
    title: str
    paper: str
    paper_figure: str
    caption: str
    data: pl.DataFrame
    render: Callable[[pl.DataFrame, Path], None]

    def entry(self) -> dict[str, str]:
        """Its index.json record."""
        return {
            "name": self.name,
            "title": self.title,
            "paper": self.paper,
            "paper_figure": self.paper_figure,
            "caption": self.caption,
            "png": f"{self.name}.png",
            "csv": f"{self.name}.csv",
        }


PAPER_002 = "002: Towards Better Understanding of Contrastive SRL: A Unified Paradigm for Gradient"
PAPER_003 = "003: On the Inadequacy of Optimizing Alignment and Uniformity in Contrastive SRL"


def figures(params: FiguresParams) -> list[Figure]:
    simulation = gradient_dissipation.Simulation.from_params(params)
    mu_axes = {"x": "mu_neg", "y": "mu_pos", "x_label": "mu_neg / pi", "y_label": "mu_pos / pi"}
    theta_axes = {
        "x": "theta_neg",
        "y": "theta_pos",
        "x_label": "theta_ij' / pi",
        "y_label": "theta_ii' / pi",
    }
    theta = gradient_norms.angles(params.heatmap_points)
    counts = params.negative_counts
    fixed_neg, fixed_pos = (
        math.radians(params.curve_theta_neg_deg),
        math.radians(params.curve_theta_pos_deg),
    )
    batch = f"1 positive and {params.negatives} negative angles"
    return [
        Figure(
            name="gradient_dissipation",
            title="Mean gradient dissipation GD over simulated batches",
            paper=PAPER_002,
            paper_figure="Fig. 2 (ArcCon, MET) and Fig. 10 (InfoNCE, MPT), Section 3.1.1",
            caption=(
                f"Mean GD (Table 1) over {params.batches} batches of {batch} per cell, theta_ii' "
                f"~ N(mu_pos, {params.sigma_pos:g}^2), theta_ij' ~ N(mu_neg, "
                f"{params.sigma_neg:g}^2), on a {params.grid_points} x {params.grid_points} grid."
                " Both forms (fraction: InfoNCE, ArcCon; indicator: MPT, MET) are 1 when mu_pos "
                "and mu_neg are close and drop to 0 once mu_neg exceeds mu_pos by some gap."
            ),
            data=gradient_dissipation.gradient_dissipation(simulation),
            render=partial(plotting.heatmaps, **mu_axes, columns=2, value_range=(0, 1)),
        ),
        Figure(
            name="hardest_negative_share",
            title="Share of the hardest negative in the exponential weight",
            paper=PAPER_002,
            paper_figure="Fig. 3, Section 3.1.2",
            caption=(
                "Mean over simulated batches of max_j w_j / sum_j w_j, w_j = e^{cos theta_ij'/tau}"
                f", at mu_pos = {params.weight_mu_pos_deg:g} deg, against mu_neg, one curve per "
                f"tau; only batches whose InfoNCE GD >= {params.weight_min_gd:g} (the released "
                "code's filter; gaps: no batch gets a gradient). Small tau focuses the weight on "
                "the hardest negative; from tau = 0.3 its share collapses."
            ),
            data=gradient_dissipation.hardest_negative_share(
                simulation,
                params.weight_mu_pos_deg,
                params.weight_temperatures,
                params.weight_min_gd,
            ),
            render=plotting.share_curves,
        ),
        Figure(
            name="dynamic_ratio",
            title="Dynamic ratios R of ArcCon and MET",
            paper=PAPER_002,
            paper_figure="Fig. 4, Section 3.1.3",
            caption=(
                "R = sin(theta_ii' + u) / sin theta_ii' (ArcCon) and sqrt((1 - cos theta_ij') / "
                "(1 - cos theta_ii')) (MET) on the angle grid, colour range [0, 5]. Shaded: pairs "
                "that do not occur in training (theta_ii' > theta_ij', or GD off). Where they "
                "occur, R is mostly between 1 and 2."
            ),
            data=gradient_dissipation.dynamic_ratios(params.grid_points, params.negatives),
            render=partial(
                plotting.heatmaps, **theta_axes, columns=2, value_range=(0, 5), shade="occurs"
            ),
        ),
        Figure(
            name="alignment_gradient_norms",
            title="Gradient norms of the alignment part",
            paper=PAPER_003,
            paper_figure="Fig. 2a and 2b, Section 4",
            caption=(
                "||grad^pos|| * ||h_i|| over (theta_ij', theta_ii'), every negative at theta_ij'. "
                "L_cl's norm vanishes once theta_ij' is adequately larger than theta_ii' "
                "(gradient dissipation); that region shrinks as the negatives grow "
                f"({', '.join(map(str, counts))}). L_align and L_dcl do not vary with theta_ij'; "
                "L_dcl+, L_mpt, L_met and L_mat cut the gradient as L_cl does."
            ),
            data=gradient_norms.heatmap_frame(
                theta, theta, gradient_norms.alignment_part(theta, theta, counts)
            ),
            render=partial(plotting.heatmaps, **theta_axes, columns=5),
        ),
        Figure(
            name="uniformity_gradient_norms",
            title="Gradient norms of the uniformity part (one negative)",
            paper=PAPER_003,
            paper_figure="Fig. 4, Appendix B",
            caption=(
                "||grad^neg_j|| * ||h_i|| of a single negative j (the hardest for the hinge "
                "losses) over (theta_ij', theta_ii'). L_cl's per-negative norm approaches "
                "L_uniform's and L_dcl's shape as the negatives grow."
            ),
            data=gradient_norms.heatmap_frame(
                theta, theta, gradient_norms.uniformity_part(theta, theta, counts)
            ),
            render=partial(plotting.heatmaps, **theta_axes, columns=5),
        ),
        Figure(
            name="gradient_norm_curves",
            title="Gradient norms against the angle, closed form vs autograd",
            paper=PAPER_003,
            paper_figure="slices of Fig. 2a and Fig. 4 (eqs. 7, 9, 11, 16, 18, 19)",
            caption=(
                f"Left: ||grad^pos|| against theta_ii' at theta_ij' = "
                f"{params.curve_theta_neg_deg:g} deg; right: one negative's ||grad^neg_j|| "
                f"against theta_ij' at theta_ii' = {params.curve_theta_pos_deg:g} deg. Lines: "
                "closed forms (Appendix B.3); circles: autograd through the registry's InfoNCE, "
                f"DCL and DCL+ on an explicit batch with {counts[0]} negatives."
            ),
            data=gradient_norms.norm_curves(theta, fixed_neg, fixed_pos, counts),
            render=partial(
                plotting.norm_curves,
                fixed={
                    "positive": f"theta_ij' = {params.curve_theta_neg_deg:g} deg",
                    "negative": f"theta_ii' = {params.curve_theta_pos_deg:g} deg",
                },
            ),
        ),
    ]
