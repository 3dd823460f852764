"""The SentEval evaluation protocol (STS and transfer tasks), re-implemented to give SentEval's
numbers (as SimCSE's evaluation.py runs it) with batched classifiers and cached embeddings.

``evaluate(encode, tasks, data_dir, mode)`` scores any ``encode(list[str]) -> array``;
``StsbDevEvaluation`` is the STS-B dev score used for checkpoint selection during training.
"""

from stages.senteval_protocol.cache import EmbeddingCache
from stages.senteval_protocol.dev import DevScores, StsbDevEvaluation
from stages.senteval_protocol.evaluate import EncoderOutputError, evaluate
from stages.senteval_protocol.loaders import (
    STS_TASKS,
    TASKS,
    TRANSFER_TASKS,
    DataFormatError,
)

__all__ = [
    "STS_TASKS",
    "TASKS",
    "TRANSFER_TASKS",
    "DataFormatError",
    "DevScores",
    "EmbeddingCache",
    "EncoderOutputError",
    "StsbDevEvaluation",
    "evaluate",
]
