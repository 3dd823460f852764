"""Verified carry-over (``cse carry-over``): a stored run and its evaluations are kept under the
ids a code change gives them only when the current code reproduces the replayed steps' logged
values, the schedules' values over the whole log, and the sampled tasks' records and the
summary exactly; anything else is named and left to recompute. A carried run names its new id
in every file, and a killed carry-over leaves nothing any command takes for a run."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "faults"))

from fault_helpers import EXPERIMENT, killed, make_workspace, stage  # noqa: E402

import stages.core.identity.experiments as experiments  # noqa: E402
from stages.commands import carry_over  # noqa: E402
from stages.core.errors import StageError  # noqa: E402
from stages.core.identity.experiments import plan_experiments  # noqa: E402
from stages.core.planning.carry_over import (  # noqa: E402
    log_differences,
    run_candidates,
    schedule_differences,
    value_differences,
)
from stages.core.planning.status import status_rows  # noqa: E402
from stages.core.schema.evaluation_settings import (  # noqa: E402
    EVALUATIONS,
    SENTEVAL_TASKS,
    Evaluation,
    MtebParams,
    SentEvalParams,
    StsTsvParams,
)
from stages.core.schema.params import load_params  # noqa: E402
from stages.evaluations import CONTRACT, evaluation_module  # noqa: E402

# The tiny run's temperature cools down from 0.1 to its tau 0.05 at update 0.75 * 8 = 6: after
# the replayed updates (through the first dev evaluation, at 4).
COOL_DOWN = {"schedule": "tcc", "initial_tau": 0.1, "step_ratio": 0.75}
# One task of each of SentEval's code paths but SST2 (the slowest to encode), and one binary
# task before it that the sample does not need (MR: CR is the cheaper one).
SENTEVAL_TASKS_SCORED = ["STS12", "STS13", "STSBenchmark", "MR", "CR", "TREC", "MRPC"]


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


def test_the_schedules_are_compared_at_every_logged_step_of_the_whole_run() -> None:
    stored = [record(t, lr=0.1 / t, tau=0.1 if t < 120 else 0.05) for t in range(1, 201)]
    stored.insert(50, {"event": "eval", "step": 50, "spearman": 60.0})
    schedule = {t: {"lr": 0.1 / t, "tau": 0.1 if t <= 120 else 0.05} for t in range(1, 201)}
    assert schedule_differences(stored, schedule) == [
        "train step 120: tau 0.05 stored, 0.1 by the current code's schedule"
    ]
    assert schedule_differences(stored, {t: schedule[t] for t in range(1, 200)}) == [
        "train step 120: tau 0.05 stored, 0.1 by the current code's schedule",
        "train step 200: past the run's last update now",
    ]
    assert schedule_differences([record(1, lr=0.1)], {1: {"lr": 0.1, "tau": None}}) == [
        "train step 1: 'tau' is not in the stored log"
    ]


def test_records_are_compared_down_every_key_path_exactly() -> None:
    stored = {"tasks": {"TREC": {"devacc": 22.96, "acc": 20.0}}, "summary": {"sts_avg": 33.88}}
    assert value_differences(stored, json.loads(json.dumps(stored)), "rescored") == []
    now = {"tasks": {"TREC": {"devacc": 22.9641, "acc": 20.0}}, "extra": [1]}
    assert value_differences(stored, now, "rescored") == [
        "extra: only in the rescored record",
        "summary: only in the stored record",
        "tasks.TREC.devacc: 22.96 stored, 22.9641 rescored",
    ]
    assert value_differences({"l2": [1e-5, 1e-4]}, {"l2": [1e-5]}, "rescored") == [
        "l2: 2 items stored, 1 rescored"
    ]
    assert value_differences({"n": 5}, {"n": 5.0}, "recomputed") == ["n: 5 stored, 5.0 recomputed"]


def test_the_samples_reach_every_code_path_of_each_evaluation() -> None:
    senteval = evaluation_module("senteval").sample(SentEvalParams(tasks=SENTEVAL_TASKS))
    assert senteval == ("STS12", "STSBenchmark", "CR", "SST2", "TREC", "MRPC")
    mine = SentEvalParams(tasks=("SICKRelatedness", "STS16", "MPQA", "MR"))
    assert evaluation_module("senteval").sample(mine) == ("SICKRelatedness", "STS16", "MPQA")
    mteb = evaluation_module("mteb")
    assert mteb.sample(MtebParams(tasks="sts")) == ("STS12",)
    categories = mteb.sample(MtebParams(tasks="simace56"))
    assert categories[:5] == (  # each category's first, in the set's order
        "AmazonCounterfactualClassification",
        "ArxivClusteringP2P",
        "SprintDuplicateQuestions",
        "AskUbuntuDupQuestions",
        "ArguAna",
    )
    assert categories[5:] == ("SICK-R", "SummEval")  # STS: its first task with a local copy
    files = StsTsvParams(files={"a": "a.tsv", "b": "b.tsv"})
    assert evaluation_module("sts_tsv").sample(files) == ("a",)


def test_mteb_and_tsv_records_compare_their_scores_and_recompute_their_means() -> None:
    def task(score: float, category: str, wall_s: float) -> dict[str, Any]:
        return {"main_score": score, "metric": "cosine_spearman", "category": category,
                "data": "local:senteval", "from_cache": False, "wall_s": wall_s}  # fmt: skip

    mteb = evaluation_module("mteb")
    stored = {
        "requested": ["STS12", "SICK-R", "Banking77Classification"],
        "evaluated": ["STS12", "SICK-R"],
        "skipped": {"Banking77Classification": "offline"},
        "tasks": {"STS12": task(61.25, "STS", 3.0), "SICK-R": task(70.5, "STS", 4.0)},
        "average": 65.875,
        "categories": {"STS": {"mean": 65.875, "tasks": 2, "requested": 2}},
        "complete": False,
        "data": {"hub_offline": True, "local_source": "senteval"},
        "timing": {"wall_s": 7.0},
    }
    assert mteb.recomputed_summary(stored) == {
        "average": 65.875,
        "categories": {"STS": {"mean": 65.875, "tasks": 2, "requested": 2}},
        "complete": False,
    }
    rescored = {**stored, "requested": ["STS12"], "evaluated": ["STS12"], "skipped": {},
                "tasks": {"STS12": task(61.25, "STS", 9.0)}, "average": 61.25,
                "data": {"hub_offline": False, "local_source": "senteval"}}  # fmt: skip
    assert mteb.comparable(stored, ("STS12",)) == mteb.comparable(rescored, ("STS12",))
    rescored["tasks"]["STS12"]["main_score"] = 61.26
    assert value_differences(
        mteb.comparable(stored, ("STS12",)), mteb.comparable(rescored, ("STS12",)), "rescored"
    ) == ["tasks.STS12.main_score: 61.25 stored, 61.26 rescored"]

    tsv = evaluation_module("sts_tsv")
    scored = {"spearman": 70.0, "pearson": 68.0, "file": "a.tsv", "sha256": "0" * 64}
    record = {"tasks": {"a": scored, "b": scored}, "scores": {"a": {"spearman": 70.0}}}
    assert tsv.recomputed_summary(record) == {
        "scores": {name: {"spearman": 70.0, "pearson": 68.0} for name in ("a", "b")}
    }
    assert tsv.comparable(record, ("a",)) == {"tasks": {"a": scored}, "encoder": {}}


def test_every_registered_evaluation_keeps_the_contract_and_a_gap_is_named_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in EVALUATIONS:
        evaluation_module(name)
    lacking = types.ModuleType("lacking_evaluation")
    for function in CONTRACT:
        if function not in ("comparable", "recomputed_summary"):
            setattr(lacking, function, lambda *args: None)
    monkeypatch.setitem(sys.modules, "lacking_evaluation", lacking)
    monkeypatch.setitem(
        EVALUATIONS, "lacking", Evaluation(StsTsvParams, "lacking_evaluation", "a test")
    )
    with pytest.raises(StageError) as refused:
        evaluation_module("lacking")
    assert str(refused.value).startswith(
        "evaluation 'lacking': lacking_evaluation lacks comparable, recomputed_summary"
    )
    assert "\n" not in str(refused.value)


@pytest.fixture(scope="module")
def built(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny workspace whose run (with a temperature cool-down) is trained and scored with
    SentEval by the stages themselves, once for the module."""
    from stages import evaluate, train

    root = make_workspace(tmp_path_factory.mktemp("carry") / "ws", shared_data, senteval=True)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["methods"]["simcse"]["temperature"] = COOL_DOWN
    params["evaluations"]["senteval"]["tasks"] = SENTEVAL_TASKS_SCORED
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    here = Path.cwd()
    os.chdir(root)
    try:
        train.main([EXPERIMENT])
        evaluate.main(["senteval", "--experiment", EXPERIMENT])
    finally:
        os.chdir(here)
    return root


