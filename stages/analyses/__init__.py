"""The papers' analyses that need no training, one function per figure: from the ``figures``
params, the tidy data and its rendering (a ``stages.reporting.plots.Plot``, data kept for the
CSV) with a caption true of what it draws.

One module per paper computes the data: ``gradient_dissipation`` (paper 002, Section 3.1
simulations) and ``gradient_norms`` (paper 003, gradient norms against the angles).
``stages.reporting.registry`` lists these figures, with the report's, under their titles and
the papers' figure numbers; the ``figures`` stage writes them. Those two modules import torch
(the objectives), so each function imports its module when it runs: the report, which embeds
these figures from the stage's output, imports the registry without importing torch.
"""

from __future__ import annotations

import math

from stages.analyses import plotting
from stages.core.schema.params import FiguresParams
from stages.reporting.plots import Plot
from stages.reporting.styles import HEATMAP_DPI

MU_AXES = {"x": "mu_neg", "y": "mu_pos", "x_label": "mu_neg / pi", "y_label": "mu_pos / pi"}
THETA_AXES = {
    "x": "theta_neg",
    "y": "theta_pos",
    "x_label": "theta_ij' / pi",
    "y_label": "theta_ii' / pi",
}


def gradient_dissipation_figure(params: FiguresParams) -> Plot:
    from stages.analyses import gradient_dissipation  # torch: only where a figure is computed

    simulation = gradient_dissipation.Simulation.from_params(params)
    data = gradient_dissipation.gradient_dissipation(simulation)
    return Plot(
        "gradient_dissipation",
        f"Mean GD (Table 1) over {params.batches} batches of 1 positive and {params.negatives} "
        f"negative angles per cell, theta_ii' ~ N(mu_pos, {params.sigma_pos:g}^2), theta_ij' ~ "
        f"N(mu_neg, {params.sigma_neg:g}^2), on a {params.grid_points} x {params.grid_points} "
        "grid. Both forms (fraction: InfoNCE, ArcCon; indicator: MPT, MET) are 1 when mu_pos "
        "and mu_neg are close and drop to 0 once mu_neg exceeds mu_pos by some gap.",
        plotting.heatmap_figure(data, **MU_AXES, columns=2, value_range=(0, 1)),
        data,
        HEATMAP_DPI,
    )


def hardest_negative_share_figure(params: FiguresParams) -> Plot:
    from stages.analyses import gradient_dissipation  # torch: only where a figure is computed

    data = gradient_dissipation.hardest_negative_share(
        gradient_dissipation.Simulation.from_params(params),
        params.weight_mu_pos_deg,
        params.weight_temperatures,
        params.weight_min_gd,
    )
    return Plot(
        "hardest_negative_share",
        "Mean over simulated batches of max_j w_j / sum_j w_j, w_j = e^{cos theta_ij'/tau}, at "
        f"mu_pos = {params.weight_mu_pos_deg:g} deg, against mu_neg, one curve per tau; only "
        f"batches whose InfoNCE GD >= {params.weight_min_gd:g} (the released code's filter; "
        "gaps: no batch gets a gradient). Small tau focuses the weight on the hardest negative; "
        "from tau = 0.3 its share collapses.",
        plotting.share_figure(data),
        data,
    )


def dynamic_ratio_figure(params: FiguresParams) -> Plot:
    from stages.analyses import gradient_dissipation  # torch: only where a figure is computed

    data = gradient_dissipation.dynamic_ratios(params.grid_points, params.negatives)
    return Plot(
        "dynamic_ratio",
        "R = sin(theta_ii' + u) / sin theta_ii' (ArcCon) and sqrt((1 - cos theta_ij') / "
        "(1 - cos theta_ii')) (MET) on the angle grid, colour range [0, 5]. Shaded: pairs that "
        "do not occur in training (theta_ii' > theta_ij', or GD off). Where they occur, R is "
        "mostly between 1 and 2.",
        plotting.heatmap_figure(data, **THETA_AXES, columns=2, value_range=(0, 5), shade="occurs"),
        data,
        HEATMAP_DPI,
    )


def alignment_gradient_norms_figure(params: FiguresParams) -> Plot:
    from stages.analyses import gradient_norms  # torch: only where a figure is computed

    theta, counts = gradient_norms.angles(params.heatmap_points), params.negative_counts
    data = gradient_norms.heatmap_frame(
        theta, theta, gradient_norms.alignment_part(theta, theta, counts)
    )
    return Plot(
        "alignment_gradient_norms",
        "||grad^pos|| * ||h_i|| over (theta_ij', theta_ii'), every negative at theta_ij'. "
        "L_cl's norm vanishes once theta_ij' is adequately larger than theta_ii' (gradient "
        "dissipation); that region shrinks as the negatives grow "
        f"({', '.join(map(str, counts))}). L_align and L_dcl do not vary with theta_ij'; "
        "L_dcl+, L_mpt, L_met and L_mat cut the gradient as L_cl does.",
        plotting.heatmap_figure(data, **THETA_AXES, columns=5),
        data,
        HEATMAP_DPI,
    )


def uniformity_gradient_norms_figure(params: FiguresParams) -> Plot:
    from stages.analyses import gradient_norms  # torch: only where a figure is computed

    theta, counts = gradient_norms.angles(params.heatmap_points), params.negative_counts
    data = gradient_norms.heatmap_frame(
        theta, theta, gradient_norms.uniformity_part(theta, theta, counts)
    )
    return Plot(
        "uniformity_gradient_norms",
        "||grad^neg_j|| * ||h_i|| of a single negative j (the hardest for the hinge losses) "
        "over (theta_ij', theta_ii'). L_cl's per-negative norm approaches L_uniform's and "
        "L_dcl's shape as the negatives grow.",
        plotting.heatmap_figure(data, **THETA_AXES, columns=5),
        data,
        HEATMAP_DPI,
    )


def gradient_norm_curves_figure(params: FiguresParams) -> Plot:
    from stages.analyses import gradient_norms  # torch: only where a figure is computed

    counts = params.negative_counts
    data = gradient_norms.norm_curves(
        gradient_norms.angles(params.heatmap_points),
        math.radians(params.curve_theta_neg_deg),
        math.radians(params.curve_theta_pos_deg),
        counts,
    )
    fixed = {
        "positive": f"theta_ij' = {params.curve_theta_neg_deg:g} deg",
        "negative": f"theta_ii' = {params.curve_theta_pos_deg:g} deg",
    }
    return Plot(
        "gradient_norm_curves",
        f"Left: ||grad^pos|| against theta_ii' at {fixed['positive']}; right: one negative's "
        f"||grad^neg_j|| against theta_ij' at {fixed['negative']}. Lines: closed forms "
        "(Appendix B.3); circles: autograd through the registry's InfoNCE, DCL and DCL+ on an "
        f"explicit batch with {counts[0]} negatives.",
        plotting.norm_figure(data, fixed),
        data,
    )
