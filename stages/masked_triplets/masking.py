"""ArcCSE's masked triplets (s, s', s''): s' masks one contiguous span of s, s'' enlarges it.

The procedure, per corpus line (spec A.3; decisions in docs/triplets.md):

1. Eligibility. Lines with fewer than ``min_words`` whitespace-separated words (``str.split``)
   get no triplet; the filter counts words whatever the masking unit (ArcCSE's 25 words).
2. Tokens. s is tokenised with the backbone's tokenizer without special tokens: exactly the ids
   ``tokenizer(s, add_special_tokens=False)`` gives. Lines the encoder cannot take whole (more
   tokens than its maximum input length minus the special tokens), and lines with no tokens at
   all (only characters the tokenizer drops, counted as empty), get no triplet.
3. Units. Either those tokens, or the whitespace-separated words of s (a word owns the tokens
   whose last character lies in it, and a whitespace-only token before it). L is the number of
   units of s.
4. Span lengths, relative to s: k' = round(short_rate * L), k'' = round(long_rate * L), to the
   nearest integer with halves rounded up, so each realised rate is within half a unit of the
   requested one. Lines where that gives no strict enlargement (not 1 <= k' < k'') get no
   triplet.
5. Positions, from the line's own two uniforms u0, u1 (a Philox stream seeded with ``seed``,
   two draws per line index, so a line's spans do not depend on any other line): the span of s'
   starts at a' = floor(u0 * (L - k' + 1)); s'' adds k'' - k' units around it, ``left`` of them
   before, drawn uniformly from the values that keep the span inside s (floor of u1 times their
   number). So the span of s'' always contains the span of s'.
6. Replacement, on the token ids: every token of a masked unit goes, and in its place come one
   mask id per masked unit (``mask_per_unit``), one mask id for the span (``mask_per_span``) or
   nothing (``delete``). Ids outside the span are those of s, untouched. The readable text forms
   splice the mask token string(s), space-separated, into the original text over the span's
   characters; the ids are the faithful form (the text need not re-tokenise to them).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
from tokenizers import Tokenizer
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from stages.core.schema.params import TripletsParams

# The triplet file's contract: column -> dtype, in file order. Token ids carry no special tokens.
TRIPLETS_SCHEMA = pl.Schema(
    {
        "line": pl.Int64,  # 0-based index of s among the corpus lines
        "sentence": pl.String,  # s, the line as read
        "short_masked": pl.String,  # s', readable form
        "long_masked": pl.String,  # s'', readable form
        "sentence_ids": pl.List(pl.Int32),  # s as token ids
        "short_masked_ids": pl.List(pl.Int32),  # s' as token ids (the faithful form)
        "long_masked_ids": pl.List(pl.Int32),  # s'' as token ids
        "n_units": pl.Int32,  # L: units (tokens or words) of s
        "short_start": pl.Int32,  # span of s' in units of s: [short_start, short_end)
        "short_end": pl.Int32,
        "long_start": pl.Int32,  # span of s'': [long_start, long_end), contains the span of s'
        "long_end": pl.Int32,
        "seed": pl.Int64,  # TripletsParams.seed
    }
)

SKIP_REASONS = ("empty", "below_min_words", "too_long", "too_few_units")

# Rates are decimals (0.2, 0.15); their binary products can land a hair below a half (0.15 * 10).
ROUNDING_TOLERANCE = 1e-9
# Encoded per batch so that memory stays bounded; results do not depend on it (tested).
CHUNK_SENTENCES = 8192
# Every character str.isspace() accepts is at most U+3000.
_IS_SPACE = np.array([chr(c).isspace() for c in range(0x3001)], dtype=bool)


class TripletsError(ValueError):
    """The tokenizer cannot produce the triplets these params ask for."""


@dataclass(frozen=True)
class MaskingTokenizer:
    """What masking needs from the backbone's tokenizer."""

    backend: Tokenizer  # the Rust tokenizer, padding and truncation off
    mask_token: str | None
    mask_token_id: int | None
    max_tokens: int | None  # longest s in tokens that fits the encoder with its special tokens

    @classmethod
    def from_pretrained(cls, tokenizer: PreTrainedTokenizerBase) -> MaskingTokenizer:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TripletsError(
                f"tokenizer {tokenizer.name_or_path!r} has no fast (Rust) backend; "
                "masked triplets need its token offsets"
            )
        # A private copy: the saved tokenizer may pad and truncate (all-MiniLM-L6-v2 does, at 128).
        backend = Tokenizer.from_str(backend.to_str())
        backend.no_padding()
        backend.no_truncation()
        limit = tokenizer.model_max_length
        # Tokenizers without a known limit report a huge sentinel (transformers' 1e30).
        max_tokens = (
            limit - tokenizer.num_special_tokens_to_add(pair=False) if limit < 1e9 else None
        )
        return cls(backend, tokenizer.mask_token, tokenizer.mask_token_id, max_tokens)


