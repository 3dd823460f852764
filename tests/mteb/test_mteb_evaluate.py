"""The evaluation loop with the real mteb on a small local STS-B: results content, mteb's cache
(name/revision collisions, stale local data), and tasks skipped for lack of data offline."""

from __future__ import annotations

import http.server
import logging
import socket
import threading
import warnings
from pathlib import Path

import datasets.config
import pytest
from mteb.models import ModelMeta
from mteb.results import TaskResult
from mteb_testing import save_tiny_bert, write_stsb

from stages.core.schema.evaluation_settings import EVALUATIONS
from stages.modeling.encoder import SentenceEncoder
from stages.mteb_protocol import benchmark as evaluate_module
from stages.mteb_protocol.benchmark import LocalData, NoTaskEvaluated, evaluate_mteb, probe_hub
from stages.mteb_protocol.mteb_encoder import MtebEncoder

STSB = "STSBenchmark"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, minilm_path: str) -> tuple[SentenceEncoder, SentenceEncoder]:
    """Two trained-checkpoint directories of different runs (different weights and run ids)."""
    root = tmp_path_factory.mktemp("runs")
    return tuple(
        SentenceEncoder(
            str(save_tiny_bert(root / run_id, minilm_path, seed=seed, run_id=run_id)), device="cpu"
        )
        for seed, run_id in ((0, "run-a"), (1, "run-b"))
    )


@pytest.fixture
def local(tmp_path: Path) -> LocalData:
    return LocalData("sts_raw", write_stsb(tmp_path / "sts_raw", n=60), tmp_path / "senteval")


def _evaluate(encoder: SentenceEncoder, local: LocalData, cache: Path, tasks=(STSB,), **kw):
    return evaluate_mteb(MtebEncoder(encoder, "simcse-bert-base-42", **kw), list(tasks),
                         cache_dir=cache, local=local, batch_size=16)  # fmt: skip


def test_results_record_scores_categories_data_timings_and_mtebs_files(
    runs, local: LocalData, tmp_path: Path
) -> None:
    results = _evaluate(runs[0], local, tmp_path / "cache", tasks=(STSB, "BIOSSES"))
    row = results["tasks"][STSB]
    assert results["evaluated"] == [STSB] and list(results["skipped"]) == ["BIOSSES"]
    assert results["requested"] == [STSB, "BIOSSES"] and results["complete"] is False
    assert results["categories"] == {"STS": {"mean": row["main_score"], "tasks": 1, "requested": 2}}
    assert results["average"] == row["main_score"] and -100 <= row["main_score"] <= 100
    assert (row["metric"], row["category"], row["splits"]) == ("cosine_spearman", "STS", ["test"])
    assert row["data"] == "local:sts_raw" and row["dataset_revision"].startswith("local-sts_raw-")
    assert row["local_copy"]["pairs"] == 60 and row["local_copy"]["files"] == ["sts-test.csv"]
    assert row["local_copy"]["matches_hub_statistics"] is False  # 60 synthetic pairs, not 1,379
    assert row["texts_encoded"] == 120 and row["texts_per_s"] > 0 and row["from_cache"] is False
    assert row["wall_s"] >= row["encode_s"] > 0
    assert results["timing"]["texts_encoded"] == 120
    assert results["encoder"]["run_id"] == "run-a" and results["encoder"]["normalize"] is False
    assert results["encoder"]["mteb_name"] == "cse-repro/simcse-bert-base-42"
    assert results["data"] == {"hub_offline": True, "local_source": "sts_raw"}
    stored = TaskResult.from_disk(Path(row["result_file"]))  # mteb's own file, kept
    assert Path(row["result_file"]).parent == Path(results["mteb_results_dir"])
    assert stored.dataset_revision == row["dataset_revision"]
    assert 100 * stored.scores["test"][0]["main_score"] == pytest.approx(row["main_score"])


