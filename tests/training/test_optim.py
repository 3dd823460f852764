from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from stages.core.schema.params import SamParams, TrainParams
from stages.training import runtime
from stages.training.optim import (
    SharpnessAware,
    build_optimizer,
    build_scheduler,
    clip_gradients,
)
from stages.training.runtime import resolve_runtime


def quadratic(w: torch.Tensor) -> torch.Tensor:
    """f(w) = sum(a * w^3) + sum(w^2): its gradient 3 a w^2 + 2 w is not linear in w."""
    a = torch.arange(1.0, w.numel() + 1, dtype=w.dtype)
    return (a * w**3).sum() + (w**2).sum()


def gradient(w: torch.Tensor) -> torch.Tensor:
    a = torch.arange(1.0, w.numel() + 1, dtype=w.dtype)
    return 3 * a * w**2 + 2 * w


@pytest.mark.parametrize("max_norm", [0.5, 1.0, 1e6, None])
def test_clipping_is_torchs_clip_grad_norm_bit_for_bit(max_norm: float | None) -> None:
    torch.manual_seed(0)
    shapes = [(64, 32), (32,), (3, 5, 7), (1,)]
    grads = [
        torch.randn(shape) * scale
        for shape, scale in zip(shapes, (1e-3, 1.0, 0.3, 1e2), strict=True)
    ]
    ours, torchs = ([nn.Parameter(torch.zeros(s)) for s in shapes] for _ in range(2))
    unused = nn.Parameter(torch.ones(2))  # no gradient: skipped, as torch skips it
    for params in (ours, torchs):
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
    norm = clip_gradients([*ours, unused], max_norm)
    expected = nn.utils.clip_grad_norm_(
        [*torchs, unused], math.inf if max_norm is None else max_norm
    )
    assert torch.equal(norm, expected)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours, torchs, strict=True))
    if max_norm == 0.5:  # it did clip
        assert torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in ours])) < norm
    assert clip_gradients([unused], max_norm).item() == 0.0


@pytest.mark.parametrize("adaptive", [False, True])
def test_sam_takes_the_gradient_at_the_perturbed_point(adaptive: bool) -> None:
    w0 = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64)
    w = nn.Parameter(w0.clone())
    sam = SharpnessAware([w], SamParams(rho=0.05, adaptive=adaptive))
    quadratic(w).backward()
    sam.ascend()
    g = gradient(w0)
    if adaptive:
        expected_eps = 0.05 * w0**2 * g / torch.linalg.vector_norm(w0.abs() * g)
    else:
        expected_eps = 0.05 * g / torch.linalg.vector_norm(g)
    torch.testing.assert_close(w.detach() - w0, expected_eps)
    assert w.grad is None
    quadratic(w).backward()
    sam.restore()
    assert torch.equal(w.detach(), w0)  # exactly back, not w + e - e
    torch.testing.assert_close(w.grad, gradient(w0 + expected_eps))


def test_weight_decay_spares_biases_and_layer_norms() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    frozen = nn.Linear(2, 2)
    frozen.requires_grad_(False)
    model.append(frozen)
    optimizer = build_optimizer(model, TrainParams(weight_decay=0.01, optimizer="adamw_torch"))
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert [p.shape for p in decay["params"]] == [(4, 4)]
    assert [p.shape for p in no_decay["params"]] == [(4,), (4,), (4,)]
    assert optimizer.defaults["fused"] is True
    hf42 = build_optimizer(model, TrainParams(weight_decay=0.01, optimizer="adamw_hf42"))
    assert [g["hf42_weight_decay"] for g in hf42.param_groups] == [0.01, 0.0]
    assert hf42.defaults["fused"] is True


