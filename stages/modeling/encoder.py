"""A sentence encoder: a Hugging Face model plus a pooler, as ``encode(list[str]) -> np.ndarray``.

``SentenceEncoder`` loads a hub id, a local model directory, ``package:<module>``, or a trained
checkpoint directory (whose ``encoder.json`` names the evaluation pooler; an explicit pooler
overrides it and is recorded as such). It tokenises with padding and truncation (512 tokens by
default, i.e. no truncation for BERT-sized models, as SimCSE's evaluation), encodes each distinct
sentence once in length-sorted batches (``length_batches``: mostly of one length, so without
padding) under ``torch.inference_mode`` on the GPU when there is one, and returns float32 rows in
input order. ``encode_batch`` is SentEval's batcher instead (one padded forward of the
sentences as given, every occurrence), for the SentEval protocol's ``senteval_batches``.
Non-finite embeddings raise an error naming the model and an offending sentence instead of
silently scoring zeros.

``fingerprint`` identifies what the encoder computes (weights, pooler, tokenisation, precision),
for caching embeddings: a trained checkpoint's run id, else a hash of the model files, else the hub
id with its resolved commit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from transformers import AutoConfig, AutoModel, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from stages.core.identity.code import code_identity
from stages.core.schema.params import POOLERS
from stages.core.storage import layout
from stages.modeling.backbone import first_layers, loading, model_location, pretrained_tokenizer
from stages.modeling.backbone_adapters import find_adapter, log_padded_only
from stages.modeling.checkpoint import ENCODER_FILE, EncoderInfo, read_encoder_info
from stages.modeling.cpu_linear import use_onednn_linear
from stages.modeling.input_length import LIMIT_PARTS, max_model_length
from stages.modeling.pooler_head import pooler_head, restore_pooler_head
from stages.modeling.pooling import (
    needs_hidden_states,
    pool,
    pool_packed,
    reads_first_tokens_only,
)
from stages.modeling.unpadded import Packing, packed_forward, unpadding_unsupported

Precision = Literal["fp32", "bf16", "fp16"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Vectors read back from the device this many sentences at a time (32 MiB at width 1024).
READBACK_ROWS = 8192


class EncoderError(ValueError):
    """The encoder cannot be built or produced unusable embeddings."""


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise EncoderError("device 'cuda' requested but CUDA is not available")
    return torch.device(device)


def embed(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: Sequence[str],
    pooler: str,
    *,
    batch_size: int = 128,
    max_length: int = 512,
    precision: Precision = "fp32",
    name: str = "model",
    unpad: bool = True,
) -> np.ndarray:
    """(len(sentences), hidden) float32 embeddings in input order; each distinct sentence is
    encoded once, in batches of similar token length. The model is used as it is (mode, device);
    call ``model.eval()`` first for deterministic embeddings. With ``unpad`` a model whose family
    has a packed forward computes only the real tokens (``stages.modeling.unpadded``; equal up to
    float rounding). Token type ids go only to a family that takes them (its adapter; a family
    without an adapter gets what the tokenizer returns)."""
    distinct = list(dict.fromkeys(sentences))
    if not distinct:
        return np.zeros((0, model.config.hidden_size), dtype=np.float32)
    tokens = tokenizer(list(distinct), truncation=True, max_length=max_length)
    lengths = np.array([len(ids) for ids in tokens["input_ids"]])
    order = np.argsort(lengths, kind="stable")
    device = next(model.parameters()).device
    autocast = torch.autocast(device.type, dtype=DTYPES.get(precision), enabled=precision != "fp32")
    rows = np.empty((len(distinct), model.config.hidden_size), dtype=np.float32)
    right_padded = getattr(tokenizer, "padding_side", "right") == "right"
    unpadded = unpad and right_padded and unpadding_unsupported(model) is None
    adapter = find_adapter(model.config.model_type)
    drop_types = adapter is not None and not adapter.token_type_ids
    head = pooler_head(model)
    pending = _PendingVectors()
    move = _mover(device)
    with torch.inference_mode(), autocast:
        for start, stop in length_batches(lengths[order], batch_size):
            idx = order[start:stop]
            batch = tokenizer.pad(
                {k: [v[i] for i in idx] for k, v in tokens.items()}, return_tensors="pt"
            )
            host_mask = batch["attention_mask"].numpy()
            batch = {
                k: move(v) for k, v in batch.items() if not (drop_types and k == "token_type_ids")
            }
            if unpadded:
                packing = Packing.from_mask(host_mask, move)
                states = packed_forward(
                    model,
                    batch["input_ids"],
                    batch["attention_mask"],
                    packing,
                    token_type_ids=batch.get("token_type_ids"),
                    keep_first_layer=needs_hidden_states(pooler),
                    first_tokens_only=reads_first_tokens_only(pooler),
                )
                vectors = pool_packed(states, packing, pooler, head)
            else:
                outputs = model(**batch, output_hidden_states=needs_hidden_states(pooler))
                vectors = pool(outputs, batch["attention_mask"], pooler, head)
            # a copy: a pooled vector can be a view ([CLS]) that keeps the batch's states alive
            pending.add(idx, vectors.to(torch.float32, copy=True))
            if pending.rows >= READBACK_ROWS:
                pending.read_into(rows, distinct, name)
        pending.read_into(rows, distinct, name)
    index = {s: i for i, s in enumerate(distinct)}
    return rows[[index[s] for s in sentences]]


def embed_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: Sequence[str],
    pooler: str,
    *,
    max_length: int = 512,
    precision: Precision = "fp32",
    name: str = "model",
) -> np.ndarray:
    """(len(sentences), hidden) float32 embeddings of ``sentences`` as one padded batch, in the
    order given, every occurrence encoded: SimCSE's ``evaluation.py`` batcher (the tokenizer
    pads to the batch's longest sentence, one forward, pooled over the attention mask). What the
    SentEval protocol's ``senteval_batches`` encoding calls with each of SentEval's batches: a
    sentence's last bits then depend on its batch's padding, as they do in SentEval."""
    if not sentences:
        return np.zeros((0, model.config.hidden_size), dtype=np.float32)
    device = next(model.parameters()).device
    autocast = torch.autocast(device.type, dtype=DTYPES.get(precision), enabled=precision != "fp32")
    batch = tokenizer(
        list(sentences), padding=True, truncation=True, max_length=max_length, return_tensors="pt"
    )
    adapter = find_adapter(model.config.model_type)
    drop_types = adapter is not None and not adapter.token_type_ids
    batch = {
        k: v.to(device) for k, v in batch.items() if not (drop_types and k == "token_type_ids")
    }
    with torch.inference_mode(), autocast:
        outputs = model(**batch, output_hidden_states=needs_hidden_states(pooler))
        vectors = pool(outputs, batch["attention_mask"], pooler, pooler_head(model))
    rows = vectors.to(torch.float32).cpu().numpy()
    finite = np.isfinite(rows).all(axis=1)
    if not finite.all():
        bad = sentences[int(np.flatnonzero(~finite)[0])]
        raise EncoderError(f"{name} produced a non-finite embedding, e.g. for {bad!r}")
    return rows


class _PendingVectors:
    """Batches' vectors left on the device, read back together: on a GPU a read per batch would
    make the host wait for every batch before it could queue the next."""

    def __init__(self) -> None:
        self.indices: list[np.ndarray] = []
        self.vectors: list[torch.Tensor] = []
        self.rows = 0

    def add(self, idx: np.ndarray, vectors: torch.Tensor) -> None:
        self.indices.append(idx)
        self.vectors.append(vectors)
        self.rows += len(idx)

    def read_into(self, rows: np.ndarray, distinct: list[str], name: str) -> None:
        """Copy the pending vectors to their ``rows`` (one device read); refuse non-finite ones."""
        if not self.vectors:
            return
        block = torch.cat(self.vectors).cpu().numpy()
        idx = np.concatenate(self.indices)
        finite = np.isfinite(block).all(axis=1)
        if not finite.all():
            bad = distinct[idx[np.flatnonzero(~finite)[0]]]
            raise EncoderError(f"{name} produced a non-finite embedding, e.g. for {bad!r}")
        rows[idx] = block
        self.indices, self.vectors, self.rows = [], [], 0


def length_batches(sorted_lengths: np.ndarray, batch_size: int) -> list[tuple[int, int]]:
    """[start, stop) batches of at most ``batch_size`` over lengths sorted ascending. A batch
    ends where the length changes once it holds a quarter of ``batch_size`` rows, so most
    batches have no padding at all (packing them is a reshape, and their attention needs no
    mask) while rare lengths still share a batch instead of running one tiny batch each."""
    enough, rows = max(1, batch_size // 4), len(sorted_lengths)
    batches, start = [], 0
    for i in range(1, rows + 1):
        size = i - start
        if (
            size == batch_size
            or i == rows
            or (size >= enough and sorted_lengths[i] != sorted_lengths[i - 1])
        ):
            batches.append((start, i))
            start = i
    return batches


def _mover(device: torch.device) -> Callable[[np.ndarray | torch.Tensor], torch.Tensor]:
    """Host arrays to ``device`` without waiting: pinned and non-blocking on CUDA, where a
    blocking copy synchronises the stream (each batch would wait for the one before it)."""
    pin = device.type == "cuda"

    def move(array: np.ndarray | torch.Tensor) -> torch.Tensor:
        tensor = torch.as_tensor(array)
        return (tensor.pin_memory() if pin else tensor).to(device, non_blocking=pin)

    return move


class SentenceEncoder:
    """``encoder(sentences) -> np.ndarray`` for a model name, directory or trained checkpoint;
    sentences are truncated to ``max_length`` tokens (default: the longest the model takes);
    ``layers`` keeps a pretrained model's first layers (a backbone's ``layers``, for baselines)."""

    def __init__(
        self,
        model: str,
        pooler: str | None = None,
        *,
        revision: str = "main",
        max_length: int | None = None,
        batch_size: int = 128,
        device: str = "auto",
        precision: Precision = "fp32",
        unpad: bool = True,
        layers: int | None = None,
    ) -> None:
        self.model_name = model
        self.layers = layers
        self.unpad = unpad
        self.location = model_location(model, model)
        self.info = read_encoder_info(self.location) if Path(self.location).is_dir() else None
        if pooler is None and self.info is None:
            raise EncoderError(
                f"{model}: no {ENCODER_FILE} (not a trained checkpoint), so pass a pooler: "
                f"{', '.join(POOLERS)}"
            )
        if pooler is not None and pooler not in POOLERS:
            raise EncoderError(f"unknown pooler '{pooler}'; allowed: {', '.join(POOLERS)}")
        self.pooler = pooler or self.info.eval_pooler
        self.pooler_source = "argument" if pooler else "encoder.json"
        self.revision = revision
        self.batch_size = batch_size
        self.precision = precision
        self.device = pick_device(device)
        self.tokenizer = pretrained_tokenizer(self.location, revision, model)
        self.model = self._load_model()
        longest = max_model_length(self.model.config, self.tokenizer)
        if max_length is not None and max_length > longest:
            # a longer sentence would index past the position embeddings, deep in the forward
            raise EncoderError(
                f"{model}: max_length {max_length} exceeds the {longest} tokens it takes "
                f"({LIMIT_PARTS})"
            )
        self.max_length = max_length or longest

    def _load_model(self) -> PreTrainedModel:
        with loading(self.model_name, "config", self.location):
            config = AutoConfig.from_pretrained(self.location, revision=self.revision)
        # built as training builds the family (its pooler: add_pooling_layer where AutoModel
        # would otherwise leave it out), so a trained pooler is loaded, never left random
        adapter = find_adapter(config.model_type)
        log_padded_only(adapter)
        if self.layers is not None:
            config = first_layers(config, adapter, self.layers, self.model_name)
        with loading(self.model_name, "weights", self.location):
            model, report = AutoModel.from_pretrained(  # float32: precision is autocast's
                self.location,
                revision=self.revision,
                config=config,
                output_loading_info=True,
                dtype=torch.float32,
                **(adapter.model_kwargs() if adapter is not None else {}),
            )
        missing = report.get("missing_keys", [])
        encoder_missing = [k for k in missing if not k.startswith("pooler.")]
        if encoder_missing:
            raise EncoderError(
                f"{self.model_name}: weights missing from the checkpoint (they would be random): "
                f"{', '.join(sorted(encoder_missing)[:5])}"
            )
        # A family without a pooler of its own keeps a trained head beside the weights
        restore_pooler_head(model, self.location)
        if self.pooler == "cls" and (
            len(encoder_missing) < len(missing) or pooler_head(model) is None
        ):
            raise EncoderError(
                f"{self.model_name}: pooler 'cls' needs the trained pooler (dense + tanh) "
                "weights, which the checkpoint lacks; use cls_before_pooler"
            )
        if self.device.type == "cpu":
            use_onednn_linear(model)  # fp32 products on oneDNN (cpu_linear.py)
        return model.to(self.device).eval()

    def __call__(self, sentences: Sequence[str]) -> np.ndarray:
        return embed(
            self.model,
            self.tokenizer,
            sentences,
            self.pooler,
            batch_size=self.batch_size,
            max_length=self.max_length,
            precision=self.precision,
            name=self.model_name,
            unpad=self.unpad,
        )

    def encode_batch(self, sentences: Sequence[str]) -> np.ndarray:
        """``sentences`` encoded as one padded batch, every occurrence (``embed_batch``): the
        batcher SentEval's own batches are sent to (``senteval.encoding: senteval_batches``)."""
        return embed_batch(
            self.model,
            self.tokenizer,
            sentences,
            self.pooler,
            max_length=self.max_length,
            precision=self.precision,
            name=self.model_name,
        )

    @cached_property
    def fingerprint(self) -> str:
        """Changes whenever the embeddings could: weights, tokenizer, pooler, length, precision,
        and the code that encodes (the import closure of this module: an edit of the pooling or
        the packed forward must not be served embeddings the old code computed)."""
        parts: dict[str, Any] = {
            "code": code_identity([__name__]),
            "pooler": self.pooler,
            "max_length": self.max_length,
            "precision": self.precision,
        }
        checkpoint = stored_checkpoint(Path(self.location), self.info)
        if checkpoint is not None:
            parts["checkpoint"] = checkpoint
        elif Path(self.location).is_dir():
            parts["files"] = _directory_digest(Path(self.location))
        else:
            commit = getattr(self.model.config, "_commit_hash", None)
            parts["hub"] = [self.model_name, self.revision, commit]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        """What the results JSON records about the encoder."""
        return {
            "model": self.model_name,
            "location": self.location,
            "pooler": self.pooler,
            "pooler_source": self.pooler_source,
            "run_id": self.info.run_id if self.info else None,
            "max_length": self.max_length,
            "precision": self.precision,
            "device": str(self.device),
            "fingerprint": self.fingerprint,
        }


def stored_checkpoint(location: Path, info: EncoderInfo | None) -> tuple[str, str] | None:
    """(run id, checkpoint name) when ``location`` is a checkpoint folder of its own run in the
    runs store (written once, complete, never changed, so the pair names its weights without
    reading them); None for any other folder, whose ``encoder.json`` may have been copied along
    with weights that have changed since (an exported or further-trained model)."""
    if info is None or not info.run_id:
        return None
    run = layout.run_dir(info.run_id).resolve()
    return (info.run_id, location.name) if location.resolve().parent == run else None


def _directory_digest(folder: Path) -> str:
    """sha256 over the relative paths and contents of every file under ``folder``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda f=f: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
