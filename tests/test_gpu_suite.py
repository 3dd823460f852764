"""benchmarks/gpu_suite.py, the one prepared device suite (issues 42, 52): each call's plan fits
the 8 minutes with the measured compile time; its corpus makes full batches only; its JSON is
written after every part, so a killed call keeps what finished; its compiled-vs-eager check
fails where the steps differ; its decision reads the unpadded graphs against the padded ones;
its smoke run on the CPU compiles the graph configs for real and writes every figure."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import gpu_checks, gpu_suite, harness, train_gpu
from stages.core.schema.params import BackboneParams, TrainParams
from stages.training.data import BatchPlan, read_corpus

REPO = Path(__file__).resolve().parents[1]
SAMPLE = harness.data_dir() / "corpus" / "wiki1m_head_11913.txt"


def test_each_call_fits_the_budget_with_the_measured_compile_time() -> None:
    for call in gpu_suite.CALLS:
        assert gpu_suite.planned_total(call) <= gpu_suite.BUDGET_S < gpu_suite.LIMIT_S
    configs = {f"{size}/{name}" for size in gpu_suite.SIZES for name in gpu_suite.CONFIGS}
    sharing = {f"{gpu_suite.SHARING_SIZE}/sharing_k{k}" for k in gpu_suite.KS}
    arccse = {f"arccse/{name}" for name in gpu_suite.ARCCSE_CONFIGS}
    others = {"base/peer", "gpu_checks", "compiled_vs_eager"}
    assert set(gpu_suite.PLAN) == configs | sharing | arccse | others
    assert {part.call for part in gpu_suite.PLAN.values()} == set(gpu_suite.CALLS)
    # every cold compile of a BERT-base step budgets the ~65 s measured for padded graphs
    for name in ("base/default", "base/unpadded_graphs", "base/sharing_k1", "arccse/default"):
        assert gpu_suite.PLAN[name].warmup_s >= gpu_suite.COMPILE_S
    assert gpu_suite.UNPLANNED["base"].warmup_s >= gpu_suite.COMPILE_S
    # the deciding figures come first in the first call
    first = [name for name, part in gpu_suite.PLAN.items() if part.call == 1]
    assert first[:4] == [
        "base/default", "base/unpadded_graphs", "base/padded_graphs", "compiled_vs_eager",
    ]  # fmt: skip


def test_the_records_of_the_calls_are_named_apart() -> None:
    assert gpu_suite.record_name("NVIDIA H200", [1]) == "gpu_suite_h200.json"
    assert gpu_suite.record_name("NVIDIA H100 80GB HBM3", [3]) == "gpu_suite_h100_call3.json"


def test_the_corpus_is_cut_to_full_batches(tmp_path: Path) -> None:
    """The 11,913-line sample ends in a batch of 9 rows; its first 11,904 lines in the same
    order make 186 full batches of 64 in every epoch."""
    lines = read_corpus(SAMPLE)
    assert BatchPlan(len(lines), 64, 42).global_batch(186).size == 9
    cut = gpu_suite.full_batches_corpus(SAMPLE, 64, tmp_path)
    assert read_corpus(cut) == lines[:11_904]
    plan = BatchPlan(11_904, 64, 42)
    assert plan.steps_per_epoch == 186
    assert all(plan.global_batch(step).size == 64 for step in range(2 * 186))
    assert gpu_suite.full_batches_corpus(cut, 32, tmp_path) == cut  # already whole
    few = tmp_path / "few.txt"
    few.write_text("a\nb\n")
    with pytest.raises(ValueError, match="2 lines make no full batch of 64"):
        gpu_suite.full_batches_corpus(few, 64, tmp_path)


def suite_args(tmp_path: Path) -> argparse.Namespace:
    return argparse.Namespace(
        smoke=True, precision="auto", device="cpu", warmup=1, limit_s=None, calls=[1],
        corpus=SAMPLE, senteval=train_gpu.default_path("senteval"),
        out=tmp_path / "suite.json",
    )  # fmt: skip


def fake_run(*args: Any, settings: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """What train_gpu.run returns, without training."""
    return {
        "steady_steps_per_s": 5.0,
        "training_steps_per_s": 6.0,
        "execution": {"compile": settings["compile"], "unpadded": settings["unpad"]},
    }


def two_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = [
        gpu_suite.Part("base/default", 1, 6, 1.0, 0.0),
        gpu_suite.Part("base/peer", 1, 6, 1.0, 0.0),
    ]
    monkeypatch.setattr(gpu_suite, "PLAN", {part.name: part for part in parts})
    monkeypatch.setattr(train_gpu, "run", fake_run)


def test_a_call_killed_in_a_part_keeps_the_parts_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The peer's part is interrupted (the device tool's time limit, a Ctrl-C): the record on
    disk holds the default's figures and says it is not finished."""
    two_parts(monkeypatch)

    def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(train_gpu, "peer", interrupted)
    args = suite_args(tmp_path)
    suite = gpu_suite.Suite(args, harness.begin(__file__, []), "cpu", tmp_path)
    with pytest.raises(KeyboardInterrupt):
        suite.run()
    record = json.loads(args.out.read_text())
    assert record["finished"] is False and record["peer"] is None
    (default,) = record["configs"]
    assert default["name"] == "default" and default["steady_steps_per_s"] == 5.0
    assert record["ratios"]["default_steps_per_s"] == 5.0
    assert set(record["budget"]["spent_s"]) == {"base/default"}
    assert not list(tmp_path.glob("*.tmp*")), "a temporary file was left beside the record"


