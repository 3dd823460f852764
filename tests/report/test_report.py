"""The report stage on synthetic run folders: 2 methods x 2 seeds on one backbone (one run
missing), a third method that differs from the baseline only in tau (2 seeds, one of them
collapsed: MR at its majority-class rate), and one baseline; the real SentEval data beside
them (the majority-class rates)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from scipy import stats

from stages.core.identity.experiments import plan_experiments
from stages.core.schema.params import Params, load_params
from stages.core.storage import layout
from stages.report import build_report
from stages.reporting.collect import RESULT_SCHEMA, Planned, collect
from stages.reporting.plots import detect_sweeps
from stages.reporting.significance import significance
from stages.reporting.tables import paper_tables, results_table, seed_summary
from stages.senteval_protocol.protocol import _summary
from stages.senteval_protocol.sts import alignment_uniformity
from stages.train import curve_tables

REPO = Path(__file__).resolve().parents[2]
STS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
MISSING_RUN = "simace.bert-base.s2"
COLLAPSED = ("simcse_hot", 1)


@pytest.fixture(scope="module")
def params(tmp_path_factory: pytest.TempPathFactory) -> Params:
    tree = yaml.safe_load((REPO / "params.yaml").read_text())
    tree["methods"] = {
        "simcse": {"objective": {"name": "infonce", "tau": 0.05}},
        "simcse_hot": {
            "objective": {"name": "infonce", "tau": 0.1},
            "method_key": "simcse",
            "sweep": "tau=0.1",
        },
        "simace": {"objective": {"name": "simace"}},
    }
    tree["experiments"] = [
        {"methods": ["simcse", "simace"], "backbones": ["bert-base"], "seeds": [1, 2]},
        {"methods": ["simcse_hot"], "backbones": ["bert-base"], "seeds": [1, 2]},
    ]
    path = tmp_path_factory.mktemp("params") / "params.yaml"
    path.write_text(yaml.safe_dump(tree))
    return load_params(path)


def sts_score(method: str, seed: int, task: str) -> float:
    """Deterministic, method- and seed-dependent scores (SimACE better than SimCSE, SimCSE at
    tau 0.1 worse by about 2 points on each seed)."""
    base = {"simcse": 76.0, "simace": 78.0, "simcse_hot": 74.0}.get(method, 60.0)
    jitter = {("simace", 2): 0.3, ("simcse_hot", 2): 0.05}.get((method, seed), 0.0)
    return base + 0.5 * seed + 0.1 * STS.index(task) + jitter


def senteval_result(method: str, seed: int, run_id: str | None, evaluation: str) -> dict:
    tasks = {}
    for task in STS:
        value = sts_score(method, seed, task)
        if task in ("STSBenchmark", "SICKRelatedness"):
            tasks[task] = {"dev": {"spearman": value}, "test": {"spearman": value}}
        else:
            tasks[task] = {"all": {"spearman": value}}
    collapsed = (method, seed) == COLLAPSED  # MR's majority-class rate: half the labels
    tasks["MR"] = {"acc": 50.0 if collapsed else 80.0 + seed, "devacc": 80.0}
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(20, 8))
    geometry = alignment_uniformity(emb[:10], emb[10:], np.linspace(0, 5, 10))
    return {
        "tasks": tasks,
        "summary": _summary(tasks),
        "alignment_uniformity": geometry,
        "encoder": {"run_id": run_id, "fingerprint": f"fp-{method}-{seed}"},
        "evaluation_id": evaluation,
    }


def train_log(seed: int) -> list[dict]:
    log = []
    for step in range(1, 21):
        log.append(
            {
                "event": "train",
                "step": step,
                "epoch": step / 20,
                "lr": 3e-5,
                "tau": 0.05,
                "loss": 2.0 / step + seed,
                "grad_norm": 1.0,
                "pos_cos": 0.8,
                "batch_pos_angle_deg": 30.0 - step / 4,
                "batch_neg_angle_deg": 85.0,
                "batch_infonce_grad_pos": 1.0 / step,
                "batch_infonce_grad_neg": 2.0 / step,
                "batch_alignment": 0.3,
                "batch_uniformity": -2.0,
            }
        )
        if step % 5 == 0:
            log.append(
                {
                    "event": "eval",
                    "step": step,
                    "spearman": 60.0 + step,
                    "alignment": 0.4 - step / 100,
                    "uniformity": -2.0 - step / 50,
                    "best": True,
                    "eval_s": 0.1,
                }
            )
    return log


def write(path: Path, data: dict | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))


@pytest.fixture(scope="module")
def project(params: Params, tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    root = tmp_path_factory.mktemp("project")
    (root / params.evaluations.senteval.data_dir).parent.mkdir(parents=True)
    (root / params.evaluations.senteval.data_dir).symlink_to(shared_data / "senteval")
    plan = plan_experiments(params)
    for name, run in plan.runs.items():
        if name == MISSING_RUN:
            continue
        folder = root / layout.experiment_dir(name)
        write(
            folder / "train.json",
            {
                "run_id": run.run_id,
                "best_dev_spearman": 80.0,
                "best_step": 20,
                "steps": 20,
                "wall_time_s": 5.0,
            },
        )
        tables = curve_tables(train_log(run.seed))
        write(root / layout.train_steps_file(name), tables["train"])
        write(root / layout.dev_curve_file(name), tables["eval"])
        evaluation = plan.evaluation_id("senteval", run)
        write(
            folder / "senteval.json", senteval_result(run.method, run.seed, run.run_id, evaluation)
        )
    baseline = "baseline.bert-base-first-last"
    write(
        root / layout.experiment_dir(baseline) / "senteval.json",
        senteval_result(
            "baseline",
            0,
            None,
            plan.evaluation_id("senteval", plan.experiment(baseline)),
        ),
    )
    return root


@pytest.fixture(scope="module")
def built(params: Params, project: Path) -> dict:
    return build_report(params, project)


def test_tidy_frame_has_one_row_per_run_task_metric(params: Params, project: Path) -> None:
    results = collect(params, project).results
    assert set(results.columns) >= {
        "experiment",
        "run_id",
        "method",
        "backbone",
        "seed",
        "task",
        "metric",
        "value",
    }
    assert results.select("experiment", "task", "metric").is_unique().all()
    sts_avg = results.filter(task="STS_avg", metric="spearman")
    assert sorted(sts_avg["experiment"]) == sorted(
        [
            "simcse.bert-base.s1",
            "simcse.bert-base.s2",
            "simace.bert-base.s1",
            "simcse_hot.bert-base.s1",
            "simcse_hot.bert-base.s2",
            "baseline.bert-base-first-last",
        ]
    )
    row = results.filter(experiment="simace.bert-base.s1", task="STS12").row(0, named=True)
    assert row["value"] == sts_score("simace", 1, "STS12") and row["seed"] == 1


def test_missing_run_is_marked_not_fatal(params: Params, project: Path, built: dict) -> None:
    status = collect(params, project).status.filter(experiment=MISSING_RUN).row(0, named=True)
    assert status["train"] == status["senteval"] == "missing"
    md = (project / "reports/results/report.md").read_text()
    assert MISSING_RUN in md and "missing" in md
    assert built["finished/senteval"] == 6 and built["planned"] == 7


def test_an_evaluation_of_other_settings_is_stale_not_reported(
    params: Params, project: Path
) -> None:
    """Changing the SentEval settings (tasks, mode) without re-evaluating leaves results of the
    old settings under experiments/: the report marks them stale and does not use them."""
    changed = Params.model_validate(
        {
            **params.model_dump(),
            "evaluations": {
                **params.evaluations.model_dump(),
                "senteval": {**params.evaluations.senteval.model_dump(), "mode": "fasttest"},
            },
        }
    )
    collected = collect(changed, project)
    status = collected.status.filter(experiment="simcse.bert-base.s1").row(0, named=True)
    assert status["train"] == "done"
    assert status["senteval"].startswith("stale: evaluation ")
    assert collected.results.filter(source="senteval").is_empty()
    assert (
        collect(params, project)
        .status.filter(experiment="simcse.bert-base.s1")
        .row(0, named=True)["senteval"]
        == "done"
    )


def test_seed_mean_and_std_with_ddof_1(params: Params, project: Path) -> None:
    summary = seed_summary(collect(params, project).results)
    row = summary.filter(method="simcse", task="STS13", metric="spearman").row(0, named=True)
    values = [sts_score("simcse", s, "STS13") for s in (1, 2)]
    assert row["mean"] == pytest.approx(np.mean(values))
    assert row["std"] == pytest.approx(np.std(values, ddof=1))
    assert row["n_seeds"] == 2


def test_significance_equals_scipys_paired_t_test(params: Params, project: Path) -> None:
    results = collect(params, project).results
    tests = significance(results, "simcse")
    row = tests.filter(method="simace", task="STS_avg", metric="spearman").row(0, named=True)
    # simace has seed 1 only (seed 2 missing): one pair, no p-value
    assert row["n_pairs"] == 1 and row["p_value"] is None
    extra = results.filter(experiment="simace.bert-base.s1").with_columns(
        seed=pl.lit(2, pl.Int64), value=pl.col("value") + 0.7
    )
    row = (
        significance(pl.concat([results, extra]), "simcse")
        .filter(method="simace", task="STS_avg")
        .row(0, named=True)
    )
    ours = [sts_score("simace", 1, t) for t in STS]
    a = [np.mean(ours), np.mean(ours) + 0.7]
    b = [np.mean([sts_score("simcse", s, t) for t in STS]) for s in (1, 2)]
    expected = stats.ttest_rel(a, b)
    assert row["n_pairs"] == 2
    assert row["p_value"] == pytest.approx(expected.pvalue)
    assert row["statistic"] == pytest.approx(expected.statistic)
    # p_fdr: Benjamini-Hochberg over every test of simace on bert-base
    family = significance(pl.concat([results, extra]), "simcse").filter(
        pl.col("p_value").is_not_null(), method="simace", backbone="bert-base"
    )
    assert family.height > 5
    adjusted = stats.false_discovery_control(family["p_value"].to_numpy())
    np.testing.assert_allclose(family["p_fdr"].to_numpy(), adjusted)


def test_published_join_and_difference(built: dict, project: Path) -> None:
    md = (project / "reports/results/report.md").read_text()
    # SimACE Table 1, SimCSE-BERT_base STS12 (published 68.40): ours is the seed mean
    ours = np.mean([sts_score("simcse", s, "STS12") for s in (1, 2)])
    assert f"{ours:.2f} / 68.40 ({ours - 68.40:+.2f})" in md
    assert "simace Table 1" in md and "cooldown Table 1" in md
    # cool-down Table 1's sweep rows: tau 0.05 is the plain simcse run, tau 0.10 simcse_hot
    hot = np.mean([np.mean([sts_score("simcse_hot", s, t) for t in STS]) for s in (1, 2)])
    plain = np.mean([np.mean([sts_score("simcse", s, t) for t in STS]) for s in (1, 2)])
    table_1 = md[md.index("### cooldown Table 1") :]
    assert f"{plain:.2f} / 76.95 ({plain - 76.95:+.2f})" in table_1
    assert f"{hot:.2f} / 71.92 ({hot - 71.92:+.2f})" in table_1
    # a planned method's published rows on backbones the plan does not run: ours is missing
    assert "| SimCSE | simcse | roberta-large | spearman (as_printed) | – | – / 72.86 |" in md
    assert "| SimCSE-BERT_base | simcse | bert-base | spearman (as_printed) | n/a | " in md


def test_significance_compares_evaluation_results_only(params: Params, project: Path) -> None:
    tests = significance(collect(params, project).results, "simcse")
    assert set(tests["task"]) >= {"STS_avg", "STS12"}
    assert not set(tests["task"]) & {"training", "train_batch"}


def test_markdown_and_html_hold_every_table_and_figure(built: dict, project: Path) -> None:
    out = project / "reports/results"
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    pngs = sorted((out / "figures").glob("*.png"))
    names = {p.stem for p in pngs}
    assert {
        "training_curves",
        "alignment_uniformity",
        "gradient_norms",
        "batch_angles",
        "temperature_sweep",
    } <= names
    assert all(p.stat().st_size > 1000 for p in pngs)
    for png in pngs:
        assert f"figures/{png.name}" in md
    assert page.count("data:image/png;base64,") == len(pngs)
    for title in ("### Runs", "### STS (Spearman x100)", "### Significance", "### simace Table 1"):
        assert title in md and title.removeprefix("### ") in page
    assert (out / "results.parquet").is_file() and (out / "results.csv").is_file()
    assert (
        pl.read_parquet(out / "results.parquet").height == pl.read_csv(out / "results.csv").height
    )
    metrics = json.loads((project / "reports/metrics.json").read_text())
    assert math.isclose(
        metrics["simcse_hot/bert-base/STS_avg/spearman"],
        np.mean([sts_score("simcse_hot", s, t) for s in (1, 2) for t in STS]),
    )


def test_temperature_sweep_detected_from_settings_not_names(params: Params) -> None:
    planned = collect(params, Path("/nonexistent")).planned
    sweeps = detect_sweeps(planned)
    assert len(sweeps) == 1  # simace has a tau and a margin, but no twin
    assert sweeps[0].parameter == "objective.tau"
    assert sweeps[0].points == {0.05: ["simcse"], 0.1: ["simcse_hot"]}


def test_a_sweep_is_drawn_against_its_own_methods_published_sweep(params: Params) -> None:
    """The SimCSE temperature sweep against SimCSE's published points, not another method's
    sweep of a parameter with the same name (SimACE's tau, ArcCon's margin)."""
    from stages.reporting.plots import sweep_plot

    planned = collect(params, Path("/nonexistent")).planned
    sweeps = detect_sweeps(planned)
    assert sweeps[0].method_keys == {"simcse"}
    published = pl.DataFrame(
        {
            "paper": ["cooldown", "simace"], "table": ["Table 1", "Appendix I"],
            "method": ["SimCSE", "SimACE"], "method_key": ["simcse", "simace"],
            "backbone": ["bert-base"] * 2, "task": ["STS_avg"] * 2, "metric": ["spearman"] * 2,
            "value": [76.0, 78.0], "sweep": ["tau=0.1", "tau=0.1"],
        }
    )  # fmt: skip
    plot = sweep_plot(sweeps, pl.DataFrame(schema=RESULT_SCHEMA), published)
    assert plot is not None and plot.name == "temperature_sweep"
    labels = plot.figure.axes[0].get_legend_handles_labels()[1]
    assert any("cooldown Table 1: SimCSE" in label for label in labels)
    assert not any("SimACE" in label for label in labels)
    assert "published: dashed lines" in plot.caption
    alone = sweep_plot(sweeps, pl.DataFrame(schema=RESULT_SCHEMA), published.clear())
    assert alone is not None and "published" not in alone.caption


def test_report_with_nothing_finished(params: Params, tmp_path: Path) -> None:
    metrics = build_report(params, tmp_path)
    assert metrics["finished/senteval"] == 0
    assert "### Runs" in (tmp_path / "reports/results/report.md").read_text()


def test_angle_distributions_from_the_senteval_embedding_cache(tmp_path: Path) -> None:
    from stages.reporting.collect import stsb_dev_angles
    from stages.reporting.plots import angle_distributions
    from stages.senteval_protocol.cache import EmbeddingCache
    from stages.senteval_protocol.loaders import downstream_dir, load_task

    data = REPO.parent / "shared" / "data" / "senteval"
    if not (data / "downstream").is_dir():
        pytest.skip("no SentEval data at ../shared/data/senteval")
    task = load_task(downstream_dir(data), "STSBenchmark")
    distinct = sorted(set(task.texts))
    embeddings = np.random.default_rng(0).normal(size=(len(distinct), 16)).astype(np.float32)
    EmbeddingCache(tmp_path, "fp").store("STSBenchmark", distinct, embeddings)
    angles = stsb_dev_angles(data, tmp_path, "fp")
    dev = next(p for p in task.parts if p.name == "dev")
    assert angles is not None and len(angles["positive"]) == int((dev.scores > 4).sum())
    assert len(angles["negative"]) == len(dev.scores) * (len(dev.scores) - 1)
    assert 80 < np.mean(angles["negative"]) < 100  # random directions: near orthogonal
    assert stsb_dev_angles(data, tmp_path, "other") is None
    plot = angle_distributions({"run": angles})
    assert plot is not None and plot.name == "angle_distributions"


def test_paper_tables_print_the_implementation_next_to_each_published_value() -> None:
    published = pl.DataFrame(
        {
            "paper": ["align_uniform"] * 2,
            "table": ["Table 1"] * 2,
            "method": ["MPT", "SimCSE"],
            "method_key": ["mpt", "simcse"],
            "backbone": ["bert-base"] * 2,
            "task": ["STS12"] * 2,
            "metric": ["spearman"] * 2,
            "aggregation": ["mean"] * 2,
            "sweep": [None, None],
            "value": [77.0, 76.0],
            "unit": ["x100"] * 2,
            "flags": [[], []],
        }
    )
    planned = [
        Planned("mpt.bert-base.s1", "run", "mpt", "bert-base", 1, "r1",
                {"objective.implementation": "code"}, "mpt"),
        Planned("simcse.bert-base.s1", "run", "simcse", "bert-base", 1, "r2", {}, "simcse"),
    ]  # fmt: skip
    summary = pl.DataFrame(
        {"method": ["mpt"], "backbone": ["bert-base"], "task": ["STS12"],
         "metric": ["spearman"], "mean": [77.5], "std": [None]},
        schema_overrides={"std": pl.Float64},
    )  # fmt: skip
    (table,) = paper_tables(summary, published, planned, pl.DataFrame(
        schema={"method": str, "baseline": str, "backbone": str, "task": str, "p_value": float}
    ))  # fmt: skip
    assert table.header[4] == "implementation"
    assert table.rows[0][4:] == ["code", "77.50 / 77.00 (+0.50)"]
    assert table.rows[1][4:] == ["n/a", "– / 76.00"]


def test_a_paper_table_shows_when_the_plan_runs_one_of_its_backbones() -> None:
    """Its rows on every backbone the paper prints, for context; but a table none of whose
    backbones the plan runs (a tiny test encoder) would be all '–': left out."""
    published = pl.DataFrame(
        {
            "paper": ["p"] * 2, "table": ["T"] * 2, "method": ["SimCSE"] * 2,
            "method_key": ["simcse"] * 2, "backbone": ["bert-base", "bert-large"],
            "task": ["STS12"] * 2, "metric": ["spearman"] * 2, "aggregation": ["mean"] * 2,
            "sweep": [None] * 2, "value": [68.4, 70.9], "unit": ["x100"] * 2, "flags": [[], []],
        }
    )  # fmt: skip
    summary = pl.DataFrame(
        schema={"method": str, "backbone": str, "task": str, "metric": str, "mean": float,
                "std": float}
    )  # fmt: skip
    no_tests = pl.DataFrame(
        schema={"method": str, "baseline": str, "backbone": str, "task": str, "p_value": float}
    )

    def plan(backbone: str) -> list[Planned]:
        return [Planned(f"simcse.{backbone}.s1", "run", "simcse", backbone, 1, "r", {}, "simcse")]

    assert paper_tables(summary, published, plan("tiny-bert"), no_tests) == []
    (table,) = paper_tables(summary, published, plan("bert-base"), no_tests)
    assert [row[2] for row in table.rows] == ["bert-base", "bert-large"]


def test_an_accuracy_at_the_majority_class_rate_is_marked() -> None:
    """A collapsed encoder's classifier predicts one class: its accuracy is the task's majority
    rate (the smoke preset's tiny encoder: MR 50.00, CR 63.76 for every method). One collapsed
    seed among good ones marks the cell too: its mean is no longer a method's typical score."""
    results = pl.DataFrame(
        {"method": ["collapsed"] * 2 + ["good"] * 2 + ["one_bad_seed"] * 4,
         "backbone": ["b"] * 8, "seed": [1, 1, 1, 1, 1, 1, 2, 2],
         "task": ["MR", "CR"] * 4, "metric": ["accuracy"] * 8,
         "value": [50.0, 64.1, 75.0, 80.0, 76.0, 81.0, 50.2, 79.0]},
    )  # fmt: skip
    summary = seed_summary(results)
    table = results_table(summary, ["MR", "CR"], "accuracy", "Transfer", {"MR": 50.0, "CR": 63.76})
    assert table.rows == [
        ["collapsed", "b", "1", "50.00‡", "64.10‡"],
        ["good", "b", "1", "75.00", "80.00"],
        ["one_bad_seed", "b", "2", "63.10 ± 18.24‡", "80.00 ± 1.41"],
    ]
    assert "‡ a seed within 0.5 points of always predicting the task's most frequent" in table.note
    plain = results_table(summary, ["MR", "CR"], "accuracy", "Transfer", {})
    assert "‡" not in plain.note and plain.rows[0][3] == "50.00"


def test_paper_cells_compare_like_with_like() -> None:
    """A published average only against ours over the same tasks; a std over training steps
    against nothing; ArcCSE's 0-1 dev Spearman against our best checkpoint's, x100; a flagged
    published number marked as no target."""
    rows = [
        ("STS_avg", "spearman", "mean", 77.0, "x100", []),
        ("STS12", "spearman", "mean", 70.0, "x100", ["suspect-value"]),
        ("train_batch", "negative_angle_deg", "std_over_steps", 4.67, "degrees", []),
        ("STSBenchmark_dev", "spearman", "as_printed", 0.847, "raw", []),
    ]
    published = pl.DataFrame(
        {
            "paper": ["p"] * 4, "table": ["T"] * 4, "method": ["M1", "M2", "M3", "M4"],
            "method_key": ["m"] * 4, "backbone": ["b"] * 4, "sweep": [None] * 4,
            "task": [r[0] for r in rows], "metric": [r[1] for r in rows],
            "aggregation": [r[2] for r in rows], "value": [r[3] for r in rows],
            "unit": [r[4] for r in rows], "flags": [r[5] for r in rows],
        }
    )  # fmt: skip
    planned = [Planned("m.b.s1", "run", "m", "b", 1, "r1", {}, "m")]
    ours = [("STS_avg", "spearman", 78.0), ("STS12", "spearman", 71.0),
            ("train_batch", "negative_angle_deg", 90.0),
            ("STSBenchmark_dev", "best_spearman", 85.0)]  # fmt: skip
    summary = pl.DataFrame(
        {"method": ["m"] * 4, "backbone": ["b"] * 4, "task": [o[0] for o in ours],
         "metric": [o[1] for o in ours], "mean": [o[2] for o in ours], "std": [None] * 4},
        schema_overrides={"std": pl.Float64},
    )  # fmt: skip
    no_tests = pl.DataFrame(
        schema={"method": str, "baseline": str, "backbone": str, "task": str, "p_value": float}
    )
    table = paper_tables(summary, published, planned, no_tests)[0]
    tasks = table.header[5:]
    cells = {r[0]: row[5 + tasks.index(r[0])] for r, row in zip(rows, table.rows, strict=True)}
    assert cells["STS_avg"] == "– / 77.00"  # ours averages STS12 alone, the paper 7 tasks
    assert cells["STS12"] == "71.00 / 70.00 (+1.00)†"
    assert cells["train_batch"] == "– / 4.67"
    assert cells["STSBenchmark_dev"] == "85.00 / 84.70 (+0.30)"
    others = pl.DataFrame(
        {"method": ["m"] * 6, "backbone": ["b"] * 6, "task": STS[1:], "metric": ["spearman"] * 6,
         "mean": [70.0] * 6, "std": [None] * 6},
        schema_overrides={"std": pl.Float64},
    )  # fmt: skip
    complete = pl.concat([summary, others])
    table = paper_tables(complete, published.head(1), planned, no_tests)[0]
    assert table.rows[0][5] == "78.00 / 77.00 (+1.00)"


def test_every_reading_of_a_published_row_gets_its_own_line() -> None:
    """Methods filed under one key (ArcCSE's accumulation readings, Table 3's 'best of' margin
    runs) each face the published row, named; seeds of one method are one line."""
    published = pl.DataFrame(
        {
            "paper": ["arccse"], "table": ["Table 3"], "method": ["ArcCon mixed"],
            "method_key": ["mixed"], "backbone": ["bert-base"], "task": ["STS12"],
            "metric": ["spearman"], "aggregation": ["as_printed"], "sweep": [None],
            "value": [70.0], "unit": ["x100"], "flags": [[]],
        }
    )  # fmt: skip
    planned = [
        Planned(f"{m}.bert-base.s{s}", "run", m, "bert-base", s, f"r{m}{s}", {}, "mixed")
        for m in ("m02", "m12")
        for s in (1, 2)
    ]
    summary = pl.DataFrame(
        {"method": ["m02", "m12"], "backbone": ["bert-base"] * 2, "task": ["STS12"] * 2,
         "metric": ["spearman"] * 2, "mean": [69.0, 71.0], "std": [0.1, 0.2]},
    )  # fmt: skip
    no_tests = pl.DataFrame(
        schema={"method": str, "baseline": str, "backbone": str, "task": str, "p_value": float}
    )
    (table,) = paper_tables(summary, published, planned, no_tests)
    assert [(row[0], row[5]) for row in table.rows] == [
        ("ArcCon mixed [m02]", "69.00 / 70.00 (-1.00)"),
        ("ArcCon mixed [m12]", "71.00 / 70.00 (+1.00)"),
    ]


def test_majority_class_rates_come_from_the_labels_the_protocol_scores(
    shared_data: Path, tmp_path: Path
) -> None:
    """Each transfer task's rate of always predicting its most frequent class, from the real
    data: over every sample of a cross-validated task, the test split of the others (as
    ``run_transfer`` scores them and records ``majority_acc``); the values SentEval's users
    know (MR 50.00, CR 63.76, MPQA 68.77, TREC 27.60: DESC, MRPC 66.49: paraphrases)."""
    from stages.core.schema.evaluation_settings import SENTEVAL_TRANSFER_TASKS
    from stages.reporting.collect import majority_rates
    from stages.senteval_protocol.loaders import downstream_dir, load_task
    from stages.senteval_protocol.transfer import majority_accuracy

    data = shared_data / "senteval"
    rates = majority_rates(data, [*SENTEVAL_TRANSFER_TASKS, "STS12"])
    scored = {"MR": "all", "CR": "all", "SUBJ": "all", "MPQA": "all", "SST2": "test",
              "TREC": "test", "MRPC": "test"}  # fmt: skip
    assert set(rates) == set(scored) == set(SENTEVAL_TRANSFER_TASKS)
    for name, split in scored.items():
        labels = load_task(downstream_dir(data), name).splits[split].labels
        assert rates[name] == majority_accuracy(labels), name
    assert rates == {"MR": 50.0, "CR": 63.76, "SUBJ": 50.0, "MPQA": 68.77, "SST2": 50.08,
                     "TREC": 27.6, "MRPC": 66.49}  # fmt: skip
    assert majority_rates(tmp_path, ["MR"]) == {}


def test_the_report_reads_the_majority_rate_from_the_data_or_else_the_results(
    params: Params, project: Path, tmp_path: Path
) -> None:
    """With the data beside the runs, from the data; without it, the rate the evaluation
    recorded (majority_acc), if any; the summary marks the collapsed seed either way."""
    assert collect(params, project).majority == {"MR": 50.0}
    elsewhere = tmp_path / "project"
    shutil.copytree(project, elsewhere, symlinks=True)
    (elsewhere / params.evaluations.senteval.data_dir).unlink()
    assert collect(params, elsewhere).majority == {}
    result = elsewhere / layout.experiment_dir("simcse.bert-base.s1") / "senteval.json"
    recorded = json.loads(result.read_text())
    recorded["tasks"]["MR"]["majority_acc"] = 50.0
    result.write_text(json.dumps(recorded))
    assert collect(params, elsewhere).majority == {"MR": 50.0}
