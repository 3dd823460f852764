"""The MTEB stage's command line, end to end on one small local task, and its failures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mteb_testing import save_tiny_bert, write_stsb

from stages.core.cli import run
from stages.core.errors import StageError
from stages.evaluations.mteb import main
from stages.modeling.encoder import SentenceEncoder

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"


OWN_STS = "own_sts_raw"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_path: str) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny") / "model", minilm_path)


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    """A working directory without params.yaml (the schema's defaults: cache/mteb) and a small
    STS-B of its own outside data/ (workspace data must match the manifest)."""
    write_stsb(tmp_path / OWN_STS, n=30)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_writes_results_and_keeps_mtebs_files(tiny: Path, project: Path, capsys) -> None:
    out = project / "out" / "mteb.json"
    argv = ["--model", str(tiny), "--pooler", "mean", "--tasks", "STSBenchmark", "BIOSSES"]
    main([*argv, "--name", "tiny-run", "--output", str(out), "--sts-raw-dir", OWN_STS])
    results = json.loads(out.read_text())
    assert results["evaluated"] == ["STSBenchmark"] and list(results["skipped"]) == ["BIOSSES"]
    assert results["tasks"]["STSBenchmark"]["data"] == "local:senteval"
    assert results["encoder"]["max_length"] == 512  # no sentence_bert_config.json: the default
    assert results["encoder"]["mteb_name"] == "cse-repro/tiny-run"
    assert results["mteb_results_dir"].startswith("cache/mteb/results/cse-repro__tiny-run/")
    assert (project / results["tasks"]["STSBenchmark"]["result_file"]).is_file()
    printed = capsys.readouterr().out
    assert "BIOSSES" in printed and "skipped" in printed and f"wrote {out}" in printed


@pytest.mark.parity
def test_minilm_truncates_at_its_declared_256_tokens(project: Path, minilm_path: str) -> None:
    out = project / "minilm.json"
    main(["--model", minilm_path, "--pooler", "mean", "--tasks", "STSBenchmark",
          "--normalize", "--output", str(out), "--sts-raw-dir", OWN_STS])  # fmt: skip
    encoder = json.loads(out.read_text())["encoder"]
    assert (encoder["max_length"], encoder["normalize"]) == (256, True)


def test_failures_exit_2_with_one_line_and_no_output(
    tiny: Path, project: Path, monkeypatch, capsys
) -> None:
    out = project / "results.json"
    model = [
        "--model",
        str(tiny),
        "--pooler",
        "mean",
        "--output",
        str(out),
        "--sts-raw-dir",
        OWN_STS,
    ]
    cases = [
        ([*model, "--tasks", "BIOSSES"], "no MTEB task could be evaluated"),
        ([*model, "--tasks", "NoSuchTask"], "not in mteb's task registry: NoSuchTask"),
        ([*model, "--tasks", "STS12", "--no-local-data"], "STS12: hub data not in the local"),
        (["--model", str(tiny), "--output", str(out)], "pass a pooler"),
        (["--model", str(tiny), "--pooler", "mean"], "--output is required with --model"),
    ]
    for argv, message in cases:
        monkeypatch.setattr("sys.argv", ["evaluate_mteb", *argv])
        with pytest.raises(SystemExit) as exit_info:
            run(main)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
        assert not out.exists()


def test_experiment_resolves_through_the_shared_evaluation_target(
    tiny: Path, project: Path, monkeypatch
) -> None:
    with pytest.raises(StageError, match="--experiment needs a params file"):
        main(["--experiment", "simcse.bert-base.s42"])
    shutil.copy(PARAMS, project / "params.yaml")
    calls = []

    def encoder_for(experiment, *, batch_size, device):
        calls.append((experiment.name, batch_size, device))
        return SentenceEncoder(str(tiny), "mean", device="cpu")

    monkeypatch.setattr("stages.evaluations.target.encoder_for", encoder_for)
    main(
        [
            "--experiment",
            "simcse.bert-base.s42",
            "--tasks",
            "STSBenchmark",
            "--sts-raw-dir",
            OWN_STS,
            "--device",
            "cpu",
        ]
    )
    assert calls == [("simcse.bert-base.s42", 128, "cpu")]
    results = json.loads((project / "experiments/simcse.bert-base.s42/mteb.json").read_text())
    assert results["encoder"]["mteb_name"] == "cse-repro/simcse.bert-base.s42"
