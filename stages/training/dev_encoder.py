"""Encoding sentences with the model being trained, for the periodic dev evaluation.

The dev evaluator is injected into the training loop: any callable that takes an
``encode(sentences) -> (n, d) array`` and returns named scores. Encoding here follows how
SimCSE's Trainer evaluates: eval mode (no dropout), the evaluation pooler recorded with the
run, padding to the batch's longest sentence without truncation (up to the model's limit), and in
fp32 whatever the training precision (``train.dev_precision: fp32``; SimCSE's evaluation does not
autocast). bf16 moves the dev Spearman by a few hundredths and can change which checkpoint is
kept; ``dev_precision: train`` encodes under the training autocast instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from stages.modeling.input_length import max_model_length
from stages.modeling.unpadded import Packing
from stages.training.contrastive_model import ContrastiveModel
from stages.training.data import TokenRows, pad_rows, tokenize
from stages.training.runtime import Runtime

Encode = Callable[[Sequence[str]], np.ndarray]
DevEvaluator = Callable[[Encode], dict[str, float]]


class DevEncoder:
    """``encode`` for the dev evaluator; remembers the tokenisation of the last sentence list
    (the evaluator asks for the same dev sentences at every evaluation)."""

    def __init__(
        self,
        encoder: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        pooler: str,
        runtime: Runtime,
        batch_size: int,
        precision: str = "fp32",
    ) -> None:
        self.model = ContrastiveModel(encoder, pooler)
        self.tokenizer = tokenizer
        self.runtime = runtime if precision == "train" else replace(runtime, autocast_dtype=None)
        self.batch_size = batch_size
        self.max_length = max_model_length(encoder.config, tokenizer)
        self._cached: tuple[tuple[str, ...], TokenRows, np.ndarray] | None = None

    def _tokenized(self, sentences: Sequence[str]) -> tuple[TokenRows, np.ndarray]:
        key = tuple(sentences)
        if self._cached is None or self._cached[0] != key:
            rows = tokenize(key, self.tokenizer, self.max_length)
            order = np.argsort(-np.diff(rows.offsets), kind="stable")  # longest first
            self._cached = (key, rows, order)
        return self._cached[1], self._cached[2]

    @torch.no_grad()
    def __call__(self, sentences: Sequence[str]) -> np.ndarray:
        rows, order = self._tokenized(sentences)
        encoder = self.model.encoder
        was_training = encoder.training
        encoder.eval()
        chunks = []
        try:
            for start in range(0, len(order), self.batch_size):
                ids, mask = pad_rows(rows.rows(order[start : start + self.batch_size]), self._pad)
                # Where the real tokens are, from the host's mask: the device is never waited for
                # inside the loop, and its vectors come back in one read at the end.
                packing = (
                    Packing.from_mask(mask, self.runtime.to_device) if self.model.unpadded else None
                )
                with self.runtime.autocast():
                    vectors = self.model.embed(
                        self.runtime.to_device(ids), self.runtime.to_device(mask), packing
                    )
                chunks.append(vectors.to(torch.float32, copy=True))  # not a view of the states
        finally:
            encoder.train(was_training)
        out = np.empty((len(order), chunks[0].shape[1]) if chunks else (0, 0), dtype=np.float32)
        if chunks:
            out[order] = torch.cat(chunks).cpu().numpy()
        return out

    @property
    def precision(self) -> str:
        """The precision dev sentences are encoded in (fp32 or bf16)."""
        return self.runtime.precision

    @property
    def _pad(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
