"""Temperature cool-down schedules (eqs. 2-4) against the spec's derived schedule lengths."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stages.core.schema.temperature_settings import TemperatureSchedule
from stages.objectives.temperature import tau_at


def schedule(kind: str, initial_tau: float, step_ratio: float) -> TemperatureSchedule:
    return TemperatureSchedule(schedule=kind, initial_tau=initial_tau, step_ratio=step_ratio)


def taus(s: TemperatureSchedule, total: int, tau: float = 0.05) -> list[float]:
    return [tau_at(s, t, total, tau) for t in range(1, total + 1)]


def test_constant_is_tau_everywhere():
    assert set(taus(TemperatureSchedule(), 100, 0.07)) == {0.07}


def test_tcc_bert_base():
    """Table 6: tau_i = 0.10, r_s = 0.014, s = 15625 (bs 64): 0.10 for t = 1..218, then 0.05."""
    values = taus(schedule("tcc", 0.10, 0.014), 15625)
    assert values[:218] == [0.10] * 218 and set(values[218:]) == {0.05}


def test_tcs_bert_base():
    """r_s = 0.028: 0.10 for t = 1..218, 0.075 for t = 219..437, then 0.05 (spec B.1 table)."""
    values = taus(schedule("tcs", 0.10, 0.028), 15625)
    assert values[:218] == [0.10] * 218
    assert values[218:437] == pytest.approx([0.075] * 219)
    assert set(values[437:]) == {0.05}


def test_tcs_roberta_large():
    """tau_i = 0.07, r_s = 0.020, s = 3907 (bs 256): 0.07 for 1..39, 0.06 for 40..78, then 0.05."""
    values = taus(schedule("tcs", 0.07, 0.020), 3907)
    assert values[:39] == [0.07] * 39
    assert values[39:78] == pytest.approx([0.06] * 39)
    assert set(values[78:]) == {0.05}


def test_linear_cool_down_eq4():
    """tau_i - (tau_i - tau) t / (r_s s) for t < r_s s (not exactly tau_i at t = 1), then tau."""
    s = schedule("linear", 0.10, 0.01)
    end = 0.01 * 10000
    assert tau_at(s, 1, 10000, 0.05) == pytest.approx(0.10 - 0.05 / end)
    assert tau_at(s, 50, 10000, 0.05) == pytest.approx(0.075)
    assert tau_at(s, 99, 10000, 0.05) == pytest.approx(0.10 - 0.05 * 99 / end)
    assert tau_at(s, 100, 10000, 0.05) == 0.05
    assert all(a >= b for a, b in zip(taus(s, 300), taus(s, 300)[1:], strict=False))


@pytest.mark.parametrize("kind", ["tcc", "tcs", "linear"])
def test_cool_down_needs_both_parameters(kind):
    with pytest.raises(ValidationError, match="needs both initial_tau"):
        TemperatureSchedule(schedule=kind, initial_tau=0.1)


def test_constant_rejects_cool_down_parameters():
    with pytest.raises(ValidationError, match="only apply to a cool-down"):
        TemperatureSchedule(schedule="constant", initial_tau=0.1, step_ratio=0.01)


@pytest.mark.parametrize(
    ("field", "value"), [("initial_tau", 0.0), ("step_ratio", 0.0), ("step_ratio", 1.5)]
)
def test_out_of_range_parameters_are_rejected(field, value):
    good = {"schedule": "tcc", "initial_tau": 0.1, "step_ratio": 0.014}
    with pytest.raises(ValidationError, match=field):
        TemperatureSchedule(**(good | {field: value}))


def test_steps_are_one_based():
    with pytest.raises(ValueError, match="1-based"):
        tau_at(schedule("tcc", 0.1, 0.014), 0, 100, 0.05)
