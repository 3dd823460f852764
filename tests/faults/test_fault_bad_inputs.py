"""Bad inputs a researcher types: a backbone that cannot be loaded, an experiment that is not
planned. Each stage prints one `error:` line naming the params key or argument, exits 2 and leaves
nothing that looks finished, nor points to an unfinished run that does not exist."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fault_helpers import (
    EXPERIMENT,
    make_workspace,
    no_finished_outputs,
    params,
    run_id,
    stage_error,
)

from stages.core.schema.evaluation_settings import EVALUATIONS
from stages.training.run_folder import unfinished_run_note

pytestmark = pytest.mark.faults


@pytest.fixture
def workspace(shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_workspace(tmp_path, shared_data, senteval=True)
    monkeypatch.chdir(root)
    return root


def test_a_missing_backbone_folder_names_the_key_and_no_unfinished_run(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = workspace / "no-such-model"
    backbone = {"model": str(missing), "random_init": params()["backbones"]["tiny"]["random_init"]}
    (workspace / "params.yaml").write_text(yaml.safe_dump(params(backbones={"tiny": backbone})))
    err = stage_error("stages.train", [EXPERIMENT], monkeypatch, capsys)
    assert err == (
        f"error: backbones.tiny.model ({missing}): no such folder {missing} (a model is a folder "
        "holding config.json, a hub id 'name' or 'owner/name', or package:<module>)\n"
    )
    assert not (workspace / "runs" / f"{run_id(workspace)}.partial").exists()
    assert no_finished_outputs(workspace)


def test_the_unfinished_run_is_pointed_to_only_when_it_exists(tmp_path: Path) -> None:
    partial = tmp_path / "abc.partial"
    assert unfinished_run_note(partial) == ""
    partial.mkdir()
    assert unfinished_run_note(partial).startswith(f"\nThe unfinished run is in {partial}: ")


# The arguments an evaluation's stage needs besides --experiment (none: not listed).
EVALUATION_ARGS = {"sts_tsv": ["--file", "mine=mine.tsv"]}


@pytest.mark.parametrize("evaluation", EVALUATIONS)
def test_an_unknown_experiment_is_refused_by_every_evaluation(
    evaluation: str, workspace: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    args = ["--experiment", "nosuch.tiny.s1", *EVALUATION_ARGS.get(evaluation, [])]
    err = stage_error(EVALUATIONS[evaluation].module, args, monkeypatch, capsys)
    assert err == f"error: unknown experiment 'nosuch.tiny.s1'; planned: {EXPERIMENT}\n"
    assert no_finished_outputs(workspace)
