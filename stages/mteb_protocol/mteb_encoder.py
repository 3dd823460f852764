"""A ``SentenceEncoder`` as an mteb model (mteb 2's encoder protocol).

mteb hands ``encode`` a DataLoader of small batches; the wrapper gathers their texts (a retrieval
document arrives as mteb's "title text" string) and encodes them all at once, so the encoder's
length-sorted batching and de-duplication work across the whole input, on the GPU when there is
one. Inputs of more than ``progress_chunk`` texts are encoded in chunks of similar character
length under a progress bar. Prompts and instructions are ignored: these encoders have none.

Cache identity: mteb stores results under ``<cache>/results/<name>/<revision>/<task>.json`` and
serves them again for the same name and revision. Unnamed local models all land under
``no_model_name/available/no_revision_available``, so every wrapped encoder gets a name
(``cse-repro/<label>``: the experiment or model) and a revision that hashes the encoder's
fingerprint (weights or run id, pooler, truncation, precision), the normalisation and this
wrapper's version: two encoders that can embed differently never share a cache entry, whatever
their labels.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mteb
import numpy as np
from mteb.models import ModelMeta
from mteb.models.abs_encoder import AbsEncoder
from mteb.models.model_meta import ScoringFunction
from tqdm.auto import tqdm

from stages.core.identity.code import code_identity
from stages.core.schema.evaluation_settings import EVALUATIONS
from stages.modeling.backbone import model_location
from stages.modeling.encoder import SentenceEncoder

if TYPE_CHECKING:
    from mteb.abstasks.task_metadata import TaskMetadata
    from mteb.types import BatchedInput, PromptType
    from torch.utils.data import DataLoader

NAME_PREFIX = "cse-repro/"


def model_label(model: str) -> str:
    """A path-safe label for a model string: 'org/name' -> 'org__name', 'package:m' -> 'm'."""
    label = model.removeprefix("package:").rstrip("/")
    label = label.replace("/", "__")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._") or "model"


def declared_max_length(model: str, revision: str = "main") -> int | None:
    """The ``max_seq_length`` a sentence-transformers model declares in sentence_bert_config.json
    (all-MiniLM-L6-v2: 256), or None. Its published MTEB scores were computed with that
    truncation, so reproducing them needs it too."""
    from transformers.utils import cached_file

    path = cached_file(
        model_location(model, model),
        "sentence_bert_config.json",
        revision=revision,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )
    if path is None:
        return None
    return json.loads(Path(path).read_text(encoding="utf-8")).get("max_seq_length")


def cache_revision(encoder: SentenceEncoder, normalize: bool) -> str:
    """The revision mteb files the encoder's results under in its cache: the encoder's
    fingerprint (weights, settings, encoding code), normalisation, the MTEB evaluation's code
    (this wrapper, the local data's parsing, the scoring) and mteb's version, so a result that
    other code or another mteb computed is never served."""
    parts = {
        "encoder": encoder.fingerprint,
        "normalize": normalize,
        "code": code_identity([EVALUATIONS["mteb"].module]),
        "mteb": mteb.__version__,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class EncodeCounter:
    """Texts encoded and seconds spent in ``encode`` (throughput reporting)."""

    texts: int = 0
    seconds: float = 0.0


class MtebEncoder(AbsEncoder):
    """mteb's view of a ``SentenceEncoder``: cosine similarity, optional L2 normalisation."""

    def __init__(
        self,
        encoder: SentenceEncoder,
        label: str,
        *,
        normalize: bool = False,
        progress_chunk: int = 8192,
    ) -> None:
        self.model = encoder
        self.normalize = normalize
        self.progress_chunk = progress_chunk
        self.counter = EncodeCounter()
        self.mteb_model_meta = ModelMeta.create_empty(
            overwrites={
                "name": NAME_PREFIX + model_label(label),
                "revision": cache_revision(encoder, normalize),
                "embed_dim": encoder.model.config.hidden_size,
                "n_parameters": sum(p.numel() for p in encoder.model.parameters()),
                "max_tokens": encoder.max_length,
                "similarity_fn_name": ScoringFunction.COSINE,
                "framework": ["PyTorch"],
                "use_instructions": False,
            }
        )

    def describe(self) -> dict[str, Any]:
        """The encoder's description plus what mteb files its results under."""
        meta = self.mteb_model_meta
        return {
            **self.model.describe(),
            "normalize": self.normalize,
            "mteb_name": meta.name,
            "mteb_revision": meta.revision,
        }

    def encode(
        self,
        inputs: DataLoader[BatchedInput],
        *,
        task_metadata: TaskMetadata,
        hf_split: str,
        hf_subset: str,
        prompt_type: PromptType | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        texts = [text for batch in inputs for text in batch["text"]]
        start = time.perf_counter()
        vectors = self._embed(texts, f"{task_metadata.name} {hf_split}/{hf_subset}")
        if self.normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors /= np.maximum(norms, 1e-12)  # sentence-transformers' Normalize (eps 1e-12)
        self.counter.texts += len(texts)
        self.counter.seconds += time.perf_counter() - start
        return vectors

    def _embed(self, texts: list[str], description: str) -> np.ndarray:
        if len(texts) <= self.progress_chunk:
            return self.model(texts)
        # chunks of similar character length, so each chunk's token-length batches stay tight
        order = np.argsort([len(t) for t in texts], kind="stable")
        vectors = np.empty((len(texts), self.model.model.config.hidden_size), dtype=np.float32)
        with tqdm(total=len(texts), desc=f"encoding {description}", unit="text") as bar:
            for start in range(0, len(texts), self.progress_chunk):
                idx = order[start : start + self.progress_chunk]
                vectors[idx] = self.model([texts[i] for i in idx])
                bar.update(len(idx))
        return vectors
