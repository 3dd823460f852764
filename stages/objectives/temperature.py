"""Temperature schedules (temperature cool-down paper, eqs. 2-4), usable with every objective
that has a temperature.

``tau`` is the objective's own temperature; a cool-down starts at ``initial_tau`` (tau_i) and
reaches ``tau`` at step r_s * s, where s is the number of optimizer steps and r_s the step
ratio. Steps t are 1-based optimizer steps, as in the paper (HF Trainer: global_step + 1):
- constant: tau at every step;
- tcc (eq. 2): tau_i for t < r_s s, then tau;
- tcs (eq. 3): tau_i for t < r_s s / 2, (tau_i + tau) / 2 for t < r_s s, then tau;
- linear, TCL (eq. 4; defined but not evaluated by the paper): tau_i - (tau_i - tau) t / (r_s s)
  for t < r_s s (so not exactly tau_i at t = 1), then tau.
"""

from __future__ import annotations

from stages.core.schema.temperature_settings import TemperatureSchedule


def tau_at(schedule: TemperatureSchedule, step: int, total_steps: int, tau: float) -> float:
    """Temperature at 1-based optimizer ``step`` of ``total_steps``."""
    if step < 1 or total_steps < 1:
        raise ValueError(f"steps are 1-based: got step {step} of {total_steps}")
    if schedule.schedule == "constant":
        return tau
    assert schedule.initial_tau is not None and schedule.step_ratio is not None
    end = schedule.step_ratio * total_steps
    if step >= end:
        return tau
    if schedule.schedule == "tcc":
        return schedule.initial_tau
    if schedule.schedule == "tcs":
        return schedule.initial_tau if step < 0.5 * end else 0.5 * (schedule.initial_tau + tau)
    return schedule.initial_tau - (schedule.initial_tau - tau) / end * step
