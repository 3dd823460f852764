"""The `figures` stage: the key facts of paper 002's Section 3.1 simulations and of paper 003's
gradient-norm figures, checked on the data the figures are drawn from (each test names the
sentence or figure it checks), plus the CLI's outputs and their determinism."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import polars as pl
import pytest
import torch
import yaml

from stages import figures as stage
from stages.analyses import gradient_dissipation as p002
from stages.analyses import gradient_norms as p003
from stages.analyses import plotting
from stages.core.schema.params import DEFAULT_PARAMS, FiguresParams
from stages.objectives import diagnostics
from stages.objectives.hardest_negative import MET, MPT
from stages.reporting import registry
from stages.reporting.styles import DPI, PAGE_WIDTH_PX

DEFAULTS = FiguresParams()  # the papers' values
SIMULATION = p002.Simulation.from_params(DEFAULTS)


def grids(frame: pl.DataFrame, rows: str, columns: str) -> dict[str, np.ndarray]:
    """Each panel's value as a (rows x columns) array."""
    n_rows, n_columns = frame[rows].n_unique(), frame[columns].n_unique()
    return {
        panel: part["value"].to_numpy().reshape(n_rows, n_columns)
        for (panel,), part in frame.group_by("panel", maintain_order=True)
    }


@pytest.fixture(scope="module")
def gradient_dissipation() -> dict[str, np.ndarray]:
    return grids(p002.gradient_dissipation(SIMULATION), "mu_pos", "mu_neg")


@pytest.fixture(scope="module")
def hardest_share() -> pl.DataFrame:
    return p002.hardest_negative_share(
        SIMULATION, DEFAULTS.weight_mu_pos_deg, DEFAULTS.weight_temperatures, 0.01
    )


@pytest.fixture(scope="module")
def theta() -> np.ndarray:
    return p003.angles(DEFAULTS.heatmap_points)


@pytest.fixture(scope="module")
def alignment(theta) -> dict[str, np.ndarray]:
    return p003.alignment_part(theta, theta, DEFAULTS.negative_counts)


@pytest.fixture(scope="module")
def uniformity(theta) -> dict[str, np.ndarray]:
    return p003.uniformity_part(theta, theta, DEFAULTS.negative_counts)


def panel(panels: dict[str, np.ndarray], prefix: str) -> np.ndarray:
    (name,) = [name for name in panels if name.startswith(prefix)]
    return panels[name]


# Paper 002, Section 3.1 ----------------------------------------------------------------------


def test_simulation_draws_the_papers_batches():
    """Sec. 3.1.1 (1)-(2): 100 values of mu_pos in [pi/20, pi/2] and of mu_neg in [pi/20, pi];
    batches of 1 positive and 127 negative angles; angles folded into [0, pi]."""
    mu_pos, mu_neg = SIMULATION.mu_pos(), SIMULATION.mu_neg()
    assert len(mu_pos) == len(mu_neg) == 100
    assert (mu_pos[0], mu_pos[-1], mu_neg[0], mu_neg[-1]) == (
        pytest.approx(math.pi / 20), pytest.approx(math.pi / 2), pytest.approx(math.pi / 20),
        pytest.approx(math.pi),
    )  # fmt: skip
    theta_pos, theta_neg = SIMULATION.angles(mu_pos)
    assert theta_pos.shape == (100, 1000) and theta_neg.shape == (100, 1000, 127)
    assert theta_neg.min() >= 0 and theta_neg.max() <= math.pi
    assert abs(theta_neg[50].std() - 0.10) < 0.002 and abs(theta_pos[50].std() - 0.05) < 0.005


def test_gd_is_one_when_mu_pos_and_mu_neg_are_close(gradient_dissipation):
    """Sec. 3.1.1 / Fig. 2, 10: "when mu_pos and mu_neg are close, the value is 1"."""
    nearest = np.abs(SIMULATION.mu_neg()[None, :] - SIMULATION.mu_pos()[:, None]).argmin(1)
    assert set(gradient_dissipation) == {
        "InfoNCE (tau = 0.05)", "ArcCon (tau = 0.05, u = 10 deg)", "MPT (m = 0.23)",
        "MET (m = 0.45)",
    }  # fmt: skip
    for name, gd in gradient_dissipation.items():
        on_diagonal = gd[np.arange(100), nearest]
        assert on_diagonal.min() > 0.99, name


