"""Carry-over under both orchestrators, on a cut-down smoke preset (SimCSE and SimACE on the tiny
BERT, SentEval's and MTEB's STS-B): a workspace built before a refactor (a module moved, a function
renamed) needs no retraining after it: `cse carry-over` verifies and keeps every run and
evaluation, and Snakemake and DVC then compute nothing and report the same numbers; after an edit
of what an objective computes, that objective's run is not carried over."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from test_end_to_end import SMOKE, built_by_both, ci_sized, dvc_repro, run, snakemake

EXPERIMENTS = ("simcse.tiny-bert.s42", "simace.tiny-bert.s42")

pytestmark = pytest.mark.e2e  # orchestrator runs: the e2e tier


def params() -> dict:
    raw = ci_sized(yaml.safe_load(SMOKE.read_text()))
    raw["experiments"] = [{"methods": ["simcse", "simace"], "backbones": ["tiny-bert"]}]
    raw["evaluations"]["senteval"]["tasks"] = ["STSBenchmark"]
    raw["evaluations"]["mteb"]["tasks"] = ["STSBenchmark"]
    raw["baselines"] = {}
    return raw


def refactor(root: Path) -> None:
    """A result-neutral change of the training code: stages/training/batch.py moved to
    step_batch.py (its importers rewritten) and optim.clip_gradients renamed."""
    stages = root / "stages"
    (stages / "training" / "batch.py").rename(stages / "training" / "step_batch.py")
    for path in stages.rglob("*.py"):
        text = path.read_text()
        new = text.replace("stages.training.batch ", "stages.training.step_batch ")
        new = re.sub(r"\bclip_gradients\b", "clip_gradient_norm", new)
        if new != text:
            path.write_text(new)
    run([sys.executable, "-m", "stages.commands", "dvc"], root)


def results(root: Path) -> dict[str, dict]:
    """What each experiment's evaluations and training report, as the report reads them."""
    out = {}
    for name in EXPERIMENTS:
        folder = root / "experiments" / name
        out[name] = {
            "senteval": json.loads((folder / "senteval.json").read_text())["tasks"],
            "mteb": json.loads((folder / "mteb.json").read_text())["average"],
            "best_dev": json.loads((folder / "train.json").read_text())["best_dev_spearman"],
        }
    return out


def run_folders(root: Path) -> set[str]:
    return {p.name for p in (root / "runs").iterdir() if p.is_dir() and p.name != "evaluations"}


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return built_by_both(tmp_path_factory.mktemp("carry"), params())


def test_a_refactor_is_carried_over_and_neither_orchestrator_retrains(
    workspaces: dict[str, Path],
) -> None:
    for tool, root in workspaces.items():
        before, trained = results(root), run_folders(root)
        refactor(root)
        status = run([sys.executable, "-m", "stages.commands", "status"], root)
        assert status.count("stale: run ") == 2 * 3, status  # train, senteval, mteb of both
        output = run([sys.executable, "-m", "stages.commands", "carry-over"], root)
        assert output.count("carried over from") == 2 * 3, output
        assert "6 result(s) carried over" in output
        carried = run_folders(root) - trained
        assert len(carried) == 2  # the two runs under their new ids, linked, nothing trained
        status = run([sys.executable, "-m", "stages.commands", "status"], root)
        assert status.count("yes (carried over from ") == 2, status

        log = snakemake(root) if tool == "snakemake" else dvc_repro(root)
        assert "step/s" not in log  # no training step ran
        assert log.count("(the stored run ") == 2, log
        assert log.count("the stored result of the same evaluation") == 2 * 2, log
        assert run_folders(root) == trained | carried
        assert results(root) == before
        status = run([sys.executable, "-m", "stages.commands", "status"], root)
        assert "stale" not in status and status.count("carried over") == 2, status
    assert "Nothing to be done" in snakemake(workspaces["snakemake"], "-n")
    assert "up to date" in run(["dvc", "status"], workspaces["dvc"])


def test_an_objective_whose_arithmetic_changed_is_not_carried_over(
    workspaces: dict[str, Path],
) -> None:
    root = workspaces["snakemake"]
    simace = root / "stages" / "objectives" / "simace.py"
    text = simace.read_text()
    assert "(s - margin *" in text
    simace.write_text(text.replace("(s - margin *", "(s - 0.5 * margin *", 1))
    output = run([sys.executable, "-m", "stages.commands", "carry-over"], root)
    assert "simcse.tiny-bert.s42: run " in output and ": stored" in output
    refused = re.search(r"simace\.tiny-bert\.s42: run \w+: not carried over: (.*)", output)
    assert refused and ": train step 1: " in refused[1], output
    assert "0 result(s) carried over" in output