def test_a_failed_part_is_recorded_and_the_call_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    two_parts(monkeypatch)
    monkeypatch.setattr(
        train_gpu, "peer", lambda *args: {"size": "base", "steady_steps_per_s": 2.0}
    )

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(train_gpu, "run", broken)
    args = suite_args(tmp_path)
    suite = gpu_suite.Suite(args, harness.begin(__file__, []), "cpu", tmp_path)
    suite.run()
    record = json.loads(args.out.read_text())
    assert record["finished"] is True
    assert record["configs"][0]["error"] == "RuntimeError: CUDA out of memory"
    assert record["peer"]["steady_steps_per_s"] == 2.0
    assert suite.failures() == ["base/default: RuntimeError: CUDA out of memory"]


def outputs(loss: float, views: list[Any], grad: list[float]) -> gpu_checks.StepOutputs:
    return gpu_checks.StepOutputs(loss, torch.tensor(views), {"w": torch.tensor(grad)})


def test_the_compiled_step_check_fails_where_the_steps_differ() -> None:
    eager = outputs(2.0, [1.0, 2.0], [1.0, -1.0, 0.5])
    within = outputs(2.0 + 1e-3, [1.0, 2.0], [1.0 + 1e-3, -1.0, 0.5])
    off = outputs(2.0, [1.0, 2.0], [1.0, -0.9, 0.5])
    assert gpu_checks.agreement(within, eager, 2e-2)["passed"]
    result = gpu_checks.agreement(off, eager, 2e-2)
    assert not result["passed"] and result["grad_max_abs_diff"] == pytest.approx(0.1)
    assert not gpu_checks.agreement(within, eager, 1e-4)["passed"]
    wrong_loss = outputs(2.1, [1.0, 2.0], [1.0, -1.0, 0.5])
    assert not gpu_checks.agreement(wrong_loss, eager, 2e-2)["passed"]


def test_the_mask_check_fails_where_a_replay_repeats_the_masks() -> None:
    first = outputs(1.0, [[1.0, 0.0], [0.0, 1.0]], [0.0])  # views: z row, z_pos row
    frozen = outputs(1.0, [[1.0, 0.0], [0.0, 1.0]], [0.0])
    fresh = outputs(1.0, [[0.9, 0.2], [0.1, 1.1]], [0.0])
    assert gpu_checks.fresh_masks(first, fresh)["passed"]
    assert not gpu_checks.fresh_masks(first, frozen)["passed"]
    same_views = outputs(1.0, [[1.0, 0.0], [1.0, 0.0]], [0.0])
    assert not gpu_checks.fresh_masks(same_views, fresh)["passed"]