def test_gd_drops_to_zero_once_mu_neg_exceeds_mu_pos_by_a_gap(gradient_dissipation):
    """Sec. 3.1.1 / Fig. 2, 10: "when mu_neg is larger than mu_pos to some extent, the value
    rapidly decreases to 0", alike for the fraction form (InfoNCE, ArcCon) and the indicator
    form (MPT, MET): along every row GD never increases with mu_neg, crosses 1/2 within a
    moderate gap (0.3-1.2 rad), and is < 0.01 past 1.4 rad."""
    gap = SIMULATION.mu_neg()[None, :] - SIMULATION.mu_pos()[:, None]
    for name, gd in gradient_dissipation.items():
        assert (np.diff(gd, axis=1) <= 1e-12).all(), name
        half = gap[np.arange(100), (gd < 0.5).argmax(axis=1)]
        assert ((gd < 0.5).any(axis=1)).all(), name
        assert half.min() > 0.3 and half.max() < 1.2, (name, half.min(), half.max())
        assert gd[gap > 1.4].max() < 0.01, name


def test_gd_zero_means_no_gradient_through_the_real_objectives():
    """Table 1 / eq. 3: the indicator GD of MPT and MET is the objective's own cut: autograd
    through the registry's MPT and MET gives anchor 0 a zero gradient exactly where GD = 0."""
    for objective, active in ((MPT(name="mpt"), diagnostics.mpt_active),
                              (MET(name="met"), diagnostics.met_active)):  # fmt: skip
        for theta_pos, theta_neg in ((0.5, 0.6), (0.5, 0.9), (0.5, 1.4), (1.2, 1.5), (1.2, 2.8)):
            gd = active(np.array([theta_pos]), np.array([[theta_neg]]), objective.margin)[0]
            z, z_pos = p003.anchor_batch(theta_pos, theta_neg, 16)
            z.requires_grad_()
            (grad,) = torch.autograd.grad(objective(z, z_pos).loss, z)
            assert (grad[0].norm().item() > 1e-6) == bool(gd), (objective.name, theta_neg)


def test_hardest_negative_share_follows_the_temperature(hardest_share):
    """Sec. 3.1.2 / Fig. 3: the exponential weight "becomes focused solely on the hardest
    negative" at small tau; Sec. 3.2: "when tau is increased to 0.3, the proportion begins to
    sharply decline"."""
    share = {
        tau: part.filter(pl.col("value").is_not_nan())["value"].to_numpy()
        for (tau,), part in hardest_share.group_by("temperature", maintain_order=True)
    }
    assert list(share) == [0.3, 0.1, 0.05, 0.03, 0.01, 0.005]
    for values in share.values():
        assert ((values >= 1 / 127 - 1e-12) & (values <= 1 + 1e-12)).all()
    assert share[0.005].max() > 0.999 and share[0.01].max() > 0.99
    assert share[0.05].max() > 0.3
    assert share[0.1].max() < 0.1 and share[0.3].max() < 0.02  # near 1/127
    peaks = [values.max() for values in share.values()]
    assert peaks == sorted(peaks)  # the smaller tau, the larger the hardest negative's share


def test_hardest_negative_share_keeps_only_batches_with_a_gradient(hardest_share):
    """Fig. 3 as in the released code: batches whose InfoNCE GD < 0.01 are left out; a mu_neg
    where none is left is missing (NaN), never a made-up value."""
    empty = hardest_share.filter(pl.col("batches") == 0)
    assert empty["value"].is_nan().all() and len(empty) > 0
    assert hardest_share.filter(pl.col("batches") > 0)["value"].is_not_nan().all()
    tau_03 = hardest_share.filter(pl.col("temperature") == 0.3)
    assert (tau_03["batches"] > 0).all()


def test_dynamic_ratios_mostly_between_one_and_two_where_pairs_occur():
    """Sec. 3.1.3 / Fig. 4: "the dynamic ratio varies significantly. However, [in the pairs
    that occur] the values of the dynamic ratio mostly fall between 1 and 2"."""
    frame = p002.dynamic_ratios(100, 127)
    for (name,), part in frame.group_by("panel", maintain_order=True):
        occurs = part.filter("occurs")["value"].to_numpy()
        assert part["value"].max() > 2 * part["value"].min()  # varies significantly
        assert ((occurs >= 1 - 0.02) & (occurs <= 2)).mean() > 0.9, name
        cut = part.filter(pl.col("theta_pos") > pl.col("theta_neg"))
        assert not cut["occurs"].any()
    arccon = frame.filter(pl.col("panel").str.starts_with("ArcCon")).row(0, named=True)
    u = math.pi / 18
    expected = math.sin(arccon["theta_pos"] + u) / math.sin(arccon["theta_pos"])
    assert arccon["value"] == pytest.approx(expected, rel=1e-12)


# Paper 003, gradient norms -----------------------------------------------------------------


