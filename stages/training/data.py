"""Training data: the corpus tokenised once (cached on disk), seeded resumable batch order,
dynamic padding, and the pool of masked triplets for objectives that need one.

Token sequences are stored flat (``TokenRows``: one int32 array of ids plus row offsets), so a
corpus of 10^6 sentences costs ~120 MB and a batch is a gather plus one padding copy.

Batch order is a pure function of (seed, epoch, step): epoch e visits the corpus in the
permutation ``default_rng([seed, e])``, so the data position of a resumed run is just its step.
``sampling: by_length`` (ArcCSE: "the sentences are sampled by length") cuts that permutation into
megabatches of 50 batches and sorts each by token length, longest first, as transformers'
``group_by_length`` sampler: batches of similar length, in a seeded order, so in-batch negatives
differ from SimCSE's uniform batches (it is part of the run identity).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
import polars as pl
import pyarrow as pa
from tqdm.auto import tqdm
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from stages.core.errors import UNREADABLE_NPZ
from stages.core.storage.atomic import atomic_path
from stages.masked_triplets.file_format import read_triplets
from stages.masked_triplets.masking import split_lines

# Bump when the cached tokenisation format or procedure changes.
CACHE_FORMAT = 1
TOKENIZE_CHUNK = 20_000
# The triplets stage's columns holding s, s' and s'' as token ids without special tokens.
TRIPLET_ID_COLUMNS = ("sentence_ids", "short_masked_ids", "long_masked_ids")


@dataclass(frozen=True)
class TokenRows:
    """Variable-length token id sequences, stored flat: row i is ids[offsets[i]:offsets[i+1]]."""

    ids: np.ndarray  # int32
    offsets: np.ndarray  # int64, len(rows) + 1

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def rows(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        return [self.ids[self.offsets[i] : self.offsets[i + 1]] for i in indices]

    def head(self, n: int | None) -> TokenRows:
        """The first ``n`` rows (all of them for None)."""
        if n is None or n >= len(self):
            return self
        return TokenRows(self.ids[: self.offsets[n]], self.offsets[: n + 1])

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]]) -> TokenRows:
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=offsets[-1])
        return cls(ids, offsets)


# --- corpus -----------------------------------------------------------------------------------


def read_corpus(path: Path) -> list[str]:
    """One sentence per line, split as the triplets stage splits it (so line numbers agree);
    empty lines are sentences too, as in SimCSE's wiki1m reading."""
    return split_lines(path.read_text(encoding="utf-8"))


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of everything that decides the token ids (vocabulary, normaliser, templates)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # Truncation and padding are call-time state that the backend keeps from its last call.
        state = json.loads(backend.to_str())
        spec = json.dumps({**state, "truncation": None, "padding": None}, sort_keys=True)
    else:
        spec = json.dumps(sorted(tokenizer.get_vocab().items())) + type(tokenizer).__name__
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def tokenize(
    sentences: Sequence[str], tokenizer: PreTrainedTokenizerBase, max_length: int
) -> TokenRows:
    """Token ids with special tokens, truncated to ``max_length`` (SimCSE's preprocessing)."""
    rows: list[list[int]] = []
    chunks = range(0, len(sentences), TOKENIZE_CHUNK)
    for start in tqdm(chunks, desc="tokenising", unit="chunk", disable=len(chunks) < 5):
        chunk = list(sentences[start : start + TOKENIZE_CHUNK])
        rows += tokenizer(
            chunk,
            truncation=True,
            max_length=max_length,
            add_special_tokens=True,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]
    return TokenRows.from_lists(rows)


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def read_cached_rows(cached: Path) -> TokenRows | None:
    """The rows stored in ``cached``, or None, with a warning naming it, if it cannot be read
    (truncated, damaged): it is a cache, so the corpus is tokenised again and the file
    rewritten."""
    try:  # the file opened here: np.load leaves its own handle open when the archive is damaged
        with cached.open("rb") as file, np.load(file) as stored:
            return TokenRows(stored["ids"], stored["offsets"])
    except UNREADABLE_NPZ as err:
        warnings.warn(
            f"{cached}: unreadable cache entry ({type(err).__name__}: {err}); tokenising the "
            "corpus again and rewriting it",
            stacklevel=2,
        )
        return None


def load_tokenized_corpus(
    path: Path,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    cache_dir: Path,
    max_sentences: int | None = None,
) -> TokenRows:
    """The corpus tokenised, from ``cache_dir`` when this file/tokenizer/length was seen before.

    The cache holds the whole file; ``max_sentences`` takes a prefix of it.
    """
    key = hashlib.sha256(
        json.dumps(
            [CACHE_FORMAT, _file_digest(path), tokenizer_fingerprint(tokenizer), max_length]
        ).encode()
    ).hexdigest()[:24]
    cached = cache_dir / f"{key}.npz"
    rows = read_cached_rows(cached) if cached.is_file() else None
    if rows is None:
        rows = tokenize(read_corpus(path), tokenizer, max_length)
        with atomic_path(cached) as tmp, tmp.open("wb") as f:
            np.savez(f, ids=rows.ids, offsets=rows.offsets)
    return rows.head(max_sentences)


