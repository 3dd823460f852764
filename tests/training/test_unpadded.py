"""The unpadded forward (stages/modeling/unpadded.py) against the padded Hugging Face forward."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from train_helpers import SENTENCES, TINY, HostReadWatch, padded_batch
from transformers import RobertaConfig, RobertaModel

from stages.core.schema.params import POOLERS
from stages.modeling.backbone import load_backbone
from stages.modeling.batched_attention import batched_attention
from stages.modeling.cpu_linear import onednn_linear_available
from stages.modeling.encoder import embed
from stages.modeling.pooling import pool, pool_packed
from stages.modeling.unpadded import (
    Packing,
    _split_heads,
    attention_bias,
    packed_forward,
    unpadding_unsupported,
)
from stages.training.batch import make_batch
from stages.training.contrastive_model import ContrastiveModel
from stages.training.data import BatchPlan, TokenRows
from stages.training.runtime import GRAPH_ROWS_MULTIPLE, resolve_runtime


def encoder(family: str, tokenizer, implementation: str = "sdpa", dropout: float = 0.0):
    if family == "bert":
        return load_backbone(TINY, seed=0, dropout=dropout, attn_implementation=implementation)
    torch.manual_seed(0)
    config = RobertaConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout, pad_token_id=tokenizer.pad_token_id,
        attn_implementation=implementation,
    )  # fmt: skip
    return RobertaModel(config, add_pooling_layer=True)


def reference(model, ids: torch.Tensor, mask: torch.Tensor, pooler: str) -> torch.Tensor:
    """The plain Hugging Face forward with its own mask handling (2-D mask), then pooling."""
    outputs = model(
        input_ids=ids, attention_mask=mask.long(), output_hidden_states=pooler == "first_last_mean"
    )
    return pool(outputs, mask, pooler)


def output_and_grads(
    model, embed_fn, seed: int = 0
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = embed_fn()
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


def assert_same(a, b, atol: float = 1e-5) -> None:
    out_a, grads_a = a
    out_b, grads_b = b
    torch.testing.assert_close(out_a, out_b, rtol=1e-5, atol=atol)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=atol, msg=name)


# The unpadded forward's two packings: a batch's real tokens in its own dynamic layout, or
# (CUDA graphs, ``train.compile: reduce-overhead``) bucketed: the layout padded to a fixed
# length, the rows rounded up with fillers and the index tensors of fixed sizes.
LAYOUTS = ["dynamic", "bucketed"]


def laid_out(
    ids: torch.Tensor, mask: torch.Tensor, layout: str
) -> tuple[torch.Tensor, torch.Tensor, Packing]:
    """The batch in ``layout``, and its packing."""
    if layout == "dynamic":
        return ids, mask, Packing.from_mask(mask)
    extra = 5  # the layout's fixed length beyond the batch's longest row
    ids = F.pad(ids, (0, extra), value=0)
    mask = F.pad(mask, (0, extra), value=False)
    return ids, mask, Packing.from_mask(mask, rows_multiple=16, fixed_shapes=True)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize("pooler", POOLERS)
def test_unpadded_outputs_and_gradients_equal_the_padded_forward(
    pooler: str, family: str, implementation: str, layout: str, tokenizer
) -> None:
    model = encoder(family, tokenizer, implementation)
    ids, mask = padded_batch(tokenizer)
    assert mask.sum() < mask.numel()  # the batch has padding
    contrastive = ContrastiveModel(model, pooler)
    assert contrastive.unpadded
    padded = output_and_grads(model, lambda: reference(model, ids, mask, pooler))
    long_ids, long_mask, packing = laid_out(ids, mask, layout)
    unpadded = output_and_grads(model, lambda: contrastive.embed(long_ids, long_mask, packing))
    assert_same(unpadded, padded)


class DropoutReplay:
    """``F.dropout`` whose k-th call draws its mask from seed k in the padded layout: a packed
    (tokens, hidden) input gets the real tokens' rows of the (batch, length, hidden) mask. The
    padded and the unpadded forward call dropout in the same order (embeddings, then per layer
    attention probabilities under eager attention, attention output, feed-forward output), so
    both see the same masks at the real tokens. It draws nothing from the global generator, so
    SDPA's internal attention dropout also sees the same random numbers in both forwards."""

    def __init__(self, packing: Packing) -> None:
        self.packing = packing
        self.calls = 0

    def __call__(self, x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return x
        generator = torch.Generator().manual_seed(1000 + self.calls)
        self.calls += 1
        packing = self.packing
        packed = x.dim() == 2 and x.shape[0] == packing.tokens
        shape = (packing.batch, packing.length, x.shape[-1]) if packed else x.shape
        keep = torch.rand(shape, generator=generator) >= p
        if packed:  # the real tokens' rows (and the fillers', copies of the last one's)
            keep = keep.reshape(-1, x.shape[-1])[packing.indices]
        return x * keep / (1 - p)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("pooler", POOLERS)
def test_with_the_same_dropout_masks_training_outputs_and_gradients_are_equal(
    pooler: str, implementation: str, layout: str, tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In either layout (the padded forward runs on the same one: its dropout masks cover it)."""
    model = encoder("bert", tokenizer, implementation, dropout=0.1).train()
    ids, mask, packing = laid_out(*padded_batch(tokenizer), layout)
    contrastive = ContrastiveModel(model, pooler)
    runs = []
    for run in (
        lambda: reference(model, ids, mask, pooler),
        lambda: contrastive.embed(ids, mask, packing),
    ):
        replay = DropoutReplay(packing)
        monkeypatch.setattr(F, "dropout", replay)
        runs.append(output_and_grads(model, run, seed=5))
        assert replay.calls == 1 + (3 if implementation == "eager" else 2) * 2
    assert_same(runs[1], runs[0])
    monkeypatch.undo()
    # Without the replay, dropout is on: two forwards differ.
    first, again = contrastive.embed(ids, mask), contrastive.embed(ids, mask)
    assert not torch.allclose(first, again)


def test_dropout_statistics_of_the_unpadded_forward_match_the_padded_one(tokenizer) -> None:
    """Over many draws, the unpadded forward's dropout noise has the padded one's size: the
    spread of [CLS] agrees within sampling error."""
    model = encoder("bert", tokenizer, "sdpa", dropout=0.1).train()
    ids, mask = padded_batch(tokenizer)
    contrastive = ContrastiveModel(model, "cls_before_pooler")
    spreads = []
    with torch.no_grad():
        for run in (
            lambda: reference(model, ids, mask, "cls_before_pooler"),
            lambda: contrastive.embed(ids, mask),
        ):
            torch.manual_seed(0)
            draws = torch.stack([run() for _ in range(100)])
            spreads.append(draws.std(dim=0).mean())
    assert abs(spreads[1] / spreads[0] - 1) < 0.1


@pytest.mark.parametrize(
    ("rows_multiple", "fixed_shapes"),
    [(1, False), (8, False), (16, True)],
    ids=["real-tokens", "with-fillers", "bucketed"],
)
def test_the_two_views_and_the_triplet_branch_match_the_padded_model(
    rows_multiple: int, fixed_shapes: bool, tokenizer
) -> None:
    model = encoder("bert", tokenizer, dropout=0.1)
    ids, mask = padded_batch(tokenizer)
    t_ids, t_mask = padded_batch(tokenizer, SENTENCES[:3] * 3)
    results = []
    for unpad in (False, True):
        contrastive = ContrastiveModel(model, "cls", unpad=unpad).eval()  # dropout off

        def packed(mask: torch.Tensor, unpad: bool = unpad) -> Packing | None:
            if not unpad:
                return None
            return Packing.from_mask(mask.numpy(), rows_multiple=rows_multiple,
                                     fixed_shapes=fixed_shapes)  # fmt: skip

        packing, t_packing = packed(mask), packed(t_mask)

        def run(contrastive=contrastive, packing=packing, t_packing=t_packing):
            z, z_pos, triplets = contrastive(ids, mask, t_ids, t_mask, packing, t_packing)
            return torch.cat([z, z_pos, *triplets])

        results.append(output_and_grads(model, run))
    assert_same(results[1], results[0])


@pytest.mark.parametrize("pooler", POOLERS)
def test_the_evaluation_encoder_unpads_and_gives_the_padded_embeddings(pooler: str, tokenizer):
    model = encoder("bert", tokenizer).eval()
    sentences = SENTENCES * 3 + ["another sentence of medium length here"]
    padded = embed(model, tokenizer, sentences, pooler, batch_size=4, unpad=False)
    unpadded = embed(model, tokenizer, sentences, pooler, batch_size=4)
    np.testing.assert_allclose(unpadded, padded, rtol=1e-5, atol=1e-6)


def test_the_evaluation_encoder_runs_the_unpadded_forward(tokenizer, monkeypatch) -> None:
    import stages.modeling.encoder as encoder_module

    calls = []
    original = encoder_module.packed_forward
    monkeypatch.setattr(
        encoder_module, "packed_forward", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    embed(encoder("bert", tokenizer).eval(), tokenizer, SENTENCES, "mean", batch_size=2)
    assert len(calls) == 4  # four lengths: a batch each (a quarter of 2 rows is one)
    embed(encoder("bert", tokenizer).eval(), tokenizer, SENTENCES, "mean", unpad=False)
    assert len(calls) == 4


@pytest.mark.parametrize("unpad", [True, False])
def test_the_evaluation_encoder_reads_the_device_once_per_block(
    unpad: bool, tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batches' vectors are read back together (every ``READBACK_ROWS`` sentences), not
    one batch at a time: on a GPU a read per batch makes the host wait for each batch."""
    import stages.modeling.encoder as encoder_module

    sentences = [*SENTENCES, "one more sentence", "and the last one of them all"]
    model = encoder("bert", tokenizer).eval()
    reference = embed(model, tokenizer, sentences, "mean", batch_size=2, unpad=unpad)
    for block, reads in ((10**6, 1), (2, 3)):  # 6 sentences: one read; blocks of 2: three
        monkeypatch.setattr(encoder_module, "READBACK_ROWS", block)
        with HostReadWatch(monkeypatch) as watch:
            vectors = embed(model, tokenizer, sentences, "mean", batch_size=2, unpad=unpad)
        device_reads = [v for v in watch.violations if v[:2] == ("cpu", encoder_module.__name__)]
        assert len(device_reads) == reads
        np.testing.assert_array_equal(vectors, reference)


def test_the_evaluation_encoder_copies_to_a_gpu_without_waiting(monkeypatch) -> None:
    """A blocking host-to-device copy synchronises the CUDA stream: every batch would wait for
    the one before it. The encoder's batches and packings go pinned and non-blocking."""
    import stages.modeling.encoder as encoder_module

    calls = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: calls.append("pin") or self)
    monkeypatch.setattr(
        torch.Tensor, "to", lambda self, device, non_blocking=False: calls.append(non_blocking)
    )
    encoder_module._mover(torch.device("cuda"))(np.zeros(3, dtype=np.int64))
    assert calls == ["pin", True]
    calls.clear()
    encoder_module._mover(torch.device("cpu"))(np.zeros(3, dtype=np.int64))
    assert calls == [False]


@pytest.mark.parametrize("unpad", [True, False])
def test_pending_vectors_hold_only_themselves(
    unpad: bool, tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[CLS] of the padded forward is a view of the batch's states: kept as it is until the
    read-back, it would keep every pending batch's (batch, length, hidden) states alive."""
    import stages.modeling.encoder as encoder_module

    kept = []
    add = encoder_module._PendingVectors.add
    monkeypatch.setattr(
        encoder_module._PendingVectors, "add", lambda self, i, v: kept.append(v) or add(self, i, v)
    )
    model = encoder("bert", tokenizer).eval()
    embed(model, tokenizer, SENTENCES, "cls_before_pooler", batch_size=2, unpad=unpad)
    assert kept and all(v.untyped_storage().nbytes() == v.numel() * 4 for v in kept)


def test_packing_of_a_right_padded_mask() -> None:
    mask = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=bool)
    packing = Packing.from_mask(mask)
    assert packing.indices.tolist() == [0, 1, 2, 3, 6, 7]
    assert packing.first.tolist() == [0, 3, 4] and packing.lengths.tolist() == [3, 1, 2]
    doubled = packing.repeated(2)
    assert doubled.indices.tolist() == [0, 1, 2, 3, 6, 7, 9, 10, 11, 12, 15, 16]
    assert doubled.first.tolist() == [0, 3, 4, 6, 9, 10] and doubled.batch == 6
    assert packing.padding.tolist() == [4, 5, 8] and doubled.padding.tolist() == [
        4,
        5,
        8,
        13,
        14,
        17,
    ]
    states = torch.arange(6.0)[:, None]
    assert packing.unpack(states)[:, :, 0].tolist() == [[0, 1, 2], [3, 0, 0], [4, 5, 0]]
    torch.testing.assert_close(packing.pack(packing.unpack(states)), states)
    with pytest.raises(ValueError, match="right padding"):
        Packing.from_mask(np.array([[0, 1], [1, 1]], dtype=bool))


def test_filler_rows_round_the_packing_up_and_are_dropped_when_unpacked() -> None:
    mask = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=bool)  # 6 real tokens of 9
    packing = Packing.from_mask(mask, rows_multiple=4)
    assert packing.tokens == 8 and not packing.dense
    assert packing.indices.tolist() == [0, 1, 2, 3, 6, 7, 7, 7]  # fillers: the last real token
    assert packing.targets.tolist() == [0, 1, 2, 3, 6, 7, 9, 9]  # 9: the spare row, cut off
    assert packing.fillers.tolist() == [6, 7] and packing.padding.tolist() == [4, 5, 8]
    assert packing.first.tolist() == [0, 3, 4] and packing.lengths.tolist() == [3, 1, 2]
    states = torch.arange(8.0, requires_grad=True)
    padded = packing.unpack(states[:, None])
    assert padded[:, :, 0].tolist() == [[0, 1, 2], [3, 0, 0], [4, 5, 0]]
    padded.sum().backward()
    assert states.grad.tolist() == [1, 1, 1, 1, 1, 1, 0, 0]  # nothing flows into the fillers
    doubled = packing.repeated(2)
    assert doubled.indices.tolist() == [0, 1, 2, 3, 6, 7, 7, 7, 9, 10, 11, 12, 15, 16, 16, 16]
    assert doubled.targets.tolist() == [0, 1, 2, 3, 6, 7, 18, 18, 9, 10, 11, 12, 15, 16, 18, 18]
    assert doubled.first.tolist() == [0, 3, 4, 8, 11, 12]
    assert doubled.unpack(torch.arange(16.0)[:, None])[:, :, 0].tolist() == [
        [0, 1, 2], [3, 0, 0], [4, 5, 0], [8, 9, 10], [11, 0, 0], [12, 13, 0]
    ]  # fmt: skip
    assert Packing.from_mask(mask, rows_multiple=64).tokens == 9  # never beyond the layout
    assert Packing.from_mask(np.ones((2, 3), dtype=bool), rows_multiple=4).dense


