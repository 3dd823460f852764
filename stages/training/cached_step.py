"""A cached contrastive step (``train.embedding_chunk_size``): the same update as the plain
step, for the activation memory of one chunk of rows.

An in-batch objective needs every embedding of the batch at once, so the plain step keeps the
activations of all 2N rows (SimCSE's batch 512 is 1024 sequences) until its backward. Following
GradCache (Gao et al., 2021; sentence-transformers' cached losses), this step

1. encodes each of the step's forwards (``ContrastiveModel.passes``) chunk by chunk without
   gradients, keeping only the embeddings;
2. evaluates the objective on them (gathered across ranks as usual) and back-propagates it to
   the embeddings alone;
3. encodes each chunk again, with gradients, and back-propagates its embeddings' cached
   gradients through the encoder; the parameter gradients sum to the plain step's.

Both encodings of a chunk, and the plain step, apply the same dropout masks: each forward's
``MaskTape`` draws the masks of all its rows while its first chunk runs, in the plain forward's
order from the same generator, and replays their slices after (``stages.modeling.dropout_tape``).
So the loss, the gradients and the AdamW update equal the plain step's within float rounding
(chunks of a matrix product sum in another order), on one device or several, and the generator
ends where the plain step leaves it (a resumed run draws what an uninterrupted one draws).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from stages.modeling.dropout_tape import MaskTape
from stages.modeling.unpadded import Packing
from stages.objectives.base import LossOutput, Objective
from stages.training.batch import Batch
from stages.training.contrastive_model import ContrastiveModel, EmbeddingPass
from stages.training.distributed import Distributed
from stages.training.loss import objective_loss
from stages.training.runtime import Runtime, phase


def cached_contrastive_step(
    model: ContrastiveModel,
    batch: Batch,
    objective: Objective,
    tau: float | None,
    runtime: Runtime,
    ctx: Distributed,
    gather_negatives: bool,
    chunk_rows: int,
    micro_batches: int = 1,
    diagnostics: bool = False,
) -> LossOutput:
    """The loss of ``batch`` over ``micro_batches`` back-propagated into the parameters' ``.grad``
    (accumulated, as a plain ``backward`` does; with several processes, summed over this rank's
    share only: ``average_gradients`` completes it), encoding ``chunk_rows`` rows at a time;
    the loss and stats as ``contrastive_loss`` returns them."""
    passes = model.passes(
        batch.ids,
        batch.mask,
        batch.triplet_ids,
        batch.triplet_mask,
        batch.packing,
        batch.triplet_packing,
    )
    tapes = [MaskTape(p.rows) for p in passes]
    with phase("step.forward"), torch.no_grad():
        cached = [
            torch.cat([_encode(model, p, tape, span, runtime) for span in _spans(p, chunk_rows)])
            for p, tape in zip(passes, tapes, strict=True)
        ]
    embeddings = [e.requires_grad_() for e in cached]
    z, z_pos, triplets = model.assemble(embeddings)
    out = objective_loss(z, z_pos, triplets, objective, tau, ctx, gather_negatives, diagnostics)
    with phase("step.backward"):
        (out.loss / micro_batches).backward()
        for p, tape, embedded in zip(passes, tapes, embeddings, strict=True):
            if embedded.grad is None:  # an objective that does not read this forward
                continue
            for start, stop in _spans(p, chunk_rows):
                again = _encode(model, p, tape, (start, stop), runtime)
                again.backward(embedded.grad[start:stop])
    return out


def average_gradients(params: list[nn.Parameter], ctx: Distributed) -> None:
    """The mean of every rank's gradients, as DistributedDataParallel's backward leaves them
    (the cached step encodes through the bare model, outside DDP's hooks)."""
    if not ctx.active:
        return
    for param in params:
        if param.grad is not None:
            dist.all_reduce(param.grad)
            param.grad.div_(ctx.world_size)


def _spans(p: EmbeddingPass, chunk_rows: int) -> list[tuple[int, int]]:
    return [(start, min(start + chunk_rows, p.rows)) for start in range(0, p.rows, chunk_rows)]


def _encode(
    model: ContrastiveModel,
    p: EmbeddingPass,
    tape: MaskTape,
    span: tuple[int, int],
    runtime: Runtime,
) -> torch.Tensor:
    """The embeddings of rows [start, stop) of pass ``p`` with the tape's dropout masks. Once the
    tape has recorded, the forward must draw nothing more from the generator: a dropout outside
    the tape's reach would make the two encodings of a chunk differ."""
    start, stop = span
    chunk = p._replace(
        ids=p.ids[start:stop], mask=p.mask[start:stop], packing=_chunk_packing(p, span, runtime)
    )
    replaying = tape.recorded
    before = _generator_state(runtime.device) if replaying else None
    with tape.chunk(start, stop), runtime.autocast():
        embedded = model.run_pass(chunk)
    if before is not None and not torch.equal(before, _generator_state(runtime.device)):
        raise RuntimeError(
            "the encoder drew random numbers outside its dropout modules (a dropout the cached "
            "step cannot replay): train it without train.embedding_chunk_size"
        )
    return embedded


def _chunk_packing(p: EmbeddingPass, span: tuple[int, int], runtime: Runtime) -> Packing | None:
    """Where the chunk's real tokens are: built from its rows' mask (one read of the mask from
    the device per chunk) with the batch's padded length, so its dropout masks are the rows'
    slices of the batch's."""
    if p.packing is None:
        return None
    start, stop = span
    return Packing.from_mask(p.mask[start:stop], rows_multiple=runtime.packed_rows_multiple)


def _generator_state(device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    return torch.get_rng_state()
