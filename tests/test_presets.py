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

from stages.commands import pipeline
from stages.core.identity.experiments import plan_experiments
from stages.core.planning.estimates import dry_run, format_dry_run
from stages.core.planning.jobs import build_jobs
from stages.core.schema.params import Params, ResolvedMethod, load_params
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
}
# Published methods without a method key (other papers' methods, quoted as printed), by a name
# each one's `method` contains: why.
NOT_REPRODUCED_UNKEYED = {
    "PCL": "another paper's objective (SimACE Tables 4, 9, 10); not in the registry",
    "RankCSE": "another paper's objective (SimACE Tables 4, 9, 10); not in the registry",
    "RBF": "SimACE Table 11's RBF-kernel similarity; not in the registry",
    "with MLM": "SimACE Table 13's MLM auxiliary loss variants; no MLM objective",
    "BERT_base-flow": "ArcCSE Table 1's quoted post-processing baseline (BERT-flow)",
    "BERT_base-whitening": "ArcCSE Table 1's quoted post-processing baseline (BERT-whitening)",
    "IS-BERT": "ArcCSE Tables 1-2's quoted prior method",
    "ConSERT": "ArcCSE Table 1's quoted prior method",
    "CT-BERT": "ArcCSE Table 1's quoted prior method",
    "Skip-thought": "ArcCSE Table 2's quoted prior method",
}
# Published backbones no preset trains on: why.
NOT_REPRODUCED_BACKBONES = {
    "sbert-base": "ArcCSE Table 1's SBERT rows: the SBERT checkpoints are not named",
    "sbert-large": "ArcCSE Table 1's SBERT rows: the SBERT checkpoints are not named",
    "glove": "GloVe vectors, not a transformer the pipeline trains",
    "skip-thought": "Skip-thought vectors, not a transformer the pipeline trains",
}
# Studies and figures without printed numbers (not in published.csv), by the name
# docs/presets.md gives them: why.
NOT_REPRODUCED_STUDIES = {
    "Section 3.2": "paper 002's empirical study (Figures 5-9): eq. 5 is no registry objective, "
    "a 90/10 held-out split no data setting, and its outputs are curves without printed numbers",
    "Figure 8": "ArcCSE's alignment and uniformity every 10 dev steps: every run's dev log holds "
    "both at each evaluation, and evaluating every 10 steps would change the checkpoint kept",
    "Figure 4-7": "ArcCSE's margin, tau, masking-rate and lambda sweeps: only their best point, "
    "the arccse run itself, has a printed number",
}
# Presets beyond a paper's own: its ablations (published.csv's paper id -> preset).
ABLATIONS = {"arccse": "presets/arccse_ablation.yaml"}
PAPER_BACKBONES = {"bert-base", "bert-large", "roberta-base", "roberta-large"}  # not SBERT


@pytest.fixture(scope="module")
def presets() -> dict[str, Params]:
    return {paper: load_params(REPO / path) for paper, path in PRESETS.items()}


@pytest.fixture(scope="module")
def ablations() -> dict[str, Params]:
    return {paper: load_params(REPO / path) for paper, path in ABLATIONS.items()}


SMOKE = "presets/smoke.yaml"  # not a paper's: every objective family on a tiny model, on CPU
SMOKE_SWEEP = "presets/smoke_arccse_margin.yaml"  # ArcCSE's margin as a grid, on the same model


# Every preset file, also one of your own: the checks that hold for any preset run over these.
ALL_PRESETS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "presets").glob("*.yaml"))


def test_the_papers_presets_are_there() -> None:
    assert {*PRESETS.values(), *ABLATIONS.values(), SMOKE, SMOKE_SWEEP} <= set(ALL_PRESETS)