@pytest.mark.parametrize("rows_multiple", [1, 4])
def test_qkv_go_to_the_heads_contiguous_and_their_gradients_come_back(rows_multiple) -> None:
    """``_split_heads`` equals unpacking and permuting (forward and backward, fillers and the
    doubled views included), with each of Q, K and V contiguous, zeros at the padding, and no
    gradient for the fillers."""
    mask = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=bool)
    packing = Packing.from_mask(mask, rows_multiple=rows_multiple).repeated(2)
    heads, size = 2, 3
    qkv = torch.randn(packing.tokens, 3 * heads * size, dtype=torch.float64, requires_grad=True)
    heads_out = _split_heads(qkv, packing, heads)
    permuted = packing.unpack(qkv).view(6, 3, 3, heads, size).permute(2, 0, 3, 1, 4)
    assert torch.equal(heads_out, permuted) and heads_out.shape == (3, 6, heads, 3, size)
    assert all(part.is_contiguous() for part in heads_out)
    weights = torch.randn(heads_out.shape, dtype=torch.float64)
    (ours,) = torch.autograd.grad((heads_out * weights).sum(), qkv)
    (theirs,) = torch.autograd.grad((permuted * weights).sum(), qkv)
    assert torch.equal(ours, theirs)
    if rows_multiple > 1:
        assert packing.fillers.tolist() == [6, 7, 14, 15]
        assert not ours[packing.fillers].any()
    else:
        assert packing.fillers is None


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_the_cls_poolers_run_the_last_layer_after_attention_on_the_first_tokens(
    family: str, tokenizer
) -> None:
    """``first_tokens_only``: the last layer's states at each row's first token, equal to the
    whole forward's there, with its attention output projection and feed-forward run on those
    rows alone (the earlier layers and the attention on every token)."""
    model = encoder(family, tokenizer).eval()
    ids, mask = padded_batch(tokenizer)
    packing = Packing.from_mask(mask.numpy(), rows_multiple=4)
    rows: dict[str, list[int]] = {}
    hooks = [
        module.register_forward_hook(
            lambda m, args, out, name=name: rows.setdefault(name, []).append(args[0].shape[0])
        )
        for name, module in model.named_modules()
        if name.endswith("intermediate.dense")
    ]
    with torch.no_grad():
        whole = packed_forward(model, ids, mask, packing)
        rows.clear()
        firsts = packed_forward(model, ids, mask, packing, first_tokens_only=True)
    for hook in hooks:
        hook.remove()
    batch = ids.shape[0]
    assert firsts.first_tokens_only and firsts.last.shape == (batch, model.config.hidden_size)
    torch.testing.assert_close(firsts.first_tokens(packing), whole.first_tokens(packing))
    assert rows == {
        "encoder.layer.0.intermediate.dense": [packing.tokens],
        "encoder.layer.1.intermediate.dense": [batch],
    }
    with pytest.raises(ValueError, match="every token"):
        pool_packed(firsts, packing, "mean", None)
    with pytest.raises(ValueError, match="first_tokens_only"):
        packed_forward(model, ids, mask, packing, keep_first_layer=True, first_tokens_only=True)


