"""SentEval's own batches: the protocol's ``senteval_batches`` encoding.

The default encoding (``EmbeddingTable``) encodes each distinct sentence once; an identical
sentence then has one embedding wherever it occurs, and the two sides of a pair of identical
sentences have cosine 1 to the bit. SentEval encodes every task by itself, in its sample order,
``batch_size`` sentences per batcher call, every occurrence: a sentence's last bits depend on
the padding of the batch it falls in, and Spearman ranks the near-1 cosines of identical pairs by
those bits. This module sends the encoder exactly SentEval's batches, read from its source
(``senteval/sts.py``, ``binary.py``, ``sst.py``, ``trec.py``, ``mrpc.py``):

- STS12-16 (``STSEval.loadFile`` and ``run``): each subset's scored pairs sorted by
  ``(len(tokens1), len(tokens2), gold score)`` (Python's stable sort: ties keep the file order);
  then, per chunk of ``batch_size`` pairs, the chunk's first sentences, then its second
  sentences; scored in that order (``all`` concatenates the sorted subsets).
- STS-B and SICK-R (SimCSE's ``STSBenchmarkEval`` and ``SICKRelatednessEval``, which load
  without sorting): the same loop over each split's pairs in file order.
- The transfer tasks: each split's sentences in SentEval's sorted order (the order the loaders
  already return), chunk after chunk; MRPC all of column A, then all of column B, per split
  (train, then test); SST2 train, dev, test; TREC train, then test.

The encoder is the batcher: it gets SentEval's batches as they are and returns one row per
sentence (``SentenceEncoder.encode_batch`` pads each batch as SimCSE's batcher does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from stages.senteval_protocol.embeddings import Encode, checked_embeddings
from stages.senteval_protocol.loaders import STS_YEARS, StsPairs, StsTask, Task, TransferTask


def sentevals_sts_order(task: StsTask) -> StsTask:
    """``task`` with each STS12-16 subset's pairs in the order SentEval encodes and scores
    them; STS-B and SICK-R (not sorted by SentEval) as they are."""
    if task.name not in STS_YEARS:
        return task
    return dataclasses.replace(task, parts=tuple(_sorted_pairs(part) for part in task.parts))


def _sorted_pairs(part: StsPairs) -> StsPairs:
    keys = [
        (len(a.split()), len(b.split()), score)
        for a, b, score in zip(part.sent1, part.sent2, part.scores.tolist(), strict=True)
    ]
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return StsPairs(
        part.name,
        [part.sent1[i] for i in order],
        [part.sent2[i] for i in order],
        part.scores[order],
    )


class SentEvalBatches:
    """Embeddings of one task at a time, encoded in SentEval's batches (``add``); calling it
    with one of the task's columns (a subset's or split's first or second sentences, a transfer
    split's sentences) returns that column's rows, one per occurrence."""

    def __init__(self, encode: Encode, batch_size: int, empty_sentence: str) -> None:
        if batch_size < 1:
            raise ValueError(f"SentEval's batches need a batch size of at least 1: {batch_size}")
        self.encode = encode
        self.batch_size = batch_size
        self.empty_sentence = empty_sentence
        self.columns: dict[tuple[str, ...], np.ndarray] = {}
        self.dim: int | None = None

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        # by content: two columns of the same texts are sent as the same batches, so a
        # deterministic encoder gives them the same rows
        return self.columns[tuple(texts)]

    def add(self, task: Task) -> Task:
        """Encode ``task`` as SentEval does (the previous task's rows are dropped); returns the
        task in the order SentEval scores it."""
        self.columns = {}
        if isinstance(task, StsTask):
            task = sentevals_sts_order(task)
            for part in task.parts:
                self._pairs(part.sent1, part.sent2)
            return task
        assert isinstance(task, TransferTask)
        for split in task.splits.values():
            for column in split.columns:
                rows = [self._encode(column[s : s + self.batch_size])
                        for s in range(0, len(column), self.batch_size)]  # fmt: skip
                self.columns[tuple(column)] = self._stack(rows)
        return task

    def _pairs(self, sent1: list[str], sent2: list[str]) -> None:
        """STSEval.run's loop: per chunk of pairs, the first sentences, then the second."""
        rows1, rows2 = [], []
        for start in range(0, len(sent1), self.batch_size):
            rows1.append(self._encode(sent1[start : start + self.batch_size]))
            rows2.append(self._encode(sent2[start : start + self.batch_size]))
        self.columns[tuple(sent1)] = self._stack(rows1)
        self.columns[tuple(sent2)] = self._stack(rows2)

    def _stack(self, rows: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(rows) if rows else np.zeros((0, self.dim or 0), dtype=np.float32)

    def _encode(self, texts: list[str]) -> np.ndarray:
        out = checked_embeddings(self.encode, texts, self.empty_sentence, self.dim)
        self.dim = out.shape[1]
        return out