def test_a_superseded_task_is_scored_as_asked_without_mtebs_warnings(
    runs, local: LocalData, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The papers report STSBenchmark, which mteb says STSBenchmark.v2 supersedes: mteb's two
    warnings per evaluation are replaced by one line, and the result names the newer task."""
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        row = _evaluate(runs[0], local, tmp_path / "cache")["tasks"][STSB]
    assert row["superseded_by"] == "STSBenchmark.v2"
    assert not [w for w in caught if "superseded" in str(w.message)]
    superseded = [r.getMessage() for r in caplog.records if "superseded" in r.getMessage()]
    assert superseded == []
    assert any(
        "newer version STSBenchmark.v2 is not used" in r.getMessage() for r in caplog.records
    )


def test_two_runs_in_one_cache_never_share_a_result(runs, local: LocalData, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _evaluate(runs[0], local, cache)["tasks"][STSB]
    second = _evaluate(runs[1], local, cache)["tasks"][STSB]  # same label, another run
    assert second["main_score"] != first["main_score"]
    assert second["result_file"] != first["result_file"]
    assert second["from_cache"] is False and second["texts_encoded"] == 120
    again = _evaluate(runs[0], local, cache)["tasks"][STSB]
    assert again["from_cache"] is True and again["texts_encoded"] == 0
    assert again["main_score"] == first["main_score"]
    assert len(list((cache / "results").glob(f"*/*/{STSB}.json"))) == 2


def test_control_unnamed_models_do_collide_in_mtebs_cache(
    runs, local: LocalData, tmp_path: Path
) -> None:
    """Why the wrapper names every model: mteb files unnamed models under one key and serves the
    first one's scores to the second."""
    unnamed = []
    for encoder in runs:
        model = MtebEncoder(encoder, "x")
        model.mteb_model_meta = ModelMeta.create_empty()
        unnamed.append(model)
    cache = tmp_path / "cache"
    kwargs = {"cache_dir": cache, "local": local}
    first = evaluate_mteb(unnamed[0], [STSB], **kwargs)["tasks"][STSB]
    second = evaluate_mteb(unnamed[1], [STSB], **kwargs)["tasks"][STSB]
    assert second["from_cache"] is True and second["main_score"] == first["main_score"]


def test_result_from_other_local_data_is_recomputed(runs, local: LocalData, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    before = _evaluate(runs[0], local, cache)["tasks"][STSB]
    write_stsb(local.sts_raw_dir, n=60, seed=7)  # other pairs: another local revision
    after = _evaluate(runs[0], local, cache)["tasks"][STSB]
    assert after["dataset_revision"] != before["dataset_revision"]
    assert after["from_cache"] is False and after["texts_encoded"] == 120
    assert after["main_score"] != before["main_score"]
    stored = TaskResult.from_disk(Path(after["result_file"]))
    assert stored.dataset_revision == after["dataset_revision"]


def test_normalisation_is_part_of_the_cache_key(runs, local: LocalData, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    plain = _evaluate(runs[0], local, cache)["tasks"][STSB]
    unit = _evaluate(runs[0], local, cache, normalize=True)["tasks"][STSB]
    assert unit["from_cache"] is False and unit["result_file"] != plain["result_file"]
    assert unit["main_score"] == pytest.approx(plain["main_score"], abs=1e-4)  # cosine: same


def test_offline_tasks_without_local_data_are_skipped_without_network(
    runs, local: LocalData, tmp_path: Path, monkeypatch
) -> None:
    def no_network(*args, **kwargs):
        raise AssertionError("offline mode must not probe the hub")

    monkeypatch.setattr(evaluate_module.urllib.request, "urlopen", no_network)
    missing = LocalData("senteval", local.sts_raw_dir, tmp_path / "no-senteval")
    results = _evaluate(runs[0], missing, tmp_path / "cache", tasks=(STSB, "STS12", "BIOSSES"))
    assert results["evaluated"] == [STSB]
    assert results["skipped"]["STS12"].startswith(
        f"no local copy ({tmp_path / 'no-senteval' / 'downstream/STS/STS12-en-test'} not found)"
    )
    for name in ("STS12", "BIOSSES"):
        assert "not in the local Hugging Face cache, HF_HUB_OFFLINE=1" in results["skipped"][name]
        assert "mteb/" in results["skipped"][name]  # the hub dataset that was looked for
    with pytest.raises(NoTaskEvaluated, match=r"(?s)no MTEB task could be evaluated.*BIOSSES"):
        _evaluate(runs[0], local, tmp_path / "cache", tasks=("BIOSSES", "SICK-R"))


def test_unreachable_hub_is_probed_once_and_tasks_are_skipped(
    runs, local: LocalData, tmp_path: Path, monkeypatch
) -> None:
    probes = []
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(evaluate_module, "probe_hub", lambda: probes.append(1) or "no route")
    results = _evaluate(runs[0], local, tmp_path / "cache", tasks=("BIOSSES", STSB, "SICK-R"))
    assert results["evaluated"] == [STSB] and probes == [1]
    assert results["data"]["hub_offline"] is False
    for name in ("BIOSSES", "SICK-R"):
        assert results["skipped"][name].startswith("the Hugging Face hub is unreachable (no route)")
        assert "set HF_HUB_OFFLINE=1" in results["skipped"][name]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_probe_hub_tells_reachable_from_unreachable() -> None:
    refused = probe_hub(f"http://127.0.0.1:{_free_port()}", timeout=2)
    assert refused is not None and "127.0.0.1" in refused

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert probe_hub(f"http://127.0.0.1:{server.server_port}", timeout=2) is None
    finally:
        server.shutdown()


def test_a_result_of_other_evaluation_code_or_mteb_is_recomputed(
    runs, local: LocalData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage reruns when its code changes (its id covers the code); the cache must not
    answer it with the scores the old code, or another mteb version, computed."""
    from stages.mteb_protocol import mteb_encoder as wrapper

    cache = tmp_path / "cache"
    assert _evaluate(runs[0], local, cache)["tasks"][STSB]["from_cache"] is False
    assert _evaluate(runs[0], local, cache)["tasks"][STSB]["from_cache"] is True
    identity = wrapper.code_identity([EVALUATIONS["mteb"].module])
    assert "stages/mteb_protocol/local_data.py" in identity
    edited = {**identity, "stages/mteb_protocol/local_data.py": "edited"}
    monkeypatch.setattr(wrapper, "code_identity", lambda modules: edited)
    assert _evaluate(runs[0], local, cache)["tasks"][STSB]["from_cache"] is False
    monkeypatch.setattr(wrapper.mteb, "__version__", "0.0.1")
    assert _evaluate(runs[0], local, cache)["tasks"][STSB]["from_cache"] is False