def test_the_trainer_rounds_packings_where_onednn_computes_the_products() -> None:
    """On the CPU in bf16, and in fp32 where ``cpu_linear`` puts the products on oneDNN."""
    rows = TokenRows.from_lists([[101, *range(2000, 2000 + n), 102] for n in range(1, 9)])
    plan = BatchPlan(len(rows), batch_size=8, world_size=1, seed=0)
    fp32_multiple = 64 if onednn_linear_available() else 1
    for precision, compiled, multiple, tokens in (
        ("fp32", False, fp32_multiple, 64 if fp32_multiple == 64 else 52),
        ("fp32", True, 1, 52),  # the compiler computes the Linear layers
        ("bf16", False, 64, 64),
        ("fp32", "reduce-overhead", 256, 8 * 12),  # CUDA graphs: the fixed layout, whole
    ):
        runtime = resolve_runtime("cpu", precision, compile=compiled)  # 52 of 8 x 10 tokens
        assert runtime.packed_rows_multiple == multiple
        batch = make_batch(rows, plan, None, 0, 0, 0, runtime, unpad=True, max_length=12)
        assert batch.packing.tokens == tokens
        assert batch.ids.shape == (8, 12 if compiled == "reduce-overhead" else 10)


def test_bucketed_packings_come_in_a_few_shapes_whatever_the_batch() -> None:
    """Under CUDA graphs every tensor a step's forward reads has a shape fixed by the batch
    size and the bucket of its real-token count: one recorded graph per bucket. The dynamic
    layout meets a new shape almost every batch."""
    lengths = np.random.default_rng(0).integers(3, 33, size=64 * 40)
    rows = TokenRows.from_lists([[101, *range(2000, 2000 + n - 2), 102] for n in lengths])
    plan = BatchPlan(len(rows), batch_size=64, world_size=1, seed=0)

    def shapes(runtime) -> set[tuple]:
        seen = set()
        for step in range(40):
            batch = make_batch(rows, plan, None, step, 0, 0, runtime, unpad=True, max_length=32)
            p = batch.packing.repeated(2)  # the two views, as the trainer runs them
            tensors = (batch.ids, p.indices, p.first, p.targets, p.padding, p.fillers)
            seen.add(tuple(None if t is None else tuple(t.shape) for t in tensors))
        return seen

    bucketed = shapes(resolve_runtime("cpu", "fp32", compile="reduce-overhead"))
    dynamic = shapes(resolve_runtime("cpu", "fp32"))
    cells = 2 * 64 * 32
    assert len({s[1] for s in bucketed}) <= -(-cells // GRAPH_ROWS_MULTIPLE) + 1
    assert len(bucketed) == len({s[1] for s in bucketed})  # the bucket decides every shape
    assert all(s[0] == (64, 32) for s in bucketed)
    assert len(bucketed) <= 4 and len(dynamic) >= 30


def test_fixed_shape_index_tensors_fill_up_with_repeats() -> None:
    mask = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=bool)
    packing = Packing.from_mask(mask, rows_multiple=4, fixed_shapes=True)
    assert packing.padding.tolist() == [4, 5, 8, 4, 4, 4]  # 9 cells - 3 first tokens
    assert packing.fillers.tolist() == [6, 7, 6, 6]  # 1 to rows_multiple of them
    exact = Packing.from_mask(mask, rows_multiple=3, fixed_shapes=True)  # 6 real: 3 fillers
    assert exact.tokens == 9 and exact.fillers.tolist() == [6, 7, 8]
    assert packing.indices.tolist() == [0, 1, 2, 3, 6, 7, 7, 7]
    states = torch.arange(8.0)[:, None]
    dynamic = Packing.from_mask(mask, rows_multiple=4)
    assert torch.equal(packing.unpack(states), dynamic.unpack(states))


