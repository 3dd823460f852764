"""Softmax attention as two batched matrix products and a softmax.

On the CPU this beats SDPA's kernel for short rows (it works in blocks; see
``benchmarks/short_attention.py``), and it lets the caller drop the probabilities with a mask
of its own drawing: the unpadded forward's short evaluation batches
(``stages.modeling.unpadded``) and the CPU training attention ``sdpa_fast_dropout``
(``stages.modeling.dropout``) both run it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def batched_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    drop: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ · scaling + mask) v for (batch, heads, length, head_size) q, k, v, with
    ``mask`` boolean (True: attend), additive, or None, broadcastable to (batch, heads, queries,
    keys); ``drop`` (if given) maps the (batch · heads, queries, keys) probabilities to their
    dropped-out values. Returned as (batch, queries, heads, head_size), the layout of
    transformers' attention functions (not made contiguous)."""
    batch, heads, length, size = query.shape
    keys = key.shape[2]
    rows = query.reshape(batch * heads, length, size)
    transposed_keys = key.reshape(batch * heads, keys, size).transpose(1, 2)
    if mask is None:
        scores = torch.bmm(rows, transposed_keys).mul_(scaling)
    else:
        bias = mask.to(query.dtype)
        if mask.dtype == torch.bool:
            minimum = torch.finfo(query.dtype).min  # finite: a fully masked row cannot give NaN
            bias = torch.zeros_like(bias).masked_fill_(~mask, minimum)
        queries = bias.shape[2]
        bias = bias.expand(batch, heads, queries, keys).reshape(batch * heads, queries, keys)
        scores = torch.baddbmm(bias, rows, transposed_keys, alpha=scaling)
    probs = scores.softmax(dim=-1)
    if drop is not None:
        probs = drop(probs)
    context = torch.bmm(probs, value.reshape(batch * heads, keys, size))
    return context.view(batch, heads, length, size).transpose(1, 2)
