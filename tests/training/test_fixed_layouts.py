"""Layouts under fixed shapes (CUDA graphs): each batch at its longest row rounded up to a
multiple of ``LAYOUT_MULTIPLE``, views and triplets each up to their own truncation length
(stages/training/batch.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from train_helpers import TINY

from stages.core.schema.params import POOLERS, load_params
from stages.masked_triplets.file_format import write_triplets
from stages.masked_triplets.masking import MaskingTokenizer, generate_triplets
from stages.modeling.backbone import load_backbone
from stages.training.batch import make_batch
from stages.training.contrastive_model import ContrastiveModel
from stages.training.data import (
    LAYOUT_MULTIPLE,
    BatchPlan,
    TokenRows,
    TripletPool,
    fixed_layout_length,
    read_corpus,
    read_triplet_token_ids,
    special_token_frame,
    tokenize,
)
from stages.training.runtime import GRAPH_ROWS_MULTIPLE, Runtime, resolve_runtime

REPO = Path(__file__).resolve().parents[2]
GRAPHS = resolve_runtime("cpu", "fp32", compile="reduce-overhead")
EAGER = resolve_runtime("cpu", "fp32")


def test_a_layout_is_the_longest_row_rounded_up_to_the_multiple_within_the_limit() -> None:
    assert LAYOUT_MULTIPLE == 32
    cases = {(1, 512): 32, (32, 512): 32, (33, 512): 64, (500, 512): 512, (40, 50): 50}
    for (longest, limit), length in cases.items():
        assert fixed_layout_length(longest, limit) == length
    assert fixed_layout_length(700, None) == 704


def pool_of(rows: list[list[int]], max_length: int = 512, batch_size: int = 4) -> TripletPool:
    """A triplet pool whose s, s' and s'' are ``rows`` (ids without special tokens)."""
    tokens = TokenRows.from_lists(rows)
    return TripletPool(tokens, tokens, tokens, (101,), (102,), batch_size, 0, max_length)


@pytest.mark.parametrize("unpad", [False, True])
def test_triplets_longer_than_max_seq_length_take_their_own_layout(unpad: bool) -> None:
    """ArcCSE's triplets are truncated at the model's positions, not at max_seq_length: under
    fixed shapes a triplet row of 58 tokens is laid out at 64 while the views stay at 32 (it
    stopped the first step with 'a row of 58 tokens does not fit a layout of 32')."""
    corpus = TokenRows.from_lists([[101, *range(2000, 2000 + n), 102] for n in (3, 9, 20, 18)])
    plan = BatchPlan(len(corpus), batch_size=4, seed=0)
    pool = pool_of([list(range(3000, 3000 + n)) for n in (56, 10, 20, 30)])
    batch = make_batch(corpus, plan, pool, 0, 0, 0, GRAPHS, unpad=unpad, max_length=32)
    assert batch.ids.shape == (4, 32) and batch.triplet_ids.shape == (12, 64)
    assert batch.triplet_mask.sum(1).max() == 58
    if unpad:
        assert batch.packing.length == 32 and batch.triplet_packing.length == 64
    eager = make_batch(corpus, plan, pool, 0, 0, 0, EAGER, unpad=unpad, max_length=32)
    assert eager.ids.shape == (4, 22) and eager.triplet_ids.shape == (12, 58)


@pytest.mark.parametrize("unpad", [False, True])
@pytest.mark.parametrize("pooler", POOLERS)
def test_the_longer_layout_embeds_as_dynamic_padding(pooler: str, unpad: bool) -> None:
    """The rounding's padding is masked out: both forwards embed a batch laid out under fixed
    shapes as they embed it dynamically padded (no dropout: its masks follow the layout)."""
    encoder = load_backbone(TINY, seed=0, dropout=0.0)
    model = ContrastiveModel(encoder, pooler, unpad=unpad)
    corpus = TokenRows.from_lists([[101, *range(2000, 2000 + n), 102] for n in (3, 9, 20, 18)])
    plan = BatchPlan(len(corpus), batch_size=4, seed=0)
    embedded, lengths = [], []
    for runtime in (GRAPHS, EAGER):
        batch = make_batch(corpus, plan, None, 0, 0, 0, runtime, unpad=unpad, max_length=512)
        embedded.append(model.embed(batch.ids, batch.mask, batch.packing))
        lengths.append(batch.ids.shape[1])
    assert lengths == [32, 22]
    torch.testing.assert_close(embedded[0], embedded[1], rtol=1e-5, atol=1e-5)


def test_a_short_batch_is_not_laid_out_at_max_seq_length() -> None:
    corpus = TokenRows.from_lists([[101, *range(2000, 2000 + n), 102] for n in (3, 9, 20, 40)])
    plan = BatchPlan(len(corpus), batch_size=2, seed=0)
    lengths = set()
    for step in range(plan.steps_per_epoch):
        batch = make_batch(corpus, plan, None, step, 0, 0, GRAPHS, max_length=512)
        lengths.add(batch.ids.shape[1])
    assert lengths == {32, 64}  # the rows' 5 to 42 tokens, never 512


