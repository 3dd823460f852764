"""Dropout whose mask is cheap to draw on the CPU.

torch's CPU dropout draws one double-precision Bernoulli number per element, serially
(``bernoulli_``), then scales and multiplies: about 20 ns per element on the 2-core AMD machine
the benchmarks run on, about a fifth of a CPU forward + backward. ``FastDropout`` draws
the same distribution from the same generator (torch's default one, so seeding, per-rank
streams, checkpointed RNG states and gradient checkpointing's replay all hold as they are) in
about a quarter of the time: 64-bit random words (``random_``: one Mersenne-Twister output per
element), each read as two 31-bit uniform integers, an element kept where its integer is at
least round(p · 2³¹), so the keep probability is 1 − p within 2⁻³¹ (CUDA's own dropout compares
a 24-bit float). Kept elements are scaled by 1 / (1 − p), as ``F.dropout``. On any other device
it is ``F.dropout`` (CUDA's fused kernel).

The trainer puts it in place of every ``nn.Dropout`` of the backbone (``use_fast_dropout``); the
unpadded forward draws its padded-layout masks through ``dropout_mask``, the same draws in the
same order as the padded forward, so the two agree with one seed as before.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_LOW_31_BITS = 0x7FFFFFFF


def cpu_keep_mask(shape: tuple[int, ...], p: float, dtype: torch.dtype) -> torch.Tensor:
    """(shape) tensor of 0 and 1 / (1 − p) in ``dtype``, each element kept with probability
    1 − p (within 2⁻³¹), from torch's default CPU generator."""
    n = math.prod(shape)
    words = torch.empty((n + 1) // 2, dtype=torch.int64).random_()
    uniform31 = words.view(torch.int32)[:n] & _LOW_31_BITS
    keep = uniform31 >= round(p * 2**31)
    scale = 0.0 if p == 1 else 1 / (1 - p)
    return keep.to(dtype).mul_(scale).view(shape)


def dropout_mask(dropout: nn.Dropout, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """The scaled mask ``dropout`` (in training mode) applies to a ``like``-typed tensor of
    ``shape``: the same random numbers as calling it on such a tensor."""
    if isinstance(dropout, FastDropout) and like.device.type == "cpu":
        return cpu_keep_mask(shape, dropout.p, like.dtype)
    return F.dropout(like.new_ones(shape), dropout.p, training=True)


class FastDropout(nn.Dropout):
    """``nn.Dropout`` with ``cpu_keep_mask`` on the CPU and ``F.dropout`` elsewhere."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True, inplace=self.inplace)
        return x * cpu_keep_mask(tuple(x.shape), self.p, x.dtype)


def use_fast_dropout(model: nn.Module) -> int:
    """Replace every ``nn.Dropout`` of ``model`` by a ``FastDropout`` of the same rate (dropout
    holds no state, so weights and checkpoints are unchanged); returns how many."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                setattr(parent, name, FastDropout(child.p, inplace=child.inplace))
                replaced += 1
    return replaced
