"""``train.compile``: the training forward under ``torch.compile(dynamic=True)``, with
``reduce-overhead`` replayed as CUDA graphs; what ``auto`` resolves to (and ``precision:
auto``), its fallback to eager when compiling fails, dynamo's counts in config.json.

On a GPU it failed twice on torch 2.11 (dynamo in the unpadded forward's dropout arithmetic,
since removed), and no test compiled it: here the real backend (inductor, C++ on the CPU)
compiles the packed and the padded forward with dropout on, and a run trains, evaluates and
saves. A batch's real-token count changes every step; with dynamic shapes that must not
recompile the forward each time."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from train_helpers import assert_same_weights, make_job, model_weights

from stages.core.errors import StageError
from stages.core.planning.status import run_environment
from stages.core.schema.params import TrainParams
from stages.core.storage.run_folders import read_log
from stages.modeling import unpadded
from stages.training import runtime
from stages.training.compile_watch import first_compiled_step
from stages.training.loop import train
from stages.training.runtime import (
    CompileChoice,
    resolve_compile,
    resolve_runtime,
    unmeasured_under_graphs,
)

GPU, CPU = torch.device("cuda", 0), torch.device("cpu")
ONE_GPU_PROCESS = {"processes": 1, "chunked": False, "accumulation_steps": 1, "unpad": True}


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
    assert execution["compile_reason"] == "eager: CPU" and execution["dynamo"] is None


GRAPHS = CompileChoice("reduce-overhead", False, "CUDA graphs, padded (measured): one GPU process")


@pytest.mark.parametrize(
    ("device", "changed", "expected"),
    [
        (GPU, {}, GRAPHS),
        (GPU, {"unpad": False}, GRAPHS),
        (CPU, {}, CompileChoice(False, True, "eager: CPU")),
        (GPU, {"processes": 2}, CompileChoice(False, True, "eager: several processes (DDP)")),
        (GPU, {"chunked": True}, CompileChoice(False, True, "eager: embedding_chunk_size")),
        (
            GPU,
            {"accumulation_steps": 2},
            CompileChoice(False, True, "eager: gradient accumulation"),
        ),
        (
            GPU,
            {"unmeasured": ("SAM", "the triplet branch")},
            CompileChoice(
                False, True, "eager: SAM, the triplet branch (unmeasured under CUDA graphs)"
            ),
        ),
    ],
    ids=["one-gpu", "one-gpu-padded", "cpu", "ddp", "chunked", "accumulation", "unmeasured"],
)
def test_compile_auto_takes_only_what_a_gpu_has_measured(
    device: torch.device, changed: dict[str, Any], expected: CompileChoice
) -> None:
    """Padded CUDA graphs (the only graphs a GPU has run) where they are safe, eager elsewhere;
    the forward is padded under auto's graphs although ``unpad`` defaults to true."""
    assert resolve_compile("auto", device, **{**ONE_GPU_PROCESS, **changed}) == expected


def test_graphs_are_unmeasured_for_sam_triplets_and_checkpointing() -> None:
    """SimCSE's step is what a GPU measured under graphs; ArcCSE (SAM, triplets) and gradient
    checkpointing run eager under auto until the device suite measures them."""
    assert unmeasured_under_graphs(sam=False, triplets=False, gradient_checkpointing=False) == ()
    assert unmeasured_under_graphs(sam=True, triplets=True, gradient_checkpointing=True) == (
        "SAM",
        "the triplet branch",
        "gradient checkpointing",
    )


def test_an_explicit_compile_setting_is_taken_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bucketed unpadded graphs stay available (``reduce-overhead`` with ``unpad``), and
    making them auto's choice is the one constant ``AUTO_GRAPHS_UNPADDED``."""
    bucketed = resolve_compile("reduce-overhead", GPU, **ONE_GPU_PROCESS)
    assert bucketed == CompileChoice(
        "reduce-overhead", True, "CUDA graphs: train.compile reduce-overhead"
    )
    for setting, label in ((False, "eager"), (True, "compiled")):
        choice = resolve_compile(setting, CPU, **{**ONE_GPU_PROCESS, "processes": 2})
        assert choice == CompileChoice(
            setting, True, f"{label}: train.compile {str(setting).lower()}"
        )
    monkeypatch.setattr(runtime, "AUTO_GRAPHS_UNPADDED", True)
    assert resolve_compile("auto", GPU, **ONE_GPU_PROCESS).unpad
    assert not resolve_compile("auto", GPU, **{**ONE_GPU_PROCESS, "unpad": False}).unpad
    assert resolve_runtime("cpu", "fp32").compile is False  # compile defaults to false here


