"""The masking procedure: span arithmetic, the per-line random stream, and the invariants of
generated triplets against an independent per-sentence reference (real MiniLM tokenizer)."""

from __future__ import annotations

import io
import re
from itertools import chain
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from stages.core.schema.params import TripletsParams
from stages.masked_triplets.masking import (
    SKIP_REASONS,
    TRIPLETS_SCHEMA,
    MaskingTokenizer,
    TripletsError,
    generate_triplets,
    line_uniforms,
    masked_lengths,
    nested_spans,
    split_lines,
)

UNITS = ("token", "word")
REPLACEMENTS = ("mask_per_unit", "mask_per_span", "delete")

# --- span arithmetic ---------------------------------------------------------------------


@given(
    n_units=st.integers(1, 2000),
    short_rate=st.floats(0.01, 0.98),
    extra=st.floats(0.001, 0.98),
)
def test_masked_lengths_are_within_half_a_unit_of_the_rates(n_units, short_rate, extra):
    long_rate = min(short_rate + extra, 0.99)
    k_short, k_long = masked_lengths(np.array([n_units]), short_rate, long_rate)
    assert abs(k_short[0] - short_rate * n_units) <= 0.5 + 1e-9
    assert abs(k_long[0] - long_rate * n_units) <= 0.5 + 1e-9
    assert 0 <= k_short[0] <= k_long[0] <= n_units


def test_masked_lengths_round_halves_up_as_written_in_decimal():
    # 0.15 * 10 is 1.4999999999999998 in binary; the rule reads it as the decimal 1.5.
    k_short, k_long = masked_lengths(np.array([10, 10, 25, 45]), 0.15, 0.25)
    assert k_short.tolist() == [2, 2, 4, 7]  # 1.5 -> 2, 3.75 -> 4, 6.75 -> 7
    assert k_long.tolist() == [3, 3, 6, 11]  # 2.5 -> 3, 6.25 -> 6, 11.25 -> 11


@st.composite
def span_cases(draw):
    n_units = draw(st.integers(2, 600))
    k_long = draw(st.integers(2, n_units))
    k_short = draw(st.integers(1, k_long - 1))
    uniforms = draw(st.tuples(st.floats(0, 1, exclude_max=True), st.floats(0, 1, exclude_max=True)))
    return n_units, k_short, k_long, uniforms


@given(span_cases())
def test_long_span_contains_short_span_inside_the_sentence(case):
    n_units, k_short, k_long, uniforms = case
    short_start, long_start = nested_spans(
        np.array([n_units]), np.array([k_short]), np.array([k_long]), np.array([uniforms])
    )
    a, b = short_start[0], short_start[0] + k_short
    c, d = long_start[0], long_start[0] + k_long
    assert 0 <= c <= a < b <= d <= n_units


def test_span_positions_are_uniform_over_their_range():
    # Uniforms on a regular grid must hit every start position equally often.
    n_units, k_short, k_long, per_value = 10, 2, 4, 7
    positions = n_units - k_short + 1
    grid = (np.arange(positions * per_value) + 0.5) / (positions * per_value)
    uniforms = np.stack([grid, np.full_like(grid, 0.5)], axis=1)
    ones = np.ones_like(grid, dtype=np.int64)
    short_start, _ = nested_spans(n_units * ones, k_short * ones, k_long * ones, uniforms)
    assert np.bincount(short_start).tolist() == [per_value] * positions
    # With the short span in the middle, the 2 extra units split 0+2, 1+1 or 2+0, equally often.
    uniforms = np.stack([np.full(3 * per_value, 0.5), (np.arange(3 * per_value) + 0.5) / 21], 1)
    ones = np.ones(3 * per_value, dtype=np.int64)
    short_start, long_start = nested_spans(n_units * ones, k_short * ones, k_long * ones, uniforms)
    assert np.bincount(short_start - long_start).tolist() == [per_value] * 3


def test_line_uniforms_are_per_line_and_stable():
    u = line_uniforms(42, 1000)
    assert u.shape == (1000, 2) and u.min() >= 0 and u.max() < 1
    assert np.array_equal(line_uniforms(42, 10), u[:10])  # a line's draws ignore the others
    assert not np.array_equal(line_uniforms(43, 10), u[:10])
    # Pinned: a seed must mean the same spans on every machine and numpy version.
    np.testing.assert_array_equal(
        u[:2],
        [[0.08607763073528474, 0.14155732377913233], [0.27009303504774695, 0.8740378646728407]],
    )


