"""benchmarks/smoke_time.py's reading of a Snakemake run: each job's time from the metadata, the
stage and experiment of a job, and the totals per rule (the run itself takes minutes: it is a
benchmark, recorded in benchmarks/results/smoke_time.json)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from benchmarks.smoke_time import experiment_output, job_times, per_rule, read_metadata


def record(rule: str, job_hash: int, start: float, end: float) -> dict[str, object]:
    return {"rule": rule, "job_hash": job_hash, "starttime": start, "endtime": end}


def test_a_job_spans_its_outputs_first_start_to_last_end() -> None:
    jobs = job_times([
        ("experiments/a.tiny.s1/train.json", record("train", 1, 10.0, 50.0)),
        ("runs/a.pointer", record("train", 1, 10.5, 52.0)),
        ("experiments/a.tiny.s1/senteval.json", record("evaluate", 2, 52.0, 70.0)),
        ("data/senteval", record("download_senteval", 3, 0.0, 3.0)),
    ])  # fmt: skip
    assert [(j["rule"], j["seconds"]) for j in jobs] == [
        ("download_senteval", 3.0), ("train", 42.0), ("evaluate", 18.0)]  # fmt: skip
    assert jobs[1]["outputs"] == ["experiments/a.tiny.s1/train.json", "runs/a.pointer"]
    assert per_rule(jobs)["train"] == {"jobs": 1, "seconds": 42.0, "median_s": 42.0}


def test_train_and_evaluation_jobs_are_told_by_their_experiment_output() -> None:
    def job(*outputs: str) -> dict[str, object]:
        return {"outputs": list(outputs)}

    train = job("runs/x.pointer", "experiments/simcse.tiny-bert.s42/train.json")
    assert experiment_output(train) == ("simcse.tiny-bert.s42", "train")
    assert experiment_output(job("experiments/baseline.minilm-mean/mteb.json")) == (
        "baseline.minilm-mean", "mteb")  # fmt: skip
    assert experiment_output(job("data/senteval")) is None
    assert experiment_output(job("experiments/a/live/dvclive/metrics.json")) is None


def test_the_metadata_files_are_named_by_their_output_in_base64(tmp_path: Path) -> None:
    folder = tmp_path / ".snakemake" / "metadata"
    folder.mkdir(parents=True)
    output = "experiments/simcse.tiny-bert.s42/train.json"
    name = base64.urlsafe_b64encode(output.encode()).decode()
    (folder / name).write_text(json.dumps(record("train", 7, 1.0, 2.0)))
    assert read_metadata(tmp_path) == [(output, record("train", 7, 1.0, 2.0))]


@pytest.mark.parametrize("stage", ["train", "senteval", "mteb"])
def test_the_recorded_run_timed_every_stage_of_the_tiny_model(stage: str) -> None:
    """The record the estimates read has each stage's own timing and start-up per job."""
    result = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "smoke_time.json"
    recorded = json.loads(result.read_text())
    jobs = [j for j in recorded["jobs"] if j.get("stage") == stage]
    assert jobs and all(j["start_up_s"] >= 0 and j["self_timed"]["seconds"] > 0 for j in jobs)
    assert recorded["meta"]["load_average_before"] and recorded["load_average_during"]
