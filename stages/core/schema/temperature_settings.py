"""The ``temperature:`` block of a method: a temperature schedule (temperature cool-down paper,
eqs. 2-4) for any objective that has a temperature.

``SCHEDULES`` is the registry of schedule names: validation accepts exactly these and its error
lists them. Each name's arithmetic is its function in ``stages.objectives.temperature``
(``COOL_DOWNS``; part of every run's code identity, which this torch-free module is not). A
cool-down starts at ``initial_tau`` and reaches the objective's ``tau`` at step
``step_ratio * total_steps`` (docs/extending.md, "Add a temperature schedule").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stages.core.schema.bounds import Real

CONSTANT = "constant"


COOLDOWN = (
    "Simple Temperature Cool-down in Contrastive Framework for Unsupervised Sentence "
    "Representation Learning."
)


@dataclass(frozen=True)
class Schedule:
    summary: str  # one line for the field's description and the docs
    cool_down: bool  # takes initial_tau and step_ratio (constant: neither)
    paper: str = ""  # cited by a trained model's card


SCHEDULES: dict[str, Schedule] = {
    CONSTANT: Schedule("the objective's tau at every step", cool_down=False),
    "tcc": Schedule("cool-down with a constant (eq. 2)", cool_down=True, paper=COOLDOWN),
    "tcs": Schedule("cool-down with a step function (eq. 3)", cool_down=True, paper=COOLDOWN),
    "linear": Schedule("linear cool-down TCL (eq. 4)", cool_down=True, paper=COOLDOWN),
}


def listing(names: list[str]) -> str:
    """'a', 'b' or 'c', as pydantic lists the values of a Literal."""
    quoted = [repr(name) for name in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def cool_downs() -> list[str]:
    return [name for name, schedule in SCHEDULES.items() if schedule.cool_down]


class TemperatureSchedule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    schedule: str = Field(
        CONSTANT,
        description="; ".join(f"{name}: {entry.summary}" for name, entry in SCHEDULES.items()),
    )
    initial_tau: Real("tau") | None = Field(
        None, description="tau_i, the starting temperature (Table 6: 0.06-0.10)"
    )
    step_ratio: Real("step_ratio") | None = Field(
        None,
        description="r_s: the cool-down ends at step r_s * total_steps (Table 6: 0.013-0.028)",
    )

    @field_validator("schedule")
    @classmethod
    def _a_registered_schedule(cls, name: str) -> str:
        if name not in SCHEDULES:
            raise ValueError(
                f"unknown schedule {name!r}: use {listing(list(SCHEDULES))} (the names of "
                "SCHEDULES in stages/core/schema/temperature_settings.py)"
            )
        return name

    @property
    def cool_down(self) -> bool:
        return SCHEDULES[self.schedule].cool_down

    @model_validator(mode="after")
    def _cool_down_needs_its_parameters(self) -> Self:
        given = self.initial_tau is not None or self.step_ratio is not None
        if not self.cool_down and given:
            raise ValueError(
                "initial_tau and step_ratio only apply to a cool-down (schedule "
                f"{listing(cool_downs())}); schedule '{self.schedule}' uses the objective's tau "
                "throughout"
            )
        if self.cool_down and (self.initial_tau is None or self.step_ratio is None):
            raise ValueError(
                f"schedule '{self.schedule}' needs both initial_tau (tau_i > 0) and "
                "step_ratio (r_s in (0, 1])"
            )
        return self
