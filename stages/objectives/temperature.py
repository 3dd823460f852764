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

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TemperatureSchedule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schedule: Literal["constant", "tcc", "tcs", "linear"] = Field(
        "constant",
        description="constant; tcc = cool-down with a constant (eq. 2); tcs = with a step "
        "function (eq. 3); linear = linear cool-down TCL (eq. 4)",
    )
    initial_tau: float | None = Field(
        None, gt=0, description="tau_i, the starting temperature (Table 6: 0.06-0.10)"
    )
    step_ratio: float | None = Field(
        None,
        gt=0,
        le=1,
        description="r_s: the cool-down ends at step r_s * total_steps (Table 6: 0.013-0.028)",
    )

    @model_validator(mode="after")
    def _cool_down_needs_its_parameters(self) -> Self:
        given = self.initial_tau is not None or self.step_ratio is not None
        if self.schedule == "constant" and given:
            raise ValueError(
                "initial_tau and step_ratio only apply to a cool-down (schedule tcc, tcs or "
                "linear); schedule 'constant' uses the objective's tau throughout"
            )
        if self.schedule != "constant" and (self.initial_tau is None or self.step_ratio is None):
            raise ValueError(
                f"schedule '{self.schedule}' needs both initial_tau (tau_i > 0) and "
                "step_ratio (r_s in (0, 1])"
            )
        return self

    def tau_at(self, step: int, total_steps: int, tau: float) -> float:
        """Temperature at 1-based optimizer ``step`` of ``total_steps``."""
        if step < 1 or total_steps < 1:
            raise ValueError(f"steps are 1-based: got step {step} of {total_steps}")
        if self.schedule == "constant":
            return tau
        assert self.initial_tau is not None and self.step_ratio is not None
        end = self.step_ratio * total_steps
        if step >= end:
            return tau
        if self.schedule == "tcc":
            return self.initial_tau
        if self.schedule == "tcs":
            return self.initial_tau if step < 0.5 * end else 0.5 * (self.initial_tau + tau)
        return self.initial_tau - (self.initial_tau - tau) / end * step
