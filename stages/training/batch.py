"""A step's batch: this rank's share of the global batch, padded and on its way to the device."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from stages.modeling.unpadded import Packing
from stages.training.data import BatchPlan, TokenRows, TripletPool, pad_rows
from stages.training.runtime import Runtime


@dataclass
class Batch:
    ids: torch.Tensor
    mask: torch.Tensor
    triplet_ids: torch.Tensor | None = None
    triplet_mask: torch.Tensor | None = None
    packing: Packing | None = None  # where the real tokens are (host-built; unpadded forward)
    triplet_packing: Packing | None = None


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
    ``unpad`` also where its real tokens are (computed here, on the host). Unpadded under CUDA
    graphs (``runtime.fixed_shapes``) the layout is ``max_length`` long whatever the batch's
    longest row: its padding costs only the attention, and the shapes stay few."""
    fixed = unpad and runtime.fixed_shapes
    length = max_length if fixed else None

    def packing(mask: np.ndarray) -> Packing:
        return Packing.from_mask(mask, runtime.to_device, runtime.packed_rows_multiple, fixed)

    sentences = plan.shard(step, rank)
    ids, mask = pad_rows(corpus.rows(sentences), pad_id, length)
    batch = Batch(runtime.to_device(ids), runtime.to_device(mask))
    if unpad:
        batch.packing = packing(mask)
    if pool is not None:
        anchor, short, long = pool.shard(step, rank, sentences)
        if not anchor:  # in-batch triplets: none of the step's sentences has one
            return batch
        t_ids, t_mask = pad_rows(anchor + short + long, pad_id, length)
        batch.triplet_ids, batch.triplet_mask = runtime.to_device(t_ids), runtime.to_device(t_mask)
        if unpad:
            batch.triplet_packing = packing(t_mask)
    return batch
