"""The benchmark scripts are not run by the tests (they take minutes to hours), but each must at
least import against the current code: a renamed function otherwise breaks one unnoticed until
someone runs it (``benchmarks/step_throughput.py`` imported a loss function removed months
before)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCHMARKS_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
BENCHMARKS = sorted(
    path.stem
    for path in BENCHMARKS_DIR.glob("*.py")
    if path.stem not in ("__init__", "harness")  # the harness is what the scripts share
)
# benchmarks/rates.py times nothing: it distils the records into the estimates' rates file
RECORDING = [name for name in BENCHMARKS if name != "rates"]


@pytest.mark.parametrize("name", BENCHMARKS)
def test_the_benchmark_script_imports(name: str) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    assert callable(getattr(module, "main", None)), f"benchmarks/{name}.py has no main()"


@pytest.mark.parametrize("name", RECORDING)
def test_the_benchmark_script_records_its_result_through_the_harness(name: str) -> None:
    """A result written any other way lacks the ``meta`` block (commit, machine, load, the
    command) that tells a reader what the figures belong to, or is written in place, where an
    interrupted run leaves half a file over the recorded one."""
    source = (BENCHMARKS_DIR / f"{name}.py").read_text(encoding="utf-8")
    assert "harness.begin(__file__" in source and "harness.write_result(" in source
    assert "write_json" not in source and ".write_text(json.dumps" not in source


def test_train_gpu_counts_the_unpadded_last_layer_on_first_tokens() -> None:
    """The unpadded step skips 3 x 2 (d^2 + 2df) FLOPs (attention output projection and
    feed-forward, forward and backward) for every real token but its row's first; the padded
    step and the attention are counted in full."""
    from benchmarks.train_gpu import BERT_BASE, step_flops

    d, f = BERT_BASE.hidden_size, BERT_BASE.intermediate_size
    rows, length, tokens = 128, 32, 2_803
    whole_last_layer = step_flops(rows, length, BERT_BASE, tokens)
    first_tokens = step_flops(rows, length, BERT_BASE, tokens, unpadded=True)
    assert whole_last_layer - first_tokens == 3 * 2 * (d * d + 2 * d * f) * (tokens - rows)
    assert round(first_tokens / 1e12, 2) == 1.36  # docs/training.md, the GPU estimate
    assert round(step_flops(rows, length, BERT_BASE) / 1e12, 2) == 2.10