def test_split_lines_splits_as_a_text_mode_file_reads():
    text = "a\u2028b\r\nc\x85d\n\n  \nx\ry\rlast"
    expected = ["a\u2028b", "c\x85d", "", "  ", "x", "y", "last"]
    assert split_lines(text) == expected
    assert split_lines(text + "\n") == split_lines(text + "\r") == expected
    assert split_lines("") == []
    # as datasets' text loader reads it (universal newlines, then lines without their break)
    assert io.StringIO(text, newline=None).read().split("\n") == expected


def test_the_train_and_triplets_stages_number_the_lines_alike(tmp_path: Path) -> None:
    from stages.training.data import read_corpus as train_lines
    from stages.triplets import read_corpus as triplet_lines

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes("one\rtwo\r\nthree\n\nfour\u2028five\n".encode())
    assert train_lines(corpus) == triplet_lines(corpus)[0] == [
        "one", "two", "three", "", "four\u2028five"
    ]  # fmt: skip


# --- generated triplets against a per-sentence reference ---------------------------------


def reference_triplet(sentence, row, tokenizer, params):
    """(s', s'') ids and texts for the row's spans, computed one sentence at a time."""
    if params.unit == "token":
        enc = tokenizer(sentence, add_special_tokens=False, return_offsets_mapping=True)
        unit_ids = [[i] for i in enc["input_ids"]]
        unit_chars = enc["offset_mapping"]
    else:
        unit_chars = [m.span() for m in re.finditer(r"\S+", sentence)]
        assert len(unit_chars) == len(sentence.split())
        # BERT never lets a token cross whitespace: a word's tokens are those of the word alone.
        unit_ids = [tokenizer(sentence[a:b], add_special_tokens=False)["input_ids"]
                    for a, b in unit_chars]  # fmt: skip
    variants = []
    for start, end in (
        (row["short_start"], row["short_end"]),
        (row["long_start"], row["long_end"]),
    ):
        n_masks = {"mask_per_unit": end - start, "mask_per_span": 1, "delete": 0}
        n = n_masks[params.replacement]
        ids = [
            *chain.from_iterable(unit_ids[:start]),
            *[tokenizer.mask_token_id] * n,
            *chain.from_iterable(unit_ids[end:]),
        ]
        masks = " ".join([tokenizer.mask_token] * n)
        text = sentence[: unit_chars[start][0]] + masks + sentence[unit_chars[end - 1][1] :]
        variants.append((ids, text))
    return len(unit_ids), variants


def check_triplets(lines, frame, counts, tokenizer, params, max_tokens=510):
    assert frame.schema == TRIPLETS_SCHEMA
    assert counts.lines == len(lines) == counts.triplets + sum(counts.skipped.values())
    assert set(counts.skipped) == set(SKIP_REASONS)
    rows = {row["line"]: row for row in frame.iter_rows(named=True)}
    expected_skips = dict.fromkeys(SKIP_REASONS, 0)
    for i, sentence in enumerate(lines):
        words = len(sentence.split())
        ids = tokenizer(sentence, add_special_tokens=False)["input_ids"]
        if words == 0 or (words >= params.min_words and not ids):
            expected_skips["empty"] += 1
        elif words < params.min_words:
            expected_skips["below_min_words"] += 1
        elif len(ids) > max_tokens:
            expected_skips["too_long"] += 1
        else:
            n_units = len(ids) if params.unit == "token" else words
            k_short, k_long = masked_lengths(
                np.array([n_units]), params.short_mask_rate, params.long_mask_rate
            )
            if not 1 <= k_short[0] < k_long[0]:
                expected_skips["too_few_units"] += 1
                continue
            row = rows.pop(i)
            assert row["sentence"] == sentence and row["sentence_ids"] == ids
            assert row["seed"] == params.seed and row["n_units"] == n_units
            assert (row["short_end"] - row["short_start"], row["long_end"] - row["long_start"]) == (
                k_short[0],
                k_long[0],
            )
            assert 0 <= row["long_start"] <= row["short_start"] < row["short_end"]
            assert row["short_end"] <= row["long_end"] <= n_units
            for k, rate in (
                (k_short[0], params.short_mask_rate),
                (k_long[0], params.long_mask_rate),
            ):
                assert abs(k - rate * n_units) <= 0.5 + 1e-9
            n_ref, ((short_ids, short_text), (long_ids, long_text)) = reference_triplet(
                sentence, row, tokenizer, params
            )
            assert n_ref == n_units
            assert (row["short_masked_ids"], row["long_masked_ids"]) == (short_ids, long_ids)
            assert (row["short_masked"], row["long_masked"]) == (short_text, long_text)
    assert not rows, f"triplets for lines that should have none: {sorted(rows)}"
    assert counts.skipped == expected_skips
    assert frame["line"].is_sorted()


