"""``train.compile``: the training forward under ``torch.compile(dynamic=True)``, with
``reduce-overhead`` replayed as CUDA graphs.

On a GPU it failed twice on torch 2.11 (dynamo in the unpadded forward's dropout arithmetic,
since removed), and no test compiled it: here the real backend (inductor, C++ on the CPU)
compiles the packed and the padded forward with dropout on, and a run trains, evaluates and
saves. A batch's real-token count changes every step; with dynamic shapes that must not
recompile the forward each time."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
from train_helpers import make_job, model_weights

from stages.core.storage.run_folders import read_log
from stages.modeling import unpadded
from stages.training.loop import train


@pytest.mark.slow  # inductor compiles C++ kernels: ~15-25 s a run on two cores
@pytest.mark.parametrize(
    ("unpad", "gpu_way", "setting"),
    [
        (True, False, True),
        (True, True, True),
        (False, False, True),
        (True, True, "reduce-overhead"),
    ],
    ids=["unpadded", "unpadded-gpu-way", "padded", "unpadded-gpu-way-bucketed"],
)
def test_a_compiled_run_trains_evaluates_and_saves(
    unpad: bool, gpu_way: bool, setting: Any, corpus, token_cache, dev_evaluator, tmp_path,
    monkeypatch,
) -> None:  # fmt: skip
    """``gpu_way``: the unpadded forward's dropout as on a GPU (each dropout module on the rows
    scattered into the padded layout, ``padded_dropout``), the path a lent GPU compiles;
    ``reduce-overhead``: with it the bucketed packing a GPU's CUDA graphs replay (on a CPU the
    mode compiles as ``true`` does: no graphs are recorded here)."""
    if gpu_way:
        monkeypatch.setattr(unpadded, "_launch_bound", lambda device: True)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() leaves them: this run's frames alone
    out = tmp_path / "run"
    job = make_job(
        corpus, out, token_cache, dropout=0.1, unpad=unpad, max_steps=6, eval_steps=6,
        compile=setting,
    )  # fmt: skip
    initial = {k: v.clone() for k, v in job_initial_weights(job).items()}
    metrics = train(job, dev_evaluator)
    losses = [r["loss"] for r in read_log(out / "log.jsonl") if r["event"] == "train"]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert metrics["best"]["step"] == 6 and math.isfinite(metrics["best"]["spearman"])
    trained = model_weights(out / "final")
    assert any(not torch.equal(trained[k], initial[k]) for k in initial if k in trained)
    # one graph for the forward (and its backward), not one per batch shape
    frames = torch._dynamo.utils.counters["frames"]
    assert frames["total"] == frames["ok"] == 1, dict(frames)


def job_initial_weights(job) -> dict[str, torch.Tensor]:
    from stages.modeling.backbone import load_backbone

    return load_backbone(job.backbone, seed=job.seed).state_dict()


@pytest.mark.parametrize(
    ("setting", "mode"), [(True, None), ("reduce-overhead", "reduce-overhead")]
)
def test_the_compile_setting_reaches_torch_compile(
    setting: Any, mode: str | None, corpus, token_cache, dev_evaluator, tmp_path, monkeypatch
) -> None:
    """CUDA graphs cannot be recorded on the CPU: what is checked here is the call (the
    training forward, dynamic shapes, the mode) and the record of it; the H100 runs of
    ``benchmarks/train_gpu.py --compile reduce-overhead`` are in docs/training.md."""
    calls: list[dict[str, Any]] = []

    def record(module, **options):
        calls.append(options)
        return module

    monkeypatch.setattr(torch, "compile", record)
    out = tmp_path / "run"
    job = make_job(
        corpus, out, token_cache, unpad=False, max_steps=2, eval_steps=2, compile=setting
    )
    train(job, dev_evaluator)
    assert calls == [{"dynamic": True, "mode": mode}]
    assert json.loads((out / "config.json").read_text())["execution"]["compile"] == setting


def test_compile_auto_resolves_per_device_and_config_json_records_it(
    corpus, token_cache, dev_evaluator, tmp_path, monkeypatch
) -> None:
    """``auto`` on this CPU: eager, recorded as such (on one GPU: reduce-overhead,
    ``runtime.resolve_compile``)."""
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("compiled on a CPU"))
    out = tmp_path / "run"
    job = make_job(corpus, out, token_cache, max_steps=2, eval_steps=2, compile="auto")
    train(job, dev_evaluator)
    execution = json.loads((out / "config.json").read_text())["execution"]
    assert execution["compile"] is False and execution["unpadded"]
