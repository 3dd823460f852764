"""Verified carry-over (``cse carry-over``): a stored run and its evaluations are kept under the
ids a code change gives them only when the current code reproduces the replayed steps' logged
values and the sampled tasks' scores exactly; anything else is named and left to recompute."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "faults"))

from fault_helpers import EXPERIMENT, make_workspace  # noqa: E402

import stages.core.identity.experiments as experiments  # noqa: E402
from stages.commands import carry_over  # noqa: E402
from stages.core.identity.experiments import plan_experiments  # noqa: E402
from stages.core.planning.carry_over import (  # noqa: E402
    log_differences,
    run_candidates,
    task_differences,
)
from stages.core.planning.status import status_rows  # noqa: E402
from stages.core.schema.params import load_params  # noqa: E402


def record(step: int, **values: Any) -> dict[str, Any]:
    return {"event": "train", "step": step, "loss": 1.5, "grad_norm": 2.0, **values}


def test_identical_logs_have_no_difference_and_timings_are_not_compared() -> None:
    stored = [record(1), record(2), {"event": "eval", "step": 2, "spearman": 70.1, "eval_s": 0.4}]
    replayed = [record(1), record(2), {"event": "eval", "step": 2, "spearman": 70.1, "eval_s": 9}]
    assert log_differences(stored, replayed, 2) == []


def test_a_last_bit_names_the_step_and_the_value() -> None:
    nudged = math.nextafter(1.5, 2.0)
    (difference,) = log_differences([record(1)], [record(1, loss=nudged)], 1)
    assert difference == f"train step 1: loss 1.5 stored, {nudged!r} replayed"


def test_only_the_replayed_steps_count_and_resumes_are_no_record() -> None:
    stored = [record(1), {"event": "resume", "step": 1}, record(2), record(3, loss=9.0)]
    assert log_differences(stored, [record(1), record(2)], 2) == []


def test_nan_equals_nan_but_a_value_never_equals_another_type_or_a_missing_key() -> None:
    assert log_differences([record(1, tau=math.nan)], [record(1, tau=math.nan)], 1) == []
    assert log_differences([record(1, tau=0.05)], [record(1, tau=None)], 1) != []
    assert log_differences([record(1, stat=1.0)], [record(1)], 1) == [
        "train step 1: 'stat' is in one log only"
    ]
    assert log_differences([record(1), record(2)], [record(1)], 2)[0].startswith(
        "the logs record other steps"
    )


def test_task_differences_compare_the_sampled_tasks_exactly() -> None:
    stored = {"STS12": {"all": {"spearman": 61.25}}, "MR": {"acc": 70.0}}
    assert task_differences(stored, {"STS12": {"all": {"spearman": 61.25}}}) == []
    assert task_differences(stored, {"STS12": {"all": {"spearman": 61.26}}}) != []
    assert task_differences(stored, {"CR": {"acc": 63.76}}) == ["CR: not in the stored result"]


@pytest.fixture
def trained(shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny workspace whose run is trained and scored on STS-B by the stages themselves."""
    from stages import evaluate, train

    root = make_workspace(tmp_path, shared_data, senteval=True)
    monkeypatch.chdir(root)
    train.main([EXPERIMENT])
    evaluate.main(["senteval", "--experiment", EXPERIMENT])
    return root


def change_the_code(monkeypatch: pytest.MonkeyPatch, label: str) -> None:
    """What any edit of the code that trains and evaluates does to the ids: a fingerprint in
    every code identity changes (here a module that moved)."""
    real = experiments.code_identity

    def moved(modules) -> dict[str, str]:
        return {**real(modules), f"stages/{label}.py": label}

    monkeypatch.setattr(experiments, "code_identity", moved)


def status(name: str = EXPERIMENT) -> dict[str, str]:
    rows = status_rows(plan_experiments(load_params("params.yaml")))
    return next(row for row in rows if row["experiment"] == name)


def test_a_change_that_computes_the_same_numbers_is_carried_over(
    trained: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    old = plan_experiments(load_params("params.yaml")).runs[EXPERIMENT]
    stored_result = json.loads(Path(f"experiments/{EXPERIMENT}/senteval.json").read_text())
    change_the_code(monkeypatch, "moved")
    run = plan_experiments(load_params("params.yaml")).runs[EXPERIMENT]
    assert run.run_id != old.run_id and run_candidates(run) == [old.run_dir]
    assert status()["run stored"] == "-"

    carry_over.main([])
    out = capsys.readouterr().out
    assert f"run {run.run_id}: carried over from {old.run_id} (4 steps replayed)" in out
    assert "senteval: carried over from senteval-" in out and "(STSBenchmark rescored)" in out
    row = status()
    assert row["run stored"] == f"yes (carried over from {old.run_id})"
    assert row["senteval"] == "stored"  # written by the stage when it next runs, not computed
    config = json.loads((run.run_dir / "config.json").read_text())
    assert config["run_id"] == run.run_id and config["carried_over"]["steps_replayed"] == 4
    assert (old.run_dir / "config.json").is_file()  # the old run is kept
    best = run.run_dir / "best" / "model.safetensors"
    assert best.stat().st_ino == (old.run_dir / "best" / "model.safetensors").stat().st_ino

    from stages import evaluate

    evaluate.main(["senteval", "--experiment", EXPERIMENT])
    assert "the stored result of the same evaluation" in capsys.readouterr().out
    result = json.loads(Path(f"experiments/{EXPERIMENT}/senteval.json").read_text())
    assert result["tasks"] == stored_result["tasks"]
    assert result["encoder"]["run_id"] == run.run_id
    assert status()["senteval"] == "yes"

    carry_over.main([])  # asked again: nothing left to verify
    assert f"run {run.run_id}: stored" in capsys.readouterr().out


def test_a_change_of_what_is_computed_is_named_and_not_carried_over(
    trained: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from stages.objectives.infonce import InfoNCE

    change_the_code(monkeypatch, "changed")
    compute = InfoNCE.compute

    def scaled(self, *args, **kwargs):  # the kind of edit a refactor must not make
        out = compute(self, *args, **kwargs)
        return type(out)(out.loss * (1 + 1e-6), out.stats)

    monkeypatch.setattr(InfoNCE, "compute", scaled)
    run = plan_experiments(load_params("params.yaml")).runs[EXPERIMENT]
    carry_over.main([EXPERIMENT])
    out = capsys.readouterr().out
    assert f"run {run.run_id}: not carried over: " in out and ": train step 1: " in out
    assert "senteval: its run is not stored" in out
    assert not run.run_dir.exists() and status()["run stored"] == "-"


def test_the_dry_run_says_what_it_would_verify_and_writes_nothing(
    trained: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    change_the_code(monkeypatch, "moved")
    run = plan_experiments(load_params("params.yaml")).runs[EXPERIMENT]
    carry_over.main(["--dry-run"])
    assert "would replay 4 steps against" in capsys.readouterr().out
    assert not run.run_dir.exists()