def test_a_batch_without_padding_packs_by_reshaping() -> None:
    packing = Packing.from_mask(np.ones((2, 3), dtype=bool))
    assert packing.dense and not Packing.from_mask(np.array([[1, 1], [1, 0]], bool)).dense
    padded = torch.arange(12.0).view(2, 3, 2)
    packed = packing.pack(padded)
    assert packed.data_ptr() == padded.data_ptr() and packed.shape == (6, 2)
    assert packing.unpack(packed).data_ptr() == padded.data_ptr()
    torch.testing.assert_close(packing.unpack(packed), padded)
    assert packing.repeated(2).dense and packing.repeated(2).padding is None


# --- short batches evaluated on the CPU: batched matrix products instead of SDPA's kernel ------


@pytest.mark.parametrize("mask_kind", ["boolean", "additive", "none"])
def test_batched_attention_equals_sdpa(mask_kind: str) -> None:
    q, k, v = torch.randn(3, 4, 2, 6, 8, generator=torch.Generator().manual_seed(0))
    keys = torch.tensor([[1] * 6, [1] * 6, [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]], dtype=bool)
    mask = {
        "boolean": keys[:, None, None, :],
        "additive": attention_bias(keys, "eager"),
        "none": None,
    }[mask_kind]
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=None if mask is None else keys[:, None, None, :], scale=0.3
    ).transpose(1, 2)
    got = batched_attention(q, k, v, mask, 0.3)
    assert got.shape == (4, 6, 2, 8)  # (batch, length, heads, head_size)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize("pooler", POOLERS)
