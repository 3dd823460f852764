"""Fault 4: SIGKILL at chosen points of training and of each evaluation stage. A real SIGKILL
(tests/faults/kill_point.py: the process kills itself at the N-th call of a function, so the
point is exact and no polling race decides it). Nothing half-written is ever visible as
finished; a rerun ends with the very outputs of an uninterrupted run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from fault_helpers import (
    CHECKPOINTS,
    EXPERIMENT,
    assert_same_run,
    killed,
    load_json,
    make_workspace,
    no_finished_outputs,
    run_id,
)

import stages.evaluations.mteb as mteb_stage
import stages.evaluations.senteval as senteval_stage
import stages.train as train_stage
from stages.core.storage.run_folders import read_log

pytestmark = pytest.mark.faults

ENCODE = "stages.modeling.encoder:SentenceEncoder.__call__"
# name: (function, its N-th call, kill before/after it, resumes counted in the final log)
TRAIN_KILLS = {
    "before-the-first-checkpoint": ("stages.training.loop:Training.train_step", 2, "before", 0),
    "right-after-a-checkpoint": ("stages.training.loop:save_checkpoint", 1, "after", 1),
    "during-dev-evaluation": ("stages.training.dev_encoder:DevEncoder.__call__", 1, "after", 1),
    "before-the-finished-run-is-renamed": (
        "stages.training.run_folder:remove_checkpoints", 1, "before", 0),
}  # fmt: skip


@pytest.mark.parametrize("point", TRAIN_KILLS)
def test_training_killed_resumes_to_the_uninterrupted_run(
    point: str, reference: Path, shared_data: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    target, n, when, resumes = TRAIN_KILLS[point]
    root = make_workspace(tmp_path, shared_data)
    rid = run_id(root)
    killed(root, target, n, when, "stages.train", EXPERIMENT)

    partial = root / "runs" / f"{rid}.partial"
    assert not (root / "runs" / rid).exists()  # never visible as finished
    assert no_finished_outputs(root)  # no pointer, no curves, no results
    assert (root / "runs" / f"{rid}.lock").is_file()  # left by the dead trainer
    checkpoints = sorted(p.name for p in partial.glob("checkpoint-*"))
    events = [(r["event"], r["step"]) for r in read_log(partial / "log.jsonl")]
    if point == "before-the-first-checkpoint":
        assert checkpoints == [] and events == []  # killed in step 2; step 1 not yet flushed
    elif point == "right-after-a-checkpoint":
        assert checkpoints == [f"checkpoint-{CHECKPOINTS[0]}"] and ("train", 3) in events
    elif point == "during-dev-evaluation":
        assert checkpoints == [f"checkpoint-{CHECKPOINTS[0]}"] and ("train", 4) in events
        assert not [e for e in events if e[0] == "eval"]  # encoded, not yet scored
    else:
        assert (partial / "metrics.json").is_file() and ("eval", 8) in events

    monkeypatch.chdir(root)
    train_stage.main([EXPERIMENT])  # takes over the dead trainer's lock, resumes
    assert_same_run(root, reference, resumes=resumes)
    for curve in ("train_steps.csv", "dev_evals.csv"):
        ours = (root / "experiments" / EXPERIMENT / curve).read_text()
        assert ours == (reference / "experiments" / EXPERIMENT / curve).read_text(), curve


def test_training_terminated_gives_its_lock_back_says_so_and_resumes(
    reference: Path, shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (scancel, Snakemake and torchrun stopping a job) unwinds the trainer as Ctrl-C
    does: one line, exit 143, its lock given back; the rerun resumes to the uninterrupted run."""
    root = make_workspace(tmp_path, shared_data)
    rid = run_id(root)
    result = killed(
        root, "stages.training.loop:save_checkpoint", 1, "after", "stages.train", EXPERIMENT,
        signal="SIGTERM", returncode=143,
    )  # fmt: skip
    assert "terminated (SIGTERM): finished outputs are intact" in result.stderr
    assert (
        f"run {rid} ({EXPERIMENT}) stays unfinished in runs/{rid}.partial; a rerun resumes it "
        f"from checkpoint-{CHECKPOINTS[0]}" in result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not (root / "runs" / f"{rid}.lock").exists()
    assert (root / "runs" / f"{rid}.partial").is_dir() and not (root / "runs" / rid).exists()
    assert no_finished_outputs(root)
    monkeypatch.chdir(root)
    train_stage.main([EXPERIMENT])
    assert_same_run(root, reference, resumes=1)


def without_timings(results: dict[str, Any]) -> dict[str, Any]:
    """Results minus what measures time (and whether mteb's own cache answered)."""
    timing = {"timing", "timings", "from_cache", "texts_encoded", "texts_per_s"}

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()
                    if k not in timing and not k.endswith("_s")}  # fmt: skip
        return value

    return strip(results)


