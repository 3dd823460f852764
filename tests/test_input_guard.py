"""A stage writes its outputs only from the params file it read: an edit while it runs stops it
at its next output renamed into place (or at the end of its guarded block), naming the file,
with nothing written; outside the block (a run's checkpoints) nothing is checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import stages.figures as figures_stage
from stages.core.cli import params_file_of
from stages.core.storage.atomic import write_text
from stages.core.storage.input_guard import InputChanged, watch

REPO = Path(__file__).resolve().parents[1]


def test_an_input_edited_in_the_block_stops_the_next_write(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text("a: 1\n")
    inputs = watch(params)
    with pytest.raises(InputChanged) as err, inputs.guarding():
        write_text(tmp_path / "first.json", "{}")
        params.write_text("a: 2\n")
        write_text(tmp_path / "second.json", "{}")
    assert str(err.value) == (
        f"{params} changed while this stage ran, after it was read: {tmp_path / 'second.json'} "
        "was not written, so that no orchestrator records the new version against a result "
        "of the old one; rerun it"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.json", "params.yaml"]


def test_a_block_that_renames_nothing_is_stopped_at_its_end(tmp_path: Path) -> None:
    """A stage whose outputs were already as it would write them (a train pointer that says
    the same) writes nothing; the edit is seen as the block ends."""
    params = tmp_path / "params.yaml"
    params.write_text("a: 1\n")
    inputs = watch(params)
    with pytest.raises(InputChanged, match=r"the stage stops unfinished"), inputs.guarding():
        params.write_text("a: 2\n")


def test_outside_the_block_and_for_unchanged_inputs_writes_go_on(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text("a: 1\n")
    missing = tmp_path / "no-such-params.yaml"
    inputs = watch(params, missing)
    with inputs.guarding():
        write_text(tmp_path / "out.json", "{}")
    params.write_text("a: 2\n")
    write_text(tmp_path / "checkpoint.json", "{}")  # not in a guarded block
    assert (tmp_path / "out.json").is_file() and (tmp_path / "checkpoint.json").is_file()


def test_the_figures_stage_edited_while_it_runs_writes_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    params = tmp_path / "params.yaml"
    params.write_text((REPO / "params.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp_path / "analyses"

    def edited_while_computing(stage):
        raw = yaml.safe_load(params.read_text(encoding="utf-8"))
        raw["figures"] = {**raw.get("figures", {}), "seed": 7}
        params.write_text(yaml.safe_dump(raw), encoding="utf-8")
        return []

    monkeypatch.setattr(figures_stage, "drawn_by", edited_while_computing)
    with pytest.raises(InputChanged, match=rf"^{params} changed .*: {out} was not written"):
        figures_stage.main(["--params", str(params), "--out", str(out)])
    assert list(tmp_path.iterdir()) == [params]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--experiment", "x"], "params.yaml"),
        (["--experiment", "x", "--params", "p.yaml"], "p.yaml"),
        (["--params=q.yaml", "--experiment", "x"], "q.yaml"),
    ],
)
def test_the_params_file_of_a_stages_arguments(argv: list[str], expected: str) -> None:
    assert params_file_of(argv) == expected