# Words mix ASCII (most of the real text) with accents, CJK, emoji, RTL, combining marks,
# astral characters and control/format characters BERT drops; separators are Unicode spaces.
WORD_CHARS = st.characters(
    codec="utf-8",
    exclude_categories=("Cs", "Zs", "Zl", "Zp"),
    exclude_characters="\n\r\t\x0b\x0c\x1c\x1d\x1e\x1f\x85",
)
WORD = st.one_of(
    st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz,.'()-0123456789"), min_size=1, max_size=9),
    st.text(WORD_CHARS, min_size=1, max_size=6),
    st.sampled_from(
        ["café", "naïve", "東京都", "😀👍🏽", "שלום", "e\u0301", "𝔘𝔫𝔦", "a\u200bb", "[MASK]"]
    ),
)
SEPARATOR = st.sampled_from([" ", " ", " ", "  ", "\t", "\u00a0", "\u3000", "\u2009", "\u2028"])


@st.composite
def sentences(draw):
    words = draw(st.lists(WORD, min_size=0, max_size=40))
    seps = draw(st.lists(SEPARATOR, min_size=len(words) + 1, max_size=len(words) + 1))
    edges = draw(st.tuples(st.booleans(), st.booleans()))
    body = "".join(chain.from_iterable(zip(seps[1:], words, strict=True)))[1:] if words else ""
    return (seps[0] if edges[0] else "") + body + (seps[-1] if edges[1] else "")


@st.composite
def triplet_params(draw):
    short = draw(st.sampled_from([0.1, 0.15, 0.2, 0.25, 0.3]))
    return TripletsParams(
        short_mask_rate=short,
        long_mask_rate=draw(st.sampled_from([short + d for d in (0.05, 0.1, 0.2, 0.35)])),
        unit=draw(st.sampled_from(UNITS)),
        replacement=draw(st.sampled_from(REPLACEMENTS)),
        min_words=draw(st.integers(1, 8)),
        seed=draw(st.integers(0, 2**32)),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(sentences(), min_size=1, max_size=8), params=triplet_params())
def test_triplets_match_the_reference(lines, params, masking_tokenizer, minilm_tokenizer):
    frame, counts = generate_triplets(lines, masking_tokenizer, params, chunk_sentences=3)
    check_triplets(lines, frame, counts, minilm_tokenizer, params)


EDGE_LINES = [
    "",
    "   ",
    "\t\u3000 \u00a0",
    "too short to mask",
    " ".join(["word"] * 24),  # one word below the minimum
    " ".join(["word"] * 25),  # exactly the minimum
    "Ünïcödé 東京 😀 שלום e\u0301 𝔘 a\u200bb \u2028 " + " ".join(f"w{i}" for i in range(25)),
    " ".join(["x" * 10_000] * 25),  # 250k characters, but 25 tokens ([UNK] each): a triplet
    " ".join(["token"] * 600),  # 600 tokens: longer than the encoder's 510
    "\u200b \u200b " + " ".join(["alpha"] * 30),  # words BERT drops entirely
    " ".join(["\u200b"] * 30),  # 30 words, no tokens: nothing for the encoder, so empty
]


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("replacement", REPLACEMENTS)
def test_edge_lines(unit, replacement, masking_tokenizer, minilm_tokenizer):
    params = TripletsParams(unit=unit, replacement=replacement)
    frame, counts = generate_triplets(EDGE_LINES, masking_tokenizer, params)
    check_triplets(EDGE_LINES, frame, counts, minilm_tokenizer, params)
    assert counts.skipped == {
        "empty": 4,
        "below_min_words": 2,
        "too_long": 1,
        "too_few_units": 0,
    }
    assert frame["line"].to_list() == [5, 6, 7, 9]


