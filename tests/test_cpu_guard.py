"""No silent weeks on a CPU: a matrix too large for a machine without a GPU stops before its
first job, naming the smoke preset and the switch that forces CPU training."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from project_copy import project_copy

from stages.core.identity.experiments import plan_experiments
from stages.core.planning import cpu_guard
from stages.core.schema.params import load_params, parse_params

REPO = Path(__file__).resolve().parents[1]
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_guard, "visible_gpus", lambda: 0)
    monkeypatch.delenv(cpu_guard.FORCE_VARIABLE, raising=False)


def test_a_large_matrix_without_a_gpu_is_stopped(no_gpu: None) -> None:
    message = cpu_guard.cpu_guard(
        plan_experiments(load_params(REPO / "params.yaml")), "params.yaml"
    )
    assert message is not None
    for fragment in ("GPU-hours, about", "no GPU is visible", "params=presets/smoke.yaml",
                     "set train.device: cpu in params.yaml", "CSE_ALLOW_CPU=1"):  # fmt: skip
        assert fragment in message


def test_the_smoke_preset_a_gpu_or_the_switches_let_it_run(
    no_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (
        cpu_guard.cpu_guard(
            plan_experiments(load_params(REPO / "presets/smoke.yaml")), "presets/smoke.yaml"
        )
        is None
    )
    raw = load_params(REPO / "params.yaml").written()
    forced = parse_params({**raw, "train": {**raw["train"], "device": "cpu"}})
    assert cpu_guard.cpu_guard(plan_experiments(forced), "params.yaml") is None
    monkeypatch.setenv(cpu_guard.FORCE_VARIABLE, "1")
    assert (
        cpu_guard.cpu_guard(plan_experiments(load_params(REPO / "params.yaml")), "params.yaml")
        is None
    )
    monkeypatch.delenv(cpu_guard.FORCE_VARIABLE)
    monkeypatch.setattr(cpu_guard, "visible_gpus", lambda: 1)
    assert (
        cpu_guard.cpu_guard(plan_experiments(load_params(REPO / "params.yaml")), "params.yaml")
        is None
    )


def test_the_summary_adds_the_cpu_time_where_auto_training_would_run_on_the_cpu(
    no_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    smoke = plan_experiments(load_params(REPO / "presets/smoke.yaml"))
    text = cpu_guard.summary(smoke, "presets/smoke.yaml")
    assert "GPU-hours in all on an NVIDIA H100; with no GPU visible here, " in text
    assert "CPU-minutes in all on the project's 2-core CPU" in text
    monkeypatch.setattr(cpu_guard, "visible_gpus", lambda: 1)
    assert "no GPU visible" not in cpu_guard.summary(smoke, "presets/smoke.yaml")


@pytest.mark.e2e
def test_both_orchestrators_stop_before_any_work(tmp_path: Path) -> None:
    root = project_copy(tmp_path, None)  # params.yaml: BERT-base, about 8 GPU-hours
    snakemake = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "--resources", "gpu=1"],
        cwd=root, env=NO_GPU, capture_output=True, text=True,
    )  # fmt: skip
    assert snakemake.returncode != 0
    assert "estimated" in snakemake.stdout + snakemake.stderr
    assert "no GPU is visible" in snakemake.stdout + snakemake.stderr
    assert not (root / "data").exists()  # not even a download ran
    # DVC runs the same stage command; the train stage stops before reading any data
    train = subprocess.run(
        [sys.executable, "-m", "stages.train", "simcse.bert-base.s42"],
        cwd=root, env={**NO_GPU, "PYTHONPATH": str(root)}, capture_output=True, text=True,
    )  # fmt: skip
    assert train.returncode == 2 and "no GPU is visible" in train.stderr
    assert not (root / "runs").exists()
