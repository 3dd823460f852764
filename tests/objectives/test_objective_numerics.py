"""Numerical safety of every objective and variant: identical views (cos = 1), antipodal views
(cos = -1), tau = 0.01, two-row batches, and bf16 autocast (losses computed in fp32); and the
gradient of every loss without a stop-gradient in its equation against finite differences.
A new registered objective is tested here without an entry."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from objective_testing import objective, views

from stages.objectives.registry import all_loss_classes

ALL_SWITCHES = {"gradient_dissipation": True, "static_ratio": True}


def configurations() -> list[tuple[str, dict]]:
    configs = [(name, {}) for name in all_loss_classes()]
    configs += [
        (name, {"implementation": "code"}) for name in ("align_uniform", "mpt", "met", "mat")
    ]
    for name in ("align_mhe", "align_mhs", "barlow_twins", "vicreg"):
        switches = ALL_SWITCHES | ({} if name == "align_mhs" else {"softmax_weight": True})
        configs += [(name, switches), (name, switches | {"implementation": "code"})]
    configs += [("arccse", {"margin_deg": 0.0}), ("simace", {"margin_deg": -10.0})]
    return configs


CONFIGS = configurations()
IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in hp.items())}" for name, hp in CONFIGS]


def run(name: str, hyperparameters: dict, z: torch.Tensor, z_pos: torch.Tensor, tau=None):
    model = objective(name, **hyperparameters)
    triplets = None
    if model.needs_triplets:
        triplets = (z[:4], z_pos[:4], -z[:4])
    return model(z, z_pos, tau=tau, triplets=triplets)


def assert_finite(loss: torch.Tensor, *inputs: torch.Tensor) -> None:
    assert torch.isfinite(loss).all(), loss
    for g in torch.autograd.grad(loss, inputs, allow_unused=True, materialize_grads=True):
        assert torch.isfinite(g).all()


def base_views(n: int = 16, d: int = 64) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(("name", "hyperparameters"), CONFIGS, ids=IDS)
@pytest.mark.parametrize("case", ["identical", "antipodal", "nearly_identical"])
def test_degenerate_views_stay_finite(name, hyperparameters, case):
    z = base_views().requires_grad_()
    other = {"identical": z.detach(), "antipodal": -z.detach(),
             "nearly_identical": z.detach() + 1e-7 * base_views()}[case]  # fmt: skip
    z_pos = other.clone().requires_grad_()
    assert_finite(run(name, hyperparameters, z, z_pos).loss, z, z_pos)


@pytest.mark.parametrize(("name", "hyperparameters"), CONFIGS, ids=IDS)
def test_low_temperature_stays_finite(name, hyperparameters):
    z = base_views().requires_grad_()
    z_pos = (base_views() + 0.5 * z.detach()).requires_grad_()
    tau = 0.01 if objective(name, **hyperparameters).uses_temperature else None
    assert_finite(run(name, hyperparameters, z, z_pos, tau=tau).loss, z, z_pos)


@pytest.mark.parametrize(("name", "hyperparameters"), CONFIGS, ids=IDS)
def test_two_row_batches_work(name, hyperparameters):
    z = base_views(2).requires_grad_()
    z_pos = base_views(2).flip(0).requires_grad_()
    assert_finite(run(name, hyperparameters, z, z_pos).loss, z, z_pos)


@pytest.mark.parametrize(("name", "hyperparameters"), CONFIGS, ids=IDS)
def test_bf16_autocast_computes_in_fp32(name, hyperparameters):
    z = base_views().bfloat16().requires_grad_()
    z_pos = (base_views() + z.detach().float()).bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(name, hyperparameters, z, z_pos)
    assert out.loss.dtype == torch.float32
    reference = run(name, hyperparameters, z.detach().float(), z_pos.detach().float())
    assert out.loss.item() == reference.loss.item()
    assert all(s.dtype == torch.float32 for s in out.stats.values())
    assert_finite(out.loss, z, z_pos)


PAPER_002_MODIFICATIONS = ("gradient_dissipation", "static_ratio", "softmax_weight")


def stop_gradient_by_design(name: str, hyperparameters: dict) -> bool:
    """Paper 002's MHS holds the other rows fixed (sg(h_j)), and its modifications specify the
    gradient itself, not a loss it derives from."""
    return name == "align_mhs" or any(hyperparameters.get(k) for k in PAPER_002_MODIFICATIONS)


DERIVATIVES = [
    pytest.param(name, hyperparameters, id=id_)
    for (name, hyperparameters), id_ in zip(CONFIGS, IDS, strict=True)
    if not stop_gradient_by_design(name, hyperparameters)
]


@pytest.mark.parametrize(("name", "hyperparameters"), DERIVATIVES)
def test_the_gradient_is_the_losss_derivative(name, hyperparameters):
    """Autograd's gradient against central differences in float64: a detach, an in-place edit
    or a custom backward that the equation does not have would show."""
    z, z_pos = views(n=6, d=5, correlated=1.0)
    assert torch.autograd.gradcheck(
        lambda a, b: run(name, hyperparameters, a, b).loss, (z, z_pos), atol=1e-7, rtol=1e-5
    )


@settings(max_examples=40, deadline=None)
@given(
    config=st.sampled_from(CONFIGS),
    n=st.integers(2, 24),
    d=st.integers(2, 48),
    log_scale=st.floats(-3, 3),
    correlation=st.floats(0, 10),
    seed=st.integers(0, 2**16),
)
def test_any_batch_gives_finite_losses_and_gradients(config, n, d, log_scale, correlation, seed):
    name, hyperparameters = config
    g = torch.Generator().manual_seed(seed)
    z = (10**log_scale * torch.randn(n, d, generator=g)).requires_grad_()
    z_pos = (
        correlation * z.detach() + 10**log_scale * torch.randn(n, d, generator=g)
    ).requires_grad_()
    assert_finite(run(name, hyperparameters, z, z_pos).loss, z, z_pos)
