"""benchmarks/rates.py: the measured rates file is what it makes of benchmarks/results/, byte
for byte; a GPU suite record is read and preferred at its size; a missing record, or one in a
layout it does not read, is a one-line error naming it that writes nothing."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.rates import REPO, main, measured_rates
from stages.core.planning.estimates import (
    BERT_BASE,
    RATES_FILE,
    RESULTS,
    TRAIN,
    padded_length,
    rates_from_json,
    timing,
    train_step_flops,
)

RECORDS = REPO / RESULTS


def test_the_measured_rates_file_is_current() -> None:
    """measured_rates.json is what `python -m benchmarks.rates` makes of benchmarks/results."""
    assert RATES_FILE.read_text(encoding="utf-8") == (
        json.dumps(measured_rates(RECORDS), indent=1) + "\n"
    ), "stages/core/planning/measured_rates.json is stale: run `python -m benchmarks.rates`"


def test_a_gpu_suite_record_is_read_and_preferred_at_its_size(tmp_path: Path) -> None:
    """Where a device ran benchmarks/gpu_suite.py, its default settings' rate prices a
    BERT-base step on that GPU kind, and the estimate names the record; a smoke record is
    never read."""
    results = tmp_path / "results"
    shutil.copytree(RECORDS, results)
    suite = {"device": "NVIDIA H100 80GB HBM3", "smoke": False,
             "protocol": {"batch_size": 64, "max_seq_length": 32},
             "configs": [{"name": "default", "size": "base", "training_steps_per_s": 100.0,
                          "execution": {"precision": "bf16", "unpadded": True,
                                        "compile": "reduce-overhead"}},
                         {"name": "padded_graphs", "size": "base",
                          "training_steps_per_s": 90.0}]}  # fmt: skip
    (results / "gpu_suite_h100.json").write_text(json.dumps(suite))
    (results / "gpu_suite_h200.json").write_text(json.dumps({**suite, "smoke": True}))
    rates = rates_from_json(measured_rates(results))
    step = timing(rates, TRAIN, "h100", "bf16", train_step_flops(BERT_BASE, 64, padded_length(32)))
    assert step.seconds == pytest.approx(0.01)
    assert step.basis.startswith("gpu_suite_h100.json configs[0] (BERT-base, batch 64, default")
    assert not any(m.record.startswith("gpu_suite_h200") for m in rates.measured)


def test_the_command_writes_the_rates_or_names_the_missing_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "measured_rates.json"
    main(["--results", str(RECORDS), "--out", str(out)])
    assert out.read_bytes() == RATES_FILE.read_bytes()
    assert capsys.readouterr().out == f"wrote {out}\n"
    results = tmp_path / "results"
    shutil.copytree(RECORDS, results)
    (results / "senteval.json").unlink()
    out.unlink()
    with pytest.raises(SystemExit) as exited:
        main(["--results", str(results), "--out", str(out)])
    assert str(exited.value) == (
        f"error: {results / 'senteval.json'} not found: the measured rates are made of the "
        "benchmark records there (--results names another folder)"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "damage", "cause"),
    [
        ("train_gpu.json", lambda text: text[:200], "JSONDecodeError"),
        ("smoke_time.json", lambda text: text.replace('"model":', '"the_model":', 1), "KeyError"),
        ("train_overhead.json", lambda text: re.sub(r"FFN \d+", "FFN", text), "ValueError"),
        ("gpu_suite_h100.json", lambda text: "[1]", "AttributeError"),
    ],
)
def test_a_record_in_another_layout_is_named_and_nothing_is_written(
    tmp_path: Path, name: str, damage: Callable[[str], str], cause: str
) -> None:
    results = tmp_path / "results"
    shutil.copytree(RECORDS, results)
    record = results / name
    # no gpu_suite record is kept in the repository: that case adds one
    record.write_text(damage(record.read_text() if record.is_file() else ""))
    out = tmp_path / "measured_rates.json"
    with pytest.raises(SystemExit) as exited:
        main(["--results", str(results), "--out", str(out)])
    assert str(exited.value).startswith(
        f"error: {record}: not a record benchmarks/rates.py can read ({cause}: "
    )
    assert not out.exists()