def split_lines(text: str) -> list[str]:
    """The corpus lines as SimCSE reads wiki1m (``datasets``' text loader opens the file in text
    mode): '\\n', '\\r\\n' and a lone '\\r' each end a line, not the other separators
    str.splitlines knows (they occur inside Wikipedia sentences); a final line break ends the
    last line. The train stage's ``Path.read_text`` translates line breaks the same way, so both
    stages number the lines alike."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def masked_lengths(
    n_units: np.ndarray, short_rate: float, long_rate: float
) -> tuple[np.ndarray, np.ndarray]:
    """Span lengths k' and k'' for sentences of ``n_units`` units: nearest integer, halves up."""
    n = np.asarray(n_units, dtype=np.float64)
    k_short = np.floor(short_rate * n + 0.5 + ROUNDING_TOLERANCE).astype(np.int64)
    k_long = np.floor(long_rate * n + 0.5 + ROUNDING_TOLERANCE).astype(np.int64)
    return k_short, k_long


def line_uniforms(seed: int, n_lines: int) -> np.ndarray:
    """Two uniforms in [0, 1) per line, row i for line i, from a Philox stream seeded by ``seed``.

    Built from the bit generator's raw 64-bit output (stable across numpy versions, unlike
    Generator methods) with 53 bits per double, so a seed means the same spans everywhere.
    """
    raw = np.random.Philox(seed).random_raw(2 * n_lines)
    return ((raw >> np.uint64(11)).astype(np.float64) * 2.0**-53).reshape(n_lines, 2)