@pytest.mark.parametrize(
    ("capability", "precision"),
    [((7, 0), "fp32"), ((7, 5), "fp32"), ((8, 0), "bf16"), ((8, 9), "bf16"), ((9, 0), "bf16")],
    ids=["V100", "T4", "A100", "L4", "H100"],
)
def test_precision_auto_is_bf16_only_where_the_gpu_computes_it_natively(
    capability: tuple[int, int], precision: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """V100, T4 and RTX 20xx report bf16 support (``is_bf16_supported``) but emulate it: fp32
    there; an explicit bf16 is still taken."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert resolve_runtime("auto", "auto").precision == precision
    assert resolve_runtime("cuda", "bf16").precision == "bf16"
    assert resolve_runtime("cpu", "auto").precision == "fp32"


@pytest.mark.parametrize("setting", [True, "reduce-overhead"])
def test_an_explicit_compile_with_gradient_accumulation_is_refused(setting: Any) -> None:
    with pytest.raises(ValidationError) as err:
        TrainParams(compile=setting, gradient_accumulation_steps=2)
    message = str(err.value)
    assert f"compile: {str(setting).lower()} with gradient_accumulation_steps: 2" in message
    for accepted in ("auto", False):
        assert TrainParams(compile=accepted, gradient_accumulation_steps=2).compile == accepted


def test_the_eager_rerun_starts_from_the_state_before_the_failed_step() -> None:
    """What a step did before compiling failed (dropout drawn, SAM's move of the weights,
    gradients) is undone before the rerun."""
    model = torch.nn.Linear(3, 2)
    fell_back: list[str] = []
    run = SimpleNamespace(
        model=model, params=list(model.parameters()), runtime=resolve_runtime("cpu", "fp32"),
        job=SimpleNamespace(train=SimpleNamespace(compile="auto")), step=4,
        fall_back_to_eager=fell_back.append,
    )  # fmt: skip
    before = model.weight.detach().clone()
    seen = []

    def take_step() -> None:
        seen.append((model.weight.detach().clone(), torch.rand(4), model.weight.grad))
        if len(seen) == 1:
            with torch.no_grad():
                model.weight.add_(1.0)
            model.weight.grad = torch.ones_like(model.weight)
            failure = torch._inductor.exc.InvalidCxxCompiler()
            raise torch._dynamo.exc.BackendCompilerFailed(raise_missing_compiler, failure, None)

    with pytest.warns(UserWarning, match="fell back to eager at step 5"):
        assert first_compiled_step(run, take_step)
    (_, first_draw, _), (weights, draw, grad) = seen
    assert torch.equal(weights, before) and torch.equal(draw, first_draw) and grad is None
    assert fell_back == [
        "eager: compiling failed at step 5 (InvalidCxxCompiler: No working C++ compiler found "
        "in torch._inductor.config.cpp.cxx: (None, 'g++'))"
    ]


def raise_missing_compiler(graph, example_inputs):  # a torch.compile backend
    raise torch._inductor.exc.InvalidCxxCompiler()


def compile_with(monkeypatch: pytest.MonkeyPatch, backend: Any, **forced: Any) -> list[dict]:
    """torch.compile as the trainer calls it, with ``backend`` (and ``forced`` options) instead
    of inductor; returns the calls' options."""
    real, calls = torch.compile, []

    def compile_(module, **options):
        calls.append(options)
        options = {**options, **forced}
        options.pop("mode", None)  # a mode is inductor's; these backends take none
        return real(module, backend=backend, **options)

    monkeypatch.setattr(torch, "compile", compile_)
    torch._dynamo.reset()
    return calls


def as_if_on_one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """``compile: auto`` resolved as on one GPU process (on the CPU reduce-overhead compiles as
    ``true``: no graphs)."""
    real = runtime.resolve_compile
    monkeypatch.setattr(
        runtime, "resolve_compile", lambda setting, device, **kw: real(setting, GPU, **kw)
    )


def test_compile_auto_on_one_gpu_trains_the_padded_forward_under_graphs(
    corpus, token_cache, dev_evaluator, tmp_path, monkeypatch
) -> None:
    """``unpad`` defaults to true, yet auto's graphs take the padded forward, and config.json
    says so and why."""
    as_if_on_one_gpu(monkeypatch)
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(torch, "compile", lambda module, **options: calls.append(options) or module)
    out = tmp_path / "run"
    train(make_job(corpus, out, token_cache, max_steps=2, eval_steps=2), dev_evaluator)
    assert calls == [{"dynamic": True, "mode": "reduce-overhead"}]
    execution = json.loads((out / "config.json").read_text())["execution"]
    assert (execution["compile"], execution["unpadded"]) == ("reduce-overhead", False)
    assert execution["compile_reason"] == GRAPHS.reason
    assert execution["packed_rows_multiple"] is None  # no packing: the padded forward


def run_records(out: Path) -> list[dict[str, Any]]:
    """The log's records without wall times."""
    return [{k: v for k, v in r.items() if k != "eval_s"} for r in read_log(out / "log.jsonl")]


def test_compile_auto_falls_back_to_eager_when_compiling_fails(
    corpus, token_cache, dev_evaluator, tmp_path, monkeypatch
) -> None:
    """A backend failure at the first step (a missing C compiler): one warning, the step rerun
    eagerly from the state before it, and the run equals an eager run bit for bit; config.json
    says compile false and why."""
    settings = {"max_steps": 4, "eval_steps": 2, "checkpoint_steps": 100}
    eager = tmp_path / "eager"
    train(
        make_job(corpus, eager, token_cache, compile=False, unpad=False, **settings), dev_evaluator
    )

    as_if_on_one_gpu(monkeypatch)
    calls = compile_with(monkeypatch, raise_missing_compiler)
    out = tmp_path / "auto"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(make_job(corpus, out, token_cache, compile="auto", **settings), dev_evaluator)
    assert calls == [{"dynamic": True, "mode": "reduce-overhead"}]
    fallback = [str(w.message) for w in caught if "fell back" in str(w.message)]
    assert len(fallback) == 1 and "\n" not in fallback[0], fallback
    assert "train.compile: false" in fallback[0] and "InvalidCxxCompiler" in fallback[0]
    assert run_records(out) == run_records(eager)
    assert_same_weights(out / "final", eager / "final")
    assert_same_weights(out / "best", eager / "best")
    execution = json.loads((out / "config.json").read_text())["execution"]
    assert execution["compile"] is False and execution["unpadded"] is False  # padded, as resolved
    assert execution["compile_reason"].startswith(
        "eager: compiling failed at step 1 (InvalidCxxCompiler"
    )
    assert execution["dynamo"]["frames_compiled"] == 0  # the one attempt failed
    assert "(eager: compiling failed at step 1" in run_environment({"execution": execution})


@pytest.mark.parametrize("setting", [True, "reduce-overhead"])
def test_an_explicit_compile_that_fails_stops_with_one_line(
    setting: Any, corpus, token_cache, dev_evaluator, tmp_path, monkeypatch
) -> None:
    compile_with(monkeypatch, raise_missing_compiler)
    job = make_job(corpus, tmp_path / "run", token_cache, compile=setting, max_steps=2)
    with pytest.raises(StageError) as err:
        train(job, dev_evaluator)
    message = str(err.value)
    assert "\n" not in message and err.value.__cause__ is None
    assert message.startswith(f"train.compile: {str(setting).lower()} failed to compile")
    assert "InvalidCxxCompiler" in message


@pytest.mark.parametrize("limit", [None, 1], ids=["within-limit", "recompile-limit"])
def test_dynamo_counts_and_a_forward_gone_eager_part_way_are_recorded(
    limit: int | None, corpus, token_cache, dev_evaluator, tmp_path, monkeypatch
) -> None:
    """Static shapes recompile the padded forward at every new batch length: with a recompile
    limit of 1 dynamo runs it eagerly from the second length on, which config.json, status and
    one warning line say."""
    compile_with(monkeypatch, "eager", dynamic=limit is None)
    if limit is not None:
        monkeypatch.setattr(torch._dynamo.config, "recompile_limit", limit)
    out = tmp_path / "run"
    job = make_job(
        corpus, out, token_cache, compile=True, unpad=False, max_steps=4, eval_steps=4,
        max_seq_length=128,  # batches padded to different lengths
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(job, dev_evaluator)
    execution = json.loads((out / "config.json").read_text())["execution"]
    counts = execution["dynamo"]
    assert counts["frames_compiled"] >= 1 and counts["graphs"] >= 1, counts
    assert counts["graph_breaks"] == 0, counts
    part_way = [str(w.message) for w in caught if "part-way" in str(w.message)]
    if limit is None:
        assert counts["recompile_limit_hits"] == 0 and not part_way
        assert execution["compile_reason"] == "compiled: train.compile true"
    else:
        assert counts["recompile_limit_hits"] == 1 and len(part_way) == 1, (counts, part_way)
        assert execution["compile_reason"] == (
            "compiled: train.compile true; eager part-way (dynamo's recompile limit)"
        )
        assert "eager part-way" in run_environment({"execution": execution})