def test_the_compiled_step_check_catches_a_step_that_computes_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole check on the loop's parts, eager on both sides (no compilation: seconds): the
    two steps agree; with the checked step's head weights moved, the check fails."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(line + "\n" for line in read_corpus(SAMPLE)[:128]))
    backbone = BackboneParams(model=gpu_checks.BACKBONE.model, random_init=train_gpu.SMOKE)
    train = TrainParams(
        batch_size=64, max_seq_length=32, max_steps=1, eval_steps=1, device="cpu", compile=False
    )
    result = gpu_checks.compiled_step_check(train, backbone, corpus, tmp_path)
    assert result["passed"] and result["agreement"]["grad_rel_error"] == 0.0
    assert result["fresh_masks"]["replays_rel_diff"] > gpu_checks.FRESH_MASKS

    built = gpu_checks.check_training
    runs: list[TrainParams] = []

    def moved(train: TrainParams, *args: Any):
        training = built(train, *args)
        runs.append(train)
        if len(runs) > 1:  # the step checked (the eager step's parts are built first)
            with torch.no_grad():
                training.encoder.pooler.dense.bias.add_(0.05)
        return training

    monkeypatch.setattr(gpu_checks, "check_training", moved)
    failed = gpu_checks.compiled_step_check(train, backbone, corpus, tmp_path)
    assert not failed["passed"] and not failed["agreement"]["passed"]


def test_the_decision_is_one_reading_of_the_rate_and_the_agreement() -> None:
    def configs(unpadded: float, padded: float) -> list[dict[str, Any]]:
        return [
            {"name": "unpadded_graphs", "size": "base", "training_steps_per_s": unpadded},
            {"name": "padded_graphs", "size": "base", "training_steps_per_s": padded},
            {"name": "unpadded_graphs", "size": "large", "training_steps_per_s": 1.0},
        ]

    def checks(unpadded: bool, padded: bool = True) -> list[dict[str, Any]]:
        return [
            {"config": "unpadded_graphs", "passed": unpadded},
            {"config": "padded_graphs", "passed": padded},
        ]

    faster = gpu_suite.decision(configs(60.0, 50.0), checks(True))
    assert faster["unpadded_over_padded_graphs"] == pytest.approx(1.2)
    assert faster["verdict"].startswith("make unpadded graphs the default: 1.200x")
    slower = gpu_suite.decision(configs(45.0, 50.0), checks(True))
    assert slower["verdict"].startswith("keep padded graphs the default")
    disagreeing = gpu_suite.decision(configs(60.0, 50.0), checks(False))
    assert disagreeing["verdict"].endswith("unpadded_graphs disagree with eager")
    unmeasured = gpu_suite.decision(configs(60.0, 50.0)[:1], checks(True)[:1])
    assert unmeasured["verdict"] == (
        "undecided: not measured (padded_graphs, padded_graphs's check)"
    )


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


