"""Losses by objective name, imported only when asked for.

The names, settings and ``module:Class`` of every loss are declared once, torch-free, in
``stages.core.schema.objective_settings.OBJECTIVES``; this module turns validated settings into the
loss that computes them. A run's code identity covers exactly its own loss module (and what that
imports), so editing one objective retrains only the runs that use it."""

from __future__ import annotations

import importlib

from stages.core.schema.objective_settings import SETTINGS_BY_NAME, ObjectiveSettings, loss_location
from stages.objectives.base import Objective


def loss_class(name: str) -> type[Objective]:
    module, cls = loss_location(name)
    found = getattr(importlib.import_module(module), cls, None)
    if not (isinstance(found, type) and issubclass(found, Objective)):
        raise ImportError(
            f"objective '{name}': OBJECTIVES names '{module}:{cls}', but {module} has no "
            f"Objective subclass {cls}"
        )
    return found


def build_objective(settings: ObjectiveSettings) -> Objective:
    """The loss configured by ``settings`` (already validated)."""
    return loss_class(settings.name).model_validate(settings.model_dump())


def all_loss_classes() -> dict[str, type[Objective]]:
    """Every loss class by name (imports them all: tests, benchmarks, the figures stage)."""
    return {name: loss_class(name) for name in SETTINGS_BY_NAME}
