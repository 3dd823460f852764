"""Every objective is selectable by name in params.yaml, the papers' objectives default to the
papers' BERT-base values, and bad hyperparameters are rejected with a message naming the key.
A new objective needs no entry here: the registry tests run over the registry."""

from __future__ import annotations

import copy
import math

import pytest
import yaml

from stages.core.schema.objective_settings import OBJECTIVES, SETTINGS_BY_NAME, check_registry
from stages.core.schema.params import DEFAULT_PARAMS, ParamsError, parse_params
from stages.objectives.registry import all_loss_classes, build_objective

PAPER_DEFAULTS = {  # the five papers' objectives (and SimCSE's), BERT-base
    "infonce": {"tau": 0.05},
    "arccon": {"tau": 0.05, "margin_deg": 10.0},
    "arccse": {"tau": 0.05, "margin_deg": 10.0, "triplet_weight": 0.1, "triplet_margin": 0.0},
    "simace": {"tau": 0.06, "margin_deg": 10.0},
    "align_uniform": {"uniformity_weight": 0.1, "alpha": 2.0, "t": 6.0, "implementation": "paper"},
    "dcl": {"tau": 0.03},
    "dcl_plus": {"tau": 0.17},
    "mpt": {"margin": 0.23, "implementation": "paper"},
    "met": {"margin": 0.45, "implementation": "paper"},
    "mat": {"margin_pi": 0.15, "implementation": "paper"},
    "align_mhe": {"uniformity_weight": 10.0, "margin": 0.30, "tau": 0.05, "ratio": 1.75},
    "align_mhs": {"uniformity_weight": 1.0, "margin": 0.30, "ratio": 1.75},
    "barlow_twins": {"off_diagonal_weight": 30.0, "margin": 0.30, "tau": 0.05, "ratio": 1.5},
    "vicreg": {"covariance_weight": 30.0, "margin": 0.30, "tau": 0.05, "ratio": 1.5},
}


def with_method(objective: dict, temperature: dict | None = None) -> dict:
    raw = yaml.safe_load(DEFAULT_PARAMS.read_text())
    raw = copy.deepcopy(raw)
    raw["methods"]["candidate"] = {"objective": objective} | (
        {"temperature": temperature} if temperature else {}
    )
    return raw


def test_every_objective_is_registered_once():
    assert set(PAPER_DEFAULTS) <= set(SETTINGS_BY_NAME)
    assert len(OBJECTIVES) == len(SETTINGS_BY_NAME) == len(set(OBJECTIVES.values()))


def test_a_mistyped_registry_entry_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    infonce = SETTINGS_BY_NAME["infonce"]
    monkeypatch.setitem(OBJECTIVES, infonce, "stages.objectives.infonse:InfoNCE")
    with pytest.raises(
        ImportError, match=r"OBJECTIVES\[InfoNCESettings\] = 'stages.objectives.infonse"
    ):
        check_registry()


def test_a_registry_entry_naming_a_missing_class_is_named(monkeypatch: pytest.MonkeyPatch):
    infonce = SETTINGS_BY_NAME["infonce"]
    monkeypatch.setitem(OBJECTIVES, infonce, "stages.objectives.infonce:InfoNSE")
    check_registry()  # the module exists; the class is looked up when the loss is built
    with pytest.raises(ImportError) as err:
        build_objective(infonce(name="infonce"))
    assert str(err.value) == (
        "objective 'infonce': OBJECTIVES names 'stages.objectives.infonce:InfoNSE', but "
        "stages.objectives.infonce has no Objective subclass InfoNSE"
    )


@pytest.mark.parametrize("name", sorted(SETTINGS_BY_NAME))
def test_each_loss_subclasses_its_settings_and_is_built_from_them(name):
    settings = SETTINGS_BY_NAME[name](name=name)
    loss = build_objective(settings)
    assert isinstance(loss, type(settings)) and loss.model_dump() == settings.model_dump()
    assert all_loss_classes()[name] is type(loss)


