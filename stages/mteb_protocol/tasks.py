"""mteb task objects for a params.yaml ``mteb.tasks`` entry (the names are in
``stages.core.mteb_task_sets``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stages.core.mteb_task_sets import TASK_SETS, unknown_task_names

if TYPE_CHECKING:
    from mteb.abstasks.abstask import AbsTask

# The filters mteb's MTEB(eng, v1) benchmark puts on its tasks (MTEB_ENG_CLASSIC in
# mteb/benchmarks/benchmarks/benchmarks.py), applied to the named tasks alone:
# ``mteb.get_benchmark`` builds every benchmark mteb registers, about 2,300 task objects and
# 10 s of each evaluation job. tests/mteb/test_mteb_task_sets.py checks every task against the
# benchmark's own objects.
ENG_V1_FILTERS: dict[str, dict[str, Any]] = {
    "MSMARCO": {"languages": ["eng"], "eval_splits": ["dev"]},
    "AmazonCounterfactualClassification": {"eval_splits": ["test"], "hf_subsets": ["en"]},
    "STS17": {"eval_splits": ["test"], "hf_subsets": ["en-en"]},
    "STS22": {"eval_splits": ["test"], "hf_subsets": ["en"]},
}
ENG_V1_DEFAULT_FILTER: dict[str, Any] = {"languages": ["eng"], "eval_splits": ["test"]}


def build_tasks(names: Sequence[str]) -> list[AbsTask]:
    """Fresh task objects, in order. Tasks of the SimACE/MTEB(eng, v1) set carry that
    benchmark's English-only subsets and splits; any other name is mteb's task as registered."""
    import mteb

    unknown = unknown_task_names(names)
    if unknown:
        raise ValueError(f"unknown MTEB task(s): {', '.join(unknown)}")
    eng_v1 = set(TASK_SETS["simace56"])
    return [
        mteb.get_task(name, **ENG_V1_FILTERS.get(name, ENG_V1_DEFAULT_FILTER))
        if name in eng_v1
        else mteb.get_task(name)
        for name in names
    ]
