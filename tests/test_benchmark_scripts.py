"""The benchmark scripts are not run by the tests (they take minutes to hours), but each must at
least import against the current code: a renamed function otherwise breaks one unnoticed until
someone runs it (``benchmarks/step_throughput.py`` imported a loss function removed months
before)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCHMARKS = sorted(
    path.stem
    for path in (Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py")
    if path.stem != "__init__"
)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_the_benchmark_script_imports(name: str) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    assert callable(getattr(module, "main", None)), f"benchmarks/{name}.py has no main()"
