"""Text -> embedding for one evaluation: the SentEval batcher model (the protocol hands the
encoder batches of sentences and gets back one row per sentence), shared by the evaluation and
by training's checkpoint selection."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from stages.senteval_protocol.cache import EmbeddingCache

Encode = Callable[[list[str]], Any]


class EncoderOutputError(ValueError):
    """The encode callable returned something that is not one finite row per sentence."""


class EmbeddingTable:
    """Text -> embedding for one evaluation: every distinct text is encoded once, however many
    tasks contain it, or read from the cache; calling the table looks texts up."""

    def __init__(
        self,
        encode: Encode,
        batch_size: int | None,
        cache: EmbeddingCache | None,
        empty_sentence: str,
    ) -> None:
        self.encode = encode
        self.batch_size = batch_size
        self.cache = cache
        self.empty_sentence = empty_sentence
        self.rows: dict[str, np.ndarray] = {}
        self.dim: int | None = None

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.rows[t] for t in texts])

    def add(self, task: str, texts: list[str]) -> str:
        """Make every text of ``task`` available; says where they came from."""
        distinct = sorted(set(texts))
        stored = self.cache.load(task, distinct) if self.cache else None
        if stored is not None:
            self.rows.update(zip(distinct, stored, strict=True))
            return "cache"
        missing = sorted((t for t in distinct if t not in self.rows), key=len)
        step = self.batch_size or max(len(missing), 1)
        for start in range(0, len(missing), step):
            self._encode(missing[start : start + step])
        if self.cache:
            self.cache.store(task, distinct, self(distinct))
        return "encoded" if missing else "memory"

    def _encode(self, texts: list[str]) -> None:
        out = checked_embeddings(self.encode, texts, self.empty_sentence, self.dim)
        self.dim = out.shape[1]
        self.rows.update(zip(texts, out, strict=True))


def checked_embeddings(
    encode: Encode, texts: list[str], empty_sentence: str, dim: int | None
) -> np.ndarray:
    """``encode(texts)`` (an empty text as ``empty_sentence``) as an array, one finite row of
    ``dim`` values (any, before the first batch) per text, or an error naming what is wrong."""
    out = _as_array(encode([t or empty_sentence for t in texts]))
    if out.ndim != 2 or len(out) != len(texts) or (dim and out.shape[1] != dim):
        raise EncoderOutputError(
            f"encode returned shape {out.shape} for {len(texts)} sentences; expected "
            f"({len(texts)}, {dim or 'dim'})"
        )
    finite = np.isfinite(out).all(axis=1)
    if not finite.all():
        bad = texts[int(np.argmin(finite))]
        raise EncoderOutputError(f"encode returned a non-finite embedding, e.g. for {bad!r}")
    return out


def _as_array(raw: Any) -> np.ndarray:
    """The encoder's output in its own float dtype, as SentEval's cosine sees it (float32 for a
    torch batcher like SimCSE's, float64 for a float64 numpy one); types numpy cannot hold
    (bfloat16) or non-float outputs become float32."""
    if isinstance(raw, torch.Tensor):
        raw = raw.detach().cpu()
        raw = raw if raw.dtype in (torch.float16, torch.float32, torch.float64) else raw.float()
    out = np.asarray(raw)
    return out if out.dtype in (np.float16, np.float32, np.float64) else out.astype(np.float32)