def test_align_and_dcl_do_not_vary_with_theta_neg_and_vanish_only_at_zero(alignment, theta):
    """Sec. 4 / Fig. 2a: "since they are not constrained by theta_ij', their gradient signals
    will not vary with the horizontal axis. All anchors except those with absolutely small
    theta_ii' will receive the continuous gradient signals" (norms prop. to sin theta_ii')."""
    for prefix in ("L_align", "L_dcl ("):
        norms = panel(alignment, prefix)
        assert (norms == norms[:, :1]).all()
        assert norms[0, 0] == 0 and norms[:, 0].argmax() == np.abs(theta - math.pi / 2).argmin()
        assert (norms[1:-1, 0] > 0).all()


def test_contrastive_gradient_dissipates_and_the_region_shrinks_with_negatives(alignment, theta):
    """Sec. 4 / Fig. 2a: ||grad^pos_cl|| "quickly drops and vanishes as soon as the negative is
    adequately further away from the anchor than the positive", and "the area with weak gradient
    signals gradually decreases as the number of negative samples increases"."""
    full = np.sin(theta)[:, None] / 0.05  # the norm without dissipation (all weight on negatives)
    row = np.abs(theta - math.pi / 6).argmin()
    weak_areas = []
    for k in DEFAULTS.negative_counts:
        norms = panel(alignment, f"L_cl, {k} negatives")
        assert (norms <= full + 1e-9).all()
        equal, far = (np.abs(theta - math.radians(degrees)).argmin() for degrees in (30, 110))
        assert norms[row, equal] > 0.9 * full[row, 0]
        assert norms[row, far] < 1e-3 * norms[row, equal]
        weak_areas.append((norms < 0.05 * full)[1:-1].mean())
    assert weak_areas == sorted(weak_areas, reverse=True) and len(set(weak_areas)) == 4


def test_dcl_plus_and_the_hinges_cut_the_gradient_as_cl_does(alignment, theta):
    """Sec. 5 / Fig. 2b: "the images of ||grad^pos_dcl+|| and ||grad^pos_cl|| are almost
    identical"; L_mpt, L_met, L_mat switch the gradient off past their margin."""
    cl, dcl_plus = panel(alignment, "L_cl, 64 "), panel(alignment, "L_dcl+")
    assert ((cl > 0.01 * cl.max()) == (dcl_plus > 0)).mean() > 0.9
    pos, neg = np.meshgrid(theta, theta, indexing="ij")
    mat = panel(alignment, "L_mat")
    np.testing.assert_array_equal(mat, (neg - pos < 0.15 * math.pi).astype(float))
    mpt = panel(alignment, "L_mpt")
    np.testing.assert_array_equal(mpt > 0, (np.cos(neg) - np.cos(pos) + 0.23 > 0) & (pos > 0))


def test_uniformity_part_of_cl_approaches_the_decoupled_one(uniformity, theta):
    """App. B / Fig. 4: "||grad^neg_j_cl|| approaches ||grad^j L_uniform|| and ||grad^neg_j_dcl||
    as the negative sample size increases": K times L_cl's per-negative norm matches the
    decoupled per-negative norm sin theta_ij' / tau on a growing share of the grid."""
    matched = []
    for k in DEFAULTS.negative_counts:
        decoupled = k * diagnostics.dcl_negative_norms(theta[:, None], 0.05, k)[:, 0]
        norms = k * panel(uniformity, f"L_cl, {k} negatives")
        matched.append((np.abs(norms - decoupled) <= 0.05 * decoupled.max()).mean())
    assert matched == sorted(matched) and matched[-1] > matched[0]
    uniform = panel(uniformity, "L_uniform")
    assert (uniform == uniform[:1]).all()
    assert uniform[0].argmax() == np.abs(theta - math.pi / 2).argmin()


def test_curves_are_autograd_on_the_real_objectives(theta):
    """Eqs. 7, 9, 11, 16, 18, 19: the closed-form curves equal autograd through the registry's
    InfoNCE, DCL and DCL+, and the training-log diagnostic infonce_gradient_norms; the
    positive-part norm vanishes at theta_ii' = 0 and L_cl's peaks near theta_ii' = 90 deg when
    theta_ij' = 90 deg."""
    curves = p003.norm_curves(theta, math.pi / 2, math.pi / 6, DEFAULTS.negative_counts)
    closed = curves.filter(pl.col("source") == "closed form")
    autograd = curves.filter(pl.col("source") == "autograd")
    assert autograd["series"].n_unique() == 3 and len(autograd) == 3 * 2 * len(theta[::10])
    joined = autograd.join(closed, on=["part", "series", "angle"], suffix="_closed")
    assert len(joined) == len(autograd)
    np.testing.assert_allclose(joined["value"], joined["value_closed"], rtol=1e-9, atol=1e-12)
    positive = closed.filter(pl.col("part") == "positive")
    assert (positive.filter(pl.col("angle") == 0)["value"] == 0).all()
    cl = positive.filter(pl.col("series") == "L_cl, 4096 negatives")
    assert abs(cl["angle"][int(cl["value"].arg_max())] - math.pi / 2) < math.radians(3)

    z, z_pos = p003.anchor_batch(0.7, 1.1, 64)
    grad_pos, grad_neg = diagnostics.infonce_gradient_norms(
        diagnostics.view_geometry(z, z_pos), 0.05
    )
    expected_pos = diagnostics.cl_positive_norm(np.array([0.7]), np.array([[1.1]]), 0.05, 64)
    expected_neg = diagnostics.cl_negative_norms(np.array([0.7]), np.array([[1.1]]), 0.05, 64)
    assert grad_pos[0].item() == pytest.approx(expected_pos[0], rel=1e-9)
    assert grad_neg[0].item() == pytest.approx(8 * expected_neg[0, 0], rel=1e-9)  # sqrt(64)