@pytest.mark.parametrize("path", ["params.yaml", *ALL_PRESETS])
def test_every_key_dvc_tracks_is_spelled_out(path: str) -> None:
    """DVC reads tracked params from the file itself, so a key left to its schema default
    would stop `dvc repro` ("Parameters ... are missing")."""
    raw = yaml.safe_load((REPO / path).read_text())
    for job in build_jobs(plan_experiments(load_params(REPO / path)), path):
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
    runs = plan_experiments(params).runs
    rows = {r.experiment: r for r in dry_run(plan_experiments(params), PRESETS[paper])}
    assert set(runs) <= set(rows)
    for name, run in runs.items():
        assert rows[name].run_id == run.run_id
        assert rows[name].minutes["train"] > 0 and rows[name].minutes["senteval"] > 0
        mteb = params.evaluation_settings("mteb", run.method).is_enabled()  # a method's own
        assert ("mteb" in rows[name].minutes) == mteb
        assert rows[name].device == "h100"  # auto training: on the default GPU
    assert len({run.run_id for run in runs.values()}) == len(runs)  # no run trained twice
    report = format_dry_run(plan_experiments(params), list(rows.values()))
    assert f"{len(runs)} trained runs" in report and "GPU-hours in all on an NVIDIA H100" in report
    assert "train_gpu_h100.json eager.runs[1]" in report  # the measured record it rests on


