"""The reproduction presets (presets/*.yaml): valid, plannable, dry-runnable by both
orchestrators, complete against the papers' published rows, and equal to the specs' tables."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from stages import pipeline
from stages.estimates import dry_run, format_dry_run
from stages.experiments import plan_runs
from stages.params import Params, ResolvedMethod, load_params
from stages.reference import published

REPO = Path(__file__).resolve().parents[1]
# published.csv's paper id -> its preset
PRESETS = {
    "simace": "presets/simace.yaml",
    "arccse": "presets/arccse.yaml",
    "unified_gradient": "presets/unified_gradient.yaml",
    "align_uniform": "presets/align_uniform.yaml",
    "cooldown": "presets/cooldown.yaml",
}
# Method keys of published.csv that no preset trains, and why.
NOT_REPRODUCED = {
    "pretrained": "untrained checkpoints with unstated pooling (the presets evaluate the "
    "first-last / last-average rows as baselines)",
    "first_last_avg": "an untrained baseline: the presets' `baselines`, not a trained method",
    "last_avg": "an untrained baseline: the presets' `baselines`, not a trained method",
    "glove_avg": "GloVe vectors, not a transformer the pipeline trains",
    "arccse_arccon_dropout_mixed": "ArcCSE Table 3: ArcCon with one dropout-off view; the trainer "
    "has no per-view dropout switch",
    "arccse_triplet_dropout_on": "ArcCSE Table 3: triplets encoded with dropout on; the trainer "
    "always encodes triplets with dropout off",
}
PAPER_BACKBONES = {"bert-base", "bert-large", "roberta-base", "roberta-large"}  # not SBERT


@pytest.fixture(scope="module")
def presets() -> dict[str, Params]:
    return {paper: load_params(REPO / path) for paper, path in PRESETS.items()}


SMOKE = "presets/smoke.yaml"  # not a paper's: every objective family on a tiny model, on CPU


def test_every_preset_file_is_listed() -> None:
    assert sorted(p.name for p in (REPO / "presets").glob("*.yaml")) == sorted(
        Path(p).name for p in [*PRESETS.values(), SMOKE]
    )


@pytest.mark.parametrize("path", ["params.yaml", *PRESETS.values(), SMOKE])
def test_every_key_dvc_tracks_is_spelled_out(path: str) -> None:
    """DVC reads tracked params from the file itself, so a key left to its schema default
    would stop `dvc repro` ("Parameters ... are missing")."""
    raw = yaml.safe_load((REPO / path).read_text())
    for job in pipeline.build_jobs(load_params(REPO / path), path):
        for key in job.params:
            node = raw
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, f"{path}: {key} ({job.name})"
                node = node[part]


@pytest.mark.parametrize("paper", PRESETS)
def test_preset_plans_and_dry_runs_every_run(
    paper: str, presets: dict[str, Params], capsys: pytest.CaptureFixture[str]
) -> None:
    params = presets[paper]
    runs = plan_runs(params)
    rows = {r.experiment: r for r in dry_run(params, PRESETS[paper])}
    assert set(runs) <= set(rows)
    for name, run in runs.items():
        assert rows[name].run_id == run.run_id
        assert rows[name].minutes["train"] > 0 and rows[name].minutes["senteval"] > 0
        assert ("mteb" in rows[name].minutes) == params.mteb.enabled
    assert len({run.run_id for run in runs.values()}) == len(runs)  # no run trained twice
    report = format_dry_run(params, list(rows.values()))
    assert f"{len(runs)} trained runs" in report and "GPU-hours in all" in report


@pytest.mark.parametrize("paper", PRESETS)
def test_preset_generates_a_dvc_pipeline(
    paper: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # stages.pipeline writes ./dvc.yaml
    pipeline.main(["dvc", "--params", str(REPO / PRESETS[paper])])
    stages = yaml.safe_load((tmp_path / "dvc.yaml").read_text())["stages"]
    trains = [s for s in stages.values() if s["cmd"].startswith("python -m stages.train")]
    assert len(trains) == len(plan_runs(load_params(REPO / PRESETS[paper])))
    assert all(f"--params {REPO / PRESETS[paper]}" in s["cmd"] for s in stages.values())


@pytest.mark.e2e
def test_snakemake_dry_runs_every_preset(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    for name in ("Snakefile", "params.yaml"):
        shutil.copy(REPO / name, root / name)
    for name in ("workflow", "stages", "presets"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    snakemake = Path(sys.executable).with_name("snakemake")
    for paper, path in PRESETS.items():
        done = subprocess.run(
            [str(snakemake), "-n", "--quiet", "rules", "--cores", "1",
             "--config", f"params={path}"],
            cwd=root, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, f"{paper}: {done.stderr[-2000:]}"
        n_runs = len(plan_runs(load_params(root / path)))
        counts = dict(
            line.split()[:2] for line in done.stdout.splitlines() if line.startswith("train")
        )
        assert int(counts["train"]) == n_runs, f"{paper}: {done.stdout}"


def trained_keys(params: Params) -> set[tuple[str, str]]:
    """(method key, backbone) of every run the preset trains."""
    return {(params.method_key(r.method), r.backbone) for r in plan_runs(params).values()}


def test_every_published_method_is_a_method_of_some_preset(presets: dict[str, Params]) -> None:
    keys = set(published().get_column("method_key").drop_nulls()) - {""}
    defined = {p.method_key(m) for p in presets.values() for m in p.methods}
    assert keys - defined == set(NOT_REPRODUCED)
    assert not set(NOT_REPRODUCED) & defined


def test_each_papers_own_runs_are_in_its_preset(presets: dict[str, Params]) -> None:
    own = published().filter(
        (pl.col("provenance") == "own")
        & pl.col("method_key").is_not_null()
        & ~pl.col("method_key").is_in(list(NOT_REPRODUCED))
        & pl.col("backbone").is_in(list(PAPER_BACKBONES))
    )
    missing = [
        (paper, key, backbone, table)
        for paper, key, backbone, table in own.select("paper", "method_key", "backbone", "table")
        .unique()
        .iter_rows()
        if (key, backbone) not in trained_keys(presets[paper])
    ]
    assert not missing


def test_the_temperature_sweep_covers_table_1_of_the_cooldown_paper(
    presets: dict[str, Params],
) -> None:
    params = presets["cooldown"]
    swept = {
        (params.methods[r.method].sweep or f"tau={r.settings.objective.tau:.2f}", r.backbone)
        for r in plan_runs(params).values()
        if params.method_key(r.method) == "simcse" and r.settings.temperature.schedule == "constant"
    }
    rows = published().filter(paper="cooldown", table="Table 1")
    assert set(rows.select("sweep", "backbone").iter_rows()) <= swept


def resolved(params: Params, method: str, backbone: str | None) -> ResolvedMethod:
    return params.resolve(method, backbone)


def test_simace_table_7(presets: dict[str, Params]) -> None:
    """spec-simace-cooldown A.4, Table 7; A.6 (Table 14 margins)."""
    p = presets["simace"]
    large, rl = resolved(p, "simace", "bert-large"), resolved(p, "simace", "roberta-large")
    assert (large.train.batch_size, large.train.learning_rate, large.objective.tau) == (
        32,
        1e-5,
        0.06,
    )
    assert (rl.train.batch_size, rl.train.learning_rate, rl.objective.tau) == (128, 1e-5, 0.05)
    assert resolved(p, "simace", "bert-base").objective.margin_deg == 10
    assert resolved(p, "simace_margin_neg", "roberta-base").objective.margin_deg == -10
    assert resolved(p, "simace_no_margin", "roberta-base").train.batch_size == 128
    assert p.train.eval_steps == 125 and p.mteb.tasks == "simace56"
    assert {g.seeds for g in p.experiments} == {(42, 43, 44, 45, 46), (42,)}


def test_arccse_section_4(presets: dict[str, Params]) -> None:
    """spec-arccse-alignunif A.5."""
    p = presets["arccse"]
    base, large = resolved(p, "arccse", "bert-base"), resolved(p, "arccse", "bert-large")
    assert (base.objective.tau, base.objective.margin_deg) == (0.05, 10)
    assert (base.objective.triplet_weight, base.objective.triplet_margin) == (0.1, 0)
    assert (base.train.learning_rate, large.train.learning_rate) == (3e-5, 1e-5)
    assert (base.train.max_seq_length, large.train.max_seq_length) == (512, 32)
    assert base.train.sam.enabled and large.train.sam.enabled
    assert (p.triplets.short_mask_rate, p.triplets.long_mask_rate, p.triplets.min_words) == (
        0.2,
        0.4,
        25,
    )
    assert resolved(p, "arccse_no_arccon", "bert-base").objective.margin_deg == 0
    assert resolved(p, "arccse_no_triplet", "bert-base").objective.name == "arccon"


def test_unified_gradient_tables_6_and_7_and_scripts(presets: dict[str, Params]) -> None:
    """spec-unified-gradient 7.2, 7.3 (modified), 7.5 (originals), 5.5 (Table 5)."""
    p = presets["unified_gradient"]
    mhs = resolved(p, "align_mhs_modified", "roberta-base")
    assert (mhs.objective.margin, mhs.objective.ratio, mhs.train.batch_size) == (0.27, 1.0, 512)
    bt = resolved(p, "barlow_twins_modified", "bert-base")
    assert (bt.objective.margin, bt.objective.tau, bt.objective.ratio) == (0.30, 0.05, 1.5)
    assert (bt.train.batch_size, bt.train.learning_rate) == (128, 1e-5)
    assert resolved(p, "vicreg_modified", "roberta-base").objective.margin == 0.37
    assert resolved(p, "align_mhs_original", "bert-base").train.learning_rate == 5e-6
    original = resolved(p, "align_mhe_original", "roberta-base")
    assert (original.train.learning_rate, original.train.eval_steps) == (1e-6, 50)
    assert original.objective.uniformity_weight == 10
    assert resolved(p, "vicreg_original", "bert-base").objective.covariance_weight == 30
    gd = resolved(p, "barlow_twins_gd", "bert-base").objective
    assert gd.gradient_dissipation and not gd.softmax_weight and not gd.static_ratio
    gd_w = resolved(p, "vicreg_gd_w", "bert-base").objective
    assert gd_w.gradient_dissipation and gd_w.softmax_weight and not gd_w.static_ratio
    objectives = [resolved(p, m, None).objective for m in p.methods if m != "simcse"]
    assert {o.implementation for o in objectives} == {"code"}


def test_align_uniform_table_2(presets: dict[str, Params]) -> None:
    """spec-arccse-alignunif B.4, Table 2."""
    p = presets["align_uniform"]
    assert resolved(p, "align_uniform", "roberta-large").objective.uniformity_weight == 0.4
    dcl = resolved(p, "dcl", "bert-large")
    assert (dcl.objective.tau, dcl.train.learning_rate, dcl.train.batch_size) == (0.01, 5e-5, 64)
    assert resolved(p, "dcl_plus", "bert-base").train.learning_rate == 3e-5
    mat = resolved(p, "mat", "roberta-large")
    assert (mat.objective.margin_pi, mat.train.learning_rate, mat.train.batch_size) == (
        0.13,
        7e-6,
        128,
    )
    assert resolved(p, "met", "bert-large").objective.margin == 0.50
    assert resolved(p, "mpt", "roberta-base").objective.margin == 0.29
    assert resolved(p, "simcse", "roberta-base").train.batch_size == 128
    assert [g.seeds for g in p.experiments] == [(42, 43, 44)]


def test_cooldown_table_6(presets: dict[str, Params]) -> None:
    """spec-simace-cooldown B.3, Table 6; B.7.5 (ArcCon's tau_i)."""
    p = presets["cooldown"]
    tcs = resolved(p, "tcs", "roberta-large")
    assert (tcs.temperature.initial_tau, tcs.temperature.step_ratio) == (0.07, 0.020)
    assert (tcs.train.batch_size, tcs.train.learning_rate, tcs.objective.tau) == (256, 3e-5, 0.05)
    tcc = resolved(p, "tcc", "bert-large")
    assert (tcc.temperature.initial_tau, tcc.temperature.step_ratio) == (0.10, 0.015)
    assert resolved(p, "tcc", "roberta-base").temperature.initial_tau == 0.07
    assert resolved(p, "simcse", "roberta-base").train.batch_size == 512
    arc = resolved(p, "arccon_tcs", "bert-base")
    assert (arc.temperature.initial_tau, arc.temperature.step_ratio) == (0.10, 0.020)
    assert p.train.eval_steps == 250 and not p.mteb.enabled


# Methods whose spec marks an ambiguity in their hyperparameters or reading (spec sections in
# each method's readings); every other method of a preset is unambiguous.
NEED_READINGS = {
    "simace": {"simcse", "arccon", "simace", "simace_no_margin", "simace_margin_neg"},
    "arccse": {"arccse", "arccse_no_triplet", "arccse_no_arccon"},
    "unified_gradient": {
        f"{o}_{v}"
        for o in ("align_mhe", "align_mhs", "barlow_twins", "vicreg")
        for v in ("original", "gd", "gd_w", "modified")
    }
    - {"align_mhs_gd_w"},
    "align_uniform": {"align_uniform", "dcl", "mpt", "met", "mat"},
    "cooldown": {"simcse", "tcc", "tcs", "arccon", "arccon_tcc", "arccon_tcs"}
    | {f"simcse-tau-0_{t:02d}" for t in range(6, 11)},
}


@pytest.mark.parametrize("paper", PRESETS)
def test_ambiguous_methods_carry_their_readings(paper: str, presets: dict[str, Params]) -> None:
    params = presets[paper]
    marked = {name for name, m in params.methods.items() if m.readings}
    assert marked == NEED_READINGS[paper]
    for name in marked:
        for reading in params.methods[name].readings:
            assert " -> " in reading and "spec-" in reading, f"{name}: {reading}"
