"""Named task sets: the SimACE paper's 56 datasets (= mteb's MTEB(eng, v1)), the STS set, and
their validation in params.yaml."""

from __future__ import annotations

from pathlib import Path

import mteb
import pytest

from stages.core.schema.evaluation_settings import MtebParams
from stages.core.schema.mteb_task_sets import (
    BENCHMARK_NARROWED,
    SIMACE56,
    SIMACE56_BENCHMARK,
    STS7,
    TASK_SETS,
    task_names,
    unknown_task_names,
)
from stages.core.schema.params import ParamsError, load_params
from stages.mteb_protocol.tasks import build_tasks

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"


def test_simace56_has_the_papers_category_sizes_and_is_mteb_eng_v1() -> None:
    sizes = {category: len(names) for category, names in SIMACE56.items()}
    assert sizes == {
        "Classification": 12,
        "Clustering": 11,
        "PairClassification": 3,
        "Reranking": 4,
        "Retrieval": 15,
        "STS": 10,
        "Summarization": 1,
    }
    names = TASK_SETS["simace56"]
    assert len(names) == len(set(names)) == 56
    benchmark = {t.metadata.name for t in mteb.get_benchmark(SIMACE56_BENCHMARK).tasks}
    assert set(names) == benchmark


def test_categories_are_mtebs_task_types() -> None:
    for category, names in SIMACE56.items():
        for name in names:
            assert mteb.get_task(name).metadata.type == category, name


def test_sts_set_and_explicit_lists() -> None:
    assert task_names("sts") == STS7
    assert task_names(["STS12", "BIOSSES", "STS12"]) == ("STS12", "BIOSSES")
    with pytest.raises(ValueError, match="unknown MTEB task set 'mteb56'; named sets: sts"):
        task_names("mteb56")
    assert unknown_task_names(["STS12", "STS-12", "Banking77Classification"]) == ["STS-12"]


def test_built_tasks_carry_the_benchmarks_english_filters_on_fresh_objects() -> None:
    sts17, msmarco, massive, sts12 = build_tasks(
        ["STS17", "MSMARCO", "MassiveIntentClassification", "STS12"]
    )
    assert sts17.hf_subsets == ["en-en"] and list(sts17.eval_splits) == ["test"]
    assert list(msmarco.eval_splits) == ["dev"]
    assert massive.hf_subsets == ["en"]
    assert sts12.hf_subsets == ["default"]
    shared = {t.metadata.name: t for t in mteb.get_benchmark(SIMACE56_BENCHMARK).tasks}
    assert sts17 is not shared["STS17"]  # evaluating it never touches mteb's module state
    assert mteb.get_task("BIOSSES").metadata.name == build_tasks(["BIOSSES"])[0].metadata.name


def test_only_the_narrowed_tasks_differ_from_mtebs_registry() -> None:
    """The set's tasks outside ``BENCHMARK_NARROWED`` are built from mteb's registry, so each
    must be the benchmark's task as mteb registers it: same class, metadata, splits and subsets;
    and the narrowed ones are exactly those whose registered splits or subsets differ."""
    built = {task.metadata.name: task for task in build_tasks(TASK_SETS["simace56"])}
    narrowed = set()
    for task in mteb.get_benchmark(SIMACE56_BENCHMARK).tasks:
        name, scope = task.metadata.name, (list(task.eval_splits), task.hf_subsets)
        mine = built[name]
        assert type(mine) is type(task) and mine.metadata == task.metadata, name
        assert (list(mine.eval_splits), mine.hf_subsets) == scope, name
        registered = mteb.get_task(name)
        if (list(registered.eval_splits), registered.hf_subsets) != scope:
            narrowed.add(name)
    assert narrowed == BENCHMARK_NARROWED


def test_params_accept_sets_and_registered_names_only() -> None:
    assert MtebParams(tasks="simace56").tasks == "simace56"
    assert MtebParams(tasks=["STS12", "BIOSSES"]).tasks == ("STS12", "BIOSSES")
    with pytest.raises(ValueError, match=r"unknown task set 'STS12'.* \[STS12\]"):
        MtebParams(tasks="STS12")
    with pytest.raises(ValueError, match="not in mteb's task registry: STS-B"):
        MtebParams(tasks=["STS12", "STS-B"])
    with pytest.raises(ValueError, match="empty task list"):
        MtebParams(tasks=[])


def test_params_file_error_names_the_key(tmp_path: Path) -> None:
    text = PARAMS.read_text(encoding="utf-8")
    bad = tmp_path / "params.yaml"
    bad.write_text(text.replace("tasks: sts ", "tasks: [STS12, NoSuchTask] "), encoding="utf-8")
    with pytest.raises(ParamsError, match=r"mteb\.tasks: .*NoSuchTask"):
        load_params(bad)
    assert load_params(PARAMS).evaluations.mteb.tasks == "sts"