@pytest.mark.parametrize("path", ALL_PRESETS)
def test_preset_generates_a_dvc_pipeline(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # stages.commands.pipeline writes ./dvc.yaml
    pipeline.main(["dvc", "--params", str(REPO / path)])
    stages = yaml.safe_load((tmp_path / "dvc.yaml").read_text())["stages"]
    trains = [s for s in stages.values() if s["cmd"].startswith("python -m stages.train")]
    assert len(trains) == len(plan_experiments(load_params(REPO / path)).runs)
    assert all(f"--params {REPO / path}" in s["cmd"] for s in stages.values())


@pytest.mark.e2e
def test_snakemake_dry_runs_every_preset(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    for name in ("Snakefile", "params.yaml"):
        shutil.copy(REPO / name, root / name)
    for name in ("workflow", "stages", "presets"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    snakemake = Path(sys.executable).with_name("snakemake")
    for paper, path in [*PRESETS.items(), *ABLATIONS.items()]:
        done = subprocess.run(
            [str(snakemake), "-n", "--quiet", "rules", "--cores", "1",
             "--config", f"params={path}"],
            cwd=root, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, f"{paper}: {done.stderr[-2000:]}"
        n_runs = len(plan_experiments(load_params(root / path)).runs)
        counts = dict(
            line.split()[:2] for line in done.stdout.splitlines() if line.startswith("train")
        )
        assert int(counts["train"]) == n_runs, f"{paper}: {done.stdout}"


def trained_keys(params: Params) -> set[tuple[str, str]]:
    """(method key, backbone) of every run the preset trains."""
    return {
        (params.method_key(r.method), r.backbone) for r in plan_experiments(params).runs.values()
    }


def test_every_published_method_is_a_method_of_some_preset(
    presets: dict[str, Params], ablations: dict[str, Params]
) -> None:
    keys = set(published().get_column("method_key").drop_nulls()) - {""}
    every = [*presets.values(), *ablations.values()]
    defined = {p.method_key(m) for p in every for m in p.methods}
    assert keys - defined == set(NOT_REPRODUCED)
    assert not set(NOT_REPRODUCED) & defined


def test_the_excluded_experiments_are_the_published_rows_no_preset_trains_and_documented(
    presets: dict[str, Params], ablations: dict[str, Params]
) -> None:
    """docs/presets.md's "Not reproduced" list is held here; each entry names what it excludes
    in published.csv (every row without a method key, every backbone no preset has) and in the
    paragraph."""
    rows = published()
    unkeyed = set(
        rows.filter(pl.col("method_key").is_null() | (pl.col("method_key") == ""))
        .get_column("method")
        .unique()
    )
    for method in unkeyed:
        assert any(name in method for name in NOT_REPRODUCED_UNKEYED), method
    for name in NOT_REPRODUCED_UNKEYED:
        assert any(name in method for method in unkeyed), name
    trained = {b for p in [*presets.values(), *ablations.values()] for b in p.backbones}
    published_backbones = set(rows.get_column("backbone").drop_nulls())
    assert published_backbones - trained == set(NOT_REPRODUCED_BACKBONES)
    doc = (REPO / "docs" / "presets.md").read_text()
    paragraph = doc.split("**Not reproduced**", 1)[1].split("\n\n", 1)[0]
    names = [*NOT_REPRODUCED, *NOT_REPRODUCED_UNKEYED, *NOT_REPRODUCED_BACKBONES]
    for name in [*names, *NOT_REPRODUCED_STUDIES]:
        assert name in paragraph, name


def test_each_papers_own_runs_are_in_its_presets(
    presets: dict[str, Params], ablations: dict[str, Params]
) -> None:
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
        if (key, backbone)
        not in trained_keys(presets[paper])
        | (trained_keys(ablations[paper]) if paper in ablations else set())
    ]
    assert not missing


def test_the_temperature_sweep_covers_table_1_of_the_cooldown_paper(
    presets: dict[str, Params],
) -> None:
    params = presets["cooldown"]
    swept = {
        (params.methods[r.method].sweep or f"tau={r.settings.objective.tau:.2f}", r.backbone)
        for r in plan_experiments(params).runs.values()
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
    assert p.train.eval_steps == 125 and p.evaluations.mteb.tasks == "simace56"
    # MTEB (56 datasets) only where SimACE's tables report it (Tables 3, 12): SimCSE and SimACE
    mteb = {job.key.split(".")[0] for job in build_jobs(plan_experiments(p)) if job.stage == "mteb"}
    assert mteb == {"simcse", "simace"}
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


def test_every_preset_runs_the_implementation_behind_the_published_numbers(
    presets: dict[str, Params], ablations: dict[str, Params]
) -> None:
    """One policy: papers 002 and 003 tuned their tables' values on their released code, which
    produced the published numbers, so every preset runs implementation: code."""
    for params in [*presets.values(), *ablations.values()]:
        for run in plan_experiments(params).runs.values():
            objective = resolved(params, run.method, run.backbone).objective
            assert getattr(objective, "implementation", "code") == "code", run.method


@pytest.mark.parametrize("backbone", ["bert-base", "bert-large"])
def test_the_published_arccon_runs_are_configured_once(
    backbone: str, presets: dict[str, Params]
) -> None:
    """SimACE Table 1 and the cool-down paper's Tables 3/9 print the same ArcCon numbers, trained
    with 'ArcCSE's default configuration': every preset's ArcCon is ArcCSE w/o Triplet loss
    (max length 512 dynamic on base, 32 on large; dev every 125; length-grouped batches)."""
    arccse = resolved(presets["arccse"], "arccse_no_triplet", "bert-base")
    reference = resolved(presets["arccse"], "arccse_no_triplet", backbone)
    assert (arccse.train.max_seq_length, arccse.train.eval_steps) == (512, 125)
    assert arccse.train.sampling == "by_length"
    assert resolved(presets["simace"], "arccon", backbone) == reference
    assert resolved(presets["cooldown"], "arccon", backbone) == reference
    for name in ("arccon_tcc", "arccon_tcs"):
        assert resolved(presets["cooldown"], name, backbone).train == reference.train


def test_sweeps_the_papers_report_outside_their_tables(presets: dict[str, Params]) -> None:
    """SimACE Appendix I (tau 0.05, 0.07 on BERT-base); paper 003 Fig. 3a/3c-e (MPT margins)."""
    simace = presets["simace"]
    taus = {
        resolved(simace, r.method, r.backbone).objective.tau
        for r in plan_experiments(simace).runs.values()
        if simace.method_key(r.method) == "simace" and r.backbone == "bert-base"
    }
    assert taus == {0.05, 0.06, 0.07}
    p003 = presets["align_uniform"]
    margins = {
        resolved(p003, r.method, r.backbone).objective.margin
        for r in plan_experiments(p003).runs.values()
        if p003.method_key(r.method) == "mpt" and r.backbone == "bert-base"
    }
    assert {0.10, 0.23, 0.80} <= margins and len(margins) >= 5


def test_arccse_table_3_and_gradient_accumulation(
    presets: dict[str, Params], ablations: dict[str, Params]
) -> None:
    """spec-arccse-alignunif A.4 (Table 3) and A.9.6 ('update every 64 steps')."""
    p = ablations["arccse"]
    default = resolved(p, "arccse", "bert-base")
    assert default == resolved(presets["arccse"], "arccse", "bert-base")  # the same run
    assert (default.train.view_dropout, default.train.triplet_dropout) == ("both", False)
    mixed = [m for m in p.methods if p.method_key(m) == "arccse_arccon_dropout_mixed"]
    margins = sorted(resolved(p, m, "bert-base").objective.margin_deg for m in mixed)
    assert margins == [2, 4, 6, 8, 10, 12]  # "m swept over 2-12 degrees, best reported"
    assert {resolved(p, m, "bert-base").train.view_dropout for m in mixed} == {"first"}
    (on,) = [m for m in p.methods if p.method_key(m) == "arccse_triplet_dropout_on"]
    assert resolved(p, on, "bert-base").train.triplet_dropout
    accumulated = {
        (t.batch_size, t.gradient_accumulation_steps)
        for m in p.methods
        if (t := resolved(p, m, "bert-base").train).gradient_accumulation_steps > 1
    }
    assert accumulated == {(8, 8), (16, 4), (32, 2), (16, 64)}
    planned = {r.method for r in plan_experiments(p).runs.values()}
    assert planned == set(p.methods)


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


def test_unified_gradient_trains_with_the_released_head_and_frozen_embeddings(
    presets: dict[str, Params],
) -> None:
    """spec-unified-gradient 7.1 and 11 A6 [C]: the released code's head (Linear only on BERT,
    tanh then Linear on RoBERTa, N(0, 0.006^2)) and frozen embedding layer, for every paper-002
    run; SimCSE's rows are Gao et al.'s, trained by SimCSE's code."""
    p = presets["unified_gradient"]
    for run in plan_experiments(p).runs.values():
        train = resolved(p, run.method, run.backbone).train
        released = (train.head, train.head_init_std, train.freeze_embeddings)
        if run.method == "simcse":
            assert released == ("simcse", None, False)
        else:
            head = "linear" if run.backbone == "bert-base" else "tanh_linear"
            assert released == (head, 0.006, True), run.name
        assert train.dev_pooler is None  # the code selects with [CLS] alone (sent_emb)


def test_align_uniform_selects_the_dev_checkpoint_with_the_head(presets: dict[str, Params]) -> None:
    """spec-arccse-alignunif B.5, B.9.10 [C]: no --mlp_only_train, so the released code's dev
    evaluation reads [CLS] + MLP; the test evaluation reads [CLS] alone."""
    p = presets["align_uniform"]
    for run in plan_experiments(p).runs.values():
        train = resolved(p, run.method, run.backbone).train
        assert (train.dev_pooler, train.eval_pooler, train.head) == (
            "cls",
            "cls_before_pooler",
            "simcse",
        )


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
    assert [g.seeds for g in p.experiments] == [(42, 43, 44), (42,)]  # Table 1; Fig. 3 sweep


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
    assert p.train.eval_steps == 250 and not p.evaluations.mteb.enabled


# Methods whose spec marks an ambiguity in their hyperparameters or reading (spec sections in
# each method's readings); every other method of a preset is unambiguous.
NEED_READINGS = {
    "simace": {"simcse", "arccon", "simace", "simace_no_margin", "simace_margin_neg"}
    | {"simace-tau-0_05", "simace-tau-0_07"},
    "arccse": {"arccse", "arccse_no_triplet", "arccse_no_arccon"},
    "unified_gradient": {
        f"{o}_{v}"
        for o in ("align_mhe", "align_mhs", "barlow_twins", "vicreg")
        for v in ("original", "gd", "gd_w", "modified")
    }
    - {"align_mhs_gd_w"},
    "align_uniform": {"simcse", "align_uniform", "dcl", "dcl_plus", "mpt", "met", "mat"}
    | {f"mpt-m0_{m}" for m in ("10", "15", "30", "40", "60", "80")},
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


# The default job's methods (params.yaml) -> the preset that configures them for their paper.
DEFAULT_JOB_PRESETS = {"simcse": "simace", "arccse": "arccse", "simace": "simace"}


@pytest.mark.parametrize("method", sorted(DEFAULT_JOB_PRESETS))
def test_the_default_job_trains_each_method_as_its_paper_preset(
    method: str, presets: dict[str, Params]
) -> None:
    """params.yaml's headline comparison is read against the same published numbers as the
    presets, so each of its methods must be the preset's run (ArcCSE's length-grouped batches
    were once missing here)."""
    default = load_params(REPO / "params.yaml")
    assert set(default.methods) == set(DEFAULT_JOB_PRESETS)
    preset = presets[DEFAULT_JOB_PRESETS[method]]
    assert resolved(default, method, "bert-base") == resolved(preset, method, "bert-base")
    assert default.backbones["bert-base"] == preset.backbones["bert-base"]