@pytest.mark.parametrize("name", sorted(SETTINGS_BY_NAME))
def test_selectable_by_name_with_the_papers_defaults(name):
    params = parse_params(with_method({"name": name}))
    chosen = params.methods["candidate"].objective
    assert type(chosen) is SETTINGS_BY_NAME[name]
    for field, value in PAPER_DEFAULTS.get(name, {}).items():
        assert getattr(chosen, field) == value, field


def test_hyperparameters_and_switches_are_read():
    objective = {"name": "barlow_twins", "gradient_dissipation": True, "softmax_weight": True,
                 "static_ratio": True, "margin": 0.37, "tau": 0.05, "ratio": 1.25}  # fmt: skip
    chosen = parse_params(with_method(objective)).methods["candidate"].objective
    assert chosen.gradient_dissipation and chosen.softmax_weight and chosen.static_ratio
    assert (chosen.margin, chosen.ratio) == (0.37, 1.25)


@pytest.mark.parametrize(
    ("objective", "message"),
    [
        (
            {"name": "infonce", "tau": 0},
            "methods.candidate.objective.tau: Input should be greater than 0",
        ),
        (
            {"name": "dcl", "tau": -0.1},
            "methods.candidate.objective.tau: Input should be greater than 0",
        ),
        (
            {"name": "arccon", "margin_deg": 200},
            "objective.margin_deg: Input should be less than 90",
        ),
        (
            {"name": "simace", "margin_deg": 120},
            "objective.margin_deg: Input should be less than or equal to 90",
        ),
        (
            {"name": "mat", "margin_pi": 1.5},
            "objective.margin_pi: Input should be less than or equal to 1",
        ),
        ({"name": "align_uniform", "uniformity_weight": 1.2}, "objective.uniformity_weight"),
        (
            {"name": "mpt", "implementation": "tf"},
            "objective.implementation: Input should be 'paper' or 'code'",
        ),
        ({"name": "align_mhs", "softmax_weight": True}, "objective.softmax_weight: unknown key"),
        (
            {"name": "arccse", "triplet_weight": 0},
            "objective.triplet_weight: Input should be greater than 0",
        ),
        ({"name": "vicreg", "ratio": 0}, "objective.ratio: Input should be greater than 0"),
        ({"name": "simcse"}, "does not match any of the expected tags: 'infonce'"),
    ],
)
def test_bad_hyperparameters_are_rejected_clearly(objective, message):
    with pytest.raises(ParamsError) as error:
        parse_params(with_method(objective))
    assert message in str(error.value)


def test_schedule_needs_an_objective_with_a_temperature():
    cool_down = {"schedule": "tcc", "initial_tau": 0.1, "step_ratio": 0.014}
    parse_params(with_method({"name": "arccon"}, cool_down))
    with pytest.raises(ParamsError, match="objective 'mpt' has no temperature to schedule"):
        parse_params(with_method({"name": "mpt"}, cool_down))


def test_temperature_flags_match_the_objectives():
    with_tau = {n for n, cls in SETTINGS_BY_NAME.items() if cls(name=n).uses_temperature}
    # paper 002's tau belongs to the W modification: read only with softmax_weight on
    softmax = {"align_mhe", "barlow_twins", "vicreg"}
    papers = with_tau & set(PAPER_DEFAULTS)
    assert papers == {n for n, d in PAPER_DEFAULTS.items() if "tau" in d} - softmax
    assert all(SETTINGS_BY_NAME[n](name=n, softmax_weight=True).uses_temperature for n in softmax)
    assert {n for n in PAPER_DEFAULTS if SETTINGS_BY_NAME[n].needs_triplets} == {"arccse"}
    assert math.isclose(all_loss_classes()["simace"](name="simace").initial_tau, 0.06)
    assert all_loss_classes()["mpt"](name="mpt").initial_tau is None
