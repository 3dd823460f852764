"""The loss of one batch: the forward under the run's precision, negatives gathered across
ranks, the objective in fp32 at the step's temperature, and the batch's geometry for the log."""

from __future__ import annotations

import torch
from torch import nn

from stages.objectives.base import LossOutput, Objective
from stages.objectives.diagnostics import batch_diagnostics
from stages.training import distributed as dist_util
from stages.training.batch import Batch
from stages.training.distributed import Distributed
from stages.training.runtime import Runtime, phase

# InfoNCE's gradient norms in the batch diagnostics of objectives without a temperature use
# SimCSE's tau (paper 003's training-set curves, spec B.7: "tau = 0.05").
DIAGNOSTICS_TAU = 0.05


def contrastive_loss(
    model: nn.Module,
    batch: Batch,
    objective: Objective,
    tau: float | None,
    runtime: Runtime,
    ctx: Distributed,
    gather_negatives: bool,
    diagnostics: bool = False,
) -> LossOutput:
    """Forward under the run's precision, then the objective over the (gathered) batch.

    Objectives turn autocast off and upcast their inputs themselves, so the loss is fp32.
    With ``diagnostics`` the stats also hold the batch's geometry (``batch_diagnostics``:
    alignment, uniformity, positive and negative angles, InfoNCE gradient norms) as ``batch_*``,
    detached and still on the device.
    """
    with phase("step.forward"), runtime.autocast():
        z, z_pos, triplets = model(
            batch.ids,
            batch.mask,
            batch.triplet_ids,
            batch.triplet_mask,
            packing=batch.packing,
            triplet_packing=batch.triplet_packing,
        )
    return objective_loss(z, z_pos, triplets, objective, tau, ctx, gather_negatives, diagnostics)


def objective_loss(
    z: torch.Tensor,
    z_pos: torch.Tensor,
    triplets: tuple[torch.Tensor, ...] | None,
    objective: Objective,
    tau: float | None,
    ctx: Distributed,
    gather_negatives: bool,
    diagnostics: bool = False,
) -> LossOutput:
    """The objective over the batch's embeddings (every rank's, with ``gather_negatives``),
    with the batch's geometry in the stats if ``diagnostics``."""
    with phase("step.loss"):
        if gather_negatives and ctx.active:
            z, z_pos = dist_util.gather_with_grad(z, ctx), dist_util.gather_with_grad(z_pos, ctx)
            if triplets is not None:
                triplets = tuple(dist_util.gather_with_grad(h, ctx) for h in triplets)
        out = objective(z, z_pos, tau=tau, triplets=triplets)  # type: ignore[arg-type]
    if diagnostics:
        with phase("step.diagnostics"):
            geometry = batch_diagnostics(z, z_pos, DIAGNOSTICS_TAU if tau is None else tau)
            out.stats.update({f"batch_{name}": value for name, value in geometry.items()})
    return out


def mean_over_micro_batches(outs: list[LossOutput]) -> LossOutput:
    """One update's loss and statistics: the mean over its micro-batches, on the device."""
    if len(outs) == 1:
        return outs[0]
    mean = {k: sum(o.stats[k] for o in outs) / len(outs) for k in outs[0].stats}
    return LossOutput(sum(o.loss.detach() for o in outs) / len(outs), mean)
