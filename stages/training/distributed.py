"""Data parallelism under torchrun, and in-batch negatives gathered across ranks.

``train.batch_size`` is the global batch (the papers' number): with W ranks each encodes
batch_size / W sentences. With ``gather_negatives`` every rank gathers all ranks' embeddings
*with their gradients* and computes the objective over the whole batch, so a W-rank run
computes the same loss and (after DDP's gradient averaging) the same gradients as one process
on the whole batch, and shares its run id. Without it each anchor only sees its own rank's
batch_size / W - 1 negatives.

Why the gradients come out exact: every rank computes the same global loss L, so the
all-gather's backward (the sum over ranks of each rank's gradient for the rows it owns) hands
each rank W * dL/dz_local; DDP then averages parameter gradients over the W ranks, which
cancels the factor W.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_environment() -> Distributed:
    """The process's place in a torchrun launch (a single process when not launched so)."""
    return Distributed(
        rank=int(os.environ.get("RANK", 0)),
        world_size=int(os.environ.get("WORLD_SIZE", 1)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
    )


def rank_seed(seed: int, rank: int) -> int:
    """Each rank's dropout stream (ranks must not share dropout masks)."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


@contextmanager
def process_group(ctx: Distributed, device: torch.device) -> Iterator[None]:
    """Join the torchrun process group for the duration (nothing to do for one process)."""
    if not ctx.active or dist.is_initialized():
        yield
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()


class _AllGather(torch.autograd.Function):
    """Concatenate every rank's rows; backward sums the gradients of this rank's rows."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor)
        rows = tensor.shape[0]
        ctx.own = slice(dist.get_rank() * rows, (dist.get_rank() + 1) * rows)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)  # small (batch x dim): a full all-reduce works on every backend
        return grad[ctx.own]


def gather_with_grad(tensor: torch.Tensor, ctx: Distributed) -> torch.Tensor:
    """All ranks' rows in rank order, differentiable (gradients flow back to their owners)."""
    if not ctx.active:
        return tensor
    return _AllGather.apply(tensor)


def gather_objects(obj: Any, ctx: Distributed) -> list[Any]:
    if not ctx.active:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def any_rank(flag: bool, ctx: Distributed) -> bool:
    """True on every rank if ``flag`` is true on any rank."""
    if not ctx.active:
        return flag
    return any(gather_objects(flag, ctx))


def broadcast_object(obj: Any, ctx: Distributed) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not ctx.active:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def mean_across_ranks(ctx: Distributed) -> Callable[[torch.Tensor], None]:
    """Averages a tensor across ranks, in place."""

    def average(values: torch.Tensor) -> None:
        dist.all_reduce(values)
        values.div_(ctx.world_size)

    return average


def barrier(ctx: Distributed) -> None:
    if ctx.active:
        dist.barrier()
