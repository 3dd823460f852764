"""The dense + tanh head over the first token (pooler ``cls``) for every backbone.

BERT, RoBERTa, XLM-R and MPNet build it themselves (``pooler.dense``, ``add_pooling_layer``).
DistilBERT, DeBERTa-v2/v3 and ModernBERT have none, so training with pooler ``cls`` attaches
``PoolerHead`` (BERT's pooler: same parameter names, same computation) as ``encoder.pooler``.
``save_pretrained`` then writes its weights as ``pooler.dense.*`` beside the encoder's; loading
such a checkpoint with AutoModel drops them as unexpected keys, so the evaluators restore them
with ``restore_pooler_head`` / ``saved_head_weights``.

Paper 002's released code trains another head (``train.head``): Linear only on BERT, tanh then
Linear on RoBERTa; ``use_head_kind`` puts a ``PoolerHead`` of that kind in the pooler slot, with
the same parameter names. Such a head is for training only (the evaluators read a saved head as
Linear then tanh, so the params refuse ``eval_pooler: cls`` with it).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import PreTrainedModel

from stages.modeling.backbone_adapters import find_adapter

HEAD_KEYS = ("pooler.dense.weight", "pooler.dense.bias")
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"


HEAD_KINDS = ("simcse", "linear", "tanh_linear")


class PoolerHead(nn.Module):
    """BERT's pooler: tanh(dense(first token's state)) (``kind`` simcse); ``linear``:
    dense(first), ``tanh_linear``: dense(tanh(first)) (paper 002's released heads)."""

    def __init__(self, hidden_size: int, kind: str = "simcse") -> None:
        super().__init__()
        if kind not in HEAD_KINDS:
            raise ValueError(f"unknown head '{kind}'; allowed: {', '.join(HEAD_KINDS)}")
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()
        self.kind = kind

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        first = hidden_states[:, 0]
        if self.kind == "linear":
            return self.dense(first)
        if self.kind == "tanh_linear":
            return self.dense(self.activation(first))
        return self.activation(self.dense(first))


def pooler_head(model: nn.Module) -> nn.Module | None:
    """The model's pooler module (its own, or an attached ``PoolerHead``), or None."""
    head = getattr(model, "pooler", None)
    return head if isinstance(head, nn.Module) else None


def attach_pooler_head(encoder: PreTrainedModel) -> nn.Module:
    """The encoder's pooler, a ``PoolerHead`` attached first where its family has none."""
    head = pooler_head(encoder)
    if head is None:
        adapter = find_adapter(encoder.config.model_type)
        if adapter is None or adapter.has_pooler:
            raise ValueError(
                f"{type(encoder).__name__} was built without its pooler "
                "(load it with add_pooling_layer=True)"
            )
        head = PoolerHead(encoder.config.hidden_size).to(encoder.device, encoder.dtype)
        encoder.pooler = head
    return head


def use_head_kind(encoder: PreTrainedModel, kind: str) -> nn.Module:
    """The encoder's pooler computing ``kind`` (``HEAD_KINDS``): its own (or attached) pooler for
    simcse, else a ``PoolerHead`` of that kind in its slot, holding the same dense layer."""
    head = attach_pooler_head(encoder)
    if kind == "simcse":
        return head
    replacement = PoolerHead(encoder.config.hidden_size, kind)
    replacement.dense = head.dense
    encoder.pooler = replacement
    return replacement


def saved_head_weights(model_dir: str | Path) -> dict[str, torch.Tensor] | None:
    """``pooler.dense.{weight,bias}`` from a saved model's safetensors, or None if absent."""
    folder = Path(model_dir)
    index = folder / WEIGHTS_INDEX
    if index.is_file():
        files = json.loads(index.read_text())["weight_map"]
        located = {key: folder / files[key] for key in HEAD_KEYS if key in files}
    elif (folder / WEIGHTS_FILE).is_file():
        with safe_open(folder / WEIGHTS_FILE, framework="pt") as f:
            names = set(f.keys())
        located = {key: folder / WEIGHTS_FILE for key in HEAD_KEYS if key in names}
    else:
        return None
    if len(located) < len(HEAD_KEYS):
        return None
    weights = {}
    for key, path in located.items():
        with safe_open(path, framework="pt") as f:
            weights[key.removeprefix("pooler.")] = f.get_tensor(key)
    return weights


def restore_pooler_head(model: PreTrainedModel, model_dir: str | Path) -> bool:
    """Attach the trained ``PoolerHead`` saved in ``model_dir`` to a model loaded without it
    (a family with no pooler of its own); False when there is none to restore."""
    if pooler_head(model) is not None:
        return False
    weights = saved_head_weights(model_dir)
    if weights is None:
        return False
    head = PoolerHead(model.config.hidden_size)
    head.load_state_dict(weights)
    model.pooler = head.to(model.device, model.dtype)
    return True
