"""The forward pass of an encoder over the real tokens only (no padding computed).

A dynamically padded batch of short sentences is about a third padding (wiki1m, 32 tokens), and
a Hugging Face encoder runs every dense layer over it. Here the token states are gathered once
per forward into a packed (tokens, hidden) matrix and every token-wise layer (QKV projection,
attention output projection, feed-forward, LayerNorm, dropout) runs on it; the packed Q, K, V
are scattered back into the padded layout only for the attention itself, which then runs
through transformers' own attention function for the model's implementation (SDPA or eager) with
the padding masked out, and the attention output is gathered again.

The model's own modules and weights do the work (embeddings, the attention output
projection, feed-forward, LayerNorms, the pooler; Q, K and V as one matrix product with the
three projections' weights), so checkpoints are unchanged and every state equals the padded
forward's up to float rounding at the real tokens. Dropout after a dense layer draws its mask
for the whole padded (batch, length, hidden) layout, exactly as the padded forward draws it (same
shape, dtype, device and call order, so the same random numbers), and keeps the real tokens'
rows: with the same seed, a training step unpadded equals the padded one up to float rounding,
and switching ``train.unpad`` changes no random number of a run. The masks come from the
dropout module: on a GPU the module itself runs on the padded layout; on the CPU its mask is
drawn for that layout (``stages.modeling.dropout.dropout_mask``; the trainer's ``FastDropout``
draws it cheaply) and only the real rows multiply (``padded_dropout``).

The cls poolers read the last layer at each row's first token alone, and everything in a layer
after its attention works row by row, so with ``first_tokens_only`` the last layer's attention
runs as always (every token's keys, values and queries: the same dropout draws as the padded
forward) and its output projection, feed-forward, dropouts and LayerNorms run on the first
tokens only (``_first_tokens``, in every layout). The trainer (``train.pooler: cls``, as
SimCSE) and the evaluation encoder (``cls_before_pooler``) ask for it. That is about 3/4 of the
last layer's matrix products (BERT: attention output 1, feed-forward 8, of 12 units a token with
Q, K, V 3), so 3/8 of a 2-layer encoder's, 1/8 of a 6-layer one's, 1/16 of BERT-base's.

One ``PackedLayout`` per layer structure, named by the family's adapter
(``stages.modeling.backbone_adapters``: ``packed_layout``):

- ``bert``: BERT, RoBERTa, XLM-RoBERTa (MiniLM checkpoints are BERT), absolute positions, SDPA
  or eager attention through transformers' attention functions;
- ``distilbert``: DistilBERT (the same attention functions, its own module names);
- ``mpnet``: MPNet, eager attention with its relative position bias (one (heads, length,
  length) table per forward, added to the padding mask);
- ``deberta``: DeBERTa-v2 and -v3, whose disentangled attention (content-to-position and
  position-to-content scores from the relative position embeddings) is computed as its module
  computes it, from its weights and methods: Q, K and V projected on the packed tokens, the
  scores over the padded layout; its output projection and feed-forward run packed. A DeBERTa
  with the convolution after its first layer (``conv_kernel_size``, DeBERTa-v2 xlarge) is not
  covered;
- ``modernbert``: ModernBERT, pre-LayerNorm layers with a gated feed-forward, rotary positions
  applied to the scattered Q and K (the model's own rotary tables per layer type), the global
  layers' padding mask and the local layers' sliding-window one built once per forward, and
  the final LayerNorm on the packed states.

``unpadding_unsupported`` says why another model is not covered (a family whose adapter says
``padded_only``, a layout's own refusal); the callers then run the padded forward.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from stages.modeling.backbone_adapters import ADAPTERS, find_adapter
from stages.modeling.batched_attention import batched_attention
from stages.modeling.cpu_linear import OneDnnLinear, linear
from stages.modeling.dropout import FAST_DROPOUT_SDPA, dropout_mask

# Attention implementations that take a (batch, 1, 1, keys) mask ready made: boolean (True:
# attend) or additive.
BOOLEAN_MASKED_ATTENTION = frozenset({"sdpa", FAST_DROPOUT_SDPA})
MASKED_ATTENTION = BOOLEAN_MASKED_ATTENTION | {"eager"}


def attention_bias(
    mask: torch.Tensor, implementation: str, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The (batch, 1, 1, keys) attention mask as transformers' ``implementation`` expects it.

    SDPA (and ``FAST_DROPOUT_SDPA``) takes a boolean mask (True: attend); eager attention adds the
    mask to the scores, so it needs an additive float mask (0 to attend, the dtype's minimum for
    padding). Handing transformers a ready 4-D mask skips its own mask preparation, which
    inspects the mask's values (``mask.all()``) and so would wait for the GPU at every forward.
    Other implementations (flash attention, flex attention) take other mask forms and are refused.
    """
    if implementation in BOOLEAN_MASKED_ATTENTION:
        return mask[:, None, None, :].bool()
    if implementation == "eager":
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        bias = bias.masked_fill(~mask.bool(), torch.finfo(dtype).min)
        return bias[:, None, None, :]
    raise ValueError(
        f"attention implementation '{implementation}' is not supported; "
        f"use one of {', '.join(sorted(MASKED_ATTENTION))}"
    )