def test_short_evaluation_batches_on_the_cpu_equal_the_padded_forward_with_gradients(
    family: str, pooler: str, tokenizer, monkeypatch
) -> None:
    """In evaluation mode (gradient analyses keep gradients on) the short path gives the padded
    forward's outputs and gradients; a batch longer than SHORT_CPU_LENGTH goes through
    transformers' attention function."""
    import stages.modeling.unpadded as unpadded

    short = []
    original = unpadded.batched_attention
    monkeypatch.setattr(unpadded, "batched_attention", lambda *a: short.append(1) or original(*a))
    model = encoder(family, tokenizer).eval()
    ids, mask = padded_batch(tokenizer)
    monkeypatch.setattr(unpadded, "SHORT_CPU_LENGTH", ids.shape[1])
    contrastive = ContrastiveModel(model, pooler)
    padded = output_and_grads(model, lambda: reference(model, ids, mask, pooler))
    assert_same(output_and_grads(model, lambda: contrastive.embed(ids, mask)), padded)
    assert len(short) == model.config.num_hidden_layers
    monkeypatch.setattr(unpadded, "SHORT_CPU_LENGTH", ids.shape[1] - 1)
    assert_same(output_and_grads(model, lambda: contrastive.embed(ids, mask)), padded)
    assert len(short) == model.config.num_hidden_layers


