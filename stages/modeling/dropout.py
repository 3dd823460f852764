"""Dropout whose mask is cheap to draw on the CPU.

torch's CPU dropout draws one double-precision Bernoulli number per element (``bernoulli_``),
then scales and multiplies: about 4.5 ns per element on the 2-core AMD machine the benchmarks
run on (2 threads), which made it about a fifth of a tiny encoder's CPU step. ``FastDropout``
draws the same distribution from the same generator (torch's default one, so seeding, per-rank
streams, checkpointed RNG states and gradient checkpointing's replay all hold as they are) in
about 0.7 ns per element, multiply included. An element's draw is one random byte b, eight to
a 64-bit word of ``random_`` (a quarter of a Mersenne-Twister output per element, the bulk of
the cost). With p · 256 = k + f (k whole, 0 ≤ f < 1) the element is dropped where b < k, kept
where b > k, and where b = k (one element in 256) a 32-bit integer drawn after the bytes
decides: dropped where it is below round(f · 2³²). So the keep probability is 1 − p within
2⁻⁴⁰ (CUDA's own dropout compares a 24-bit float). The bytes are compared in numpy, on the
words in place (torch's uint8 comparison is about 10x slower here). Kept elements are scaled by
1 / (1 − p), as ``F.dropout``. On any other device it is ``F.dropout`` (CUDA's fused kernel).
Until 2026-11-26 an element took 32 bits (a whole Mersenne-Twister output): 2.2-2.9x this
cost, the same distribution within 2⁻³³, other masks from the same seed.

The trainer puts it in place of every ``nn.Dropout`` of the backbone (``use_fast_dropout``; not
when ``train.compile`` traces the step, where its in-place ``random_`` would break the graph); on
the CPU the unpadded forward draws its padded-layout masks through ``dropout_mask``, the same
draws in the same order as the padded forward, so the two agree with one seed as before.

The attention probabilities' dropout happens inside transformers' attention function, not in a
module. Under SDPA, ``use_fast_dropout`` switches the backbone to ``FAST_DROPOUT_SDPA``, an
attention function registered with transformers (``fast_dropout_attention``): in training on the
CPU it computes softmax(q kᵀ · scaling + mask) · keep-mask · v with ``cpu_keep_mask``'s mask, and
everywhere else it is transformers' SDPA function. torch's SDPA with dropout on the CPU takes its
unfused math path and draws the mask with ``bernoulli_``: measured on the 2-core AMD machine
(forward and backward of one layer's attention, batch 128 of 32 positions), 7.6 against 4.1 ms
for a 2-head, width-128 encoder in bf16, 28.4 against 13.3 ms for all-MiniLM-L6-v2's 12 heads of
32 (8.7 against 7.2 and 36.1 against 26.5 ms in fp32). The padded and the unpadded forward both
call it, with the same shapes, so they still draw the same masks.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from stages.modeling.batched_attention import batched_attention
from stages.modeling.dropout_tape import active_tape

# The attention implementation ``use_fast_dropout`` gives an SDPA backbone; SDPA's mask form.
FAST_DROPOUT_SDPA = "sdpa_fast_dropout"


def cpu_keep_mask(shape: tuple[int, ...], p: float, dtype: torch.dtype) -> torch.Tensor:
    """(shape) tensor of 0 and 1 / (1 − p) in ``dtype``, each element kept with probability
    1 − p (within 2⁻⁴⁰), from torch's default CPU generator."""
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if p == 1:
        return torch.zeros(shape, dtype=dtype)
    n = math.prod(shape)
    draws = _random_words((n + 7) // 8).view(np.uint8)[:n]
    whole, fraction = divmod(p * 256, 1)
    tie = int(whole)  # the byte value the tiebreaks decide: below it drops, above it keeps
    keep = draws > tie
    ties = np.flatnonzero(draws == tie)
    if ties.size:
        tiebreaks = _random_words((ties.size + 1) // 2).view(np.uint32)[: ties.size]
        # may round to 2³²: no tiebreak reaches it, every tie drops (numpy compares exactly)
        drop_below = round(fraction * 2**32)
        keep[ties] = tiebreaks >= drop_below
    # bool -> float runs unvectorised in torch (~8x the time of uint8 -> float, bf16 and fp32)
    return torch.from_numpy(keep.view(np.uint8)).to(dtype).mul_(1 / (1 - p)).view(shape)


def _random_words(count: int) -> np.ndarray:
    """``count`` 64-bit words from torch's default CPU generator, every bit random."""
    words = np.empty(count, dtype=np.int64)
    # (from, None) with the int64 minimum: the full range (plain random_() leaves the top bit 0)
    torch.from_numpy(words).random_(-(2**63), None)
    return words


def dropout_mask(dropout: nn.Dropout, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """The scaled mask ``dropout`` (in training mode) applies to a ``like``-typed tensor of
    ``shape``: the same random numbers as calling it on such a tensor."""
    if isinstance(dropout, FastDropout):
        return _keep_mask(shape, dropout.p, like)
    return F.dropout(like.new_ones(shape), dropout.p, training=True)


def _keep_mask(shape: tuple[int, ...], p: float, like: torch.Tensor) -> torch.Tensor:
    """A ``FastDropout``'s scaled mask: from the playing ``MaskTape`` (a cached contrastive
    step, ``stages.modeling.dropout_tape``), else drawn now."""
    tape = active_tape()
    if tape is not None:
        return tape.keep_mask(shape, p, like, _draw_keep_mask)
    return _draw_keep_mask(shape, p, like)


def _draw_keep_mask(shape: tuple[int, ...], p: float, like: torch.Tensor) -> torch.Tensor:
    if like.device.type == "cpu":
        return cpu_keep_mask(shape, p, like.dtype)
    return F.dropout(like.new_ones(shape), p, training=True)


class FastDropout(nn.Dropout):
    """``nn.Dropout`` with ``cpu_keep_mask`` on the CPU and ``F.dropout`` elsewhere."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if x.device.type != "cpu" and active_tape() is None:
            return F.dropout(x, self.p, training=True, inplace=self.inplace)
        return x * _keep_mask(tuple(x.shape), self.p, x)


def fast_dropout_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract ((batch, heads, length, head_size) q, k, v; a
    boolean mask (True: attend), an additive one, or None; returns (batch, length, heads,
    head_size)). With dropout on CPU tensors, the probabilities are dropped with
    ``cpu_keep_mask``; otherwise, and for what SDPA's function handles beyond an encoder's plain
    attention (causal masks, position biases, grouped heads, soft-capping, sinks), it is
    ``sdpa_attention_forward``."""
    _, heads, length, size = query.shape
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    plain = (
        not (causal and attention_mask is None and length > 1)
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and kwargs.get("s_aux") is None
        and key.shape[1] == heads
    )
    tape = active_tape()
    if tape is not None and dropout > 0 and not plain:
        raise RuntimeError(
            "a cached contrastive step replays attention dropout only for an encoder's plain "
            "attention (no causal mask, position bias, soft-capping or grouped heads)"
        )
    if dropout == 0 or (query.device.type != "cpu" and tape is None) or not plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask,
            dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs,
        )  # fmt: skip
    scale = size**-0.5 if scaling is None else scaling

    def drop(probs: torch.Tensor) -> torch.Tensor:
        # drawn as (batch, heads, queries, keys): the same numbers as over the (batch · heads)
        # rows, and a chunk's rows are its batch rows
        keep = _keep_mask(tuple(query.shape[:2]) + tuple(probs.shape[1:]), dropout, probs)
        return probs * keep.view(probs.shape)

    context = batched_attention(query, key, value, attention_mask, scale, drop)
    return context.contiguous(), None


AttentionInterface.register(FAST_DROPOUT_SDPA, fast_dropout_attention)
# transformers builds (or passes through) SDPA's boolean masks for it
AttentionMaskInterface.register(FAST_DROPOUT_SDPA, sdpa_mask)


def use_fast_dropout(model: nn.Module) -> int:
    """Replace every ``nn.Dropout`` of ``model`` by a ``FastDropout`` of the same rate (dropout
    holds no state, so weights and checkpoints are unchanged), and an SDPA backbone's attention
    implementation by ``FAST_DROPOUT_SDPA`` (not saved: transformers leaves the implementation
    out of a saved config); returns how many modules were replaced."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "sdpa":
        config._attn_implementation = FAST_DROPOUT_SDPA
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                setattr(parent, name, FastDropout(child.p, inplace=child.inplace))
                replaced += 1
    return replaced
