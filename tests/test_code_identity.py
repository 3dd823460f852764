"""Code identity: what a source file's fingerprint ignores and what it sees, and which files
each output's id covers (docs/identity.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stages.core.identity import code as code_identity
from stages.core.identity.code import code_files, source_fingerprint
from stages.core.identity.experiments import REPORT_CODE, plan_experiments
from stages.core.schema.evaluation_settings import EVALUATIONS
from stages.core.schema.params import load_params

REPO = Path(__file__).resolve().parents[1]
SIMACE = REPO / "stages" / "objectives" / "simace.py"


def edited_copy(tmp_path: Path, edit) -> Path:
    copy = tmp_path / "simace.py"
    shutil.copy(SIMACE, copy)
    copy.write_text(edit(copy.read_text()))
    return copy


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.replace("from __future__", "# a new comment\nfrom __future__", 1),
        lambda s: s.replace('"""InfoNCE on the angular', '"""Reworded. InfoNCE on the angular', 1),
        lambda s: s.replace("\n\n\n", "\n\n\n\n", 1),  # formatting
    ],
    ids=["comment", "docstring", "blank line"],
)
def test_comments_docstrings_and_formatting_leave_the_fingerprint(tmp_path: Path, edit) -> None:
    assert source_fingerprint(edited_copy(tmp_path, edit)) == source_fingerprint(SIMACE)


def test_a_change_to_the_arithmetic_changes_the_fingerprint(tmp_path: Path) -> None:
    flipped = edited_copy(tmp_path, lambda s: s.replace("(s - margin *", "(s + margin *", 1))
    assert flipped.read_text() != SIMACE.read_text()
    assert source_fingerprint(flipped) != source_fingerprint(SIMACE)


def test_a_run_covers_its_own_loss_and_no_other() -> None:
    runs = plan_experiments(load_params(REPO / "presets" / "smoke.yaml")).runs
    simace = set(runs["simace.tiny-bert.s42"].code_files)
    simcse = set(runs["simcse.tiny-bert.s42"].code_files)
    assert "stages/objectives/simace.py" in simace
    assert "stages/objectives/simace.py" not in simcse
    assert "stages/objectives/unified_gradient.py" not in simace | simcse
    # the training machinery and checkpoint selection are in every run
    assert {"stages/training/loop.py", "stages/senteval_protocol/stsb_dev.py"} <= simace & simcse
    assert not any(f.startswith("stages/core/") for f in simace)


def test_a_packages_data_files_are_code_of_its_modules(tmp_path: Path) -> None:
    """The published numbers the report joins are in its code; no run's."""
    runs = plan_experiments(load_params(REPO / "presets" / "smoke.yaml")).runs
    assert "stages/reference/published.csv" in code_files(REPORT_CODE)
    assert not any(f.endswith(".csv") for run in runs.values() for f in run.code_files)
    table = tmp_path / "table.csv"
    table.write_text("a,b\n1,2\n")
    before = source_fingerprint(table)
    table.write_text("a,b\n1,3\n")
    assert source_fingerprint(table) != before


def test_a_packages_documentation_and_hidden_files_are_not_its_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "stages" / "tables"
    package.mkdir(parents=True)
    for name in ("__init__.py", "scores.csv", "words.txt", "README.md", ".scores.csv.swp"):
        (package / name).write_text("x")
    (package / "__pycache__").mkdir()
    monkeypatch.setattr(code_identity, "SOURCE_ROOT", tmp_path)
    found = sorted(p.name for p in code_identity.package_data_files("stages.tables"))
    assert found == ["scores.csv", "words.txt"]


def test_the_senteval_protocol_is_evaluation_code_not_training_code() -> None:
    train = set(
        plan_experiments(load_params(REPO / "presets" / "smoke.yaml"))
        .runs["simcse.tiny-bert.s42"]
        .code_files
    )
    senteval = set(code_files(EVALUATIONS["senteval"].code_modules))
    protocol = "stages/senteval_protocol"
    evaluation_only = {f"{protocol}/{m}.py" for m in ("classifier", "protocol", "transfer")}
    assert evaluation_only <= senteval and not evaluation_only & train


def test_imports_inside_functions_are_followed() -> None:
    # stages.train imports the training machinery only when there is a run to train
    assert "stages.training.run_folder" in code_identity.import_closure(["stages.train"])


def test_the_environment_switch_puts_torch_and_transformers_versions_in_every_id() -> None:
    import yaml

    from stages.core.identity.environment import major_minor, software
    from stages.core.schema.params import parse_params

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    recorded = plan_experiments(parse_params(raw)).runs
    strict = plan_experiments(
        parse_params({**raw, "identity": {"environment": "major_minor"}})
    ).runs
    assert all(recorded[n].run_id != strict[n].run_id for n in recorded)
    expected = {p: major_minor(software()[p]) for p in ("torch", "transformers")}
    assert all(run.identity["environment"] == expected for run in strict.values())
    assert expected["torch"] == "2.13" and all(
        r.identity["environment"] is None for r in recorded.values()
    )


def test_mteb_task_sets_are_code_of_the_mteb_evaluation_only() -> None:
    """Which tasks a named set runs decides an MTEB result: editing the list re-evaluates."""
    mteb = set(code_files(EVALUATIONS["mteb"].code_modules))
    senteval = set(code_files(EVALUATIONS["senteval"].code_modules))
    train = set(code_files(["stages.train"]))
    assert "stages/core/schema/mteb_task_sets.py" in mteb
    assert "stages/core/schema/mteb_task_sets.py" not in senteval | train


def test_what_the_core_derives_from_an_objectives_settings_is_in_its_runs_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The core is outside code identity, so its derivations (paper 002's ``modified``, which
    objectives read a temperature) enter run ids as values: editing one changes the ids of the
    runs whose behaviour it changes, and no other run's."""
    from stages.core.schema.objective_settings import AlignMHESettings

    params = load_params(REPO / "presets" / "unified_gradient.yaml")
    before = {name: run.run_id for name, run in plan_experiments(params).runs.items()}
    original_mhe = next(n for n in before if n.startswith("align_mhe_original."))
    assert (
        plan_experiments(params).runs[original_mhe].identity["objective_derived"]["modified"]
        is False
    )
    monkeypatch.setattr(AlignMHESettings, "modified", property(lambda self: True))
    after = {name: run.run_id for name, run in plan_experiments(params).runs.items()}
    changed = {name for name in before if before[name] != after[name]}
    assert original_mhe in changed
    assert not any(n.startswith(("simcse.", "align_mhs", "barlow", "vicreg")) for n in changed)
    assert all(n.startswith("align_mhe") for n in changed)
