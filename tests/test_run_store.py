"""The runs store as status sees it: complete runs, broken ones, runs made before code identity
(listed as 'code unknown', reused only through `adopt`), and the environment warning; stored
evaluations and the folders they wrote beside their results."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from stages.core.errors import StageError
from stages.core.identity.experiments import plan_experiments
from stages.core.planning.evaluation_store import reuse_evaluation, store_evaluation
from stages.core.planning.status import adopt_legacy_run, status_rows
from stages.core.schema.params import load_params
from stages.core.storage import layout
from stages.core.storage.run_folders import RUN_FILES, environment_summary
from stages.reporting.tables import environment_warning

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "simcse.bert-base.s42"


def write_run(folder: Path, identity: dict) -> None:
    for name in RUN_FILES:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("{}")
    (folder / "config.json").write_text(
        json.dumps({"identity": identity, "execution": {"torch": "2.4.0", "device": "cuda"}})
    )


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(layout, "RUNS", tmp_path / "runs")
    (tmp_path / "runs").mkdir()
    return tmp_path / "runs"


def rows_by_name(params) -> dict[str, dict[str, str]]:
    return {row["experiment"]: row for row in status_rows(plan_experiments(params))}


def test_a_run_made_before_code_identity_is_listed_and_adopted_only_on_request(store: Path):
    params = load_params(REPO / "params.yaml")
    run = plan_experiments(params).runs[EXPERIMENT]
    old = {k: v for k, v in run.identity.items() if k not in ("code", "environment")}
    write_run(store / "0123456789abcdef", {**old, "id_schema": 1})
    row = rows_by_name(params)[EXPERIMENT]
    assert row["run stored"].startswith("- (old run 0123456789abcdef, code unknown")
    assert f"adopt {EXPERIMENT}" in row["run stored"]

    message = adopt_legacy_run(plan_experiments(params), EXPERIMENT)
    assert "0123456789abcdef" in message and run.run_id in message
    assert rows_by_name(params)[EXPERIMENT]["run stored"] == "yes (adopted, code unknown)"
    assert (store / "0123456789abcdef" / "config.json").is_file()  # nothing deleted
    legacy = json.loads((store / "0123456789abcdef" / "config.json").read_text())
    assert "adopted_from" not in legacy  # the hard-linked config was replaced, not edited


def test_a_run_with_other_settings_is_not_offered(store: Path):
    params = load_params(REPO / "params.yaml")
    run = plan_experiments(params).runs[EXPERIMENT]
    old = {k: v for k, v in run.identity.items() if k not in ("code", "environment")}
    write_run(store / "0123456789abcdef", {**old, "seed": 7})
    assert rows_by_name(params)[EXPERIMENT]["run stored"] == "-"
    with pytest.raises(StageError, match="no run made before code identity matches"):
        adopt_legacy_run(plan_experiments(params), EXPERIMENT)


def test_an_incomplete_run_folder_is_reported_broken(store: Path):
    params = load_params(REPO / "params.yaml")
    run = plan_experiments(params).runs[EXPERIMENT]
    write_run(run.run_dir, run.identity)
    (run.run_dir / "final" / "model.safetensors").unlink()
    state = rows_by_name(params)[EXPERIMENT]["run stored"]
    assert state == "broken (missing final/model.safetensors)"


def test_a_stored_evaluation_writes_the_folders_beside_its_results_again(
    store: Path, tmp_path: Path
) -> None:
    plan = plan_experiments(load_params(REPO / "params.yaml"))
    experiment = plan.experiment(EXPERIMENT)
    output = tmp_path / "experiments" / EXPERIMENT / "mteb.json"
    native = output.parent / "mteb_results"
    (native / "results" / "m").mkdir(parents=True)
    (native / "results" / "m" / "STS12.json").write_text("12")
    assert not reuse_evaluation(plan, "mteb", experiment, output, [native])  # nothing stored
    store_evaluation(plan, "mteb", experiment, {"average": 1.0}, [native])

    (native / "results" / "m" / "STS12.json").write_text("changed")
    (native / "results" / "other").mkdir()
    (native / "results" / "other" / "STS12.json").write_text("another model's")
    assert reuse_evaluation(plan, "mteb", experiment, output, [native])
    assert (native / "results" / "m" / "STS12.json").read_text() == "12"
    assert (native / "results" / "other" / "STS12.json").read_text() == "another model's"
    assert json.loads(output.read_text())["average"] == 1.0
    # a stored result without the folder asked for is not reused: computed again, it is stored
    assert not reuse_evaluation(plan, "mteb", experiment, output, [output.parent / "absent"])


def test_the_report_warns_when_runs_differ_in_environment():
    same = pl.DataFrame({"environment": ["torch 2.13.0, cpu fp32"] * 2})
    assert environment_warning(same) is None
    mixed = pl.DataFrame({"environment": ["torch 2.13.0, cpu fp32", "torch 2.4.0, cuda bf16"]})
    assert "different environments" in environment_warning(mixed)


def test_status_shows_the_forward_a_run_resolved_to():
    """``compile: auto`` resolves per device: status's environment column says what ran."""
    execution = {"torch": "2.13.0", "transformers": "4.57.1", "device": "cuda:0",
                 "precision": "bf16", "unpadded": True, "compile": "reduce-overhead"}  # fmt: skip
    assert environment_summary({"execution": execution}) == (
        "torch 2.13.0, transformers 4.57.1, cuda:0 bf16, unpadded CUDA graphs"
    )
    execution.update(device="cpu", precision="fp32", unpadded=False, compile=False)
    assert environment_summary({"execution": execution}).endswith("cpu fp32, padded eager")
    del execution["unpadded"], execution["compile"]  # recorded before either was
    assert environment_summary({"execution": execution}).endswith(", cpu fp32")


def test_status_tells_current_outputs_from_stale_ones(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output under experiments/ counts as done only if it is the one the params plan now:
    training for the planned run id, an evaluation for the planned evaluation id."""
    monkeypatch.chdir(tmp_path)
    params = load_params(REPO / "params.yaml")
    plan = plan_experiments(params)
    runs = plan.runs
    folder = layout.experiment_dir(EXPERIMENT)
    folder.mkdir(parents=True)
    (folder / "train.json").write_text(json.dumps({"run_id": runs[EXPERIMENT].run_id}))
    record = {"tasks": {}, "encoder": {"run_id": runs[EXPERIMENT].run_id}}
    stored = store_evaluation(plan, "senteval", runs[EXPERIMENT], record)
    (folder / "senteval.json").write_text(json.dumps(stored))
    row = rows_by_name(params)[EXPERIMENT]
    assert (row["train"], row["senteval"], row["mteb"]) == ("yes", "yes", "-")

    senteval = params.evaluations.senteval.model_copy(update={"mode": "fasttest"})
    changed = load_params(REPO / "params.yaml").model_copy(
        update={"evaluations": params.evaluations.model_copy(update={"senteval": senteval})}
    )
    row = rows_by_name(changed)[EXPERIMENT]
    assert row["train"] == "yes"
    assert row["senteval"].startswith(f"stale: evaluation {stored['evaluation_id']}, planned ")
    (folder / "train.json").write_text(json.dumps({"run_id": "0123456789abcdef"}))
    assert rows_by_name(params)[EXPERIMENT]["train"] == (
        f"stale: run 0123456789abcdef, planned {runs[EXPERIMENT].run_id}"
    )
