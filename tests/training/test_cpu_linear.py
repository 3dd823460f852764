"""``OneDnnLinear``: fp32 Linear layers on oneDNN on x86 CPUs, equal to ``F.linear``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from train_helpers import TINY, make_job, padded_batch

import stages.modeling.cpu_linear as cpu_linear
import stages.training.loop as loop
from stages.core.schema.params import POOLERS
from stages.modeling.backbone import load_backbone
from stages.modeling.cpu_linear import (
    OneDnnLinear,
    fp32_matmuls_on_onednn,
    linear,
    onednn_linear_available,
    onednn_matmul_is_fp32,
    use_onednn_linear,
)
from stages.training.contrastive_model import ContrastiveModel
from stages.training.parts import load_encoder
from stages.training.runtime import resolve_runtime

needs_onednn = pytest.mark.skipif(
    not onednn_linear_available(), reason="oneDNN's inner product needs an x86 CPU build"
)


def on_onednn(out: torch.Tensor) -> bool:
    return type(out.grad_fn).__name__ == "_OneDnnLinearBackward"


def products(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, fn):
    """The output and the gradients of x, W and b for a fixed random upstream gradient."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight, bias) if t is not None]
    out = fn(*leaves[:2], leaves[2] if bias is not None else None)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)
    out.backward(upstream)
    return out.detach(), [t.grad for t in leaves]


@pytest.fixture(params=["matmul", "inner product"])
def weight_gradient_by(request, monkeypatch: pytest.MonkeyPatch) -> str:
    """dW by oneDNN's matmul (where it computes fp32 on this CPU) or by its inner product."""
    if request.param == "matmul" and not onednn_matmul_is_fp32():
        pytest.skip("oneDNN's matmul would compute bf16 here (or is not there)")
    if request.param == "inner product":
        monkeypatch.setattr(cpu_linear, "onednn_matmul_is_fp32", lambda: False)
    return request.param


@needs_onednn
@pytest.mark.parametrize("lead", [(700,), (4, 33), (1,)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_output_and_gradients_equal_f_linear_in_float64(
    lead, with_bias: bool, weight_gradient_by: str
) -> None:
    """Against the float64 product, oneDNN's fp32 error is the size of torch's own (MKL) fp32
    error: both are fp32 arithmetic, differing only in the order of summation."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*lead, 96, generator=g)
    weight = torch.randn(160, 96, generator=g) * 0.1
    bias = torch.randn(160, generator=g) if with_bias else None
    ours, our_grads = products(x, weight, bias, linear)
    mkl, mkl_grads = products(x, weight, bias, F.linear)
    exact, exact_grads = products(
        x.double(), weight.double(), bias.double() if bias is not None else None, F.linear
    )
    with torch.enable_grad():
        assert on_onednn(linear(x, weight.requires_grad_(), bias))
    pairs = zip([ours, *our_grads], [mkl, *mkl_grads], [exact, *exact_grads], strict=True)
    for a, b, reference in pairs:
        assert a.shape == reference.shape and a.dtype == torch.float32
        error = (a.double() - reference).abs().max()
        mkl_error = (b.double() - reference).abs().max()
        scale = reference.abs().max()
        assert error <= max(4 * mkl_error, 1e-6 * scale), (error, mkl_error)


@needs_onednn
def test_strided_inputs_and_partial_gradients(weight_gradient_by: str) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 50, generator=g).t()  # (50, 64), not contiguous
    weight = torch.randn(32, 64, generator=g, requires_grad=True)
    out = linear(x, weight, None)
    assert on_onednn(out)
    out.sum().backward()
    torch.testing.assert_close(out, F.linear(x, weight), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad, torch.ones(50, 32).t() @ x, rtol=1e-5, atol=1e-5)
    frozen = torch.randn(32, 64, generator=g)
    x_leaf = x.detach().clone().requires_grad_()
    linear(x_leaf, frozen, None).sum().backward()  # only dX
    torch.testing.assert_close(x_leaf.grad, torch.ones(50, 32) @ frozen, rtol=1e-5, atol=1e-5)


def test_anything_but_fp32_on_the_cpu_outside_autocast_is_f_linear() -> None:
    x = torch.randn(8, 16, requires_grad=True)
    weight, bias = torch.randn(4, 16), torch.randn(4)
    assert not on_onednn(linear(x.double(), weight.double(), bias.double()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear(x, weight, bias)
    assert out.dtype == torch.bfloat16 and not on_onednn(out)
    assert linear(x[:0], weight, bias).shape == (0, 4)


def test_use_onednn_linear_changes_the_class_only() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 2)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weight = model[0].weight
    assert use_onednn_linear(model) == 2
    assert [type(m) for m in model.modules() if isinstance(m, nn.Linear)] == [OneDnnLinear] * 2
    assert model[0].weight is weight  # the same parameters, so the optimizer's stay valid
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert use_onednn_linear(model) == 0  # already changed


@needs_onednn
@pytest.mark.parametrize("unpad", [True, False])
@pytest.mark.parametrize("pooler", POOLERS)
def test_an_encoder_on_onednn_equals_the_plain_one(pooler: str, unpad: bool, tokenizer) -> None:
    """A BERT's outputs and gradients (padded and unpadded forward, every pooler) with its
    Linear layers on oneDNN equal the unchanged model's within fp32 rounding."""
    ids, mask = padded_batch(tokenizer)
    results = []
    for onednn in (False, True):
        model = load_backbone(TINY, seed=0, dropout=0.0)
        if onednn:
            assert use_onednn_linear(model) > 0
        out = ContrastiveModel(model, pooler, unpad=unpad).embed(ids, mask)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((out.detach(), grads))
    (plain, plain_grads), (ours, our_grads) = results
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-5)
    assert our_grads.keys() == plain_grads.keys()
    for name, grad in our_grads.items():
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-5, atol=1e-5, msg=name)


