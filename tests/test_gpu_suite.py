"""benchmarks/gpu_suite.py, the one prepared device suite (issue 42): its smoke run on the CPU
writes the JSON a device run writes, with a positive rate for every config; its time plan fits
the 8 minutes; its sharing and training rates read the step ends right."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_suite, harness, train_gpu

REPO = Path(__file__).resolve().parents[1]


def test_the_plan_fits_the_budget_and_names_every_part() -> None:
    assert gpu_suite.planned_total() <= gpu_suite.BUDGET_S < gpu_suite.LIMIT_S
    configs = {f"{size}/{name}" for size in gpu_suite.SIZES for name in gpu_suite.CONFIGS}
    sharing = {f"{gpu_suite.SHARING_SIZE}/sharing_k{k}" for k in gpu_suite.KS}
    assert set(gpu_suite.PLAN) == configs | sharing | {"base/peer", "gpu_checks"}


def test_sharing_rates_are_taken_over_the_window_where_all_runs_train() -> None:
    """Two runs released at t = 10: the first steps every 0.1 s and ends at t = 11.05, the
    second steps every 0.2 s and runs on to t = 21.1. Over the window (10, 11.05] the first
    steps at 10 a second, the second at 5."""
    first = {"released_at": 10.0, "clock_ends": [9.55 + 0.1 * i for i in range(16)]}
    second = {"released_at": 10.0, "clock_ends": [9.9 + 0.2 * i for i in range(57)]}
    rates = gpu_suite.window_rates([first, second])
    assert rates["window_s"] == pytest.approx(1.05)
    assert rates["per_run_steps_per_s"] == pytest.approx([10.0, 5.0])
    assert rates["summed_steps_per_s"] == pytest.approx(15.0)


def test_the_training_rate_leaves_out_the_intervals_that_hold_an_evaluation() -> None:
    """Steps of 0.1 s, an evaluation of 1 s after every 4th step; 2 warm-up steps."""
    ends, t = [], 0.0
    for step in range(1, 13):
        t += 0.1 + (1.0 if step > 1 and (step - 1) % 4 == 0 else 0.0)
        ends.append(t)
    assert train_gpu.training_rate(ends, 2, 4) == pytest.approx(10.0)
    assert train_gpu.steady_rate(ends, 2) < 10.0 / 2


def test_a_smoke_run_never_writes_to_the_recorded_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = harness.RESULTS / "gpu_suite_smoke.json"
    monkeypatch.setattr(sys, "argv", ["gpu_suite", "--smoke", "--out", str(out)])
    with pytest.raises(SystemExit) as raised:
        gpu_suite.main()
    assert raised.value.code == 2 and not out.exists()


@pytest.mark.slow
def test_the_smoke_run_writes_every_figure_of_the_suite(tmp_path: Path) -> None:
    """The whole suite end to end on the CPU (about a minute on 2 cores): tiny encoders, a few
    steps, the graph configs eager, k = 1, 2, 4 processes, the peer, the checks."""
    out = tmp_path / "gpu_suite_smoke.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_suite", "--smoke", "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads(out.read_text())

    assert {"date", "commit", "machine", "load_average_before", "load_average_after"} <= set(
        record["meta"]
    )
    assert record["smoke"] is True and record["device"] == "cpu"
    assert record["skipped"] == [] and set(record["sizes"]) == {"base", "large"}

    configs = {(c["size"], c["name"]): c for c in record["configs"]}
    assert set(configs) == {(s, n) for s in gpu_suite.SIZES for n in gpu_suite.CONFIGS}
    for config in configs.values():
        assert "error" not in config
        assert config["steady_steps_per_s"] > 0 and config["training_steps_per_s"] > 0
        assert config["execution"]["compile"] is False  # eager on a CPU, whatever was asked
    for size in gpu_suite.SIZES:
        default = configs[size, "default"]
        assert default["settings"]["compile"] == "auto" and not default["ran_eager"]
        # the default resolved on the CPU to eager and unpadded: the unpadded config's stand-in
        assert configs[size, "unpadded_graphs"]["same_as"] == "default"
        padded = configs[size, "padded_graphs"]
        assert padded["ran_eager"] and padded["settings"]["compile"] == "reduce-overhead"
        assert padded["execution"]["unpadded"] is False

    sharing = {entry["k"]: entry for entry in record["sharing"]}
    assert set(sharing) == set(gpu_suite.KS)
    for k, entry in sharing.items():
        assert "error" not in entry and len(entry["runs"]) == k
        assert len(entry["per_run_steps_per_s"]) == k
        assert all(rate > 0 for rate in entry["per_run_steps_per_s"])
        assert entry["summed_steps_per_s"] > 0 and entry["summed_over_single"] > 0

    assert "error" not in record["peer"] and record["peer"]["steady_steps_per_s"] > 0
    checks = record["gpu_checks"]
    assert checks["total"] > 0 and checks["passed"] == checks["total"]

    ratios = record["ratios"]
    for key in ("default_steps_per_s", "best_single_run_steps_per_s", "ours_over_peer"):
        assert ratios[key] > 0
    assert set(ratios["sharing_summed_over_single"]) == {"1", "2", "4"}
    assert ratios["default_resolved"] == {"compile": False, "unpadded": True}
    assert record["by_size"]["base"] == ratios
    assert set(record["budget"]["spent_s"]) >= {"base/default", "base/sharing_k4", "gpu_checks"}
