"""The ``temperature:`` block of a method: a temperature schedule (temperature cool-down paper,
eqs. 2-4) for any objective that has a temperature. The schedule's arithmetic is in
``stages.objectives.temperature`` (part of every run's code identity)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from stages.core.schema.bounds import Real


class TemperatureSchedule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    schedule: Literal["constant", "tcc", "tcs", "linear"] = Field(
        "constant",
        description="constant; tcc = cool-down with a constant (eq. 2); tcs = with a step "
        "function (eq. 3); linear = linear cool-down TCL (eq. 4)",
    )
    initial_tau: Real("tau") | None = Field(
        None, description="tau_i, the starting temperature (Table 6: 0.06-0.10)"
    )
    step_ratio: Real("step_ratio") | None = Field(
        None,
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