def test_the_trainer_puts_its_cpu_encoder_on_onednn_unless_compiled(tmp_path) -> None:
    job = make_job(tmp_path / "corpus.txt", tmp_path / "out", tmp_path / "cache")
    encoder = load_encoder(job, resolve_runtime("cpu", "fp32"))
    linears = [m for m in encoder.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is OneDnnLinear for m in linears)
    compiled = make_job(tmp_path / "corpus.txt", tmp_path / "out", tmp_path / "cache", compile=True)
    runtime = resolve_runtime("cpu", "fp32", compile=True)
    assert not runtime.onednn_linear and runtime.packed_rows_multiple == 1
    encoder = load_encoder(compiled, runtime)
    assert all(type(m) is nn.Linear for m in encoder.modules() if isinstance(m, nn.Linear))


@contextmanager
def onednn_switched_off() -> Iterator[None]:
    """oneDNN off in this block (``torch.backends.mkldnn.flags`` would also set oneDNN's TF32
    switch, which warns on a torch without Intel GPU support)."""
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


@needs_onednn
def test_a_strided_bias_and_mismatched_shapes_are_left_to_f_linear() -> None:
    x, weight = torch.randn(50, 96), torch.randn(160, 96)
    bias = torch.randn(320)[::2]  # oneDNN would read it as contiguous
    torch.testing.assert_close(linear(x, weight, bias), F.linear(x, weight, bias))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        linear(x, torch.randn(160, 95), None)
    with onednn_switched_off():
        assert not on_onednn(linear(x.requires_grad_(), weight, None))


def matmul_settings() -> tuple[str, str]:
    return torch.backends.mkldnn.matmul.fp32_precision, torch.backends.cuda.matmul.fp32_precision


