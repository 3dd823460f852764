"""Temperature schedules (temperature cool-down paper, eqs. 2-4), usable with every objective
that has a temperature.

``tau`` is the objective's own temperature; a cool-down starts at ``initial_tau`` (tau_i) and
reaches ``tau`` at step end = r_s * s, where s is the number of optimizer steps and r_s the step
ratio. Steps t are 1-based optimizer steps, as in the paper (HF Trainer: global_step + 1):
- constant: tau at every step;
- tcc (eq. 2): tau_i for t < r_s s, then tau;
- tcs (eq. 3): tau_i for t < r_s s / 2, (tau_i + tau) / 2 for t < r_s s, then tau;
- linear, TCL (eq. 4; defined but not evaluated by the paper): tau_i - (tau_i - tau) t / (r_s s)
  for t < r_s s (so not exactly tau_i at t = 1), then tau.

``COOL_DOWNS`` holds each cool-down's temperature before its end, one function per cool-down
name of ``SCHEDULES`` (``stages.core.schema.temperature_settings``); from ``end`` on every
cool-down is at ``tau``.
"""

from __future__ import annotations

from collections.abc import Callable

from stages.core.schema.temperature_settings import TemperatureSchedule

# (step t, end = r_s * s, tau_i, tau) -> the temperature at t, for 1 <= t < end
CoolDown = Callable[[int, float, float, float], float]


def tcc(step: int, end: float, initial_tau: float, tau: float) -> float:
    return initial_tau


def tcs(step: int, end: float, initial_tau: float, tau: float) -> float:
    return initial_tau if step < 0.5 * end else 0.5 * (initial_tau + tau)


def linear(step: int, end: float, initial_tau: float, tau: float) -> float:
    return initial_tau - (initial_tau - tau) / end * step


COOL_DOWNS: dict[str, CoolDown] = {"tcc": tcc, "tcs": tcs, "linear": linear}


def tau_at(schedule: TemperatureSchedule, step: int, total_steps: int, tau: float) -> float:
    """Temperature at 1-based optimizer ``step`` of ``total_steps``."""
    if step < 1 or total_steps < 1:
        raise ValueError(f"steps are 1-based: got step {step} of {total_steps}")
    if not schedule.cool_down:
        return tau
    assert schedule.initial_tau is not None and schedule.step_ratio is not None
    end = schedule.step_ratio * total_steps
    if step >= end:
        return tau
    return COOL_DOWNS[schedule.schedule](step, end, schedule.initial_tau, tau)