def unpadding_unsupported(model: nn.Module) -> str | None:
    """Why ``packed_forward`` cannot run ``model``, or None when it can."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    adapter = find_adapter(model_type)
    if adapter is None:
        packed = sorted(t for t, a in ADAPTERS.items() if a.packed_layout is not None)
        return f"model type {model_type!r} is not one of {', '.join(packed)}"
    if adapter.packed_layout is None:
        return f"{adapter.family}: {adapter.padded_only}"
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return "a decoder (causal or cross attention)"
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return f"position embeddings '{config.position_embedding_type}'"
    if config._attn_implementation not in MASKED_ATTENTION:
        return f"attention implementation '{config._attn_implementation}'"
    layout = PACKED_LAYOUTS[adapter.packed_layout]
    missing = layout.missing(model)
    if missing:
        return f"{type(model).__name__} has no {missing}"
    return layout.refuse(model)


@dataclass(frozen=True)
class HeadRows:
    """Q, K and V packed as (tokens, 3, heads, head_size) and padded as (3, batch, heads,
    length, head_size), both seen as rows of head_size: ``gather``, for each padded row, the
    packed row it copies (padding copies row 0, then ``padding``'s rows are zeroed); ``padding``,
    the padded rows at padding cells (None without any); ``sources``, for each packed row, the
    padded row its gradient comes from (a filler's reads the last real token)."""

    gather: torch.Tensor
    padding: torch.Tensor | None
    sources: torch.Tensor


def _filled_up(positions: np.ndarray, size: int) -> np.ndarray:
    """``positions`` repeated at its first entry up to ``size`` entries (none stays none)."""
    if positions.size == 0 or positions.size >= size:
        return positions
    return np.concatenate([positions, np.full(size - positions.size, positions[0])])


@dataclass(frozen=True)
class Packing:
    """Where the real tokens of a right-padded (batch, length) batch sit.

    ``indices``: the flat positions (row * length + column) gathered into the packed rows: the
    real tokens, row by row, then any filler rows; ``first``: each row's first token in the
    packed order; ``lengths``: real tokens per row (float, for means); ``targets``: only with
    filler rows, where each packed row goes when unpacked (its flat position, or the spare
    position ``batch * length``, dropped, for a filler); ``padding``: the flat positions of the
    padding (None without any); ``fillers``: the packed positions of the filler rows (None
    without any; derivable from ``targets``, but only by a ``nonzero``, which would wait for a
    device and break ``torch.compile``'s graph). Built on the host from the mask, so using it
    never waits for the device.

    Filler rows (``from_mask(..., rows_multiple=k)``) round the packed row count up to a
    multiple of k with copies of the last real token, computed and then dropped. On a CPU in
    bf16, oneDNN builds (JIT-compiles) a kernel for every new matrix shape, and the number of
    real tokens changes from batch to batch: a training step on fresh batches took 17-27% longer
    than on batches whose shapes it had seen (all-MiniLM-L6-v2 and a 2 × 128 encoder,
    AVX512-BF16), and a run meets new shapes for as long as it lasts. Rounding keeps the shapes to
    a few dozen for a few percent more rows. The trainer's fp32 products on an x86 CPU run on
    oneDNN too (``stages.modeling.cpu_linear``).

    CUDA graphs replay a graph recorded for exactly one shape of every tensor (``train.compile:
    reduce-overhead``): there the batch comes laid out at one of a few lengths (its longest row
    rounded up, ``stages.training.batch``) and ``fixed_shapes`` makes every index tensor's size
    depend only on the layout and the bucket (at least one filler row; ``padding`` and
    ``fillers`` filled up to their largest size with repeats of an entry, which the in-place
    fills they serve write twice with the same value; only a batch without any padding differs),
    so a graph recorded for one (layout, bucket) replays for every batch in it.
    """

    indices: torch.Tensor
    first: torch.Tensor
    lengths: torch.Tensor
    batch: int
    length: int
    targets: torch.Tensor | None = None
    padding: torch.Tensor | None = None
    fillers: torch.Tensor | None = None

    @property
    def tokens(self) -> int:
        """Rows of the packed matrix (the real tokens and any fillers)."""
        return self.indices.numel()

    @classmethod
    def from_mask(
        cls,
        mask: np.ndarray | torch.Tensor,
        to_device: Callable[[np.ndarray], torch.Tensor] | None = None,
        rows_multiple: int = 1,
        fixed_shapes: bool = False,
    ) -> Packing:
        """From a host (numpy or CPU tensor) mask; a device tensor is copied to the host first
        (one wait for the device). ``to_device`` moves the index arrays (default: the mask's
        device); ``rows_multiple``: filler rows up to a multiple of it (at most batch * length
        rows in all); ``fixed_shapes``: index tensors of sizes fixed by the layout and bucket
        (see the class docstring)."""
        if isinstance(mask, torch.Tensor):
            device = mask.device
            mask = mask.detach().cpu().numpy()
            if to_device is None:

                def to_device(array: np.ndarray) -> torch.Tensor:
                    return torch.from_numpy(array).to(device, non_blocking=True)

        mask = np.asarray(mask, dtype=bool)
        if mask.ndim != 2:
            raise ValueError(f"a (batch, length) mask is needed, not shape {mask.shape}")
        batch, length = mask.shape
        lengths = mask.sum(axis=1)
        if not np.array_equal(mask, np.arange(length) < lengths[:, None]) or (lengths == 0).any():
            raise ValueError("unpadding needs right padding and at least one token per row")
        indices = np.flatnonzero(mask)
        first = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        move = to_device or torch.from_numpy
        cells, real = batch * length, indices.size
        # fixed shapes: at least one filler, so that a batch whose tokens fill its bucket
        # exactly takes the bucket's graph, not one without fillers (a recompile)
        rounded = -(-(real + fixed_shapes) // rows_multiple) * rows_multiple
        fillers = min(rounded, cells) - real
        targets = None
        if fillers > 0:
            targets = move(np.concatenate([indices, np.full(fillers, cells)]).astype(np.int64))
            indices = np.concatenate([indices, np.full(fillers, indices[-1])])
        padding = np.flatnonzero(~mask)
        filler_rows = np.arange(real, real + fillers, dtype=np.int64)
        if fixed_shapes:
            padding = _filled_up(padding, cells - batch)  # every row holds a token
            filler_rows = _filled_up(filler_rows, rows_multiple)
        return cls(
            move(indices.astype(np.int64)),
            move(first.astype(np.int64)),
            move(lengths.astype(np.float32)),
            batch,
            length,
            targets,
            move(padding.astype(np.int64)) if padding.size else None,
            move(filler_rows) if fillers > 0 else None,
        )

    def repeated(self, times: int) -> Packing:
        """The packing of the batch stacked ``times`` times (``torch.cat([x] * times)``),
        computed on the device without waiting for it."""
        if times == 1:
            return self
        cells, tokens = self.batch * self.length, self.tokens
        targets = None
        if self.targets is not None:
            spare = self.targets == cells
            targets = torch.cat(
                [torch.where(spare, cells * times, self.targets + i * cells) for i in range(times)]
            )
        return Packing(
            torch.cat([self.indices + i * cells for i in range(times)]),
            torch.cat([self.first + i * tokens for i in range(times)]),
            self.lengths.repeat(times),
            self.batch * times,
            self.length,
            targets,
            None
            if self.padding is None
            else torch.cat([self.padding + i * cells for i in range(times)]),
            None
            if self.fillers is None
            else torch.cat([self.fillers + i * tokens for i in range(times)]),
        )

    def head_rows(self, heads: int) -> HeadRows:
        """``HeadRows`` for ``heads`` heads, computed once per head count (on the device; kept
        in the instance's ``__dict__``, which a frozen dataclass leaves writable, and not with
        ``functools.cached_property``, whose lock breaks ``torch.compile``'s graph)."""
        cache = self.__dict__.setdefault("_head_rows_by_heads", {})
        if heads not in cache:
            cells, device = self.batch * self.length, self.indices.device
            # each cell's packed row (fillers go to the spare cell, cut off; padding reads row 0)
            packed_row = torch.zeros(cells + 1, dtype=torch.long, device=device)
            packed_row.index_copy_(
                0,
                self.indices if self.targets is None else self.targets,
                torch.arange(self.tokens, device=device),
            )
            by_cell = packed_row[:cells].view(1, self.batch, 1, self.length)
            parts = torch.arange(3, device=device).view(3, 1, 1, 1)
            head = torch.arange(heads, device=device).view(1, 1, heads, 1)
            cache[heads] = HeadRows(
                gather=((by_cell * 3 + parts) * heads + head).reshape(-1),
                padding=None if self.padding is None else self._head_rows(self.padding, heads),
                sources=self._head_rows(self.indices, heads),
            )
        return cache[heads]

    def _head_rows(self, flat: torch.Tensor, heads: int) -> torch.Tensor:
        """The rows of the padded (3, batch, heads, length) layout of the cells at ``flat``,
        as (cells, 3, heads) flattened."""
        rows, positions = flat.div(self.length, rounding_mode="floor"), flat.remainder(self.length)
        parts = torch.arange(3, device=flat.device)[:, None]
        head = torch.arange(heads, device=flat.device)
        cell = (parts * self.batch + rows[:, None, None]) * heads + head  # (cells, 3, heads)
        return (cell * self.length + positions[:, None, None]).reshape(-1)

    def first_tokens(self) -> Packing:
        """The packing of each row's first token alone (what the cls poolers read); every later
        position is its padding."""
        device = self.indices.device
        rows = torch.arange(self.batch, device=device)
        later = rows[:, None] * self.length + torch.arange(1, self.length, device=device)
        return Packing(
            rows * self.length,
            rows,
            torch.ones(self.batch, device=device),
            self.batch,
            self.length,
            padding=later.reshape(-1) if self.length > 1 else None,
        )

    @property
    def dense(self) -> bool:
        """No padding at all (every row as long as the batch): packing is a reshape."""
        return self.targets is None and self.tokens == self.batch * self.length

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """(batch, length, ...) -> (tokens, ...)."""
        flat = padded.reshape(self.batch * self.length, *padded.shape[2:])
        return flat if self.dense else flat.index_select(0, self.indices)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """(tokens, ...) -> (batch, length, ...), zeros at the padding."""
        if self.dense:
            return packed.view(self.batch, self.length, *packed.shape[1:])
        cells, row = self.batch * self.length, packed.shape[1:]
        if self.targets is None:
            padded = packed.new_zeros((cells, *row)).index_copy_(0, self.indices, packed)
        else:  # the fillers land on the spare row, cut off
            padded = packed.new_zeros((cells + 1, *row)).index_copy_(0, self.targets, packed)
            padded = padded[:cells]
        return padded.view(self.batch, self.length, *row)


@dataclass
class PackedStates:
    """The packed outputs: the last layer's token states ((tokens, hidden); (batch, hidden),
    each row's first token only, with ``first_tokens_only``) and, if asked, the first layer's."""

    last: torch.Tensor
    first_layer: torch.Tensor | None
    first_tokens_only: bool = False

    def first_tokens(self, packing: Packing) -> torch.Tensor:
        """The last layer's states at each row's first token, (batch, hidden)."""
        return self.last if self.first_tokens_only else self.last.index_select(0, packing.first)


def packed_forward(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    packing: Packing,
    *,
    token_type_ids: torch.Tensor | None = None,
    keep_first_layer: bool = False,
    first_tokens_only: bool = False,
) -> PackedStates:
    """The encoder's token states at the real tokens (see the module docstring). With
    ``first_tokens_only`` (what the cls poolers read) the last layer's states come back at each
    row's first token alone: that layer's attention runs as before (keys and values of every
    token, every query, so dropout draws what the padded forward draws) and only what follows it
    runs on the first tokens."""
    reason = unpadding_unsupported(model)
    if reason is not None:
        raise ValueError(f"cannot unpad {type(model).__name__}: {reason}")
    if keep_first_layer and first_tokens_only:
        raise ValueError("keep_first_layer needs every token's states, not first_tokens_only")
    layout = PACKED_LAYOUTS[ADAPTERS[model.config.model_type].packed_layout]
    embedded = layout.embed(model, input_ids, token_type_ids)
    context = layout.context(model, mask, embedded)
    states = packing.pack(embedded)
    first_layer = None
    layers = layout.layers(model)
    for i, layer in enumerate(layers):
        first_only = first_tokens_only and i == len(layers) - 1
        if getattr(layer, "gradient_checkpointing", False) and layer.training:
            states = checkpoint(
                layout.layer, layer, states, context, packing, first_only, use_reentrant=False
            )
        else:
            states = layout.layer(layer, states, context, packing, first_only)
        if i == 0 and keep_first_layer:
            first_layer = states
    last = layout.finish(model, states)
    if keep_first_layer and len(layers) == 1:
        first_layer = last  # Hugging Face's hidden_states end with the finished states
    return PackedStates(last, first_layer, first_tokens_only)


def _qkv(projections: tuple[nn.Module, nn.Module, nn.Module], states: torch.Tensor) -> torch.Tensor:
    """(tokens, 3 * hidden): Q, K and V in one matrix product when the projections are plain
    Linear layers (else through the modules, e.g. adapters)."""
    if all(type(p) in (nn.Linear, OneDnnLinear) and p.bias is not None for p in projections):
        weight = torch.cat([p.weight for p in projections])
        bias = torch.cat([p.bias for p in projections])
        product = linear if isinstance(projections[0], OneDnnLinear) else F.linear
        return product(states, weight, bias)
    return torch.cat([p(states) for p in projections], dim=-1)


class _PaddedHeads(torch.autograd.Function):
    """Packed (tokens, 3 * hidden) Q, K, V to the padded (3, batch, heads, length, head_size)
    layout, zeros at the padding, each of Q, K and V contiguous as the attention's batched
    products read it: one ``index_select`` of whole head-size rows (``HeadRows``) and the
    padding's rows zeroed; the backward gathers the real tokens' gradients back the same way.
    Unpacking into a padded (batch, length, 3 * hidden) matrix and permuting that left Q, K and
    V strided: the attention copied each, and autograd's way back (the permutation's copy, the
    spare row's slice, the scatter) took four passes over the padded gradient. A training step
    of the 2 × 128 encoder (batch 64, 2 threads, four interleaved rounds of 40 steps) took 2-9%
    less with it: fp32 40.6-41.8 against 42.3-44.8 ms, bf16 30.7-30.9 against 31.4-33.1 ms."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        qkv: torch.Tensor,
        rows: HeadRows,
        fillers: torch.Tensor | None,
        shape: tuple[int, int, int, int],
    ) -> torch.Tensor:
        batch, heads, length, size = shape
        padded = qkv.reshape(-1, size).index_select(0, rows.gather)
        if rows.padding is not None:
            padded.index_fill_(0, rows.padding, 0)
        ctx.save_for_backward(rows.sources, *([] if fillers is None else [fillers]))
        ctx.tokens = qkv.shape[0]
        return padded.view(3, batch, heads, length, size)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        sources, *fillers = ctx.saved_tensors
        packed = grad.reshape(-1, grad.shape[-1]).index_select(0, sources).view(ctx.tokens, -1)
        for rows in fillers:  # dropped in the forward: no gradient
            packed.index_fill_(0, rows, 0)
        return packed, None, None, None


def _split_heads(qkv: torch.Tensor, packing: Packing, heads: int) -> torch.Tensor:
    """Packed (tokens, 3 * hidden) -> padded (3, batch, heads, length, head_size), each of Q, K
    and V contiguous, zeros at the padding. (The index rows are computed out here: under
    ``torch.compile`` a custom Function may not leave tensors it made behind in a cache.)"""
    shape = (packing.batch, heads, packing.length, qkv.shape[-1] // (3 * heads))
    return _PaddedHeads.apply(qkv, packing.head_rows(heads), packing.fillers, shape)


def _attention_function(attention: nn.Module) -> Callable[..., tuple[torch.Tensor, object]]:
    implementation = attention.config._attn_implementation
    eager = getattr(inspect.getmodule(type(attention)), "eager_attention_forward", None)
    if implementation == "eager":
        if eager is None:
            raise ValueError(f"{type(attention).__name__}: no eager attention function")
        return eager
    return ALL_ATTENTION_FUNCTIONS[implementation]


def _attend(
    attention: nn.Module, qkv: torch.Tensor, bias: torch.Tensor, packing: Packing, heads: int
) -> torch.Tensor:
    """Packed attention context (tokens, hidden) over the padded layout with the padding masked
    out: through transformers' attention function for the model's implementation, or, for a
    short batch evaluated on the CPU, ``batched_attention``."""
    q, k, v = _split_heads(qkv, packing, heads)
    if not attention.training and q.device.type == "cpu" and packing.length <= SHORT_CPU_LENGTH:
        context = batched_attention(q, k, v, None if packing.dense else bias, attention.scaling)
    else:
        context, _ = _attention_function(attention)(
            attention,
            q,
            k,
            v,
            bias,
            dropout=attention.dropout.p if attention.training else 0.0,
            scaling=attention.scaling,
        )  # (batch, length, heads, head_size)
    return packing.pack(context.reshape(packing.batch, packing.length, -1))


# Up to this many positions, attention without dropout on the CPU runs as two batched matrix
# products and a softmax: SDPA's CPU kernel works in blocks and costs more for such short rows
# (benchmarks/short_attention.py); from about 24 positions on SDPA is as fast or faster.
# transformers' eager_attention_forward computes the same with 4-D matmuls and a separate mask
# addition, which measured no faster than SDPA at 16 positions; baddbmm fuses scale and mask.
SHORT_CPU_LENGTH = 16


def padded_dropout(dropout: nn.Dropout, packed: torch.Tensor, packing: Packing) -> torch.Tensor:
    """``dropout`` on packed (tokens, hidden) rows as the padded forward applies it: the same
    mask (drawn over the padded layout, in the padded forward's order) and the same arithmetic.
    On a GPU the module itself runs on the rows scattered into the padded layout (4 kernels each
    way, against 8 forward and 4 backward for drawing a mask, packing it and replaying the fused
    kernel's arithmetic); on the CPU the mask is drawn for the padded shape and only its real
    rows multiply (less memory traffic than scattering)."""
    if not isinstance(dropout, nn.Dropout) or not dropout.training or dropout.p == 0:
        return packed  # ModernBERT builds nn.Identity where its dropout is 0
    if _launch_bound(packed.device):
        return packing.pack(dropout(packing.unpack(packed)))
    mask = dropout_mask(dropout, (packing.batch, packing.length, packed.shape[-1]), packed)
    return packed * packing.pack(mask)


def _launch_bound(device: torch.device) -> bool:
    """Whether a training step on ``device`` is bound by kernel launches (a GPU's) rather than
    by arithmetic and memory traffic (a CPU's)."""
    return device.type != "cpu"


def _dense_dropout_norm(
    output: nn.Module, hidden: torch.Tensor, residual: torch.Tensor, packing: Packing
) -> torch.Tensor:
    """BERT's ``SelfOutput`` / ``Output`` (dense, dropout, LayerNorm of the residual sum)."""
    dropped = padded_dropout(output.dropout, output.dense(hidden), packing)
    return output.LayerNorm(dropped + residual)


def _first_tokens(
    context: torch.Tensor, states: torch.Tensor, packing: Packing, first_tokens_only: bool
) -> tuple[torch.Tensor, torch.Tensor, Packing]:
    """A layer's packed attention output and input states, and the packing the rest of the layer
    runs on: all of them, or with ``first_tokens_only`` each row's first token alone (everything
    after the attention is row by row; dropout still draws its mask over the padded layout)."""
    if not first_tokens_only:
        return context, states, packing
    first = packing.first
    return context.index_select(0, first), states.index_select(0, first), packing.first_tokens()


def _bert_layer(
    layer: nn.Module,
    states: torch.Tensor,
    bias: torch.Tensor,
    packing: Packing,
    first_tokens_only: bool = False,
) -> torch.Tensor:
    attention = layer.attention.self
    qkv = _qkv((attention.query, attention.key, attention.value), states)
    context = _attend(attention, qkv, bias, packing, attention.num_attention_heads)
    context, states, packing = _first_tokens(context, states, packing, first_tokens_only)
    attended = _dense_dropout_norm(layer.attention.output, context, states, packing)
    return _dense_dropout_norm(layer.output, layer.intermediate(attended), attended, packing)


def _distilbert_layer(
    layer: nn.Module,
    states: torch.Tensor,
    bias: torch.Tensor,
    packing: Packing,
    first_tokens_only: bool = False,
) -> torch.Tensor:
    attention = layer.attention
    qkv = _qkv((attention.q_lin, attention.k_lin, attention.v_lin), states)
    context = _attend(attention, qkv, bias, packing, attention.n_heads)
    context, states, packing = _first_tokens(context, states, packing, first_tokens_only)
    attended = layer.sa_layer_norm(attention.out_lin(context) + states)
    ffn = layer.ffn  # its ff_chunk: lin1, activation, lin2, dropout
    hidden = ffn.lin2(ffn.activation(ffn.lin1(attended)))
    return layer.output_layer_norm(padded_dropout(ffn.dropout, hidden, packing) + attended)


def _mpnet_layer(
    layer: nn.Module,
    states: torch.Tensor,
    bias: torch.Tensor,
    packing: Packing,
    first_tokens_only: bool = False,
) -> torch.Tensor:
    """MPNet's attention as its own module computes it (eager; ``bias`` holds the relative
    position bias plus the padding mask)."""
    attention = layer.attention.attn
    qkv = _qkv((attention.q, attention.k, attention.v), states)
    q, k, v = _split_heads(qkv, packing, attention.num_attention_heads)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(attention.attention_head_size)
    probs = attention.dropout(F.softmax(scores + bias, dim=-1))
    context = torch.matmul(probs, v).permute(0, 2, 1, 3)
    context = packing.pack(context.reshape(packing.batch, packing.length, -1))
    context, states, packing = _first_tokens(context, states, packing, first_tokens_only)
    dropped = padded_dropout(layer.attention.dropout, attention.o(context), packing)
    attended = layer.attention.LayerNorm(dropped + states)
    return _dense_dropout_norm(layer.output, layer.intermediate(attended), attended, packing)


def _padding_bias(
    model: PreTrainedModel, mask: torch.Tensor, embedded: torch.Tensor
) -> torch.Tensor:
    return attention_bias(mask, model.config._attn_implementation, embedded.dtype)


def _mpnet_bias(model: PreTrainedModel, mask: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
    """The padding mask plus MPNet's relative position bias, computed for one row (it depends on
    the length only) and broadcast over the batch."""
    return _padding_bias(model, mask, embedded) + model.encoder.compute_position_bias(embedded[:1])


@dataclass(frozen=True)
class DebertaContext:
    """What DeBERTa's encoder hands every layer: the (batch, 1, length, length) mask, the
    relative positions and the (normalised) relative position embeddings."""

    mask: torch.Tensor
    relative_pos: torch.Tensor | None
    rel_embeddings: torch.Tensor | None


def _deberta_context(
    model: PreTrainedModel, mask: torch.Tensor, embedded: torch.Tensor
) -> DebertaContext:
    encoder = model.encoder
    return DebertaContext(
        encoder.get_attention_mask(mask), encoder.get_rel_pos(embedded), encoder.get_rel_embedding()
    )


def _deberta_layer(
    layer: nn.Module,
    states: torch.Tensor,
    context: DebertaContext,
    packing: Packing,
    first_tokens_only: bool = False,
) -> torch.Tensor:
    """DeBERTa's disentangled attention as its module computes it, with Q, K and V projected on
    the packed tokens and the scores over the padded layout (its relative attention needs the
    positions); then the output projection and feed-forward on the packed tokens."""
    attention = layer.attention
    module = attention.self
    heads, length = module.num_attention_heads, packing.length
    qkv = _qkv((module.query_proj, module.key_proj, module.value_proj), states)
    q, k, v = (module.transpose_for_scores(t, heads) for t in packing.unpack(qkv).chunk(3, -1))
    scale_factor = 1 + sum(kind in module.pos_att_type for kind in ("c2p", "p2c"))
    scale = inspect.getmodule(type(module)).scaled_size_sqrt(q, scale_factor)
    scores = torch.bmm(q, k.transpose(-1, -2) / scale.to(dtype=q.dtype))
    if module.relative_attention:
        rel_embeddings = module.pos_dropout(context.rel_embeddings)
        scores = scores + module.disentangled_attention_bias(
            q, k, context.relative_pos, rel_embeddings, scale_factor
        )
    scores = scores.view(-1, heads, length, length)
    scores = scores.masked_fill(~context.mask.bool(), torch.finfo(q.dtype).min)
    probs = module.dropout(F.softmax(scores, dim=-1))
    attended = torch.bmm(probs.view(-1, length, length), v)
    attended = attended.view(packing.batch, heads, length, -1).permute(0, 2, 1, 3)
    attended = packing.pack(attended.reshape(packing.batch, length, -1))
    attended, states, packing = _first_tokens(attended, states, packing, first_tokens_only)
    attended = _dense_dropout_norm(attention.output, attended, states, packing)
    return _dense_dropout_norm(layer.output, layer.intermediate(attended), attended, packing)


def _deberta_refusal(model: PreTrainedModel) -> str | None:
    if getattr(model.encoder, "conv", None) is not None:
        return "the convolution after its first layer (conv_kernel_size)"
    return None


@dataclass(frozen=True)
class ModernBertContext:
    """Per layer type (``full_attention``, ``sliding_attention``): the attention mask and the
    rotary (cos, sin) tables over the padded positions."""

    masks: dict[str, torch.Tensor]
    rotary: dict[str, tuple[torch.Tensor, torch.Tensor]]


def _modernbert_context(
    model: PreTrainedModel, mask: torch.Tensor, embedded: torch.Tensor
) -> ModernBertContext:
    """The masks transformers builds for ModernBERT (a key within ``sliding_window`` positions
    of the query, inclusive, for the local layers), in the form of ``attention_bias``."""
    config = model.config
    length = mask.shape[1]
    positions = torch.arange(length, device=mask.device)
    window = (positions[:, None] - positions[None, :]).abs() <= config.sliding_window
    keys = mask.bool()[:, None, None, :]
    allowed = {"full_attention": keys, "sliding_attention": keys & window}
    if config._attn_implementation == "eager":
        zeros = torch.zeros((), dtype=embedded.dtype, device=mask.device)
        minimum = torch.finfo(embedded.dtype).min
        masks = {t: zeros.expand(a.shape).masked_fill(~a, minimum) for t, a in allowed.items()}
    else:  # SDPA: True attends
        masks = allowed
    position_ids = positions[None]
    rotary = {t: model.rotary_emb(embedded, position_ids, t) for t in set(config.layer_types)}
    return ModernBertContext(masks, rotary)


def _modernbert_layer(
    layer: nn.Module,
    states: torch.Tensor,
    context: ModernBertContext,
    packing: Packing,
    first_tokens_only: bool = False,
) -> torch.Tensor:
    """ModernBERT's encoder layer: pre-LayerNorm attention with rotary Q and K, then the gated
    feed-forward (``act(input) * gate``), each added to the residual stream."""
    attention = layer.attn
    heads = attention.Wqkv.out_features // (3 * attention.head_dim)
    qkv = attention.Wqkv(layer.attn_norm(states))
    q, k, v = _split_heads(qkv, packing, heads)
    cos, sin = context.rotary[layer.attention_type]
    module = inspect.getmodule(type(attention))
    q, k = module.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(
        attention.config._attn_implementation, module.eager_attention_forward
    )
    attended, _ = attend(
        attention,
        q,
        k,
        v,
        context.masks[layer.attention_type],
        dropout=attention.attention_dropout if attention.training else 0.0,
        scaling=attention.head_dim**-0.5,
    )  # (batch, length, heads, head_size)
    attended = packing.pack(attended.reshape(packing.batch, packing.length, -1))
    attended, states, packing = _first_tokens(attended, states, packing, first_tokens_only)
    states = states + padded_dropout(attention.out_drop, attention.Wo(attended), packing)
    mlp = layer.mlp
    hidden, gate = mlp.Wi(layer.mlp_norm(states)).chunk(2, dim=-1)
    return states + mlp.Wo(padded_dropout(mlp.drop, mlp.act(hidden) * gate, packing))


Embed = Callable[[PreTrainedModel, torch.Tensor, torch.Tensor | None], torch.Tensor]
PackedLayer = Callable[[nn.Module, torch.Tensor, Any, Packing, bool], torch.Tensor]
LayerContext = Callable[[PreTrainedModel, torch.Tensor, torch.Tensor], Any]
Finish = Callable[[PreTrainedModel, torch.Tensor], torch.Tensor]


def _finished(model: PreTrainedModel, states: torch.Tensor) -> torch.Tensor:
    return states


def _covered(model: PreTrainedModel) -> str | None:
    return None


@dataclass(frozen=True)
class PackedLayout:
    """A layer structure: its embeddings (padded), where its layers are, one layer over packed
    tokens, what every layer is given besides the states (by default the padding mask in
    ``attention_bias``'s form; MPNet adds its relative position bias, ModernBERT has masks and
    rotary tables per layer type), what follows the last layer (ModernBERT's final norm), and
    why a model of the family is not covered (None: it is). A layer takes ``first_tokens_only``:
    after its attention it runs on each row's first token alone (``_first_tokens``)."""

    embed: Embed
    layers_path: tuple[str, ...]
    layer: PackedLayer
    context: LayerContext = _padding_bias
    finish: Finish = _finished
    refuse: Callable[[PreTrainedModel], str | None] = _covered

    def layers(self, model: nn.Module) -> nn.ModuleList:
        for name in self.layers_path:
            model = getattr(model, name)
        return model

    def missing(self, model: nn.Module) -> str | None:
        """The first module the layout needs that ``model`` lacks, or None."""
        if not hasattr(model, "embeddings"):
            return "embeddings"
        found = model
        for name in self.layers_path:
            found = getattr(found, name, None)
            if found is None:
                return ".".join(self.layers_path)
        return None


PACKED_LAYOUTS = {
    "bert": PackedLayout(
        lambda model, ids, types: model.embeddings(input_ids=ids, token_type_ids=types),
        ("encoder", "layer"),
        _bert_layer,
    ),
    "distilbert": PackedLayout(
        lambda model, ids, types: model.embeddings(input_ids=ids),
        ("transformer", "layer"),
        _distilbert_layer,
    ),
    "mpnet": PackedLayout(
        lambda model, ids, types: model.embeddings(input_ids=ids),
        ("encoder", "layer"),
        _mpnet_layer,
        _mpnet_bias,
    ),
    "deberta": PackedLayout(
        # the padding rows it zeroes are left out anyway
        lambda model, ids, types: model.embeddings(input_ids=ids, token_type_ids=types),
        ("encoder", "layer"),
        _deberta_layer,
        _deberta_context,
        refuse=_deberta_refusal,
    ),
    "modernbert": PackedLayout(
        lambda model, ids, types: model.embeddings(input_ids=ids),
        ("layers",),
        _modernbert_layer,
        _modernbert_context,
        lambda model, states: model.final_norm(states),
    ),
}