def test_models_without_a_packed_forward_are_not_unpadded(tokenizer) -> None:
    model = encoder("bert", tokenizer)
    assert unpadding_unsupported(model) is None
    model.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in unpadding_unsupported(model)
    assert not ContrastiveModel(model, "cls").unpadded
    model.config._attn_implementation = "sdpa"
    model.config.model_type = "gpt2"
    assert "'gpt2' is not one of" in unpadding_unsupported(model)


# --- issue 16 item 4: the ready 4-D mask under every attention implementation ----------------


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_padded_forward_gives_the_same_states_under_eager_and_sdpa(family: str, tokenizer):
    ids, mask = padded_batch(tokenizer)
    outputs = {}
    for implementation in ("sdpa", "eager"):
        model = encoder(family, tokenizer, implementation).eval()
        contrastive = ContrastiveModel(model, "cls_before_pooler", unpad=False)
        with torch.no_grad():
            outputs[implementation] = contrastive.embed(ids, mask)
            two_d = model(input_ids=ids, attention_mask=mask.long()).last_hidden_state[:, 0]
        torch.testing.assert_close(outputs[implementation], two_d, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outputs["eager"], outputs["sdpa"], rtol=1e-5, atol=1e-6)


def test_a_boolean_mask_under_eager_attention_would_attend_to_padding(tokenizer) -> None:
    """Why eager needs the additive mask: the boolean one is added as 0/1, padding attended."""
    model = encoder("bert", tokenizer, "eager").eval()
    ids, mask = padded_batch(tokenizer)
    with torch.no_grad():
        right = model(input_ids=ids, attention_mask=attention_bias(mask, "eager"))
        wrong = model(input_ids=ids, attention_mask=mask[:, None, None, :])
    assert not torch.allclose(right.last_hidden_state[:, 0], wrong.last_hidden_state[:, 0])


