"""fp32 Linear layers on oneDNN on x86 CPUs, forward and backward.

torch computes an fp32 ``nn.Linear`` on the CPU with MKL's sgemm, and MKL runs its AVX2 kernels
on AMD processors even where the processor has AVX-512 (MKL's ``*_zen`` kernels): on the 2-core
AMD EPYC with AVX-512 that the benchmarks run on, 220-230 GFLOP/s for the products of a BERT
layer at ~2,800 tokens, where oneDNN (bundled with torch, and already what torch uses for bf16
products) reaches 440-470. torch sends an fp32 product to oneDNN only under a setting that
permits bf16 (below), so ``OneDnnLinear`` calls oneDNN's inner product
(``torch.ops.mkldnn._linear_pointwise``, the op torch's own compiler emits for CPU linears; the
bias added in the same pass) for the forward and for dX = dY W. Measured there,
forward and backward of a Linear at BERT sizes (128 to 1,536 wide, ~2,800 rows): 1.7-2.1x MKL's
speed. Every product is in fp32 (oneDNN's strict float math), so results equal torch's fp32 ones
up to the order of summation; only a process that sets torch's matmul precision to "medium"
itself lets oneDNN use bf16 here too, as it then does for ``F.linear``.

dW = dYᵀ X is an inner product of two transposed activations, which oneDNN's inner product
copies into its own layouts first; oneDNN's matmul reads them as they are, 1.3-2.1x faster
(0.6 against 1.2 ms for a 128 → 384 layer at 2,816 rows; 7.2 against 10.0 ms for 384 → 1,536).
torch reaches that matmul only where bf16 is permitted to fp32 products (its "medium" matmul
precision), which on a CPU without AMX still computes fp32 (oneDNN has no faster bf16
algorithm there; ``onednn_matmul_is_fp32`` checks both, the inner product included, which the
permission reaches too). Where it does, ``fp32_matmuls_on_onednn`` permits it around dW, and the
trainer around its whole loop: its attention products (``bmm``, in training with dropout) take
half the time there as well.

oneDNN builds a kernel for every new matrix shape (0.5 ms for a forward, ~3 ms for dW, measured
on that machine), so the trainer rounds an unpadded batch up to a multiple of 64 packed rows
(``Runtime.packed_rows_multiple``); the evaluation encoder's length-sorted batches (mostly
batch size × one length) repeat their shapes across a task.

On that CPU (no AMX), ``torch.set_float32_matmul_precision("medium")`` also sends ``F.linear``
to oneDNN, and, having no faster bf16 algorithm there, computes in fp32 (bitwise the same
outputs): a setting any torch user can turn on, which the benchmarks give the peers. It only
permits bf16, though: on a CPU with AMX it computes the products in bf16, where
``OneDnnLinear`` stays fp32 (unless ``ONEDNN_DEFAULT_FPMATH_MODE`` says otherwise, in which
case it is not used).

Anywhere else it is ``F.linear``: other devices and dtypes, under autocast (autocast's bf16
products already run on oneDNN), non-x86 CPUs, torch builds without oneDNN or with
``torch.backends.mkldnn.enabled = False``. The trainer puts it in place of every ``nn.Linear``
of the backbone on the CPU (``use_onednn_linear``; weights and checkpoints unchanged), except
when ``train.compile`` traces the step.
"""

from __future__ import annotations

import functools
import os
import platform
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable


@functools.cache
def onednn_linear_available() -> bool:
    """oneDNN's inner product is in this torch build, computes what ``F.linear`` computes (a
    one-time probe, so a torch whose private op changed falls back instead of failing a run),
    oneDNN's float math is left strict (``ONEDNN_DEFAULT_FPMATH_MODE`` would let it use bf16
    where ``F.linear`` stays fp32), and the CPU is x86 (where oneDNN has its JIT kernels;
    elsewhere torch's own BLAS is the better choice)."""
    if not (
        platform.machine().lower() in {"x86_64", "amd64"}
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and os.environ.get("ONEDNN_DEFAULT_FPMATH_MODE", "STRICT").upper() == "STRICT"
    ):
        return False
    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(shape, generator=generator) for shape in ((6, 5), (4, 5), (4,)))
    y = F.linear(x, weight, bias)
    try:  # the three products of the forward and backward, with their strided operands
        with torch.inference_mode():
            ours = (
                _inner_product(x, weight, bias),
                _inner_product(y, weight.t(), None),
                _inner_product(y.t(), x.t(), None),
            )
    except RuntimeError:
        return False
    theirs = y, y @ weight, y.t() @ x
    return all(
        torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(ours, theirs, strict=True)
    )


def onednn_matmul_is_fp32() -> bool:
    """torch's fp32 matrix products run on oneDNN when bf16 is permitted to them, and oneDNN
    still computes fp32 on this CPU: oneDNN is enabled (``torch.backends.mkldnn.enabled``) and
    ``_bf16_permission_keeps_fp32``."""
    return torch.backends.mkldnn.enabled and _bf16_permission_keeps_fp32()


