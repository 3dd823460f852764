from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from train_helpers import write_triplets

from stages.training import data
from stages.training.data import (
    BatchPlan,
    TokenRows,
    TripletPool,
    load_tokenized_corpus,
    pad_rows,
    read_corpus,
    read_triplet_token_ids,
    special_token_frame,
)


def test_token_rows_round_trip_and_prefix() -> None:
    rows = TokenRows.from_lists([[1, 2, 3], [], [4]])
    assert len(rows) == 3
    assert [r.tolist() for r in rows.rows([2, 0, 1])] == [[4], [1, 2, 3], []]
    assert [r.tolist() for r in rows.head(2).rows(range(2))] == [[1, 2, 3], []]
    assert rows.head(None) is rows


def test_dynamic_padding_pads_to_the_longest_row_only() -> None:
    ids, mask = pad_rows([np.array([5, 6, 7]), np.array([8])], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    assert ids.dtype == np.int64 and mask.dtype == bool


def test_corpus_keeps_empty_lines_and_drops_only_the_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("a b\n\nc\n", encoding="utf-8")
    assert read_corpus(path) == ["a b", "", "c"]


def test_tokenised_corpus_is_cached_per_file_tokenizer_and_length(
    corpus: Path, tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = load_tokenized_corpus(corpus, tokenizer, 32, tmp_path)
    assert len(first) == len(read_corpus(corpus))
    assert max(np.diff(first.offsets)) <= 32
    expected = tokenizer(read_corpus(corpus)[7], truncation=True, max_length=32)["input_ids"]
    assert first.rows([7])[0].tolist() == expected

    def no_tokenising(*args, **kwargs):
        raise AssertionError("cache miss")

    monkeypatch.setattr(data, "tokenize", no_tokenising)
    again = load_tokenized_corpus(corpus, tokenizer, 32, tmp_path, max_sentences=10)
    assert len(again) == 10
    assert np.array_equal(again.ids, first.ids[: first.offsets[10]])
    with pytest.raises(AssertionError, match="cache miss"):
        load_tokenized_corpus(corpus, tokenizer, 16, tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "empty", "not a zip"])
def test_an_unreadable_cache_entry_is_a_miss_rewritten_with_a_warning(
    damage: str, corpus: Path, tokenizer, tmp_path: Path
) -> None:
    first = load_tokenized_corpus(corpus, tokenizer, 32, tmp_path)
    (cached,) = tmp_path.glob("*.npz")
    stored = cached.read_bytes()
    damaged = {"truncated": stored[: len(stored) // 2], "empty": b"", "not a zip": b"x" * 99}
    cached.write_bytes(damaged[damage])
    with pytest.warns(UserWarning, match=rf"{cached}: unreadable cache entry"):
        again = load_tokenized_corpus(corpus, tokenizer, 32, tmp_path)
    assert np.array_equal(again.ids, first.ids) and np.array_equal(again.offsets, first.offsets)
    assert cached.read_bytes() == stored  # rewritten


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60),
    batch=st.integers(1, 16),
    world=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 5),
)
def test_each_epoch_visits_every_row_once_in_a_seeded_order(n, batch, world, seed) -> None:
    batch = batch * world
    if batch < 2 * world or n < 2 * world:
        with pytest.raises(ValueError, match=r"fewer than 2 sentences|at least 2 per rank"):
            BatchPlan(n, batch, seed, world)
        return
    plan = BatchPlan(n, batch, seed, world)
    for epoch in range(2):
        steps = range(epoch * plan.steps_per_epoch, (epoch + 1) * plan.steps_per_epoch)
        seen = np.concatenate([plan.global_batch(s) for s in steps])
        rest = n % batch
        dropped = rest % world if rest >= 2 * world else rest
        assert len(seen) == n - dropped
        assert len(set(seen.tolist())) == len(seen)
        for s in steps:
            shards = [plan.shard(s, r) for r in range(world)]
            assert len({len(x) for x in shards}) == 1
            assert np.array_equal(np.concatenate(shards), plan.global_batch(s))
    # The position is a function of the step: a fresh plan (a resumed run) agrees.
    again = BatchPlan(n, batch, seed, world)
    assert np.array_equal(
        again.global_batch(plan.steps_per_epoch), plan.global_batch(plan.steps_per_epoch)
    )