def _adamw_reference(
    w: torch.Tensor, grads: list[torch.Tensor], lrs: list[float], wd: float, rule: str
) -> torch.Tensor:
    """Both AdamW rules transcribed in float64: torch's (eps after the bias correction, decay
    before the step) and transformers 4.2's (eps on sqrt(v), bias correction in the step size,
    decay after the step)."""
    b1, b2, eps = 0.9, 0.999, 1e-8
    w, m, v = w.clone(), torch.zeros_like(w), torch.zeros_like(w)
    for t, (g, lr) in enumerate(zip(grads, lrs, strict=True), start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        c1, c2 = 1 - b1**t, 1 - b2**t
        if rule == "adamw_torch":
            w = w * (1 - lr * wd)
            w = w - lr / c1 * m / (v.sqrt() / math.sqrt(c2) + eps)
        else:
            w = w - lr * math.sqrt(c2) / c1 * m / (v.sqrt() + eps)
            w = w - lr * wd * w
    return w


@pytest.mark.parametrize("rule", ["adamw_hf42", "adamw_torch"])
def test_adamw_rules_match_their_float64_transcriptions(rule: str) -> None:
    # gradients near eps (1e-8) make the two rules' eps placement visible
    generator = torch.Generator().manual_seed(0)
    grads = [
        torch.randn(3, 4, generator=generator, dtype=torch.float64) * s
        for s in (1e-8, 3e-8, 1.0, 1e-7, 2e-8, 0.5)
    ]
    lrs = [1e-1, 9e-2, 8e-2, 7e-2, 6e-2, 5e-2]
    w0 = torch.randn(3, 4, generator=generator, dtype=torch.float64)
    layer = nn.Linear(4, 3, bias=False).double()
    with torch.no_grad():
        layer.weight.copy_(w0)
    train = TrainParams(optimizer=rule, weight_decay=0.1, learning_rate=lrs[0])
    optimizer = build_optimizer(layer, train)
    for g, lr in zip(grads, lrs, strict=True):
        optimizer.param_groups[0]["lr"] = lr
        layer.weight.grad = g.clone()
        optimizer.step()
    expected = _adamw_reference(w0, grads, lrs, 0.1, rule)
    torch.testing.assert_close(layer.weight.detach(), expected, rtol=1e-12, atol=1e-15)
    other = "adamw_torch" if rule == "adamw_hf42" else "adamw_hf42"
    assert not torch.allclose(expected, _adamw_reference(w0, grads, lrs, 0.1, other), rtol=1e-6)


def test_hf42_step_count_survives_a_resume() -> None:
    def run(resume_at: int | None) -> torch.Tensor:
        torch.manual_seed(0)
        layer = nn.Linear(3, 3)
        optimizer = build_optimizer(layer, TrainParams(weight_decay=0.01))
        for step in range(4):
            if step == resume_at:
                state = optimizer.state_dict()
                optimizer = build_optimizer(layer, TrainParams(weight_decay=0.01))
                optimizer.load_state_dict(state)
            layer.weight.grad = torch.full_like(layer.weight, 1e-8 * (step + 1))
            layer.bias.grad = torch.full_like(layer.bias, 1e-3)
            optimizer.step()
        assert optimizer.param_groups[0]["hf42_step"] == 4
        return layer.weight.detach().clone()

    assert torch.equal(run(None), run(2))


@pytest.mark.parametrize(
    ("schedule", "warmup", "expected"),
    [
        ("linear", 0.0, [1.0, 0.9, 0.8, 0.7]),  # SimCSE: linear decay to 0, no warm-up
        ("linear", 0.2, [0.0, 0.5, 1.0, 0.875]),  # ceil(0.2 * 10) = 2 warm-up steps
        ("constant", 0.0, [1.0, 1.0, 1.0, 1.0]),
    ],
)
def test_learning_rate_schedules(schedule: str, warmup: float, expected: list[float]) -> None:
    train = TrainParams(learning_rate=1.0, lr_schedule=schedule, warmup_ratio=warmup)
    optimizer = build_optimizer(nn.Linear(2, 2), train)
    scheduler = build_scheduler(optimizer, train, total_steps=10)
    seen = []
    for _ in expected:
        seen.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx(expected)


def test_runtime_on_a_gpu_machine_uses_bf16_and_pinned_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    gpu = resolve_runtime("auto", "auto", local_rank=1)
    assert gpu.device == torch.device("cuda", 1)
    assert (gpu.autocast_dtype, gpu.pin_memory) == (torch.bfloat16, True)
    assert resolve_runtime("cuda", "fp32").autocast_dtype is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = resolve_runtime("auto", "auto")
    assert (cpu.device.type, cpu.precision, cpu.pin_memory) == ("cpu", "fp32", False)
    assert resolve_runtime("cpu", "bf16").autocast_dtype == torch.bfloat16


@pytest.mark.parametrize("units", [True, False])
def test_bf16_on_a_cpu_without_bf16_units_warns_that_it_is_emulated(
    units: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "cpu_has_bf16_units", lambda: units)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve_runtime("cpu", "bf16").precision == "bf16"
        resolve_runtime("cpu", "fp32")
        resolve_runtime("cpu", "auto")
    messages = [str(w.message) for w in caught]
    if units:
        assert messages == []
    else:  # once, for the bf16 request only
        assert len(messages) == 1 and "without bf16 matrix units" in messages[0]