def nested_spans(
    n_units: np.ndarray, k_short: np.ndarray, k_long: np.ndarray, uniforms: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Starts of the span of s' (length k') and of the enclosing span of s'' (length k'')."""
    n_units, k_short, k_long = (np.asarray(a, dtype=np.int64) for a in (n_units, k_short, k_long))
    u0, u1 = uniforms[:, 0], uniforms[:, 1]
    short_start = _uniform_int(u0, 0, n_units - k_short)
    extra = k_long - k_short
    # Units added before the span of s': as many as fit on the left, and enough that the rest
    # fit on the right.
    lowest = np.maximum(0, extra - (n_units - short_start - k_short))
    highest = np.minimum(extra, short_start)
    left = _uniform_int(u1, lowest, highest)
    return short_start, short_start - left


def _uniform_int(u: np.ndarray, low: np.ndarray | int, high: np.ndarray) -> np.ndarray:
    """An integer in [low, high] (inclusive) from a uniform u in [0, 1)."""
    count = high - low + 1
    return low + np.minimum(np.floor(u * count).astype(np.int64), count - 1)


@dataclass(frozen=True)
class TripletCounts:
    """How many corpus lines became triplets, and why the others did not."""

    lines: int
    triplets: int
    skipped: dict[str, int]


def generate_triplets(
    lines: Sequence[str],
    tokenizer: MaskingTokenizer,
    params: TripletsParams,
    *,
    chunk_sentences: int = CHUNK_SENTENCES,
) -> tuple[pl.DataFrame, TripletCounts]:
    """The triplets of every eligible line (rows in line order, ``TRIPLETS_SCHEMA``) and counts."""
    if params.replacement != "delete" and tokenizer.mask_token_id is None:
        raise TripletsError(
            f"replacement {params.replacement!r} needs a mask token and the tokenizer has none; "
            "use replacement: delete"
        )
    n_words = np.fromiter((len(line.split()) for line in lines), np.int64, len(lines))
    eligible = np.flatnonzero(n_words >= params.min_words)
    uniforms = line_uniforms(params.seed, len(lines))
    skipped = dict.fromkeys(SKIP_REASONS, 0)
    skipped["empty"] = int(np.count_nonzero(n_words == 0))
    skipped["below_min_words"] = len(lines) - len(eligible) - skipped["empty"]
    frames = [TRIPLETS_SCHEMA.to_frame()]
    for begin in range(0, len(eligible), chunk_sentences):
        index = eligible[begin : begin + chunk_sentences]
        frame, chunk_skipped = _mask_chunk(
            [lines[i] for i in index], index, uniforms[index], tokenizer, params
        )
        frames.append(frame)
        for reason, count in chunk_skipped.items():
            skipped[reason] += count
    triplets = pl.concat(frames).rechunk()
    return triplets, TripletCounts(len(lines), triplets.height, skipped)


@dataclass(frozen=True)
class _Encoded:
    """Token ids and character offsets of a batch of sentences, flattened."""

    ids: np.ndarray  # (tokens,) int32
    starts: np.ndarray  # (tokens,) character offsets in their sentence
    ends: np.ndarray
    n_tokens: np.ndarray  # (sentences,)

    @classmethod
    def of(cls, texts: list[str], backend: Tokenizer) -> _Encoded:
        encodings = backend.encode_batch(texts, add_special_tokens=False)
        n_tokens = np.fromiter((len(e.ids) for e in encodings), np.int64, len(encodings))
        total = int(n_tokens.sum())
        chain = itertools.chain.from_iterable
        ids = np.fromiter(chain(e.ids for e in encodings), np.int32, total)
        offsets = np.fromiter(chain(chain(e.offsets for e in encodings)), np.int64, 2 * total)
        return cls(ids, offsets[0::2], offsets[1::2], n_tokens)

    def select(self, keep: np.ndarray) -> _Encoded:
        token_keep = np.repeat(keep, self.n_tokens)
        return _Encoded(
            self.ids[token_keep],
            self.starts[token_keep],
            self.ends[token_keep],
            self.n_tokens[keep],
        )


@dataclass(frozen=True)
class _Units:
    """Per sentence, per unit: its first token and its character span (flattened, local)."""

    n_units: np.ndarray  # (sentences,)
    first_token: np.ndarray  # (sum(n_units + 1),): each sentence's token count appended
    char_start: np.ndarray  # (sum(n_units),)
    char_end: np.ndarray


def _token_units(encoded: _Encoded) -> _Units:
    return _Units(encoded.n_tokens, _ranges(encoded.n_tokens + 1), encoded.starts, encoded.ends)


def _word_units(texts: list[str], encoded: _Encoded) -> _Units:
    """Whitespace-separated words (as str.split sees them) and the tokens each one owns."""
    text_length = np.fromiter((len(t) for t in texts), np.int64, len(texts))
    # One array of code points for the batch; '\n' between sentences is whitespace.
    codes = np.frombuffer("\n".join(texts).encode("utf-32-le"), dtype=np.uint32)
    space = (codes <= 0x3000) & _IS_SPACE[np.minimum(codes, 0x3000)]
    word_start = np.flatnonzero(~space & np.concatenate([[True], space[:-1]]))
    word_end = np.flatnonzero(~space & np.concatenate([space[1:], [True]])) + 1
    text_base = np.concatenate([[0], np.cumsum(text_length + 1)[:-1]])
    first_word = np.searchsorted(word_start, text_base)
    n_words = np.diff(np.append(first_word, len(word_start)))

    # A token belongs to the word holding its last character (offsets of byte-level BPE tokens
    # may include the space before the word); a token of whitespace only (a lone byte-level
    # space) belongs to the word after it. Clipped to the token's own sentence.
    n = encoded.n_tokens
    token_base = np.repeat(text_base, n)
    last_char = token_base + np.maximum(encoded.ends - 1, encoded.starts)
    token_word = np.searchsorted(word_start, last_char, side="right") - 1
    token_word += (token_word < 0) | (last_char >= word_end[np.maximum(token_word, 0)])
    token_first_word = np.repeat(first_word, n)
    token_word = np.clip(token_word, token_first_word, token_first_word + np.repeat(n_words, n) - 1)

    # First token of each word, and of the word after the last (the sentence's token count).
    sentence_of_slot = np.repeat(np.arange(len(texts)), n_words + 1)
    slot_word = first_word[sentence_of_slot] + _ranges(n_words + 1)
    token_offset = np.concatenate([[0], np.cumsum(n)[:-1]])
    first_token = np.searchsorted(token_word, slot_word) - token_offset[sentence_of_slot]
    first_token = np.minimum(first_token, n[sentence_of_slot])
    word_local_base = np.repeat(text_base, n_words)
    return _Units(n_words, first_token, word_start - word_local_base, word_end - word_local_base)


def _ranges(lengths: np.ndarray) -> np.ndarray:
    """0..n-1 for each n in ``lengths``, concatenated."""
    return np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def _mask_chunk(
    texts: list[str],
    line_index: np.ndarray,
    uniforms: np.ndarray,
    tokenizer: MaskingTokenizer,
    params: TripletsParams,
) -> tuple[pl.DataFrame, dict[str, int]]:
    encoded = _Encoded.of(texts, tokenizer.backend)
    # Words of characters the tokenizer drops (format and control characters) leave no tokens.
    has_tokens = encoded.n_tokens > 0
    limit = np.inf if tokenizer.max_tokens is None else tokenizer.max_tokens
    fits = has_tokens & (encoded.n_tokens <= limit)
    units = _token_units(encoded) if params.unit == "token" else _word_units(texts, encoded)
    k_short, k_long = masked_lengths(units.n_units, params.short_mask_rate, params.long_mask_rate)
    spans_fit = (k_short >= 1) & (k_long > k_short)
    keep = fits & spans_fit
    skipped = {
        "empty": int(np.count_nonzero(~has_tokens)),
        "too_long": int(np.count_nonzero(has_tokens & ~fits)),
        "too_few_units": int(np.count_nonzero(fits & ~spans_fit)),
    }

    n_units = units.n_units[keep]
    k_short, k_long = k_short[keep], k_long[keep]
    short_start, long_start = nested_spans(n_units, k_short, k_long, uniforms[keep])
    short_end, long_end = short_start + k_short, long_start + k_long
    # Units of kept sentences only: index them through the kept positions.
    kept = np.flatnonzero(keep)

    def tokens_at(unit: np.ndarray) -> np.ndarray:
        return _at(units.n_units + 1, units.first_token, kept, unit)

    def chars_at(unit: np.ndarray, of: np.ndarray) -> np.ndarray:
        return _at(units.n_units, of, kept, unit)

    masks_short, masks_long = {
        "mask_per_unit": (k_short, k_long),
        "mask_per_span": (np.ones_like(k_short), np.ones_like(k_long)),
        "delete": (np.zeros_like(k_short), np.zeros_like(k_long)),
    }[params.replacement]
    kept_texts = [texts[i] for i in kept]
    encoded = encoded.select(keep)
    offsets = np.concatenate([[0], np.cumsum(encoded.n_tokens)]).astype(np.int64)
    sentence_ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(encoded.ids))
    spans = pl.DataFrame(
        {
            "line": line_index[keep],
            "sentence": pl.Series(kept_texts, dtype=pl.String),
            "sentence_ids": pl.Series(sentence_ids),
            "n_units": n_units,
            "short_start": short_start,
            "short_end": short_end,
            "long_start": long_start,
            "long_end": long_end,
            "short_tokens": tokens_at(short_start),
            "short_tokens_end": tokens_at(short_end),
            "long_tokens": tokens_at(long_start),
            "long_tokens_end": tokens_at(long_end),
            "short_chars": chars_at(short_start, units.char_start),
            "short_chars_end": chars_at(short_end - 1, units.char_end),
            "long_chars": chars_at(long_start, units.char_start),
            "long_chars_end": chars_at(long_end - 1, units.char_end),
            "short_masks": masks_short,
            "long_masks": masks_long,
        }
    )
    mask_id = tokenizer.mask_token_id if tokenizer.mask_token_id is not None else 0
    mask_text = tokenizer.mask_token or ""
    triplets = spans.select(
        "line",
        "sentence",
        _splice_text("short", mask_text).alias("short_masked"),
        _splice_text("long", mask_text).alias("long_masked"),
        "sentence_ids",
        _splice_ids("short", mask_id).alias("short_masked_ids"),
        _splice_ids("long", mask_id).alias("long_masked_ids"),
        "n_units",
        "short_start",
        "short_end",
        "long_start",
        "long_end",
        pl.lit(params.seed).alias("seed"),
    ).cast(dict(TRIPLETS_SCHEMA))
    return triplets, skipped


def _at(
    n_per_sentence: np.ndarray, flat: np.ndarray, sentences: np.ndarray, unit: np.ndarray
) -> np.ndarray:
    """flat[base of sentence + unit] for flattened per-sentence arrays of the given lengths."""
    base = np.concatenate([[0], np.cumsum(n_per_sentence)[:-1]])
    return flat[base[sentences] + unit]


def _splice_ids(span: str, mask_id: int) -> pl.Expr:
    ids = pl.col("sentence_ids")
    masks = pl.lit(mask_id, dtype=pl.Int32).repeat_by(pl.col(f"{span}_masks"))
    return pl.concat_list(
        ids.list.head(pl.col(f"{span}_tokens")), masks, ids.list.slice(pl.col(f"{span}_tokens_end"))
    )


def _splice_text(span: str, mask_token: str) -> pl.Expr:
    text = pl.col("sentence")
    masks = pl.lit(mask_token).repeat_by(pl.col(f"{span}_masks")).list.join(" ")
    return pl.concat_str(
        text.str.slice(0, pl.col(f"{span}_chars")),
        masks,
        text.str.slice(pl.col(f"{span}_chars_end")),
    )
