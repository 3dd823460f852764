"""The local source against the real shared data, and the stage's command line."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stages.core.errors import StageError
from stages.core.schema.data_manifest import Dataset, load_manifest
from stages.download import LOCK_FILE, download_dataset, main

REPO = Path(__file__).resolve().parents[2]
LOCAL_DATASETS = ["senteval", "sts_raw", "wiki1m_head_11913", "wiki1m_random10k_seed42"]


@pytest.mark.parametrize("name", LOCAL_DATASETS)
def test_real_shared_data_passes_every_checksum(shared_data, tmp_path, name):
    dataset = load_manifest().datasets[name]
    report = download_dataset(dataset, tmp_path, source="local", local_dir=shared_data)
    assert report.action == "copied" and report.notes == ()
    assert report.files == len(dataset.files)
    copied = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert copied == sorted(f.path for f in dataset.files)
    assert download_dataset(dataset, tmp_path, source="local", local_dir=shared_data).action == (
        "up to date"
    )


def test_senteval_copy_has_the_layout_senteval_reads(shared_data, tmp_path):
    download_dataset(
        load_manifest().datasets["senteval"], tmp_path, source="local", local_dir=shared_data
    )
    downstream = tmp_path / "senteval" / "downstream"
    assert (downstream / "STS/STS12-en-test/STS.input.MSRpar.txt").is_file()
    assert (downstream / "STS/STSBenchmark/sts-train.csv").is_file()
    assert (downstream / "SST/binary/sentiment-train").is_file()
    tasks = {"CR", "MPQA", "MR", "MRPC", "SICK", "SST", "STS", "SUBJ", "TREC"}
    assert {p.name for p in downstream.iterdir()} == tasks


def small_local_copy(shared_data: Path, root: Path) -> Dataset:
    """The TREC part of the senteval entry, with its real files copied under ``root``."""
    senteval = load_manifest().datasets["senteval"]
    files = [f for f in senteval.files if "/TREC/" in f.path]
    for f in files:
        (root / f.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shared_data / f.path, root / f.path)
    return senteval.model_copy(update={"files": tuple(files)})


def test_missing_local_folder_is_named(tmp_path):
    dataset = load_manifest().datasets["sts_raw"]
    missing = tmp_path / "no-such-folder"
    with pytest.raises(StageError, match=f"local data folder {missing} does not exist.*CSE_DATA"):
        download_dataset(dataset, tmp_path / "data", source="local", local_dir=missing)
    assert not (tmp_path / "data" / "sts_raw").exists()


def test_missing_local_file_names_path_and_checksum(shared_data, tmp_path):
    local = tmp_path / "local"
    dataset = small_local_copy(shared_data, local)
    gone = next(f for f in dataset.files if f.path.endswith("TREC_10.label"))
    (local / gone.path).unlink()
    with pytest.raises(StageError) as err:
        download_dataset(dataset, tmp_path / "data", source="local", local_dir=local)
    assert str(local / gone.path) in str(err.value) and gone.sha256 in str(err.value)
    assert not (tmp_path / "data" / "senteval").exists()
    assert list((tmp_path / "data").iterdir()) == []


def test_corrupt_local_file_is_refused_and_nothing_is_put_in_place(shared_data, tmp_path):
    local = tmp_path / "local"
    dataset = small_local_copy(shared_data, local)
    bad = next(f for f in dataset.files if f.path.endswith("train_5500.label"))
    path = local / bad.path
    path.write_bytes(path.read_bytes().replace(b"?", b"? ", 1))
    with pytest.raises(StageError) as err:
        download_dataset(dataset, tmp_path / "data", source="local", local_dir=local)
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    assert f"checksum mismatch for {path}: expected sha256 {bad.sha256}, got {actual}" == str(
        err.value
    )
    assert list((tmp_path / "data").iterdir()) == []


def test_damaged_output_is_replaced_by_a_verified_copy(shared_data, tmp_path):
    local = tmp_path / "local"
    dataset = small_local_copy(shared_data, local)
    download_dataset(dataset, tmp_path / "data", source="local", local_dir=local)
    target = tmp_path / "data" / dataset.files[0].path
    target.write_text("damaged")
    report = download_dataset(dataset, tmp_path / "data", source="local", local_dir=local)
    assert report.action == "copied"
    assert target.read_bytes() == (local / dataset.files[0].path).read_bytes()


def write_params(tmp_path: Path, **data: object) -> Path:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"].update(data)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_main_copies_the_corpus_named_in_params(shared_data, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("CSE_DATA_DIR", raising=False)
    params = write_params(
        tmp_path, source="local", local_dir=str(shared_data), corpus="wiki1m_head_11913"
    )
    main(["corpus", "--params", str(params), "--dest", str(tmp_path / "data")])
    out = tmp_path / "data" / "corpus" / "wiki1m_head_11913.txt"
    assert out.read_bytes() == (shared_data / "corpus/wiki1m_head_11913.txt").read_bytes()
    assert f"copied from {shared_data}" in capsys.readouterr().out
    assert not (tmp_path / "data" / LOCK_FILE).exists()


def test_environment_variable_overrides_the_local_folder(shared_data, tmp_path, monkeypatch):
    params = write_params(tmp_path, source="local", local_dir=str(tmp_path / "nowhere"))
    monkeypatch.setenv("CSE_DATA_DIR", str(shared_data))
    main(["sts_raw", "--params", str(params), "--dest", str(tmp_path / "data")])
    assert (tmp_path / "data/sts_raw/stsbenchmark/sts-test.csv").is_file()


def test_command_line_failure_is_one_line_and_exit_status_2(tmp_path):
    params = write_params(tmp_path, source="remote", corpus="wiki1m_random10k_seed42")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "stages.download",
            "corpus",
            "--params",
            str(params),
            "--dest",
            str(tmp_path / "data"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: corpus/wiki1m_random10k_seed42.txt has no public URL")
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "data").exists()