# --- batches ----------------------------------------------------------------------------------

# Under fixed shapes (CUDA graphs replay a graph recorded for one shape) a batch is laid out at a
# multiple of this many tokens: SimCSE's 32 is one layout, ArcCSE's 512 at most 16, and the
# rounding adds fewer than this many padding positions to a row.
LAYOUT_MULTIPLE = 32


def fixed_layout_length(longest: int, limit: int | None) -> int:
    """The length a batch whose longest row holds ``longest`` tokens is laid out at under fixed
    shapes: rounded up to a multiple of ``LAYOUT_MULTIPLE``, at most ``limit`` (the length its
    rows are truncated at; None: no limit)."""
    rounded = -(-max(longest, 1) // LAYOUT_MULTIPLE) * LAYOUT_MULTIPLE
    return rounded if limit is None else min(rounded, limit)


def pad_rows(
    rows: Sequence[np.ndarray], pad_id: int, length: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic padding: (ids int64, mask bool), both (len(rows), longest row); or padded to
    ``length`` (at least the longest row's)."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    longest = int(lengths.max(initial=1))
    if length is not None and length < longest:
        raise ValueError(f"a row of {longest} tokens does not fit a layout of {length}")
    mask = np.arange(length or longest) < lengths[:, None]
    ids = np.full(mask.shape, pad_id, dtype=np.int64)
    ids[mask] = np.concatenate(rows) if rows else []
    return ids, mask


def shard_bounds(n: int, world_size: int, rank: int) -> slice:
    """Rank ``rank``'s contiguous share of ``n`` items (n is a multiple of world_size)."""
    share = n // world_size
    return slice(rank * share, (rank + 1) * share)


@dataclass(frozen=True)
class BatchPlan:
    """Which corpus rows make up each step's global batch, and each rank's share of it.

    Global batches hold ``batch_size`` sentences (the papers' batch), the last one of an epoch
    fewer (no drop_last, as in SimCSE's Trainer). With several ranks a batch is cut into equal
    contiguous shares, so a last batch loses its ``len % world_size`` trailing sentences, and a
    last batch too small to give every rank two sentences (an anchor needs a negative) is
    dropped.
    """

    n_rows: int
    batch_size: int
    seed: int
    world_size: int = 1
    lengths: np.ndarray | None = field(default=None, compare=False, repr=False)  # by_length

    MEGABATCH = 50  # batches per length-sorted megabatch (transformers' LengthGroupedSampler)

    def __post_init__(self) -> None:
        if self.batch_size < 2 * self.world_size:
            raise ValueError(
                f"a batch of {self.batch_size} gives some of the {self.world_size} rank(s) "
                "fewer than 2 sentences (an anchor needs an in-batch negative)"
            )
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"{self.n_rows} sentences cannot make a batch of at least 2 per rank "
                f"on {self.world_size} rank(s)"
            )

    @cached_property
    def steps_per_epoch(self) -> int:
        full, rest = divmod(self.n_rows, self.batch_size)
        return full + (1 if rest >= 2 * self.world_size else 0)

    def global_batch(self, step: int) -> np.ndarray:
        """Corpus rows of 0-based global ``step`` (steps continue across epochs)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        start = within * self.batch_size
        if self.lengths is None:
            rows = _permutation(self.n_rows, self.seed, epoch)
        else:  # only the megabatch holding this batch is sorted
            size = self.MEGABATCH * self.batch_size
            first = start - start % size
            rows = _longest_first(
                _permutation(self.n_rows, self.seed, epoch)[first : first + size], self.lengths
            )
            start -= first
        batch = rows[start : start + self.batch_size]
        return batch[: len(batch) - len(batch) % self.world_size]

    def shard(self, step: int, rank: int) -> np.ndarray:
        batch = self.global_batch(step)
        return batch[shard_bounds(len(batch), self.world_size, rank)]


def _longest_first(rows: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``rows`` sorted by length, longest first (stable: equal lengths keep their random order)."""
    return rows[np.argsort(-lengths[rows], kind="stable")]


@lru_cache(maxsize=2)
def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


# --- masked triplets (ArcCSE) -----------------------------------------------------------------


def read_triplet_token_ids(
    path: Path, max_sentences: int | None = None
) -> tuple[np.ndarray, TokenRows, TokenRows, TokenRows]:
    """The corpus line of each triplet and the token ids (no special tokens) of s, s' and s''
    from the triplets stage's file, for the corpus lines the run trains on (the first
    ``max_sentences``, or all)."""
    frame = read_triplets(path)
    if max_sentences is not None:
        frame = frame.filter(pl.col("line") < max_sentences)
    anchor, short, long = (_token_rows(frame[name]) for name in TRIPLET_ID_COLUMNS)
    return frame["line"].to_numpy(), anchor, short, long


def _token_rows(column: pl.Series) -> TokenRows:
    array = column.rechunk().to_arrow()
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    offsets = array.offsets.to_numpy().astype(np.int64)
    ids = array.values.to_numpy().astype(np.int32)
    return TokenRows(ids[offsets[0] : offsets[-1]], offsets - offsets[0])


def special_token_frame(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a single sequence ([CLS] / [SEP], <s> / </s>)."""
    framed = tokenizer("a", add_special_tokens=True)["input_ids"]
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    for i in range(len(framed) - len(bare) + 1):
        if framed[i : i + len(bare)] == bare:
            return framed[:i], framed[i + len(bare) :]
    raise ValueError(f"cannot locate the sequence inside the tokenizer's template {framed}")


@dataclass(frozen=True)
class TripletPool:
    """Triplet batches drawn alongside the pairwise batches, one of two ways (``batching``;
    ArcCSE leaves it open, spec-arccse-alignunif A.9.5):

    - ``pool``: step k takes the next ``batch_size`` triplets of an endless stream that visits
      the pool in a fresh seeded permutation per pass (cycle c: ``default_rng([seed, 1, c])``),
      so like the corpus its position is a pure function of the step;
    - ``batch``: step k takes the triplets of its own sentences (``lines``: each triplet's corpus
      line; a sentence below ``triplets.min_words`` words has none), 0 to the batch's size.

    Special tokens are added here and sequences are truncated to ``max_length`` (the triplet
    branch pads to the batch's longest).
    """

    anchor: TokenRows
    short: TokenRows
    long: TokenRows
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    batch_size: int
    seed: int
    max_length: int = 512
    world_size: int = 1
    lines: np.ndarray | None = None
    batching: Literal["pool", "batch"] = "pool"

    def __post_init__(self) -> None:
        if not len(self.anchor) == len(self.short) == len(self.long):
            raise ValueError("triplet columns have different lengths")
        if len(self.anchor) == 0:
            raise ValueError("the triplet pool is empty")
        if self.batching == "batch" and (self.lines is None or len(self.lines) != len(self.anchor)):
            raise ValueError("batching 'batch' needs the corpus line of every triplet")

    @cached_property
    def _row_of_line(self) -> np.ndarray:
        assert self.lines is not None
        table = np.full(int(self.lines.max()) + 1, -1, dtype=np.int64)
        table[self.lines] = np.arange(len(self.lines))
        return table

    def rows_of_lines(self, lines: np.ndarray) -> np.ndarray:
        """The pool rows of the triplets of corpus ``lines``, in their order (lines without a
        triplet left out)."""
        table = self._row_of_line
        rows = table[lines[lines < len(table)]]
        return rows[rows >= 0]

    def indices(self, step: int) -> np.ndarray:
        n = len(self.anchor)
        size = self.batch_size - self.batch_size % self.world_size
        positions = np.arange(step * size, (step + 1) * size)
        cycles, within = np.divmod(positions, n)
        out = np.empty(size, dtype=np.int64)
        for cycle in np.unique(cycles):
            pick = cycles == cycle
            out[pick] = _permutation_cycle(n, self.seed, int(cycle))[within[pick]]
        return out

    def shard(
        self, step: int, rank: int, sentences: np.ndarray | None = None
    ) -> list[list[np.ndarray]]:
        """Rank ``rank``'s triplets of step ``step``: [s rows, s' rows, s'' rows], framed; its
        share of the step's stream, or (``batch``) those of its ``sentences`` (corpus rows)."""
        if self.batching == "batch":
            assert sentences is not None
            mine = self.rows_of_lines(sentences)
        else:
            batch = self.indices(step)
            mine = batch[shard_bounds(len(batch), self.world_size, rank)]
        body = self.max_length - len(self.prefix) - len(self.suffix)
        prefix = np.asarray(self.prefix, dtype=np.int32)
        suffix = np.asarray(self.suffix, dtype=np.int32)
        return [
            [np.concatenate([prefix, r[:body], suffix]) for r in part.rows(mine)]
            for part in (self.anchor, self.short, self.long)
        ]


@lru_cache(maxsize=2)
def _permutation_cycle(n: int, seed: int, cycle: int) -> np.ndarray:
    return np.random.default_rng([seed, 1, cycle]).permutation(n)
