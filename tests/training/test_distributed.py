"""Two gloo processes with gathered negatives compute what one process computes on the batch,
also a chunk of rows at a time (``train.embedding_chunk_size``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from train_helpers import TINY

from stages.modeling.backbone import load_backbone, load_tokenizer
from stages.objectives.arccse import ArcCSE
from stages.objectives.infonce import InfoNCE
from stages.training.cached_step import average_gradients, cached_contrastive_step
from stages.training.contrastive_model import ContrastiveModel
from stages.training.data import pad_rows
from stages.training.distributed import Distributed
from stages.training.loop import Batch, contrastive_loss
from stages.training.runtime import resolve_runtime

pytestmark = pytest.mark.slow  # two real processes with a gloo process group

SENTENCES = [
    "a man is playing a guitar .",
    "the cat sits on the mat",
    "it rains in the south of france today",
    "stocks fell sharply on monday",
    "a woman slices an onion",
    "two dogs run through a field of snow",
    "the committee approved the budget",
    "he plays the piano beautifully",
]
CPU = resolve_runtime("cpu", "fp32")


def tensors(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = pad_rows([np.asarray(r) for r in rows], pad_id=0)
    return torch.from_numpy(ids), torch.from_numpy(mask)


def make_batch(lo: int, hi: int, with_triplets: bool) -> Batch:
    """Sentences lo..hi; the triplets reuse them (s, s with 1 or 2 leading [MASK]s)."""
    tok = load_tokenizer(TINY)
    rows = [tok(s)["input_ids"] for s in SENTENCES[lo:hi]]
    batch = Batch(*tensors(rows))
    if with_triplets:
        mask = tok.mask_token_id
        short = [[r[0], mask, *r[2:]] for r in rows]
        long = [[r[0], mask, mask, *r[3:]] for r in rows]
        batch.triplet_ids, batch.triplet_mask = tensors(rows + short + long)
    return batch


def loss_and_gradients(
    model: torch.nn.Module, batch: Batch, objective, ctx, gather: bool, chunk: int | None = None
):
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    if chunk is None:
        out = contrastive_loss(model, batch, objective, 0.05, CPU, ctx, gather)
        out.loss.backward()
    else:  # the cached step encodes through the bare model and averages the gradients itself
        out = cached_contrastive_step(inner, batch, objective, 0.05, CPU, ctx, gather, chunk)
        average_gradients([p for p in inner.parameters() if p.requires_grad], ctx)
    grads = {n: p.grad.clone() for n, p in inner.named_parameters() if p.grad is not None}
    return out.loss.detach(), grads


def tiny_model(chunk: int | None = None) -> ContrastiveModel:
    # Dropout off: the comparison is about the math, not about the dropout masks. Chunked, in
    # float64: with both views alike InfoNCE's gradient is a small difference of large terms, and
    # summing the chunks in another order moves fp32 gradients by up to 1e-3 of their norm.
    model = ContrastiveModel(load_backbone(TINY, seed=0, dropout=0.0), "cls").train()
    return model if chunk is None else model.double()


SCENARIOS = {  # name: (with triplets, gather negatives, rows per chunk)
    "infonce": (False, True, None),
    "with-triplets": (True, True, None),
    "no-gathering": (False, False, None),
    "infonce-chunked": (False, True, 3),
    "with-triplets-chunked": (True, True, 3),
}


def objective_for(with_triplets: bool):
    return ArcCSE(name="arccse") if with_triplets else InfoNCE(name="infonce")


def worker(rank: int, store: str, results: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        ctx = Distributed(rank=rank, world_size=2)
        half = len(SENTENCES) // 2
        out = {}
        for name, (with_triplets, gather, chunk) in SCENARIOS.items():
            model = DistributedDataParallel(tiny_model(chunk))
            batch = make_batch(rank * half, (rank + 1) * half, with_triplets)
            loss, grads = loss_and_gradients(
                model, batch, objective_for(with_triplets), ctx, gather, chunk
            )
            out[name] = {"loss": loss, "grads": grads}
        torch.save(out, f"{results}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Each scenario's loss and gradients on both ranks of one 2-process gloo launch."""
    folder = tmp_path_factory.mktemp("gloo")
    results = str(folder / "out")
    mp.spawn(worker, args=(str(folder / "store"), results), nprocs=2, join=True)
    return [torch.load(f"{results}.{rank}", weights_only=True) for rank in range(2)]


@pytest.mark.parametrize(
    "scenario", ["infonce", "with-triplets", "infonce-chunked", "with-triplets-chunked"]
)
def test_two_ranks_with_gathered_negatives_equal_one_process_on_the_whole_batch(
    two_ranks: list[dict], scenario: str
) -> None:
    with_triplets, _, chunk = SCENARIOS[scenario]
    whole = make_batch(0, len(SENTENCES), with_triplets)
    objective = objective_for(with_triplets)
    model = tiny_model(chunk)
    loss, grads = loss_and_gradients(model, whole, objective, Distributed(), gather=False)
    rtol = 1e-4 if chunk is None else 1e-9
    for rank in range(2):
        got = two_ranks[rank][scenario]
        torch.testing.assert_close(got["loss"], loss, rtol=1e-6, atol=1e-7)
        assert got["grads"].keys() == grads.keys()
        for name, grad in grads.items():
            # relative to the gradient's norm: two processes sum in another order
            error = (got["grads"][name] - grad).norm().item()
            assert error <= rtol * grad.norm().item() + 1e-12, f"{name}: off by {error:.3g}"


def test_without_gathering_each_rank_sees_only_its_own_negatives(two_ranks: list[dict]) -> None:
    half = len(SENTENCES) // 2
    for rank in range(2):
        own = make_batch(rank * half, (rank + 1) * half, False)
        loss, _ = loss_and_gradients(
            tiny_model(), own, objective_for(False), Distributed(), gather=False
        )
        torch.testing.assert_close(
            two_ranks[rank]["no-gathering"]["loss"], loss, rtol=1e-6, atol=1e-7
        )
