"""The evaluation command line: a results JSON for any encoder, and clean failures that leave
no finished-looking output behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from senteval_testing import save_tiny_bert, write_senteval_tree
from transformers import AutoModel, AutoTokenizer

from stages.core.cli import run
from stages.core.errors import StageError
from stages.evaluations.senteval import main


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, minilm_path: str) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny") / "model", minilm_path)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return write_senteval_tree(tmp_path_factory.mktemp("data") / "senteval", n=20)


def _args(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", str(model), "--data-dir", str(data), "--output", str(out), *extra]


def test_writes_results_with_protocol_and_encoder(
    tiny_bert: Path, data_root: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)  # no params.yaml here: the schema's defaults apply
    out = tmp_path / "results.json"
    tasks = ["--tasks", "STS12", "STSBenchmark", "CR", "MRPC", "--mode", "fasttest"]
    main(_args(tiny_bert, data_root, out, "--pooler", "mean", *tasks))
    results = json.loads(out.read_text())
    assert results["protocol"]["tasks"] == ["STS12", "STSBenchmark", "CR", "MRPC"]
    assert set(results["tasks"]) == set(results["protocol"]["tasks"])
    assert results["protocol"]["mode"] == "fasttest"
    assert results["encoder"]["pooler"] == "mean"
    assert (
        tmp_path / "cache" / "embeddings" / results["encoder"]["fingerprint"] / "CR.npz"
    ).is_file()
    assert "wrote" in capsys.readouterr().out


def test_bad_inputs_exit_2_with_one_line_and_no_output(
    tiny_bert: Path, data_root: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results.json"
    cases = [
        (_args(tiny_bert, tmp_path, out, "--pooler", "mean"), "no downstream/ folder"),
        (_args(tiny_bert, data_root, out), "pass a pooler"),
        (_args(tmp_path / "nowhere", data_root, out, "--pooler", "mean"), "nowhere"),
    ]
    for argv, message in cases:
        monkeypatch.setattr("sys.argv", ["evaluate_senteval", *argv])
        with pytest.raises(SystemExit) as exit_info:
            run(main)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
        assert not out.exists()


def test_nan_model_fails_before_writing(tiny_bert: Path, data_root: Path, tmp_path: Path) -> None:
    model = AutoModel.from_pretrained(tiny_bert)
    with torch.no_grad():
        model.encoder.layer[0].output.dense.weight[:] = float("inf")
    broken = tmp_path / "broken"
    model.save_pretrained(broken)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(broken)
    out = tmp_path / "results.json"
    with pytest.raises(StageError, match="non-finite embedding"):
        main(_args(broken, data_root, out, "--pooler", "mean", "--tasks", "STS13", "--no-cache"))
    assert not out.exists()


def test_senteval_batches_are_recorded_and_not_cached(
    tiny_bert: Path, data_root: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results.json"
    extra = ["--pooler", "mean", "--tasks", "STS12", "CR", "--mode", "fasttest"]
    main(_args(tiny_bert, data_root, out, *extra, "--encoding", "senteval_batches"))
    results = json.loads(out.read_text())
    assert results["protocol"]["encoding"] == "senteval_batches"
    assert results["protocol"]["text"]["sentences_per_encode_call"] == 128
    assert {t["embeddings"] for t in results["timings"]["tasks"].values()} == {"encoded"}
    assert not (tmp_path / "cache").exists()  # rows per occurrence: nothing to cache
