"""Faults 1 and 3 under both orchestrators, once each: data damaged after the download stages
stops the train stage with the data check's message (and DVC's own rerun of a changed download
output restores it); params with a duplicate key are refused before any job runs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from fault_helpers import REPO, no_finished_outputs, run_id
from project_copy import project_copy

pytestmark = pytest.mark.faults

EXPERIMENT = "simcse.tiny-bert.s42"
CORPUS = "data/corpus/wiki1m_head_11913.txt"
STSB_DEV = "data/senteval/downstream/STS/STSBenchmark/sts-dev.csv"


def tiny_params() -> dict:
    """The smoke preset cut to one SimCSE run, STS-B only, no MTEB."""
    params = yaml.safe_load((REPO / "presets" / "smoke.yaml").read_text())
    params["experiments"] = [{"methods": ["simcse"], "backbones": ["tiny-bert"], "seeds": [42]}]
    params["evaluations"]["senteval"]["tasks"] = ["STSBenchmark"]
    params["evaluations"]["mteb"]["enabled"] = False
    params.pop("baselines", None)
    return params


def tool(root: Path, shared_data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CSE_DATA_DIR": str(shared_data), "HF_HUB_OFFLINE": "1"}
    env.pop("CSE_RUNS_DIR", None)
    return subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=600)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result.stdout + result.stderr


def assert_stopped_by_the_data_check(result: subprocess.CompletedProcess[str], rel: str,
                                     argument: str, root: Path) -> None:  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-4000:]
    assert f"error: {rel} changed after download: sha256 " in output
    assert "the manifest says " in output and "Nothing was computed from it" in output
    assert f"`python -m stages.download {argument}`" in output
    rid = run_id(root, EXPERIMENT)
    assert not (root / "runs" / rid).exists() and not (root / "runs" / f"{rid}.partial").exists()
    assert not (root / "experiments" / EXPERIMENT / "train.json").exists()


def test_snakemake_train_stops_on_a_truncated_corpus(shared_data: Path, tmp_path: Path) -> None:
    root = project_copy(tmp_path, tiny_params())
    ok(tool(root, shared_data, "snakemake", "--cores", "1", CORPUS, "data/senteval"))
    corpus = root / CORPUS
    corpus.write_bytes(corpus.read_bytes()[:1000])
    target = f"experiments/{EXPERIMENT}/train.json"
    result = tool(root, shared_data, "snakemake", target, "--cores", "1", "--resources", "gpu=1")
    assert_stopped_by_the_data_check(result, CORPUS, "corpus", root)


def test_dvc_train_stops_on_a_changed_stsb_dev_and_repro_restores_it(
    shared_data: Path, tmp_path: Path
) -> None:
    root = project_copy(tmp_path, tiny_params())
    # the train stage's upstream: the data and its code manifest (`--single-item` runs none)
    ok(tool(root, shared_data, "dvc", "repro", "download.corpus", "download.senteval", "code"))
    dev = root / STSB_DEV
    intact = dev.read_bytes()
    dev.write_bytes(intact.replace(b"\t", b" ", 1))
    result = tool(root, shared_data, "dvc", "repro", "--single-item", f"train.{EXPERIMENT}")
    assert_stopped_by_the_data_check(result, STSB_DEV, "senteval", root)
    # DVC sees the changed output of the download stage: its rerun puts a verified copy back.
    ok(tool(root, shared_data, "dvc", "repro", "download.senteval"))
    assert dev.read_bytes() == intact


def test_dvc_retrains_a_deleted_run_instead_of_restoring_its_pointer(
    shared_data: Path, tmp_path: Path
) -> None:
    """The pointer names a run folder DVC does not track: DVC's run cache must not put back a
    pointer whose run was deleted (it did while the pointer was an uncached metric)."""
    root = project_copy(tmp_path, tiny_params())
    stage = f"train.{EXPERIMENT}"
    ok(tool(root, shared_data, "dvc", "repro", stage))
    rid = run_id(root, EXPERIMENT)
    assert (root / "runs" / rid / "metrics.json").is_file()
    shown = ok(tool(root, shared_data, "dvc", "metrics", "show"))
    assert f"experiments/{EXPERIMENT}/train.json" in shown  # still DVC's metric
    shutil.rmtree(root / "runs" / rid)
    (root / "experiments" / EXPERIMENT / "train.json").unlink()
    output = ok(tool(root, shared_data, "dvc", "repro", stage))
    assert "is cached - skipping run" not in output  # DVC's words when its run cache answers
    assert (root / "runs" / rid / "metrics.json").is_file()  # trained again
    assert (root / "experiments" / EXPERIMENT / "train.json").is_file()


DUPLICATE = "\nmethods:\n  simcse:\n    objective: {name: infonce, tau: 0.5, tau: 0.05}\n"


def bad_params_copy(tmp_path: Path, tail: str) -> Path:
    """A project copy (dvc.yaml made from good params) whose params.yaml gets ``tail``."""
    root = project_copy(tmp_path, tiny_params())
    with (root / "params.yaml").open("a") as f:
        f.write(tail)
    return root


def assert_refused(result: subprocess.CompletedProcess[str], root: Path, message: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-4000:]
    assert message in output, output[-4000:]
    assert not (root / "data").exists() and not (root / "runs").exists()
    assert no_finished_outputs(root)  # no pointer, no curves, no results


def test_snakemake_dry_run_refuses_duplicate_params_keys(shared_data: Path, tmp_path: Path):
    root = bad_params_copy(tmp_path, DUPLICATE)
    result = tool(root, shared_data, "snakemake", "-n", "--cores", "1")
    assert_refused(result, root, "methods: given twice, at lines ")
    assert_refused(result, root, "methods.simcse.objective.tau: given twice, at lines ")


def test_dvc_repro_refuses_duplicate_keys_and_non_finite_values(shared_data: Path, tmp_path: Path):
    # DVC's own YAML reader refuses a repeated key before any stage runs ...
    root = bad_params_copy(tmp_path / "duplicate", DUPLICATE)
    result = tool(root, shared_data, "dvc", "repro")
    assert_refused(result, root, 'found duplicate key "methods"')
    # ... and a value the code cannot honour stops the first stage, naming the key path.
    root = bad_params_copy(tmp_path / "nan", "")
    text = (root / "params.yaml").read_text()
    (root / "params.yaml").write_text(text.replace("tau: 0.05", "tau: .nan", 1))
    result = tool(root, shared_data, "dvc", "repro")
    assert_refused(result, root, "Input should be a finite number (got nan)")