def test_other_attention_implementations_are_refused_by_name() -> None:
    mask = torch.ones(2, 3, dtype=torch.bool)
    assert attention_bias(mask, "sdpa").dtype == torch.bool
    bias = attention_bias(torch.tensor([[True, False]]), "eager", torch.bfloat16)
    assert bias.shape == (1, 1, 1, 2) and bias.dtype == torch.bfloat16
    assert bias[0, 0, 0].tolist() == [0.0, torch.finfo(torch.bfloat16).min]
    with pytest.raises(ValueError, match="flash_attention_2"):
        attention_bias(mask, "flash_attention_2")


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_training_unpadded_or_padded_gives_the_same_run(
    dropout: float, corpus, token_cache, dev_evaluator, tmp_path
) -> None:
    """train.unpad switches the forward and nothing else: the packed forward draws its dropout
    masks over the padded layout, so with dropout on or off the losses, scores and weights agree
    up to float rounding."""
    from train_helpers import make_job, model_weights

    from stages.core.storage.run_folders import read_log
    from stages.training.loop import train

    runs = {}
    for unpad in (True, False):
        out = tmp_path / f"unpad-{unpad}"
        job = make_job(
            corpus, out, token_cache, dropout=dropout, unpad=unpad, max_steps=4, eval_steps=4
        )
        metrics = train(job, dev_evaluator)
        execution = json.loads((out / "config.json").read_text())["execution"]
        assert execution["unpadded"] is unpad
        losses = [r["loss"] for r in read_log(out / "log.jsonl") if r["event"] == "train"]
        runs[unpad] = (losses, metrics["best"], model_weights(out / "final"))
    (losses, best, weights), (padded_losses, padded_best, padded_weights) = runs.values()
    np.testing.assert_allclose(losses, padded_losses, rtol=1e-5)
    # the dev embeddings agree to rounding (alignment and uniformity are smooth in them); the
    # Spearman of a barely trained random model ranks near-tied float32 cosines (SentEval's
    # arithmetic) of 120 pairs, so rounding swaps ranks: over seeds 3-5, dropout 0 and 0.1, one
    # and two threads, the two runs differed by 0.05-1.04 points (the seeds' scores span 26-36):
    # a wide bound, still below what another seed moves
    for key in ("alignment", "uniformity"):
        assert best[key] == pytest.approx(padded_best[key], rel=1e-4), key
    assert abs(best["spearman"] - padded_best["spearman"]) < 2.0
    # AdamW's update is ~lr for any gradient, so a rounding difference in a near-zero gradient
    # entry can move a weight by up to lr (3e-5) per step: compare to a few steps' worth.
    for key in weights:
        torch.testing.assert_close(weights[key], padded_weights[key], rtol=0, atol=1e-4)
