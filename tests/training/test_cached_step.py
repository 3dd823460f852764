"""A cached contrastive step (``train.embedding_chunk_size``) computes the plain step's update:
the loss, every gradient and the generator's state after it (unit level, per objective), the
AdamW update of whole training steps (SAM, accumulation, ArcCSE's triplets), and a resumed
chunked run's weights. Dropout is on throughout: the masks are what could differ."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from train_helpers import TINY, assert_same_weights, make_job, write_triplets

from stages.core.schema.params import TrainParams
from stages.modeling.backbone import load_backbone
from stages.modeling.dropout import FAST_DROPOUT_SDPA, use_fast_dropout
from stages.modeling.dropout_tape import MaskTape
from stages.modeling.unpadded import Packing
from stages.objectives.registry import all_loss_classes
from stages.training.cached_step import cached_contrastive_step
from stages.training.checkpoints import latest_checkpoint
from stages.training.contrastive_model import ContrastiveModel
from stages.training.data import pad_rows, read_corpus
from stages.training.distributed import Distributed
from stages.training.loop import Batch, contrastive_loss, train
from stages.training.runtime import resolve_runtime

SENTENCES = [
    "a man plays a guitar on the street corner",
    "the cat sleeps",
    "stocks fell sharply on monday after the report",
    "it rains",
    "two dogs run through a field of fresh snow",
    "the committee approved the budget",
    "he plays the piano",
]
CPU = resolve_runtime("cpu", "fp32")


def tiny_model(**switches) -> ContrastiveModel:
    encoder = load_backbone(TINY, seed=0)
    assert use_fast_dropout(encoder) > 0  # the trainer's dropout, on (BERT's 0.1)
    assert encoder.config._attn_implementation == FAST_DROPOUT_SDPA
    return ContrastiveModel(encoder, "cls", **switches).train()


def make_batch(tokenizer, unpad: bool, triplets: bool) -> Batch:
    ids, mask = pad_rows([np.asarray(tokenizer(s)["input_ids"]) for s in SENTENCES], 0)
    batch = Batch(torch.from_numpy(ids), torch.from_numpy(mask))
    if unpad:
        batch.packing = Packing.from_mask(mask)
    if triplets:  # anchors with their first words masked once, then twice
        words = [s.split() for s in SENTENCES[:4]]
        texts = [" ".join(w) for w in words]
        texts += [" ".join(["[MASK]", *w[1:]]) for w in words]
        texts += [" ".join(["[MASK]", "[MASK]", *w[2:]]) for w in words]
        t_ids, t_mask = pad_rows([np.asarray(tokenizer(t)["input_ids"]) for t in texts], 0)
        batch.triplet_ids, batch.triplet_mask = torch.from_numpy(t_ids), torch.from_numpy(t_mask)
        if unpad:
            batch.triplet_packing = Packing.from_mask(t_mask)
    return batch


def step(model: ContrastiveModel, batch: Batch, objective, chunk: int | None, runtime=CPU):
    """One step's loss, stats, gradients and the generator's state after it, from seed 7."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    tau = objective.initial_tau
    ctx = Distributed()
    if chunk is None:
        out = contrastive_loss(model, batch, objective, tau, runtime, ctx, True, True)
        out.loss.backward()
    else:
        out = cached_contrastive_step(
            model, batch, objective, tau, runtime, ctx, True, chunk, 1, True
        )
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads, torch.get_rng_state()


def assert_same_step(plain, cached, rtol: float = 1e-5, atol: float = 1e-7) -> None:
    (out, grads, rng), (c_out, c_grads, c_rng) = plain, cached
    torch.testing.assert_close(c_out.loss, out.loss, rtol=rtol, atol=atol)
    assert c_out.stats.keys() == out.stats.keys()
    for key, value in out.stats.items():  # angles near 0 amplify the cosines' rounding
        torch.testing.assert_close(c_out.stats[key], value, rtol=10 * rtol, atol=1e-5, msg=key)
    assert c_grads.keys() == grads.keys()
    for name, grad in grads.items():
        assert_close_in_norm(c_grads[name], grad, rtol, name)
    assert torch.equal(c_rng, rng), "the generator must end where the plain step leaves it"


def assert_close_in_norm(got: torch.Tensor, want: torch.Tensor, rtol: float, name: str) -> None:
    """Within ``rtol`` of the tensor's norm (chunks sum a gradient in another order; an element
    near zero, or a gradient that is zero but for rounding such as a key bias's, has no
    meaningful relative error of its own)."""
    error = (got - want).norm().item()
    assert error <= rtol * want.norm().item() + 1e-8, f"{name}: off by {error:.3g}"


@pytest.mark.parametrize("unpad", [True, False], ids=["unpadded", "padded"])
@pytest.mark.parametrize("name", sorted(all_loss_classes()))
def test_a_cached_step_computes_the_plain_steps_loss_gradients_and_draws(
    name: str, unpad: bool, tokenizer
) -> None:
    objective = all_loss_classes()[name].model_validate({"name": name})
    model = tiny_model()
    batch = make_batch(tokenizer, unpad, objective.needs_triplets)
    plain = step(model, batch, objective, None)
    for chunk in (3, 5, 100):  # uneven chunks, and one chunk of every row
        assert_same_step(plain, step(model, batch, objective, chunk))