def test_too_few_units_to_nest_two_spans(masking_tokenizer, minilm_tokenizer):
    params = TripletsParams(unit="token", min_words=1)
    lines = ["a", "a b c", "a b c d"]  # 0.2 * 1 rounds to 0; 0.2 and 0.4 of 3 both round to 1
    frame, counts = generate_triplets(lines, masking_tokenizer, params)
    check_triplets(lines, frame, counts, minilm_tokenizer, params)
    assert counts.skipped["too_few_units"] == 2 and frame["line"].to_list() == [2]


@pytest.fixture(scope="module")
def sample_lines(shared_data) -> list[str]:
    text = (shared_data / "corpus" / "wiki1m_head_11913.txt").read_text(encoding="utf-8")
    return split_lines(text)[:1500]


@pytest.mark.parametrize("unit", UNITS)
def test_real_sample_matches_the_reference(unit, sample_lines, masking_tokenizer, minilm_tokenizer):
    params = TripletsParams(unit=unit)
    frame, counts = generate_triplets(sample_lines, masking_tokenizer, params)
    assert counts.triplets > 200
    check_triplets(sample_lines, frame, counts, minilm_tokenizer, params)


def test_results_do_not_depend_on_batching_or_other_lines(sample_lines, masking_tokenizer):
    params = TripletsParams()
    frame, _ = generate_triplets(sample_lines, masking_tokenizer, params)
    assert frame.equals(generate_triplets(sample_lines, masking_tokenizer, params)[0])
    for chunk in (1, 7, 100_000):
        rebatched, _ = generate_triplets(
            sample_lines, masking_tokenizer, params, chunk_sentences=chunk
        )
        assert rebatched.equals(frame)
    prefix, _ = generate_triplets(sample_lines[:700], masking_tokenizer, params)
    assert prefix.equals(frame.filter(pl.col("line") < 700))


def test_the_seed_moves_the_spans(sample_lines, masking_tokenizer):
    a, _ = generate_triplets(sample_lines, masking_tokenizer, TripletsParams(seed=1))
    b, _ = generate_triplets(sample_lines, masking_tokenizer, TripletsParams(seed=2))
    same = ["line", "sentence", "sentence_ids", "n_units"]
    assert a.select(same).equals(b.select(same))
    assert (a["short_start"] != b["short_start"]).mean() > 0.8


def test_replacement_needs_a_mask_token(masking_tokenizer):
    no_mask = MaskingTokenizer(masking_tokenizer.backend, None, None, None)
    lines = [" ".join(["word"] * 30)]
    with pytest.raises(TripletsError, match="needs a mask token"):
        generate_triplets(lines, no_mask, TripletsParams())
    frame, _ = generate_triplets(lines, no_mask, TripletsParams(replacement="delete"))
    assert frame["short_masked_ids"].list.len().item() == 30 - 6


def test_word_units_with_byte_level_offsets():
    """Byte-level BPE offsets include the space before a word, and unknown words start with a
    lone space token: both belong to the word after the space."""
    corpus = ["the quick brown fox jumps over the lazy dog"] * 20
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    backend.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet)
    )
    tokenizer = MaskingTokenizer(backend, None, None, None)
    line = "the  quick brown fox jumps over the lazy dog again and again, twice"
    assert backend.encode(line).offsets[1][0] == 3  # " quick": the offsets start at the space
    params = TripletsParams(unit="word", replacement="delete", min_words=5)
    for seed in range(20):
        frame, _ = generate_triplets([line], tokenizer, params.model_copy(update={"seed": seed}))
        row = frame.row(0, named=True)
        words = line.split()
        for start, end, ids in (
            (row["short_start"], row["short_end"], row["short_masked_ids"]),
            (row["long_start"], row["long_end"], row["long_masked_ids"]),
        ):
            kept = [w for i, w in enumerate(words) if not start <= i < end]
            assert backend.decode(ids).split() == kept