@pytest.fixture(scope="module")
def arccse_epoch(
    shared_data: Path, tokenizer, tmp_path_factory: pytest.TempPathFactory
) -> tuple[TokenRows, BatchPlan, TripletPool, int]:
    """params.yaml's ArcCSE (batch 64, by length, max_seq_length 512, its triplets settings) on
    the wiki1m head sample: the corpus, its batch plan, the triplet pool, max_seq_length."""
    params = load_params(REPO / "params.yaml")
    train = params.resolve("arccse", "bert-base").train
    assert train.max_seq_length == 512 and train.sampling == "by_length"
    sentences = read_corpus(shared_data / "corpus" / "wiki1m_head_11913.txt")
    corpus = tokenize(sentences, tokenizer, train.max_seq_length)
    masking = MaskingTokenizer.from_pretrained(tokenizer)
    frame, _ = generate_triplets(sentences, masking, params.triplets_for("arccse"))
    path = tmp_path_factory.mktemp("triplets") / "triplets.parquet"
    write_triplets(frame, path)
    _, anchor, short, long = read_triplet_token_ids(path)
    prefix, suffix = special_token_frame(tokenizer)
    pool = TripletPool(
        anchor, short, long, tuple(prefix), tuple(suffix), train.batch_size, 42, max_length=512
    )
    lengths = np.diff(corpus.offsets)
    plan = BatchPlan(len(corpus), train.batch_size, 42, lengths=lengths)
    return corpus, plan, pool, train.max_seq_length


def epoch_shapes(arccse_epoch, runtime: Runtime, unpad: bool) -> list[tuple[tuple, tuple]]:
    """(views, triplets) of every step of the epoch: each a tuple of every shape the compiled
    forward reads (the ids, and unpadded the packings' index tensors, the views doubled)."""
    corpus, plan, pool, max_length = arccse_epoch
    seen = []
    for step in range(plan.steps_per_epoch):
        batch = make_batch(corpus, plan, pool, step, 0, 0, runtime, unpad, max_length)
        parts = []
        for ids, packing in (
            (batch.ids, batch.packing and batch.packing.repeated(2)),
            (batch.triplet_ids, batch.triplet_packing),
        ):
            tensors = [ids] if packing is None else [ids, packing.indices, packing.padding]
            parts.append(tuple(tuple(t.shape) for t in tensors))
        seen.append((parts[0], parts[1]))
    return seen


def test_arccse_at_512_meets_a_bounded_number_of_shapes(arccse_epoch) -> None:
    """An epoch of ArcCSE at max_seq_length 512 under fixed shapes: the padded forward meets at
    most 512 / 32 layouts of the views and of the triplets; the unpadded one at most the
    buckets of GRAPH_ROWS_MULTIPLE rows of those layouts, and its layout and bucket decide
    every shape. Dynamic padding meets a new shape at most steps."""
    _, _, pool, max_length = arccse_epoch
    padded = epoch_shapes(arccse_epoch, GRAPHS, unpad=False)
    for part, limit in enumerate((max_length, pool.max_length)):
        lengths = {shapes[part][0][1] for shapes in padded}
        assert all(length % LAYOUT_MULTIPLE == 0 or length == limit for length in lengths)
        assert len(lengths) <= -(-limit // LAYOUT_MULTIPLE)
    unpadded = epoch_shapes(arccse_epoch, GRAPHS, unpad=True)
    for part, copies in enumerate((2, 1)):  # the views run doubled
        shapes = {s[part] for s in unpadded}
        buckets = {(s[0], s[1][0]) for s in shapes}  # (layout, packed rows)
        assert len(shapes) == len(buckets)
        assert all(tokens % GRAPH_ROWS_MULTIPLE == 0 for _, tokens in buckets)
        layouts = {layout for layout, _ in buckets}
        assert layouts == {s[part][0] for s in padded}  # laid out as the padded forward
        cells = [copies * batch * length for batch, length in layouts]
        assert len(buckets) <= sum(-(-n // GRAPH_ROWS_MULTIPLE) + 1 for n in cells)
    views = {s[0] for s in epoch_shapes(arccse_epoch, EAGER, unpad=False)}
    assert len({s[0] for s in padded}) <= 16 < len(views)  # 6 against 57 on this sample
    assert len(set(padded)) < 50  # torch's warning limit of recorded shapes (10 here)


def test_arccse_at_512_pays_only_the_rounding_beyond_per_batch_padding(arccse_epoch) -> None:
    """Every batch is laid out fewer than LAYOUT_MULTIPLE positions beyond its longest row: the
    real tokens' share of the layout and the attention's work (rows x length^2) stay near
    dynamic padding's, where a layout at max_seq_length multiplies both."""
    corpus, plan, pool, max_length = arccse_epoch
    real, cells, attention = 0, np.zeros(3), np.zeros(3)  # fixed, dynamic, at max_seq_length
    for step in range(plan.steps_per_epoch):
        graphs = make_batch(corpus, plan, pool, step, 0, 0, GRAPHS, max_length=max_length)
        eager = make_batch(corpus, plan, pool, step, 0, 0, EAGER, max_length=max_length)
        for layout, padded in ((graphs.ids, eager.ids), (graphs.triplet_ids, eager.triplet_ids)):
            assert layout.shape[0] == padded.shape[0]
            assert 0 <= layout.shape[1] - padded.shape[1] < LAYOUT_MULTIPLE
            lengths = np.array([layout.shape[1], padded.shape[1], max_length])
            cells += layout.shape[0] * lengths
            attention += layout.shape[0] * lengths.astype(float) ** 2
        real += int(eager.mask.sum() + eager.triplet_mask.sum())
    share = real / cells  # wiki1m head sample: 42%, 52%, 8%
    work = attention / attention[1]  # 1.4, 1, 35
    assert share[0] > 0.8 * share[1] and share[0] > 5 * share[2]
    assert work[0] < 1.5 and work[2] > 10 * work[0]