@pytest.mark.parametrize(
    "switches",
    [{"view_dropout": "first"}, {"triplet_dropout": True}],
    ids=["second-view-without-dropout", "triplets-with-dropout"],
)
def test_arccses_dropout_switches_chunk_to_the_same_step(switches: dict, tokenizer) -> None:
    """In float64: with the second view dropout-free, fp32 rounding of the chunks' sums shows up
    to 1e-3 of a gradient through ArcCSE's arccos; in float64 the steps agree to 1e-12."""
    objective = all_loss_classes()["arccse"].model_validate({"name": "arccse"})
    model = tiny_model(**switches).double()
    batch = make_batch(tokenizer, True, True)
    plain, cached = step(model, batch, objective, None), step(model, batch, objective, 2)
    assert_same_step(plain, cached, rtol=1e-10, atol=1e-12)


def test_bf16_chunks_agree_within_bf16_rounding(tokenizer) -> None:
    bf16 = resolve_runtime("cpu", "bf16")
    objective = all_loss_classes()["infonce"].model_validate({"name": "infonce"})
    model = tiny_model()
    batch = make_batch(tokenizer, True, False)
    plain, cached = (
        step(model, batch, objective, None, bf16),
        step(model, batch, objective, 3, bf16),
    )
    assert cached[0].loss.dtype == torch.float32  # the objective still in fp32
    torch.testing.assert_close(cached[0].loss, plain[0].loss, rtol=2e-2, atol=1e-3)
    assert torch.equal(cached[2], plain[2])  # the same masks drawn
    for name, grad in plain[1].items():
        cos = torch.nn.functional.cosine_similarity(cached[1][name].flatten(), grad.flatten(), 0)
        assert cos > 0.99, name


def test_a_tape_replays_row_slices_and_refuses_a_different_forward() -> None:
    torch.manual_seed(0)
    x = torch.ones(6, 4, 8)
    whole = torch.nn.functional.dropout(x, 0.5)  # what one forward over the six rows draws
    torch.manual_seed(0)
    tape = MaskTape(rows=6)

    def draw(shape, p, like):
        return torch.nn.functional.dropout(like.new_ones(shape), p)

    with tape.chunk(0, 4):
        first = x[:4] * tape.keep_mask((4, 4, 8), 0.5, x, draw)
    with tape.chunk(4, 6):
        second = x[4:] * tape.keep_mask((2, 4, 8), 0.5, x, draw)
    torch.testing.assert_close(torch.cat([first, second]), whole)
    with pytest.raises(RuntimeError, match="shape"), tape.chunk(0, 2):
        tape.keep_mask((2, 5, 8), 0.5, x, draw)
    with pytest.raises(RuntimeError, match="0 dropouts"), tape.chunk(0, 2):
        pass


def test_the_setting_is_refused_with_compile_and_checkpointing() -> None:
    with pytest.raises(ValueError, match="compile: false"):
        TrainParams(embedding_chunk_size=64, compile=True)
    with pytest.raises(ValueError, match="gradient_checkpointing: false"):
        TrainParams(embedding_chunk_size=64, gradient_checkpointing=True)


def weights_after(job, dev_evaluator, steps: int) -> dict[str, torch.Tensor]:
    captured: dict[str, torch.Tensor] = {}

    def hook(run_step) -> None:
        run_step()
        model = run_step.__self__.model
        captured.update({k: v.detach().clone() for k, v in model.state_dict().items()})

    train(job, dev_evaluator, step_hook=hook, until_step=steps)
    return captured


@pytest.mark.parametrize(
    "case",
    ["simcse", "arccse-sam-accumulated"],
)
def test_chunked_training_steps_reach_the_plain_steps_weights(
    case: str, corpus: Path, token_cache: Path, dev_evaluator, tmp_path: Path, tokenizer
) -> None:
    """Whole updates (AdamW, clipping, the schedule; SAM's second pass and two micro-batches for
    ArcCSE with its triplets): the weights after three steps agree within fp32 rounding."""
    settings: dict = {"batch_size": 12}
    objective = None
    triplets = None
    if case != "simcse":
        objective = all_loss_classes()["arccse"].model_validate({"name": "arccse"})
        triplets = write_triplets(tmp_path / "t.parquet", tokenizer, read_corpus(corpus))
        settings.update(sam={"enabled": True}, gradient_accumulation_steps=2, triplet_batch_size=6)

    def job(name: str, **more):
        return make_job(
            corpus, tmp_path / name, token_cache, objective=objective, triplets=triplets,
            **settings, **more,
        )  # fmt: skip

    plain = weights_after(job("plain"), dev_evaluator, 3)
    cached = weights_after(job("cached", embedding_chunk_size=5), dev_evaluator, 3)
    assert plain.keys() == cached.keys()
    for name, value in plain.items():
        torch.testing.assert_close(cached[name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_a_resumed_chunked_run_reaches_the_uninterrupted_runs_weights(
    corpus: Path, token_cache: Path, dev_evaluator, tmp_path: Path
) -> None:
    whole = tmp_path / "whole"
    train(make_job(corpus, whole, token_cache, embedding_chunk_size=5), dev_evaluator)
    config = (whole / "config.json").read_text()
    assert '"embedding_chunk_size": 5' in config

    resumed = tmp_path / "resumed"
    job = make_job(corpus, resumed, token_cache, embedding_chunk_size=5)
    steps = 0

    def interrupt_at_step_7(run_step) -> None:
        nonlocal steps
        run_step()
        steps += 1
        if steps == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(job, dev_evaluator, step_hook=interrupt_at_step_7)
    assert latest_checkpoint(resumed).name == "checkpoint-5"
    train(job, dev_evaluator)
    assert_same_weights(whole / "final", resumed / "final")