@pytest.mark.parametrize("lines", [None, 10])
def test_a_corpus_that_makes_no_full_batch_is_refused_in_one_line(
    lines: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    corpus = tmp_path / "corpus.txt"
    if lines:
        corpus.write_text("a sentence\n" * lines)
    argv = ["gpu_suite", "--smoke", "--corpus", str(corpus), "--out", str(tmp_path / "s.json")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as raised:
        gpu_suite.main()
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert raised.value.code == 2 and str(corpus) in message
    assert ("no such file" if lines is None else "10 lines make no full batch of 64") in message


@pytest.mark.slow
def test_the_smoke_run_compiles_the_graph_configs_and_writes_every_figure(
    tmp_path: Path,
) -> None:
    """Every call's parts end to end on the CPU: tiny encoders (but in the compiled-vs-eager
    check), a few steps, the graph configs and the checks compiled by inductor (without CUDA
    graphs, which need CUDA), ArcCSE at its preset's lengths, k = 1, 2, 4 processes, the peer,
    gpu_checks."""
    out = tmp_path / "gpu_suite_smoke.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_suite", "--smoke", "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert_every_figure(json.loads(out.read_text()))


def assert_every_figure(record: dict[str, Any]) -> None:
    """What a smoke run's record must hold."""
    assert {"date", "commit", "machine", "load_average_before", "load_average_after"} <= set(
        record["meta"]
    )
    assert record["finished"] is True and record["calls"] == list(gpu_suite.CALLS)
    assert record["smoke"] is True and record["device"] == "cpu"
    assert record["skipped"] == [] and set(record["sizes"]) == {"base", "large"}
    assert record["protocol"]["corpus"].endswith("wiki1m_head_11913_first_11904.txt")

    configs = {(c["size"], c["name"]): c for c in record["configs"]}
    assert set(configs) == {(s, n) for s in gpu_suite.SIZES for n in gpu_suite.CONFIGS}
    for config in configs.values():
        assert "error" not in config and not config["cuda_graphs"]
        assert config["steady_steps_per_s"] > 0 and config["training_steps_per_s"] > 0
    for size in gpu_suite.SIZES:
        default = configs[size, "default"]
        assert default["settings"]["compile"] == "auto"
        assert default["execution"]["compile"] is False  # auto on a CPU: eager
        for name, unpadded in (("unpadded_graphs", True), ("padded_graphs", False)):
            graphs = configs[size, name]  # compiled for real, so no config stands for another
            assert "same_as" not in graphs
            assert graphs["execution"]["compile"] == "reduce-overhead"
            assert graphs["execution"]["unpadded"] is unpadded

    checked = {c["config"]: c for c in record["compiled_vs_eager"]}
    assert set(checked) == set(gpu_suite.GRAPH_CONFIGS)
    for check in checked.values():
        assert "error" not in check and check["passed"], check
        assert check["agreement"]["compile"] == "reduce-overhead"
        assert check["agreement"]["bound"] == gpu_checks.STEP_BOUNDS["fp32"]
        assert check["encoder"] == gpu_checks.CHECK_SIZE.model_dump()
    assert checked["unpadded_graphs"]["agreement"]["unpadded"] is True
    assert checked["padded_graphs"]["agreement"]["unpadded"] is False

    arccse = {entry["name"]: entry for entry in record["arccse"]}
    assert set(arccse) == set(gpu_suite.ARCCSE_CONFIGS)
    for entry in arccse.values():
        assert "error" not in entry and entry["steady_steps_per_s"] > 0
        assert entry["settings"]["max_seq_length"] == 512 and entry["settings"]["sam"]
    assert arccse["default"]["execution"]["batches_per_update"] == 1
    assert arccse["accumulation"]["execution"]["batches_per_update"] == 2
    assert arccse["accumulation"]["execution"]["compile"] is False

    sharing = {entry["k"]: entry for entry in record["sharing"]}
    assert set(sharing) == set(gpu_suite.KS)
    for k, entry in sharing.items():
        assert "error" not in entry and len(entry["runs"]) == k
        assert all(rate > 0 for rate in entry["per_run_steps_per_s"])
        assert entry["summed_steps_per_s"] > 0 and entry["summed_over_single"] > 0

    assert "error" not in record["peer"] and record["peer"]["steady_steps_per_s"] > 0
    checks = record["gpu_checks"]
    assert checks["total"] > 0 and checks["passed"] == checks["total"]

    ratios = record["ratios"]
    for key in ("default_steps_per_s", "best_single_run_steps_per_s", "ours_over_peer"):
        assert ratios[key] > 0
    assert set(ratios["sharing_summed_over_single"]) == {"1", "2", "4"}
    assert record["by_size"]["base"] == ratios
    decision = record["decision"]
    assert decision["unpadded_over_padded_graphs"] > 0
    assert decision["agrees_with_eager"] == {"unpadded_graphs": True, "padded_graphs": True}
    assert decision["verdict"].startswith(("make unpadded", "keep padded"))
    assert set(record["budget"]["spent_s"]) == set(gpu_suite.PLAN)  # on a CPU no twin
