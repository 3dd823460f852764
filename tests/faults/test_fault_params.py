"""Fault 3: bad params at every stage entry point. A key given twice is refused naming the key
path and both lines; values the code cannot honour are refused naming the key path; each stage
CLI prints one `error:` line, exits 2 and writes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fault_helpers import EXPERIMENT, env, params, stage_error

pytestmark = pytest.mark.faults


def with_methods(block: str, **changes) -> str:
    """The tiny params with ``block`` as their `methods:` section (written by hand, as YAML's
    dumper cannot repeat a key)."""
    base = {k: v for k, v in params(**changes).items() if k != "methods"}
    return yaml.safe_dump(base) + "methods:\n" + block


SIMCSE = "  simcse:\n    objective: {name: infonce, tau: 0.05}\n"
BAD = {
    "tau-twice": (
        with_methods("  simcse:\n    objective: {name: infonce, tau: 0.5, tau: 0.05}\n"),
        "methods.simcse.objective.tau: given twice, at lines {0} and {0}",
        ["tau: 0.5, tau: 0.05"],
    ),
    "simcse-twice": (
        with_methods(SIMCSE + "  simcse:\n    objective: {name: infonce, tau: 0.1}\n"),
        "methods.simcse: given twice, at lines {0} and {1}",
        [SIMCSE, "  simcse:\n    objective: {name: infonce, tau: 0.1}"],
    ),
    "negative-seed": (
        with_methods(SIMCSE, experiments=[
            {"methods": ["simcse"], "backbones": ["tiny"], "seeds": [-1]}]),
        "experiments.0.seeds.0: Input should be greater than or equal to 0 (got -1)",
        [],
    ),
    "infinite-tau": (
        with_methods("  simcse:\n    objective: {name: infonce, tau: .inf}\n"),
        "methods.simcse.objective.tau: Input should be a finite number (got inf)",
        [],
    ),
    "nan-tau": (
        with_methods("  simcse:\n    objective: {name: infonce, tau: .nan}\n"),
        "methods.simcse.objective.tau: Input should be a finite number (got nan)",
        [],
    ),
    "arccon-margin-120": (
        with_methods("  simcse:\n    objective: {name: arccon, margin_deg: 120}\n"),
        "methods.simcse.objective.margin_deg: Input should be less than 90, in [0, 90) (got 120)",
        [],
    ),
}  # fmt: skip


def expected_message(case: str) -> str:
    text, message, anchors = BAD[case]
    lines = [text[: text.index(a)].count("\n") + 1 for a in anchors]  # where each key begins
    return message.format(*lines)


# Every stage entry point that reads params.yaml, with arguments that would otherwise work.
ENTRY_POINTS = {
    "stages.train": [EXPERIMENT],
    "stages.evaluations.senteval": ["--experiment", EXPERIMENT],
    "stages.evaluations.mteb": ["--experiment", EXPERIMENT],
    "stages.triplets": ["--corpus", "data/corpus/x.txt", "--backbone", "tiny", "--output", "t.pq"],
    "stages.download": ["corpus"],
    "stages.figures": [],
    "stages.report": [],
    "stages.commands.pipeline": ["status"],
    "stages.commands.__main__": ["estimates"],
}


def run_cli(module: str, args: list[str], monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> str:  # fmt: skip
    """The stage's error line, which must be the params file's."""
    err = stage_error(module, args, monkeypatch, capsys)
    assert err.startswith("error: params.yaml is invalid:\n"), err
    return err


@pytest.mark.parametrize("case", BAD)
def test_bad_params_stop_the_train_stage_naming_the_key(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "params.yaml").write_text(BAD[case][0])
    monkeypatch.chdir(tmp_path)
    err = run_cli("stages.train", [EXPERIMENT], monkeypatch, capsys)
    assert f"  - {expected_message(case)}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing written


def test_a_duplicate_key_stops_every_stage_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "params.yaml").write_text(BAD["simcse-twice"][0])
    monkeypatch.chdir(tmp_path)
    for module, args in ENTRY_POINTS.items():
        err = run_cli(module, args, monkeypatch, capsys)
        assert f"  - {expected_message('simcse-twice')}" in err, module
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_the_stage_process_exits_2_with_one_error_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD["nan-tau"][0])
    result = subprocess.run(
        [sys.executable, "-m", "stages.train", EXPERIMENT, "--params", str(bad)],
        cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == f"error: {bad} is invalid:\n  - {expected_message('nan-tau')}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]
