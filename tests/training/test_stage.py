"""The stage CLI: runs/<run_id>, the pointer, the cache hit, resume after SIGKILL, STS-B dev."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr
from train_helpers import TINY, assert_same_weights, copy_real_data, without_timing

import stages.train as stage
import stages.training.run_folder as runner
from stages.core.errors import StageError
from stages.core.identity.experiments import plan_experiments
from stages.core.schema.params import load_params
from stages.core.storage.run_folders import read_log

REPO = Path(__file__).resolve().parents[2]
EXPERIMENT = "simcse.tiny.s1"
PARAMS = {
    "data": {"corpus": "wiki1m_head_11913", "max_sentences": 240},
    "train": {
        "batch_size": 16,
        "max_steps": 40,
        "eval_steps": 10,
        "checkpoint_steps": 10,
        "log_steps": 5,
        "device": "cpu",
    },
    "backbones": {"tiny": TINY.model_dump(mode="json")},
    "methods": {"simcse": {"objective": {"name": "infonce", "tau": 0.05}}},
    "experiments": [{"methods": ["simcse"], "backbones": ["tiny"], "seeds": [1]}],
}


def make_workspace(root: Path, shared_data: Path) -> Path:
    copy_real_data(shared_data, root)
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    return root


def run_id(root: Path) -> str:
    return plan_experiments(load_params(root / "params.yaml")).runs[EXPERIMENT].run_id


@pytest.fixture(scope="module")
def finished(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace in which the stage has trained the experiment once, uninterrupted."""
    root = make_workspace(tmp_path_factory.mktemp("finished"), shared_data)
    cwd = Path.cwd()
    os.chdir(root)
    try:
        stage.main([EXPERIMENT])
    finally:
        os.chdir(cwd)
    return root


def test_stage_trains_into_runs_and_writes_the_pointer(finished: Path) -> None:
    rid = run_id(finished)
    folder = finished / "runs" / rid
    assert sorted(p.name for p in folder.iterdir()) == [
        "best", "config.json", "final", "log.jsonl", "metrics.json", "origin.json",
    ]  # fmt: skip
    assert not (finished / "runs" / f"{rid}.partial").exists()
    config = json.loads((folder / "config.json").read_text())
    assert config["run_id"] == rid and config["experiment"] == EXPERIMENT
    assert config["settings"]["train"]["batch_size"] == 16
    pointer = json.loads((finished / "experiments" / EXPERIMENT / "train.json").read_text())
    metrics = json.loads((folder / "metrics.json").read_text())
    assert pointer["run_id"] == rid and pointer["run_dir"] == f"runs/{rid}"
    assert pointer["best_dev_spearman"] == metrics["best"]["spearman"]
    assert pointer["best_step"] == metrics["best"]["step"] and pointer["steps"] == 40
    # the curves DVC plots and the report read, beside the pointer
    steps = pl.read_csv(finished / "experiments" / EXPERIMENT / "train_steps.csv")
    dev = pl.read_csv(finished / "experiments" / EXPERIMENT / "dev_evals.csv")
    assert steps["step"].to_list() == list(range(1, 41)) and "batch_pos_angle_deg" in steps.columns
    assert dev["spearman"].to_list() == [e["spearman"] for e in metrics["evaluations"]]


