"""The stage modules of the registered evaluations (``stages.core.schema.evaluation_settings``),
one module each, and what each must define: ``main(argv)``, the stage, and the functions
``cse carry-over`` calls to verify a stored result under new code (docs/extending.md, "Add an
evaluation"):

- ``sample(settings) -> tuple[str, ...]``: a cheap subset of the settings' tasks (by the names
  its records use) that reaches each of the evaluation's code paths;
- ``score(encoder, settings, tasks, label, workdir) -> record``: the results of ``tasks`` as the
  evaluation under ``settings`` computes them, computed afresh (no cache of earlier results;
  ``workdir``: an empty scratch folder);
- ``mismatches(record, settings) -> list[str]``: what a stored record says it computed that
  ``settings`` would not (other tasks, protocol, data);
- ``comparable(record, tasks) -> dict``: every part of a record that scoring ``tasks`` alone
  determines (not its timings, environment, ids or averages over other tasks);
- ``recomputed_summary(record) -> dict``: the record's keys computed from its task results (the
  averages the report reads), as the current code computes them.

``evaluation_module`` imports a registered evaluation's module and checks it defines them all.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from stages.core.errors import StageError
from stages.core.schema.evaluation_settings import EVALUATIONS

CONTRACT = ("main", "sample", "score", "mismatches", "comparable", "recomputed_summary")


def evaluation_module(name: str) -> ModuleType:
    """The stage module of registered evaluation ``name``; a StageError naming every function
    of ``CONTRACT`` it lacks."""
    module_name = EVALUATIONS[name].module
    module = importlib.import_module(module_name)
    missing = [f for f in CONTRACT if not callable(getattr(module, f, None))]
    if missing:
        raise StageError(
            f"evaluation '{name}': {module_name} lacks {', '.join(missing)} (every registered "
            "evaluation defines them: stages/evaluations/__init__.py)"
        )
    return module
