"""mteb task objects for a params.yaml ``mteb.tasks`` entry (the names are in
``stages.core.schema.mteb_task_sets``)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING

from stages.core.schema.mteb_task_sets import (
    BENCHMARK_NARROWED,
    SIMACE56_BENCHMARK,
    unknown_task_names,
)

if TYPE_CHECKING:
    from mteb.abstasks.abstask import AbsTask


def build_tasks(names: Sequence[str]) -> list[AbsTask]:
    """Fresh task objects, in order. Tasks that the SimACE/MTEB(eng, v1) set narrows come from
    that benchmark, with its English-only subsets and splits; any other name is mteb's task as
    registered (for the rest of the set, the same as the benchmark's)."""
    import mteb

    unknown = unknown_task_names(names)
    if unknown:
        raise ValueError(f"unknown MTEB task(s): {', '.join(unknown)}")
    narrowed = {}
    if BENCHMARK_NARROWED.intersection(names):
        narrowed = {
            t.metadata.name: t
            for t in mteb.get_benchmark(SIMACE56_BENCHMARK).tasks
            if t.metadata.name in BENCHMARK_NARROWED
        }
    # the benchmark's task objects are shared module state in mteb: evaluate copies of them
    return [
        copy.deepcopy(narrowed[name]) if name in narrowed else mteb.get_task(name) for name in names
    ]
