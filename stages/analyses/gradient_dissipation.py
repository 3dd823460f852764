"""Paper 002 (Li, Zhang, Nie, ACL 2024), Section 3.1: the paradigm's components (Table 1) on
simulated angles, computed by the objectives module's closed forms (stages.objectives.diagnostics,
checked against autograd on the real objectives in tests/objectives).

The paper assumes theta_ii' ~ N(mu_pos, sigma_pos^2) and theta_ij' ~ N(mu_neg, sigma_neg^2), with
mu_pos in [pi/20, pi/2] and mu_neg in [pi/20, pi], and averages each component over batches of
1 positive and 127 negative angles:
- Fig. 2 and 10: the mean gradient dissipation GD on a 100 x 100 (mu_pos, mu_neg) grid, 1,000
  batches per cell, for InfoNCE, ArcCon (fraction form) and MPT, MET (indicator form);
- Fig. 3: the hardest negative's mean share of the exponential weight, max_j w_j / sum_j w_j,
  against mu_neg at mu_pos = pi/6, one curve per temperature;
- Fig. 4: the dynamic ratios R of ArcCon and MET on the deterministic (theta_ii', theta_ij') grid,
  with the pairs that do not occur in training marked (theta_ii' > theta_ij', or GD off).

Every cell reuses the same standard-normal batches, shifted and scaled to its (mu_pos, mu_neg)
(common random numbers): each cell's estimate has exactly the distribution of the paper's
independent sampling, the heat-maps come out smooth, and the whole grid costs one pass over the
100 x 1,000 x 127 negative angles. A draw outside [0, pi] is folded back to the angle it stands
for on the sphere, arccos(cos theta) (the closed forms take angles in [0, pi]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from stages.core.schema.params import FiguresParams
from stages.objectives import diagnostics
from stages.objectives.arccse import ArcCon
from stages.objectives.hardest_negative import MET, MPT
from stages.objectives.infonce import InfoNCE

MU_POS_RANGE = (math.pi / 20, math.pi / 2)
MU_NEG_RANGE = (math.pi / 20, math.pi)
# Fig. 4 marks pairs whose (ArcCon) GD is below this as not occurring in training [C].
GD_OCCURS = 0.01


@dataclass(frozen=True)
class Simulation:
    """The sampling of Section 3.1 (the paper's values are the figures params' defaults)."""

    seed: int
    batches: int
    negatives: int
    grid_points: int
    sigma_pos: float
    sigma_neg: float

    @classmethod
    def from_params(cls, params: FiguresParams) -> Simulation:
        return cls(
            seed=params.seed,
            batches=params.batches,
            negatives=params.negatives,
            grid_points=params.grid_points,
            sigma_pos=params.sigma_pos,
            sigma_neg=params.sigma_neg,
        )

    def mu_pos(self) -> np.ndarray:
        return np.linspace(*MU_POS_RANGE, self.grid_points)

    def mu_neg(self) -> np.ndarray:
        return np.linspace(*MU_NEG_RANGE, self.grid_points)

    def standard_draws(self) -> tuple[np.ndarray, np.ndarray]:
        """N(0, 1) draws: one positive (batches,) and the negatives (batches, negatives)."""
        rng = np.random.default_rng(self.seed)
        return rng.standard_normal(self.batches), rng.standard_normal(
            (self.batches, self.negatives)
        )

    def angles(self, mu_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """theta_ii' (len(mu_pos), batches) and theta_ij' (grid_points, batches, negatives)."""
        eps_pos, eps_neg = self.standard_draws()
        theta_pos = fold(mu_pos[:, None] + self.sigma_pos * eps_pos)
        theta_neg = fold(self.mu_neg()[:, None, None] + self.sigma_neg * eps_neg)
        return theta_pos, theta_neg


def fold(theta: np.ndarray) -> np.ndarray:
    """The angle in [0, pi] that a real number stands for on the sphere."""
    return np.arccos(np.cos(theta))


def _grid_frame(
    mu_pos: np.ndarray, mu_neg: np.ndarray, panels: dict[str, np.ndarray]
) -> pl.DataFrame:
    pos, neg = np.meshgrid(mu_pos, mu_neg, indexing="ij")
    return pl.concat(
        pl.DataFrame(
            {"panel": name, "mu_pos": pos.ravel(), "mu_neg": neg.ravel(), "value": v.ravel()}
        )
        for name, v in panels.items()
    )


def gradient_dissipation(simulation: Simulation) -> pl.DataFrame:
    """Fig. 2 and 10: mean GD per (mu_pos, mu_neg) cell; columns panel, mu_pos, mu_neg, value."""
    infonce, arccon = InfoNCE(name="infonce"), ArcCon(name="arccon")
    mpt, met = MPT(name="mpt"), MET(name="met")
    theta_pos, theta_neg = simulation.angles(simulation.mu_pos())
    anchors, negatives = theta_pos[:, None, :], theta_neg[None]  # (P, 1, B), (1, M, B, K)
    u = math.radians(arccon.margin_deg)
    gd = {
        f"InfoNCE (tau = {infonce.tau:g})": diagnostics.infonce_gd(anchors, negatives, infonce.tau),
        f"ArcCon (tau = {arccon.tau:g}, u = {arccon.margin_deg:g} deg)": diagnostics.arccon_gd(
            anchors, negatives, arccon.tau, u
        ),
        f"MPT (m = {mpt.margin:g})": diagnostics.mpt_active(anchors, negatives, mpt.margin),
        f"MET (m = {met.margin:g})": diagnostics.met_active(anchors, negatives, met.margin),
    }
    means = {name: values.mean(axis=-1) for name, values in gd.items()}
    return _grid_frame(simulation.mu_pos(), simulation.mu_neg(), means)


def hardest_negative_share(
    simulation: Simulation, mu_pos_deg: float, temperatures: tuple[float, ...], min_gd: float
) -> pl.DataFrame:
    """Fig. 3: per temperature and mu_neg, the mean over batches of max_j w_j / sum_j w_j,
    w_j = e^{cos theta_ij'/tau}, over the batches whose InfoNCE GD (same tau) is >= min_gd (the
    released code's filter: batches that still get a gradient). NaN where no batch does (the code
    plots 1 there). Columns temperature, mu_neg, value, batches (how many were kept)."""
    theta_pos, theta_neg = simulation.angles(np.array([math.radians(mu_pos_deg)]))
    frames = []
    for tau in temperatures:
        share = diagnostics.hardest_weight_share(theta_neg, tau)  # (M, B)
        kept = diagnostics.infonce_gd(theta_pos[0], theta_neg, tau) >= min_gd
        count = kept.sum(axis=1)
        total = np.where(kept, share, 0.0).sum(axis=1)
        mean = np.divide(total, count, out=np.full(len(count), np.nan), where=count > 0)
        frames.append(
            pl.DataFrame(
                {"temperature": tau, "mu_neg": simulation.mu_neg(), "value": mean, "batches": count}
            )
        )
    return pl.concat(frames)


def dynamic_ratios(grid_points: int, negatives: int) -> pl.DataFrame:
    """Fig. 4: R of ArcCon and MET on the grid theta_ii' in [pi/20, pi/2] x theta_ij' in
    [pi/20, pi] (all negatives at theta_ij'), and whether the pair occurs in training: not when
    theta_ii' > theta_ij', nor when GD is off (ArcCon's GD < 0.01 with ``negatives`` negatives;
    MET's hinge inactive). Columns panel, theta_pos, theta_neg, value, occurs."""
    arccon, met = ArcCon(name="arccon"), MET(name="met")
    theta_pos = np.linspace(*MU_POS_RANGE, grid_points)
    theta_neg = np.linspace(*MU_NEG_RANGE, grid_points)
    shape = (grid_points, grid_points, 1)
    anchors = theta_pos[:, None]
    pair_negatives = np.broadcast_to(theta_neg[None, :, None], shape).copy()
    u = math.radians(arccon.margin_deg)
    arc = diagnostics.arccon_components(anchors, pair_negatives, arccon.tau, u, repeat=negatives)
    mets = diagnostics.met_components(anchors, pair_negatives, met.margin)
    ordered = theta_pos[:, None] <= theta_neg[None, :]
    panels = {
        f"ArcCon (u = {arccon.margin_deg:g} deg)": (arc.ratio[..., 0], arc.gd >= GD_OCCURS),
        f"MET (m = {met.margin:g})": (mets.ratio[..., 0], mets.gd > 0),
    }
    pos, neg = np.meshgrid(theta_pos, theta_neg, indexing="ij")
    return pl.concat(
        pl.DataFrame(
            {
                "panel": name,
                "theta_pos": pos.ravel(),
                "theta_neg": neg.ravel(),
                "value": ratio.ravel(),
                "occurs": (ordered & active).ravel(),
            }
        )
        for name, (ratio, active) in panels.items()
    )
