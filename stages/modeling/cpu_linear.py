"""fp32 Linear layers on oneDNN on x86 CPUs, forward and backward.

torch computes an fp32 ``nn.Linear`` on the CPU with MKL's sgemm, and MKL runs its AVX2 kernels
on AMD processors even where the processor has AVX-512 (MKL's ``*_zen`` kernels): on the 2-core
AMD EPYC with AVX-512 that the benchmarks run on, 220-230 GFLOP/s for the products of a BERT
layer at ~2,800 tokens, where oneDNN (bundled with torch, and already what torch uses for bf16
products) reaches 440-470. No torch setting routes an fp32 product to oneDNN at full precision
(``torch.backends.mkldnn.matmul.fp32_precision`` only offers reduced precisions), so
``OneDnnLinear`` calls oneDNN's inner product (``torch.ops.mkldnn._linear_pointwise``, the op
torch's own compiler emits for CPU linears) for the forward and for both products of the
backward (dX = dY W, dW = dYᵀ X). Measured there, forward and backward of a Linear at BERT sizes
(128 to 1,536 wide, ~2,800 rows): 1.7-2.1x MKL's time. Every product is still in fp32 (oneDNN's
default strict float math), so results equal torch's up to the order of summation.

oneDNN builds a kernel for every new matrix shape (0.5 ms for a forward, ~3 ms for dW, measured
on that machine), so the callers keep the row counts to a few dozen shapes: the trainer rounds
an unpadded batch up to a multiple of 64 packed rows on the CPU in both precisions
(``Runtime.packed_rows_multiple``).

Anywhere else it is ``F.linear``: other devices and dtypes, under autocast (autocast's bf16
products already run on oneDNN), non-x86 CPUs and torch builds without oneDNN. The trainer puts
it in place of every ``nn.Linear`` of the backbone (``use_onednn_linear``; weights and
checkpoints unchanged), except when ``train.compile`` traces the step.
"""

from __future__ import annotations

import functools
import platform

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable


@functools.cache
def onednn_linear_available() -> bool:
    """oneDNN's inner product is in this torch build and the CPU is x86 (where oneDNN has its
    JIT kernels; elsewhere torch's own BLAS is the better choice)."""
    return (
        platform.machine().lower() in {"x86_64", "amd64"}
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


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
            grad_weight = _inner_product(grad_rows.t(), rows.t(), None)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_rows.sum(0)
        return grad_x, grad_weight, grad_bias


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear``, on oneDNN for fp32 CPU tensors outside autocast (see the module's doc)."""
    if (
        x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and (bias is None or bias.dtype == torch.float32)
        and x.numel() > 0
        and not torch.is_autocast_enabled("cpu")
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