@functools.cache
def _bf16_permission_keeps_fp32() -> bool:
    """``onednn_linear_available``, no AMX (whose bf16 kernels oneDNN would then use), and a
    one-time probe, with bf16 permitted, of mm on strided operands, bmm and the inner product
    against float64: bf16 inputs would be off by ~0.2 there, fp32 ones are within ~1e-4."""
    if not onednn_linear_available() or getattr(torch.cpu, "_is_amx_tile_supported", bool)():
        return False
    generator = torch.Generator().manual_seed(0)
    a, b, c, d = (
        torch.randn(shape, generator=generator)
        for shape in ((512, 64), (512, 48), (4, 24, 512), (4, 512, 16))
    )
    exact = a.double().t() @ b.double()
    with _bf16_permitted(), torch.inference_mode():
        products = [
            (a.t() @ b, exact),
            (_inner_product(a.t(), b.t(), None), exact),
            (c @ d, c.double() @ d.double()),
        ]
    return all((ours.double() - exact).abs().max() < 1e-3 for ours, exact in products)


# The permission is process-wide (torch has no narrower one): the first of nested or concurrent
# holders sets it, the last one out puts back what was there.
_permission_lock = threading.Lock()
_permission_holders = 0
_settings_before: tuple[str | None, str, str] = ("highest", "none", "none")


def _matmul_settings() -> tuple[str | None, str, str]:
    """torch's float32 matmul precision (None where a mix of its old and new settings makes
    it unreadable), oneDNN's and CUDA's matmul settings."""
    try:
        legacy: str | None = torch.get_float32_matmul_precision()
    except RuntimeError:
        legacy = None
    matmul = torch.backends.mkldnn.matmul, torch.backends.cuda.matmul
    return legacy, matmul[0].fp32_precision, matmul[1].fp32_precision


def _restore(settings: tuple[str | None, str, str]) -> None:
    legacy, mkldnn, cuda = settings
    if legacy is not None:  # torch keeps this one apart; the backends' settings then refine it
        torch.set_float32_matmul_precision(legacy)
    torch.backends.mkldnn.matmul.fp32_precision = mkldnn
    torch.backends.cuda.matmul.fp32_precision = cuda


@contextmanager
def _bf16_permitted() -> Iterator[None]:
    """bf16 permitted to torch's fp32 matrix products while the block runs. Set with
    ``torch.set_float32_matmul_precision("medium")``, which also permits TF32 to CUDA's (unused
    by a CPU run), because a setting for oneDNN alone makes torch's
    ``get_float32_matmul_precision()`` raise (a mix of its old and new settings)."""
    global _permission_holders, _settings_before
    with _permission_lock:
        if _permission_holders == 0:
            _settings_before = _matmul_settings()
            torch.set_float32_matmul_precision("medium")
        _permission_holders += 1
    try:
        yield
    finally:
        with _permission_lock:
            _permission_holders -= 1
            if _permission_holders == 0:
                _restore(_settings_before)


@contextmanager
def fp32_matmuls_on_onednn() -> Iterator[None]:
    """torch's fp32 matrix products (mm, bmm, baddbmm, addmm, matmul, ``F.linear``) on oneDNN
    while the block runs, where ``onednn_matmul_is_fp32``; elsewhere nothing changes. The
    setting is the process's, ``torch.get_float32_matmul_precision()`` reads "medium" inside,
    and what was set before is put back afterwards."""
    if not onednn_matmul_is_fp32():
        yield
        return
    with _bf16_permitted():
        yield


def _inner_product(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x Wᵀ + b for 2-D x (rows, in) and W (out, in), strided or not, on oneDNN."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _OneDnnLinear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(rows, weight)
        ctx.input_shape = x.shape
        ctx.has_bias = bias is not None
        return _inner_product(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @once_differentiable
    def backward(
        ctx: FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        rows, weight = ctx.saved_tensors
        grad_rows = grad.reshape(-1, weight.shape[0])
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:  # dX = dY W, as an inner product with Wᵀ
            grad_x = _inner_product(grad_rows, weight.t(), None).view(ctx.input_shape)
        if ctx.needs_input_grad[1]:  # dW = dYᵀ X
            if onednn_matmul_is_fp32():  # oneDNN's matmul: no copies of the transposed operands
                with _bf16_permitted():
                    grad_weight = grad_rows.t() @ rows
            else:
                grad_weight = _inner_product(grad_rows.t(), rows.t(), None)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_rows.sum(0)
        return grad_x, grad_weight, grad_bias


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear``, on oneDNN for fp32 CPU tensors outside autocast (see the module's doc)."""
    if (
        x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
        and x.numel() > 0
        and weight.dim() == 2
        and weight.shape[0] > 0
        and x.shape[-1] == weight.shape[1]  # else F.linear names the mismatch
        and not torch.is_autocast_enabled("cpu")
        and torch.backends.mkldnn.enabled
        and onednn_linear_available()
    ):
        return _OneDnnLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


class OneDnnLinear(nn.Linear):
    """``nn.Linear`` computed by ``linear``: oneDNN for fp32 on an x86 CPU, else ``F.linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def use_onednn_linear(model: nn.Module) -> int:
    """Make every plain ``nn.Linear`` of ``model`` a ``OneDnnLinear`` (the same module, its
    class changed: parameters, hooks and state dict stay); returns how many were changed."""
    changed = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = OneDnnLinear
            changed += 1
    return changed