def legend_outside_panels(figure) -> list[str]:
    """The figure's one legend: outside every panel (no line under it), its text at least 13 px
    at the DPI the PNG is written with; returns its labels."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    assert all(ax.get_legend() is None for ax in figure.axes)
    (legend,) = figure.legends
    box = legend.get_window_extent(renderer)
    assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in figure.axes)
    assert all(t.get_fontsize() * DPI / 72 >= 13 for t in legend.get_texts())
    return [t.get_text() for t in legend.get_texts()]


def test_the_line_figures_keep_their_legends_off_the_curves(hardest_share, theta):
    """The legends of the two line figures sit beside or below the panels, each series once,
    readable where the report shows the figures (at most 1400 px wide, at their own size)."""
    share = plotting.share_figure(hardest_share)
    assert legend_outside_panels(share) == [f"tau = {t:g}" for t in DEFAULTS.weight_temperatures]
    curves = p003.norm_curves(theta, math.pi / 2, math.pi / 6, DEFAULTS.negative_counts)
    norms = plotting.norm_figure(curves, {"positive": "a", "negative": "b"})
    series = curves.filter(source="closed form")["series"].unique(maintain_order=True)
    assert legend_outside_panels(norms) == series.to_list()
    for figure in (share, norms):
        assert figure.get_figwidth() * DPI <= PAGE_WIDTH_PX


# The stage -----------------------------------------------------------------------------------

SMALL = {
    "batches": 20,
    "grid_points": 12,
    "heatmap_points": 19,
    "negative_counts": [8, 32],
}


def small_params(tmp_path):
    params = yaml.safe_load(DEFAULT_PARAMS.read_text())
    params["figures"] |= SMALL
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.mark.slow
def test_cli_writes_every_figure_and_is_deterministic(tmp_path, capsys):
    params = small_params(tmp_path)
    first, second = tmp_path / "first", tmp_path / "second"
    stage.main(["--params", str(params), "--out", str(first)])
    assert "wrote 6 figures" in capsys.readouterr().out
    index = json.loads((first / "index.json").read_text())
    names = [entry["name"] for entry in index["figures"]]
    assert names == [
        "gradient_dissipation", "hardest_negative_share", "dynamic_ratio",
        "alignment_gradient_norms", "uniformity_gradient_norms", "gradient_norm_curves",
    ]  # fmt: skip
    assert names == [figure.name for figure in registry.drawn_by("figures")]
    for entry, figure in zip(index["figures"], registry.drawn_by("figures"), strict=True):
        assert entry["title"] == figure.title and entry["paper"] == figure.paper
        assert entry["paper"][:3] in {"002", "003"} and entry["paper_figure"] and entry["caption"]
        assert (first / entry["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert pl.read_csv(first / entry["csv"]).height > 0
    assert index["params"]["batches"] == 20
    assert sorted(p.name for p in first.iterdir()) == sorted(
        [f"{n}.png" for n in names] + [f"{n}.csv" for n in names] + ["index.json"]
    )
    stage.main(["--params", str(params), "--out", str(second)])
    for name in names:
        assert (first / f"{name}.csv").read_bytes() == (second / f"{name}.csv").read_bytes()


def test_cli_replaces_the_folder_atomically(tmp_path, monkeypatch):
    """A failure leaves the previous folder as it was; a success replaces stale files."""
    params, out = small_params(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / "stale.csv").write_text("old")

    def broken(params):
        raise RuntimeError("analysis failed")

    # the last figure fails, after the others were written into the temporary folder
    last = dataclasses.replace(registry.FIGURES[-1], draw=broken)
    monkeypatch.setattr(registry, "FIGURES", (*registry.FIGURES[:-1], last))
    with pytest.raises(RuntimeError):
        stage.main(["--params", str(params), "--out", str(out)])
    assert [p.name for p in out.iterdir()] == ["stale.csv"]
    monkeypatch.undo()
    stage.main(["--params", str(params), "--out", str(out)])
    assert not (out / "stale.csv").exists() and (out / "index.json").exists()