def test_by_length_sampling_groups_similar_lengths_in_a_seeded_resumable_order() -> None:
    rng = np.random.default_rng(0)
    n, batch = 1000, 4
    lengths = rng.integers(3, 40, n)
    plan = BatchPlan(n, batch, seed=7, lengths=lengths)
    size = BatchPlan.MEGABATCH * batch
    uniform = BatchPlan(n, batch, seed=7)
    steps = range(plan.steps_per_epoch)
    order = np.concatenate([plan.global_batch(s) for s in steps])
    # each megabatch holds the uniform permutation's rows, sorted longest first
    for first in range(0, n, size):
        chunk = np.concatenate([uniform.global_batch(s) for s in steps])[first : first + size]
        assert sorted(order[first : first + size].tolist()) == sorted(chunk.tolist())
        assert np.all(np.diff(lengths[order[first : first + size]]) <= 0)
    # batches are far more homogeneous in length than uniform ones
    spread = np.mean([np.ptp(lengths[plan.global_batch(s)]) for s in steps])
    uniform_spread = np.mean([np.ptp(lengths[uniform.global_batch(s)]) for s in steps])
    assert spread < uniform_spread / 5
    # seeded and a function of the step (resumable); epochs differ
    again = BatchPlan(n, batch, seed=7, lengths=lengths)
    assert all(np.array_equal(plan.global_batch(s), again.global_batch(s)) for s in (0, 61, 300))
    assert not np.array_equal(plan.global_batch(0), plan.global_batch(plan.steps_per_epoch))
    assert not np.array_equal(
        plan.global_batch(0), BatchPlan(n, batch, seed=8, lengths=lengths).global_batch(0)
    )


def test_epochs_are_reshuffled_and_seeds_differ() -> None:
    plan = BatchPlan(100, 100, seed=1)
    assert not np.array_equal(plan.global_batch(0), plan.global_batch(1))
    assert not np.array_equal(plan.global_batch(0), BatchPlan(100, 100, seed=2).global_batch(0))


def test_special_token_frame_of_a_bert_tokenizer(tokenizer) -> None:
    assert special_token_frame(tokenizer) == ([tokenizer.cls_token_id], [tokenizer.sep_token_id])


def test_triplet_file_reading_and_pool_cycling(tmp_path: Path, corpus: Path, tokenizer) -> None:
    sentences = read_corpus(corpus)
    path = write_triplets(tmp_path / "t.parquet", tokenizer, sentences)
    lines = pl.read_parquet(path, columns=["line"])["line"].to_list()
    read_lines, anchor, short, long = read_triplet_token_ids(path)
    assert read_lines.tolist() == lines
    assert len(anchor) == len(short) == len(long) == len(lines) > 20
    expected = tokenizer(sentences[lines[3]], add_special_tokens=False)["input_ids"]
    assert anchor.rows([3])[0].tolist() == expected
    mask = tokenizer.mask_token_id
    assert mask in short.rows([3])[0] and mask in long.rows([3])[0]
    head = read_triplet_token_ids(path, max_sentences=100)[1]
    assert len(head) == sum(line < 100 for line in lines)

    n = 10
    pool = TripletPool(anchor.head(n), short.head(n), long.head(n), (101,), (102,), 4, 0, 8)
    # Over 5 steps (20 draws) every triplet comes up exactly twice: two shuffled passes.
    drawn = np.concatenate([pool.indices(s) for s in range(5)])
    assert np.bincount(drawn, minlength=n).tolist() == [2] * n
    assert not np.array_equal(drawn[:n], drawn[n:])
    s, s1, s2 = pool.shard(0, 0)
    first = pool.indices(0)[0]
    assert s[0].tolist() == [101, *anchor.rows([first])[0][:6].tolist(), 102]
    assert len(s) == len(s1) == len(s2) == 4
    assert all(len(r) <= 8 for r in s + s1 + s2)
    two = TripletPool(anchor.head(n), short.head(n), long.head(n), (101,), (102,), 4, 0, 8, 2)
    halves = [two.shard(3, rank)[0] for rank in (0, 1)]
    assert [r.tolist() for r in halves[0] + halves[1]] == [r.tolist() for r in pool.shard(3, 0)[0]]


def test_in_batch_triplets_are_those_of_the_steps_own_sentences(
    tmp_path: Path, corpus: Path, tokenizer
) -> None:
    """triplet_batching: batch: a step's triplets are those of its sentences that have one (the
    lines with triplets.min_words words), in the batch's order, framed as the pool's."""
    sentences = read_corpus(corpus)
    lines, anchor, short, long = read_triplet_token_ids(
        write_triplets(tmp_path / "t.parquet", tokenizer, sentences)
    )
    pool = TripletPool(
        anchor, short, long, (101,), (102,), 4, 0, 512, lines=lines, batching="batch"
    )
    with_triplet = set(lines.tolist())
    batch = np.array([lines[5], 0, lines[2], len(sentences) + 7, lines[9]])
    s, s1, s2 = pool.shard(0, 0, batch)
    wanted = [line for line in batch.tolist() if line in with_triplet]
    assert 0 not in with_triplet and len(wanted) == 3
    assert [r[1:-1].tolist() for r in s] == [
        tokenizer(sentences[line], add_special_tokens=False)["input_ids"] for line in wanted
    ]
    assert len(s1) == len(s2) == 3 and s[0][0] == 101 and s[0][-1] == 102
    assert pool.shard(1, 0, np.array([0])) == [[], [], []]
    with pytest.raises(ValueError, match="needs the corpus line"):
        TripletPool(anchor, short, long, (101,), (102,), 4, 0, batching="batch")
