"""Live metrics: a tiny training run streams its steps and dev evaluations to DVCLive (which
`dvc plots show` renders in a git + DVC repository) and, when asked, to TensorBoard; a resumed
log replays into fresh loggers; the loggers never change a run's id."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from train_helpers import make_job

from stages.core.identity.experiments import plan_experiments
from stages.core.schema.params import load_params
from stages.core.storage.run_folders import read_log
from stages.training.live import RunLog, open_run_log
from stages.training.loop import train
from stages.training.records import JsonlLog

REPO = Path(__file__).resolve().parents[2]
DVC = [sys.executable, "-m", "dvc"]


def tsv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f, delimiter="\t"))


@pytest.fixture(scope="module")
def project(corpus, token_cache, dev_evaluator, tmp_path_factory) -> Path:
    """A git + DVC repository whose experiments/tiny/live holds a tiny run's live metrics."""
    root = tmp_path_factory.mktemp("project")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*DVC, "init", "-q"], cwd=root, check=True)
    job = make_job(corpus, root / "run", token_cache, loggers=("dvclive", "tensorboard"))
    job = type(job)(**{**job.__dict__, "live_dir": root / "experiments" / "tiny" / "live"})
    train(job, dev_evaluator)
    return root


def test_dvclive_gets_every_step_and_evaluation(project: Path) -> None:
    metrics = project / "experiments" / "tiny" / "live" / "dvclive" / "plots" / "metrics"
    loss = tsv(metrics / "train" / "loss.tsv")
    assert [int(r["step"]) for r in loss] == list(range(1, 16))
    log = [r for r in read_log(project / "run" / "log.jsonl") if r["event"] == "train"]
    assert [float(r["loss"]) for r in loss] == pytest.approx([r["loss"] for r in log])
    for name in ("tau", "lr", "grad_norm"):
        assert len(tsv(metrics / "train" / f"{name}.tsv")) == 15
    assert [int(r["step"]) for r in tsv(metrics / "dev" / "spearman.tsv")] == [5, 10, 15]


def test_dvc_plots_show_renders_the_live_metrics(project: Path) -> None:
    shown = subprocess.run(
        [*DVC, "plots", "show", "--json"], cwd=project, capture_output=True, text=True, check=True
    )
    rendered = json.dumps(json.loads(shown.stdout))
    assert "train/loss" in rendered and "dev/spearman" in rendered
    metrics = subprocess.run(
        [*DVC, "metrics", "show", "--json"], cwd=project, capture_output=True, text=True, check=True
    )
    assert "spearman" in metrics.stdout


def test_tensorboard_event_file_when_asked(project: Path) -> None:
    folder = project / "experiments" / "tiny" / "live" / "tensorboard"
    assert list(folder.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(folder))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 16))
    assert [e.step for e in events.Scalars("dev/spearman")] == [5, 10, 15]


def test_resume_replays_the_kept_log_into_fresh_loggers(tmp_path: Path) -> None:
    path, live = tmp_path / "log.jsonl", tmp_path / "live"
    log = open_run_log(path, 0, ("dvclive",), live, "x")
    log.write([{"event": "train", "step": s, "loss": float(s)} for s in (1, 2)])
    kept = log.offset
    log.write([{"event": "train", "step": 3, "loss": 3.0}])  # lost with the crash
    log.close()
    log = open_run_log(path, kept, ("dvclive",), live, "x")
    log.write([{"event": "train", "step": 3, "loss": 30.0}])
    log.close()
    rows = tsv(live / "dvclive" / "plots" / "metrics" / "train" / "loss.tsv")
    assert [(r["step"], float(r["loss"])) for r in rows] == [("1", 1.0), ("2", 2.0), ("3", 30.0)]


def test_no_live_folder_means_no_loggers(tmp_path: Path) -> None:
    log = open_run_log(tmp_path / "log.jsonl", 0, ("dvclive",), None, "x")
    assert log.loggers == [] and isinstance(log.jsonl, JsonlLog)
    log.close()


def test_wandb_is_skipped_with_a_warning_when_absent(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.warns(UserWarning, match="wandb is not installed"):
        log = open_run_log(tmp_path / "log.jsonl", 0, ("wandb",), tmp_path / "live", "x")
    assert log.loggers == []
    log.close()


def test_loggers_are_not_part_of_the_run_id(tmp_path: Path) -> None:
    tree = yaml.safe_load((REPO / "params.yaml").read_text())
    tree.setdefault("train", {})["loggers"] = ["tensorboard", "wandb"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(tree))
    default = {
        n: r.run_id for n, r in plan_experiments(load_params(REPO / "params.yaml")).runs.items()
    }
    assert {n: r.run_id for n, r in plan_experiments(load_params(path)).runs.items()} == default
    assert shutil.which("git")


class Broken:
    def log(self, step: int, scalars: dict[str, float]) -> None:
        raise OSError("disk full")

    def close(self) -> None:
        raise OSError("disk full")


def test_a_failing_logger_is_dropped_and_the_log_goes_on(tmp_path: Path) -> None:
    log = RunLog(JsonlLog(tmp_path / "log.jsonl"), [Broken()])
    with pytest.warns(UserWarning, match="Broken failed and stops: disk full"):
        log.write([{"event": "train", "step": 1, "loss": 1.0}])
    log.write([{"event": "train", "step": 2, "loss": 2.0}])
    log.close()
    assert log.loggers == [] and len(read_log(tmp_path / "log.jsonl")) == 2


def test_a_logger_that_cannot_start_is_skipped(tmp_path: Path, monkeypatch) -> None:
    """dvclive raises in a git repository without commits (a fresh clone of a template)."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*DVC, "init", "-q"], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log = open_run_log(
            tmp_path / "log.jsonl", 0, ("dvclive", "tensorboard"), tmp_path / "live", "x"
        )
    log.write([{"event": "train", "step": 1, "loss": 1.0}])
    log.close()
    kinds = {type(logger).__name__ for logger in log.loggers}
    assert "TensorBoardLogger" in kinds
    if "DvcLiveLogger" not in kinds:  # this dvclive cannot start here: it says so
        assert any("dvclive could not start" in str(w.message) for w in caught)
