"""Sweeps in params.yaml: a method's grid expands into named points whose runs are those of
the equivalent hand-written methods (stages/core/schema/sweeps.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from stages.core.identity.experiments import plan_experiments
from stages.core.planning.jobs import build_jobs, param_values
from stages.core.schema.params import ParamsError, parse_params

REPO = Path(__file__).resolve().parents[1]
SMOKE = yaml.safe_load((REPO / "presets" / "smoke.yaml").read_text())


def with_margin_grid(values: list[float]) -> dict[str, Any]:
    raw = copy.deepcopy(SMOKE)
    raw["methods"]["arccse"]["grid"] = {"objective.margin_deg": values}
    return raw


def test_a_grid_expands_into_named_points_in_every_group() -> None:
    params = parse_params(with_margin_grid([0.0, 5.0, 10.0]))
    points = ["arccse[margin_deg=0.0]", "arccse[margin_deg=5.0]", "arccse[margin_deg=10.0]"]
    assert [m for m in params.methods if m.startswith("arccse")] == points
    assert "arccse" not in params.methods
    for point, margin in zip(points, (0.0, 5.0, 10.0), strict=True):
        method = params.methods[point]
        assert method.objective.margin_deg == margin
        assert method.sweep == f"margin_deg={margin}" and params.method_key(point) == "arccse"
    assert {f"{p}.tiny-bert.s42" for p in points} <= set(plan_experiments(params).runs)


def test_a_point_has_the_run_id_of_the_hand_written_method() -> None:
    by_hand = plan_experiments(parse_params(SMOKE)).runs["arccse.tiny-bert.s42"]
    swept = plan_experiments(parse_params(with_margin_grid([5.0, 10.0]))).runs
    assert swept["arccse[margin_deg=10.0].tiny-bert.s42"].run_id == by_hand.run_id
    assert swept["arccse[margin_deg=5.0].tiny-bert.s42"].run_id != by_hand.run_id


def test_grids_over_several_keys_take_the_cross_product() -> None:
    raw = copy.deepcopy(SMOKE)
    raw["methods"]["simace"]["grid"] = {
        "objective.tau": [0.05, 0.1],
        "train.learning_rate": [3e-5, 5e-5],
    }
    names = [m for m in parse_params(raw).methods if m.startswith("simace[")]
    assert len(names) == 4 and "simace[tau=0.1,learning_rate=5e-05]" in names


def test_jobs_track_the_written_method_and_quote_the_point() -> None:
    params = parse_params(with_margin_grid([0.0, 10.0]))
    train = {j.key: j for j in build_jobs(plan_experiments(params)) if j.stage == "train"}
    job = train["arccse[margin_deg=0.0].tiny-bert.s42"]
    assert "methods.arccse" in job.params
    assert job.cmd == "python -m stages.train 'arccse[margin_deg=0.0].tiny-bert.s42'"
    assert param_values(params, ["methods.arccse"])["methods.arccse"]["grid"] == {
        "objective.margin_deg": [0.0, 10.0]
    }


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({"margin_deg": [1.0]}, "methods.arccse.grid.margin_deg: a grid key is a dotted path"),
        ({"objective.margin_deg": []}, "grid.objective.margin_deg: expected a non-empty list"),
        ({"objective.margin_deg": [120.0]}, "arccse[margin_deg=120.0].objective.margin_deg"),
        ({"objective.tua": [0.1]}, "objective.tua: unknown key"),
    ],
)
def test_a_bad_grid_is_refused_naming_the_key(grid: dict[str, Any], message: str) -> None:
    raw = copy.deepcopy(SMOKE)
    raw["methods"]["arccse"]["grid"] = grid
    with pytest.raises(ParamsError, match=pytest.importorskip("re").escape(message)):
        parse_params(raw)


def test_the_baseline_method_must_be_one_point_of_a_grid() -> None:
    raw = copy.deepcopy(SMOKE)
    raw["methods"]["simcse"]["grid"] = {"objective.tau": [0.05, 0.1]}
    with pytest.raises(ParamsError, match=r"report\.baseline_method: 'simcse' has a grid"):
        parse_params(raw)
    raw["report"]["baseline_method"] = "simcse[tau=0.05]"
    assert parse_params(raw).report.baseline_method == "simcse[tau=0.05]"


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ({"objective": {"name": "infonce", "tau": "abc"}}, "methods.hot.objective.tau: Input"),
        (
            {"objective": {"name": "infonce"}, "train": {"learning_rate": -1}},
            "methods.hot.train.learning_rate: Input should be greater than 0",
        ),
    ],
)
def test_a_bad_value_the_grid_replaces_is_still_refused(
    written: dict[str, Any], message: str
) -> None:
    """Every point overwrites the swept key: a typo in the method as written is named, not
    dropped without a word."""
    raw = copy.deepcopy(SMOKE)
    grid = {"objective.tau": [0.1]} if "tau" in str(written) else {"train.learning_rate": [1e-5]}
    raw["methods"]["hot"] = {**written, "grid": grid}
    with pytest.raises(ParamsError, match=message):
        parse_params(raw)
