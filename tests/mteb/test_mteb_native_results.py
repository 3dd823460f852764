"""Each MTEB evaluation also leaves its results in mteb's own layout, which mteb's loader reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mteb.cache import ResultCache
from mteb_testing import save_tiny_bert, write_stsb

from stages.evaluate_mteb import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_path: str) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny") / "model", minilm_path)


def test_results_in_mtebs_layout_load_with_mtebs_result_cache(
    tiny: Path, tmp_path: Path, monkeypatch
) -> None:
    write_stsb(tmp_path / "own_sts_raw", n=30)  # outside data/: not the manifest's
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "experiments" / "tiny-run" / "mteb.json"
    argv = ["--model", str(tiny), "--pooler", "mean", "--tasks", "STSBenchmark"]
    main([*argv, "--name", "tiny-run", "--output", str(out), "--sts-raw-dir", "own_sts_raw"])
    results = json.loads(out.read_text())
    native = out.parent / "mteb_results"
    revision = results["encoder"]["mteb_revision"]
    folder = native / "results" / "cse-repro__tiny-run" / revision
    assert Path(results["mteb_native_results"]) == folder
    assert {"STSBenchmark.json", "model_meta.json"} <= {p.name for p in folder.iterdir()}
    # the shared cache may be cleared: the copy stands alone
    loaded = ResultCache(native).load_results(include_remote=False, require_model_meta=True)
    (model,) = loaded.model_results
    assert (model.model_name, model.model_revision) == ("cse-repro/tiny-run", revision)
    (task,) = model.task_results
    assert task.task_name == "STSBenchmark"
    ours = results["tasks"]["STSBenchmark"]["main_score"]
    assert 100 * task.get_score() == pytest.approx(ours, abs=1e-4)
