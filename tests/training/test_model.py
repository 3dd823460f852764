from __future__ import annotations

import pytest
import torch
from train_helpers import TINY
from transformers import RobertaConfig, RobertaModel

from stages.modeling.backbone import load_backbone
from stages.modeling.dropout import use_fast_dropout
from stages.modeling.unpadded import attention_bias
from stages.training.contrastive_model import (
    ContrastiveModel,
    dropout_disabled,
    enable_gradient_checkpointing,
    reset_mlp_head,
)


def batch(tokenizer, sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tokenizer(sentences, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"].bool()


SENTENCES = ["a man is playing a guitar .", "the cat sits", "it rains in the south of france today"]


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_ready_4d_mask_gives_the_same_states_as_a_2d_mask(
    family: str, implementation: str, tokenizer
) -> None:
    torch.manual_seed(0)
    if family == "bert":
        model = load_backbone(TINY, seed=0, attn_implementation=implementation).eval()
    else:
        config = RobertaConfig(
            vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=64, attn_implementation=implementation,
        )  # fmt: skip
        model = RobertaModel(config).eval()
    ids, mask = batch(tokenizer, SENTENCES)
    bias = attention_bias(mask, implementation)
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        ours = model(input_ids=ids, attention_mask=bias).last_hidden_state
    keep = mask[..., None].expand_as(reference)
    torch.testing.assert_close(ours[keep], reference[keep], rtol=1e-5, atol=1e-6)


def test_one_forward_gives_two_dropout_views(tokenizer) -> None:
    model = ContrastiveModel(load_backbone(TINY, seed=0, dropout=0.1), "cls_before_pooler")
    ids, mask = batch(tokenizer, SENTENCES)
    model.train()
    z, z_pos, triplets = model(ids, mask)
    assert z.shape == z_pos.shape == (3, 32) and triplets is None
    assert not torch.allclose(z, z_pos)  # independent dropout masks
    model.eval()
    z, z_pos, _ = model(ids, mask)
    torch.testing.assert_close(z, z_pos)  # same sentence, no dropout: the same vector


def test_triplet_branch_runs_with_dropout_off_and_gradients_on(tokenizer) -> None:
    model = ContrastiveModel(load_backbone(TINY, seed=0, dropout=0.1), "cls")
    ids, mask = batch(tokenizer, SENTENCES)
    t_ids, t_mask = batch(tokenizer, SENTENCES * 3)
    model.train()
    _, _, (h0, h1, h2) = model(ids, mask, t_ids, t_mask)
    assert model.training and model.encoder.training  # restored after the branch
    with torch.no_grad(), dropout_disabled(model):
        expected = model.embed(t_ids, t_mask)
    torch.testing.assert_close(torch.cat([h0, h1, h2]), expected)
    h0.sum().backward()
    grads = [p.grad for p in model.encoder.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)


def test_arccse_table_3_dropout_switches(tokenizer) -> None:
    """view_dropout='first': the second view is the dropout-off encoding; triplet_dropout: the
    triplet branch keeps dropout (both still carry gradients)."""
    encoder = load_backbone(TINY, seed=0, dropout=0.1)
    model = ContrastiveModel(encoder, "cls", view_dropout="first", triplet_dropout=True)
    ids, mask = batch(tokenizer, SENTENCES)
    t_ids, t_mask = batch(tokenizer, SENTENCES * 3)
    model.train()
    z, z_pos, triplets = model(ids, mask, t_ids, t_mask)
    assert model.encoder.training
    with torch.no_grad(), dropout_disabled(model):
        clean = model.embed(ids, mask)
        clean_triplets = model.embed(t_ids, t_mask)
    torch.testing.assert_close(z_pos, clean)
    assert not torch.allclose(z, clean)  # the first view has dropout
    assert not torch.allclose(torch.cat(triplets), clean_triplets)  # dropout on
    z_pos.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder.parameters())


def test_cls_trains_a_fresh_simcse_mlp_head_in_the_pooler_slot(tokenizer) -> None:
    encoder = load_backbone(TINY, seed=0)
    reset_mlp_head(encoder, seed=5)
    weight = encoder.pooler.dense.weight.detach().clone()
    assert torch.count_nonzero(encoder.pooler.dense.bias) == 0
    assert abs(weight.std().item() - encoder.config.initializer_range) < 0.004
    other = load_backbone(TINY, seed=0)
    reset_mlp_head(other, seed=5)
    assert torch.equal(other.pooler.dense.weight, weight)  # seeded
    model = ContrastiveModel(encoder, "cls").eval()
    ids, mask = batch(tokenizer, SENTENCES)
    z, _, _ = model(ids, mask)
    cls_state = encoder(input_ids=ids, attention_mask=mask.long()).last_hidden_state[:, 0]
    torch.testing.assert_close(z, torch.tanh(encoder.pooler.dense(cls_state)))


@pytest.mark.parametrize("fast_dropout", [False, True], ids=["nn.Dropout", "FastDropout"])
def test_gradient_checkpointing_keeps_the_gradients(tokenizer, fast_dropout: bool) -> None:
    """The replay draws the same masks (torch's dropout and the trainer's ``FastDropout``,
    whose tie-breaking draws depend on the first ones) and leaves the generator where a run
    without checkpointing does."""
    ids, mask = batch(tokenizer, SENTENCES)
    t_ids, t_mask = batch(tokenizer, SENTENCES * 3)
    grads, generator_states = [], []
    for checkpointing in (False, True):
        encoder = load_backbone(TINY, seed=0, dropout=0.1)
        if fast_dropout:
            assert use_fast_dropout(encoder) > 0
        if checkpointing:
            enable_gradient_checkpointing(encoder)
        model = ContrastiveModel(encoder, "cls").train()
        torch.manual_seed(7)
        z, z_pos, triplets = model(ids, mask, t_ids, t_mask)
        (z * z_pos).sum().add(sum(h.sum() for h in triplets)).backward()
        grads.append(torch.cat([p.grad.flatten() for p in encoder.parameters()]))
        generator_states.append(torch.get_rng_state())
    torch.testing.assert_close(grads[0], grads[1])
    assert torch.equal(generator_states[0], generator_states[1])