def test_fp32_matmuls_on_onednn_compute_fp32_and_put_the_setting_back(capfd) -> None:
    """Inside the block (where this CPU computes fp32 there) mm, bmm and addmm on strided
    operands reach oneDNN's matmul and have fp32's error against float64, not bf16's; torch's
    own reading of the setting works inside; the process's setting is restored afterwards, also
    when the block raises; where oneDNN would compute bf16, nothing changes."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(300, 70, generator=g), torch.randn(300, 50, generator=g)
    c, d = torch.randn(6, 20, 300, generator=g), torch.randn(6, 40, 300, generator=g)
    before = matmul_settings()
    capfd.readouterr()
    with fp32_matmuls_on_onednn(), torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        inside = matmul_settings()[0], torch.get_float32_matmul_precision()
        products = [
            (a.t() @ b, a.double().t() @ b.double()),
            (torch.bmm(c, d.transpose(1, 2)), c.double() @ d.double().transpose(1, 2)),
            (torch.addmm(b[0], a.t(), b), b[0].double() + a.double().t() @ b.double()),
        ]
    on_onednn = onednn_matmul_is_fp32()
    executed = [line for line in capfd.readouterr().out.splitlines() if ",exec,cpu,matmul," in line]
    assert len(executed) == (3 if on_onednn else 0)
    assert inside == (("bf16", "medium") if on_onednn else (before[0], inside[1]))
    for ours, exact in products:
        assert ours.dtype == torch.float32
        assert (ours.double() - exact).abs().max() < 1e-3  # bf16 inputs: ~0.2 off
    assert matmul_settings() == before
    with pytest.raises(ValueError), fp32_matmuls_on_onednn():
        raise ValueError
    assert matmul_settings() == before


@pytest.mark.skipif(not onednn_matmul_is_fp32(), reason="oneDNN would compute bf16 here")
def test_nested_and_concurrent_holders_restore_the_setting_once_all_are_out() -> None:
    """The first holder sets the permission, the last one out restores it: a thread leaving
    while another is inside leaves it permitted, and nothing stays permitted afterwards."""
    before = matmul_settings()
    entered, first_left, second_may_leave = (threading.Event() for _ in range(3))
    seen = []

    def second() -> None:
        with fp32_matmuls_on_onednn():
            entered.set()
            first_left.wait(10)
            seen.append(matmul_settings()[0])
            second_may_leave.wait(10)

    thread = threading.Thread(target=second)
    with fp32_matmuls_on_onednn():
        with fp32_matmuls_on_onednn():  # nested in one thread
            pass
        assert matmul_settings()[0] == "bf16"
        thread.start()
        assert entered.wait(10)
    first_left.set()
    second_may_leave.set()
    thread.join(10)
    assert seen == ["bf16"]
    assert matmul_settings() == before
    torch.get_float32_matmul_precision()  # readable again


def test_a_user_setting_survives_the_block() -> None:
    before = torch.get_float32_matmul_precision()
    try:
        for precision in ("medium", "high", "highest"):
            torch.set_float32_matmul_precision(precision)
            settings = matmul_settings()
            with fp32_matmuls_on_onednn():
                pass
            assert torch.get_float32_matmul_precision() == precision
            assert matmul_settings() == settings
    finally:
        torch.set_float32_matmul_precision(before)


def test_where_onednn_would_compute_bf16_nothing_changes(monkeypatch) -> None:
    monkeypatch.setattr(cpu_linear, "onednn_matmul_is_fp32", lambda: False)
    before = matmul_settings()
    with fp32_matmuls_on_onednn():
        assert matmul_settings() == before


def test_an_amx_cpu_or_no_onednn_is_never_trusted_to_compute_fp32(monkeypatch) -> None:
    """On AMX oneDNN computes bf16 when permitted: the probe is not even asked; with oneDNN
    switched off nothing reaches it, and nothing is remembered for when it is back on."""
    probe = cpu_linear._bf16_permission_keeps_fp32
    for patch in (
        (torch.cpu, "_is_amx_tile_supported", lambda: True),
        (cpu_linear, "onednn_linear_available", lambda: False),
    ):
        with monkeypatch.context() as m:
            m.setattr(*patch, raising=False)
            probe.cache_clear()
            assert not onednn_matmul_is_fp32()
    probe.cache_clear()
    with onednn_switched_off():
        assert not onednn_matmul_is_fp32()
    assert probe.cache_info().currsize == 0


def test_the_training_loop_runs_under_the_onednn_matmul_setting(
    corpus, token_cache, dev_evaluator, tmp_path, monkeypatch
) -> None:
    """Each step (forward and backward) runs with the setting of ``fp32_matmuls_on_onednn``
    when the trainer puts its Linear layers on oneDNN; afterwards the process's is back."""
    seen = []

    def watched(step) -> None:
        seen.append(torch.backends.mkldnn.matmul.fp32_precision)
        torch.get_float32_matmul_precision()  # what libraries read: it must not raise
        step()

    before = torch.backends.mkldnn.matmul.fp32_precision
    job = make_job(corpus, tmp_path / "out", token_cache, max_steps=2, device="cpu")
    loop.train(job, dev_evaluator, step_hook=watched)
    on_onednn = resolve_runtime("cpu", "fp32").onednn_linear and onednn_matmul_is_fp32()
    expected = "bf16" if on_onednn else before
    assert seen == [expected] * 2
    assert torch.backends.mkldnn.matmul.fp32_precision == before