@pytest.fixture
def trained(built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of the built workspace, as cwd."""
    root = tmp_path / "ws"
    shutil.copytree(built, root)
    monkeypatch.chdir(root)
    yield root


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


def planned_run():
    return plan_experiments(load_params("params.yaml")).runs[EXPERIMENT]


def test_a_change_that_computes_the_same_numbers_is_carried_over(
    trained: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    old = planned_run()
    stored_result = json.loads(Path(f"experiments/{EXPERIMENT}/senteval.json").read_text())
    change_the_code(monkeypatch, "moved")
    run = planned_run()
    assert run.run_id != old.run_id and run_candidates(run) == [old.run_dir]
    assert status()["run stored"] == "-"

    carry_over.main([])
    out = capsys.readouterr().out
    assert f"run {run.run_id}: carried over from {old.run_id} (4 steps replayed)" in out
    rescored = "(STS12, STSBenchmark, CR, TREC, MRPC rescored)"
    assert "senteval: carried over from senteval-" in out and rescored in out, out
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


def test_a_carried_run_names_its_new_id_and_later_evaluations_record_it(
    trained: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    old = planned_run()
    before = {p: p.read_bytes() for p in old.run_dir.rglob("*") if p.is_file()}
    change_the_code(monkeypatch, "moved")
    run = planned_run()
    carry_over.main([])
    assert f"carried over from {old.run_id}" in capsys.readouterr().out

    def names_the_old_run(path: Path) -> bool:  # provenance aside (carried_over.from)
        text = path.read_bytes()
        if path.name in ("config.json", "run.json"):
            text = json.dumps({**json.loads(text), "carried_over": None}).encode()
        return old.run_id.encode() in text

    files = [p for p in run.run_dir.rglob("*") if p.is_file()]
    assert [str(p.relative_to(run.run_dir)) for p in files if names_the_old_run(p)] == []
    assert json.loads((run.run_dir / "best/run.json").read_text())["carried_over"]["from"] == (
        old.run_id
    )
    for name in ("best/encoder.json", "final/run.json", "best/README.md", "metrics.json"):
        assert run.run_id in (run.run_dir / name).read_text()
        assert (run.run_dir / name).stat().st_ino != (old.run_dir / name).stat().st_ino
    assert {p: p.read_bytes() for p in old.run_dir.rglob("*") if p.is_file()} == before

    # an evaluation the carried run did not have yet: computed, and recorded against it
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["evaluations"]["senteval"]["tasks"] = ["STSBenchmark"]
    Path("params.yaml").write_text(yaml.safe_dump(params))
    from stages import evaluate

    evaluate.main(["senteval", "--experiment", EXPERIMENT])
    result = json.loads(Path(f"experiments/{EXPERIMENT}/senteval.json").read_text())
    assert result["encoder"]["run_id"] == run.run_id
    assert status()["senteval"] == "yes"


def test_a_schedule_changed_after_the_replayed_steps_is_named_and_not_carried_over(
    trained: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from stages.objectives import temperature
    from stages.training import loop, replay

    def cools_one_step_later(schedule, step, total_steps, tau):  # `>=` edited to `>`
        if step > schedule.step_ratio * total_steps:
            return tau
        return schedule.initial_tau

    change_the_code(monkeypatch, "changed")
    for module in (temperature, loop, replay):
        monkeypatch.setattr(module, "tau_at", cools_one_step_later)
    run = planned_run()
    carry_over.main([EXPERIMENT])
    out = capsys.readouterr().out
    assert (
        f"run {run.run_id}: not carried over: {next(iter(run_candidates(run))).name}: train "
        "step 6: tau 0.05 stored, 0.1 by the current code's schedule\n"
    ) in out
    assert "senteval: its run is not stored" in out
    assert not run.run_dir.exists() and status()["run stored"] == "-"


def test_an_unrounded_table_average_is_named_and_not_carried_over(
    trained: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from stages.senteval_protocol import protocol

    stored = json.loads(Path(f"experiments/{EXPERIMENT}/senteval.json").read_text())
    change_the_code(monkeypatch, "changed")
    monkeypatch.setattr(protocol, "table_average", lambda scores: float(np.mean(list(scores))))
    carry_over.main([EXPERIMENT])
    out = capsys.readouterr().out
    assert "carried over from" in out.splitlines()[0]  # the run: training is unchanged
    unrounded = float(np.mean(list(stored["summary"]["sts"].values())))
    assert (
        f"senteval: not carried over: senteval-{stored['evaluation_id']}: summary.sts_avg: "
        f"{stored['summary']['sts_avg']!r} stored, {unrounded!r} recomputed"
    ) in out
    assert status()["senteval"].startswith("stale: run ")  # not "stored"


def test_a_changed_k_fold_is_named_and_not_carried_over(
    trained: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from stages.senteval_protocol import transfer

    kfold = transfer.validation.kfold

    def one_more_fold(x, y, x_test, y_test, nclasses, settings):  # TREC's and MRPC's path
        more = dataclasses.replace(settings, kfold=settings.kfold + 1)
        return kfold(x, y, x_test, y_test, nclasses, more)

    change_the_code(monkeypatch, "changed")
    monkeypatch.setattr(transfer.validation, "kfold", one_more_fold)
    carry_over.main([EXPERIMENT])
    out = capsys.readouterr().out
    assert "senteval: not carried over: senteval-" in out and ": tasks.TREC." in out, out
    assert status()["senteval"].startswith("stale: run ")  # not "stored"


def test_the_dry_run_says_what_it_would_verify_and_writes_nothing(
    trained: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    change_the_code(monkeypatch, "moved")
    run = planned_run()
    carry_over.main(["--dry-run"])
    assert "would replay 4 steps against" in capsys.readouterr().out
    assert not run.run_dir.exists()


def made_by_other_code(root: Path) -> tuple[str, str]:
    """The workspace's run as the same settings trained by other code would have stored it
    (another code identity, so another id), for the carry-over run as a process to find; its
    evaluations dropped. Returns (that run's id, the planned run's id)."""
    planned = plan_experiments(load_params(root / "params.yaml")).runs[EXPERIMENT]
    other = "0" * 16
    folder = root / "runs" / other
    planned.run_dir.rename(folder)
    shutil.rmtree(root / "runs" / "evaluations")
    config = json.loads((folder / "config.json").read_text())
    config["run_id"] = other
    config["identity"]["code"] = {"stages/other.py": "other"}
    (folder / "config.json").write_text(json.dumps(config))
    return other, planned.run_id


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "runs").iterdir() if p.name.startswith("."))


@pytest.mark.faults
@pytest.mark.parametrize(
    ("target", "n"),
    [("os:link", 3), ("stages.core.planning.carry_over:rename_durably", 1)],
    ids=["while-linking", "before-the-final-rename"],
)
def test_a_killed_carry_over_leaves_nothing_taken_for_a_run(
    trained: Path,
    target: str,
    n: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    other, planned = made_by_other_code(trained)
    killed(trained, target, n, "before", "stages.commands.carry_over", EXPERIMENT)
    assert not (trained / "runs" / planned).exists()
    assert status()["run stored"] == "-"
    assert run_candidates(planned_run()) == [Path("runs") / other]

    from stages.commands import store

    monkeypatch.setenv("CSE_STORE_URL", str(tmp_path / "store"))
    store.main(["push"])
    assert capsys.readouterr().out == f"published {other} ({EXPERIMENT})\n"

    again = stage(trained, "stages.commands", "carry-over", EXPERIMENT)
    assert f"run {planned}: carried over from {other}" in again.stdout, again.stderr
    assert leftovers(trained) == []  # the dead carry-over's staging is removed
    assert status()["run stored"] == f"yes (carried over from {other})"
