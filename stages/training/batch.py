"""A step's batch: this rank's share of the global batch, padded and on its way to the device.

Dynamic padding lays a batch out at its longest row. Under fixed shapes (``Runtime.fixed_shapes``:
CUDA graphs, which replay a graph recorded for exactly one shape of every tensor) a new longest
length would record a new graph, so the views and the triplets are each laid out at their longest
row rounded up to a multiple of ``data.LAYOUT_MULTIPLE``, up to the length their rows are
truncated at (``train.max_seq_length`` for the corpus, the model's positions for the triplets,
``TripletPool.max_length``): a run meets at most ``limit / LAYOUT_MULTIPLE`` lengths of each, and
a batch pays at most the rounding beyond its own padding. Both forwards take these layouts: the
padded one as they are, the unpadded one with its packed rows bucketed on top
(``unpadded.Packing``, ``fixed_shapes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from stages.modeling.unpadded import Packing
from stages.training.data import BatchPlan, TokenRows, TripletPool, fixed_layout_length, pad_rows
from stages.training.runtime import Runtime


@dataclass
class Batch:
    ids: torch.Tensor
    mask: torch.Tensor
    triplet_ids: torch.Tensor | None = None
    triplet_mask: torch.Tensor | None = None
    packing: Packing | None = None  # where the real tokens are (host-built; unpadded forward)
    triplet_packing: Packing | None = None


def lay_out(
    rows: Sequence[np.ndarray], pad_id: int, fixed_shapes: bool, limit: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) of ``rows``: dynamically padded, or under ``fixed_shapes`` at
    ``fixed_layout_length`` (``limit``: the length the rows are truncated at)."""
    longest = max((len(r) for r in rows), default=1)
    return pad_rows(rows, pad_id, fixed_layout_length(longest, limit) if fixed_shapes else None)


def make_batch(
    corpus: TokenRows,
    plan: BatchPlan,
    pool: TripletPool | None,
    step: int,
    rank: int,
    pad_id: int,
    runtime: Runtime,
    unpad: bool = False,
    max_length: int | None = None,
) -> Batch:
    """This rank's share of 0-based global ``step``, padded and on its way to the device; with
    ``unpad`` also where its real tokens are (computed here, on the host). ``max_length``: the
    length the corpus rows are truncated at (``train.max_seq_length``), the longest layout of
    the views under fixed shapes (see the module docstring)."""
    fixed = runtime.fixed_shapes

    def packing(mask: np.ndarray) -> Packing:
        return Packing.from_mask(mask, runtime.to_device, runtime.packed_rows_multiple, fixed)

    sentences = plan.shard(step, rank)
    ids, mask = lay_out(corpus.rows(sentences), pad_id, fixed, max_length)
    batch = Batch(runtime.to_device(ids), runtime.to_device(mask))
    if unpad:
        batch.packing = packing(mask)
    if pool is not None:
        anchor, short, long = pool.shard(step, rank, sentences)
        if not anchor:  # in-batch triplets: none of the step's sentences has one
            return batch
        t_ids, t_mask = lay_out(anchor + short + long, pad_id, fixed, pool.max_length)
        batch.triplet_ids, batch.triplet_mask = runtime.to_device(t_ids), runtime.to_device(t_mask)
        if unpad:
            batch.triplet_packing = packing(t_mask)
    return batch