def test_finished_run_is_a_cache_hit(
    finished: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing trains, the pointer keeps its bytes, and the job's log says it was stored."""
    pointer = finished / "experiments" / EXPERIMENT / "train.json"
    before = pointer.stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(runner, "train", no_training)
    monkeypatch.chdir(finished)
    capsys.readouterr()
    stage.main([EXPERIMENT])
    assert pointer.stat().st_mtime_ns == before  # unchanged content is not rewritten
    run_id = json.loads(pointer.read_text())["run_id"]
    said = f"wrote experiments/{EXPERIMENT}/train.json (the stored run {run_id}, trained before)"
    assert said in capsys.readouterr().out


def test_the_lock_holder_removes_the_temporaries_killed_writers_left_in_the_run(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_workspace(tmp_path, shared_data)
    monkeypatch.chdir(root)
    params = load_params("params.yaml")
    run = plan_experiments(params).runs[EXPERIMENT]
    left = (".checkpoint-20.elsewhere-1.abcd1234.tmp", ".best.abcd1234.tmp")  # any host, any age
    for name in (*left, "checkpoint-10"):
        (run.partial_dir / name).mkdir(parents=True)
    seen = []

    def train_run(run, params) -> None:
        seen.append(sorted(p.name for p in run.partial_dir.iterdir()))

    monkeypatch.setattr(runner, "train_run", train_run)
    stage.obtain(run, plan_experiments(params), "params.yaml", None, main_process=True)
    assert seen == [["checkpoint-10"]]  # the checkpoint to resume from stays


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_result(
    finished: Path, shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_workspace(tmp_path, shared_data)
    rid = run_id(root)
    partial = root / "runs" / f"{rid}.partial"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-m", "stages.train", EXPERIMENT],
        cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not list(partial.glob("checkpoint-*")) and child.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (root / "runs" / rid).exists()

    monkeypatch.chdir(root)
    stage.main([EXPERIMENT])
    done, reference = root / "runs" / rid, finished / "runs" / rid
    first = json.loads((reference / "metrics.json").read_text())
    resumed = json.loads((done / "metrics.json").read_text())
    assert without_timing(resumed) == without_timing(first)
    assert_same_weights(reference / "best", done / "best")
    assert_same_weights(reference / "final", done / "final")
    log = read_log(done / "log.jsonl")
    assert [r["event"] for r in log].count("resume") == 1
    assert [r["step"] for r in log if r["event"] == "train"] == list(range(1, 41))


def test_unknown_experiment_and_missing_corpus_are_clear_errors(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_workspace(tmp_path, shared_data)
    monkeypatch.chdir(root)
    with pytest.raises(StageError, match=f"unknown experiment 'nope'; planned: {EXPERIMENT}"):
        stage.main(["nope"])
    (root / "data" / "corpus" / "wiki1m_head_11913.txt").unlink()
    missing = r"data/corpus/wiki1m_head_11913\.txt is missing .*python -m stages\.download corpus"
    with pytest.raises(StageError, match=missing):
        stage.main([EXPERIMENT])


def test_stsb_dev_scores_each_unique_sentence_once(tmp_path: Path) -> None:
    rows = [  # genre, file, year, id, score, s1, s2 (SentEval's STS-B layout)
        ("g", "f", "y", "0", "4.5", "a  cat sits", "a cat is sitting"),
        ("g", "f", "y", "1", "1.0", "a cat sits", "stocks fell"),
        ("g", "f", "y", "2", "5.0", "it rains", "it is raining"),
        ("g", "f", "y", "3", "0.5", "stocks fell", "it rains"),
    ]
    dev = tmp_path / "downstream/STS/STSBenchmark/sts-dev.csv"
    dev.parent.mkdir(parents=True)
    dev.write_text("".join("\t".join(r) + "\n" for r in rows))
    rng = np.random.default_rng(0)
    vectors: dict[str, np.ndarray] = {}
    calls: list[list[str]] = []

    def encode(sentences):
        calls.append(list(sentences))
        return np.stack([vectors.setdefault(s, rng.normal(size=5)) for s in sentences])

    scores = runner.stsb_dev_evaluator(tmp_path)(encode)
    assert (
        len(calls) == 1 and len(calls[0]) == len(set(calls[0])) == 5
    )  # "a  cat sits" is "a cat sits"
    unit = {s: v / np.linalg.norm(v) for s, v in vectors.items()}
    pairs = [(" ".join(r[5].split()), r[6]) for r in rows]
    gold = [float(r[4]) for r in rows]
    cosine = [unit[a] @ unit[b] for a, b in pairs]
    assert scores["spearman"] == pytest.approx(spearmanr(cosine, gold).statistic * 100)
    positive = [
        np.sum((unit[a] - unit[b]) ** 2) for (a, b), g in zip(pairs, gold, strict=True) if g > 4
    ]
    assert scores["alignment"] == pytest.approx(np.mean(positive))
    # Uniformity as the SentEval stage reports it: over both columns of the pairs.
    distances = pdist(np.stack([unit[s] for pair in pairs for s in pair]), "sqeuclidean")
    assert scores["uniformity"] == pytest.approx(np.log(np.mean(np.exp(-2 * distances))))


def test_malformed_dev_file_names_the_line(tmp_path: Path) -> None:
    dev = tmp_path / "downstream/STS/STSBenchmark/sts-dev.csv"
    dev.parent.mkdir(parents=True)
    dev.write_text("g\tf\ty\t0\t4.5\ta\tb\nbroken line\n")
    with pytest.raises(StageError, match=r"sts-dev.csv:2: expected at least 7 tab-separated"):
        runner.stsb_dev_evaluator(tmp_path)


def child_pids(parent: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent:
                found.append(int(proc.name))
    return found


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
def test_torchrun_with_two_cpu_processes_trains_and_resumes(
    shared_data: Path, tmp_path: Path
) -> None:
    """The loop's multi-process wiring (barriers, per-rank RNG in checkpoints, rank-0 outputs)."""
    root = make_workspace(tmp_path, shared_data)
    params = {**PARAMS, "train": {**PARAMS["train"], "max_steps": 12, "checkpoint_steps": 4}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    rid = run_id(root)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        f"--master_port={port}", "-m", "stages.train", EXPERIMENT,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    partial = root / "runs" / f"{rid}.partial"
    child = subprocess.Popen(command, cwd=root, env=env, stderr=subprocess.PIPE, text=True)
    while not list(partial.glob("checkpoint-*")) and child.poll() is None:
        time.sleep(0.01)
    workers = child_pids(child.pid)  # torchrun starts each worker in a session of its own
    for pid in [child.pid, *workers]:
        os.kill(pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL, child.stderr.read()
    assert len(workers) == 2
    while any(Path(f"/proc/{pid}").exists() and not zombie(pid) for pid in workers):
        time.sleep(0.01)
    assert not (root / "runs" / rid).exists()
    subprocess.run(command, cwd=root, env=env, check=True)
    metrics = json.loads((root / "runs" / rid / "metrics.json").read_text())
    assert metrics["steps"] == 12 and metrics["timing"]["world_size"] == 2
    log = read_log(root / "runs" / rid / "log.jsonl")
    assert [r["step"] for r in log if r["event"] == "train"] == list(range(1, 13))
    assert [r["event"] for r in log].count("resume") == 1
    assert (root / "experiments" / EXPERIMENT / "train.json").is_file()