def senteval_args(model: Path, shared_data: Path) -> list[str]:
    return ["--model", str(model), "--tasks", "STSBenchmark", "--mode", "fasttest",
            "--data-dir", str(shared_data / "senteval"), "--cache-dir", "cache",
            "--output", "out/senteval.json"]  # fmt: skip


def mteb_args(model: Path, shared_data: Path) -> list[str]:
    return ["--model", str(model), "--tasks", "STSBenchmark", "--local-source", "senteval",
            "--senteval-dir", str(shared_data / "senteval"),
            "--sts-raw-dir", str(shared_data / "sts_raw"), "--cache-dir", "cache/mteb",
            "--output", "out/mteb.json"]  # fmt: skip


STAGES = {"senteval": (senteval_stage, senteval_args), "mteb": (mteb_stage, mteb_args)}


@pytest.fixture(scope="module")
def uninterrupted(reference: Path, shared_data: Path, tmp_path_factory) -> dict[str, Any]:
    """Each evaluation stage's results for the reference run's best model, uninterrupted."""
    model = reference / "runs" / run_id(reference) / "best"
    results = {}
    cwd = Path.cwd()
    for name, (stage, args) in STAGES.items():
        os.chdir(tmp_path_factory.mktemp(name))
        try:
            stage.main(args(model, shared_data))
            results[name] = load_json(Path("out") / f"{name}.json")
        finally:
            os.chdir(cwd)
    return results


RENAME = "os:replace"  # atomic writes rename a complete temporary into place
EVAL_KILLS = {
    "senteval-while-encoding": ("senteval", ENCODE, "after", ""),
    "senteval-while-caching-embeddings": ("senteval", RENAME, "before", "STSBenchmark.npz"),
    "senteval-before-the-results-are-in-place": ("senteval", RENAME, "before", "senteval.json"),
    "mteb-while-encoding": ("mteb", ENCODE, "after", ""),
    "mteb-before-the-results-are-in-place": ("mteb", RENAME, "before", "mteb.json"),
}


@pytest.mark.parametrize("point", EVAL_KILLS)
def test_evaluation_killed_leaves_no_results_and_reruns_to_the_same(
    point: str, reference: Path, uninterrupted: dict[str, Any], shared_data: Path,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    name, target, when, match = EVAL_KILLS[point]
    stage, args = STAGES[name]
    argv = args(reference / "runs" / run_id(reference) / "best", shared_data)
    killed(tmp_path, target, 1, when, stage.__name__, *argv, match=match)
    output = tmp_path / "out" / f"{name}.json"
    assert not output.exists()  # nothing looks finished
    if "caching" in point:  # the embeddings sit under a temporary name only, never as the cache
        assert list((tmp_path / "cache").glob("*/.STSBenchmark.npz.*.tmp/STSBenchmark.npz"))
        assert not list((tmp_path / "cache").glob("*/STSBenchmark.npz"))

    monkeypatch.chdir(tmp_path)
    stage.main(argv)
    assert without_timings(json.loads(output.read_text())) == without_timings(uninterrupted[name])
    if match:  # the rerun writes the same file and removes what the killed writer left of it
        assert not list(tmp_path.glob(f"**/.{match}.*.tmp"))
