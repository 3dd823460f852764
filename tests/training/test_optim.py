from __future__ import annotations

import pytest
import torch
from torch import nn

from stages.core.params import SamParams, TrainParams
from stages.training.optim import SharpnessAware, build_optimizer, build_scheduler
from stages.training.runtime import resolve_runtime


def quadratic(w: torch.Tensor) -> torch.Tensor:
    """f(w) = sum(a * w^3) + sum(w^2): its gradient 3 a w^2 + 2 w is not linear in w."""
    a = torch.arange(1.0, w.numel() + 1, dtype=w.dtype)
    return (a * w**3).sum() + (w**2).sum()


def gradient(w: torch.Tensor) -> torch.Tensor:
    a = torch.arange(1.0, w.numel() + 1, dtype=w.dtype)
    return 3 * a * w**2 + 2 * w


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
    optimizer = build_optimizer(model, TrainParams(weight_decay=0.01))
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert [p.shape for p in decay["params"]] == [(4, 4)]
    assert [p.shape for p in no_decay["params"]] == [(4,), (4,), (4,)]
    assert optimizer.defaults["fused"] is True


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
    gpu = resolve_runtime("auto", "auto", local_rank=1)
    assert gpu.device == torch.device("cuda", 1)
    assert (gpu.autocast_dtype, gpu.pin_memory) == (torch.bfloat16, True)
    assert resolve_runtime("cuda", "fp32").autocast_dtype is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = resolve_runtime("auto", "auto")
    assert (cpu.device.type, cpu.precision, cpu.pin_memory) == ("cpu", "fp32", False)
    assert resolve_runtime("cpu", "bf16").autocast_dtype == torch.bfloat16
