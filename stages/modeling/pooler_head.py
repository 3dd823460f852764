"""The dense + tanh head over the first token (pooler ``cls``) for every backbone.

BERT, RoBERTa, XLM-R and MPNet build it themselves (``pooler.dense``, ``add_pooling_layer``).
DistilBERT, DeBERTa-v2/v3 and ModernBERT have none, so training with pooler ``cls`` attaches
``PoolerHead`` (BERT's pooler: same parameter names, same computation) as ``encoder.pooler``.
``save_pretrained`` then writes its weights as ``pooler.dense.*`` beside the encoder's; loading
such a checkpoint with AutoModel drops them as unexpected keys, so the evaluators restore them
with ``restore_pooler_head`` / ``saved_head_weights``.

ALBERT's pooler is laid out otherwise: ``encoder.pooler`` a bare Linear (saved as
``pooler.weight``/``pooler.bias``) and its tanh in ``encoder.pooler_activation`` (the adapter's
``pooler_activation``). ``pooler_head`` then returns a ``SplitPooler`` over the two modules where
they are (nothing in the model moves, so its forward, its ``pooler_output`` and its saved keys
stay the family's), and ``saved_head_weights`` reads the Linear under the family's keys.

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

from stages.modeling.backbone_adapters import BackboneAdapter, find_adapter

HEAD_KEYS = ("pooler.dense.weight", "pooler.dense.bias")  # BERT's layout and PoolerHead's
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


class SplitPooler(nn.Module):
    """A family's pooler whose Linear and activation are two attributes of the model (ALBERT):
    activation(dense(first token's state)), computed with the model's own two modules."""

    def __init__(self, dense: nn.Module, activation: nn.Module) -> None:
        super().__init__()
        self.dense = dense
        self.activation = activation

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))


def _split_layout(model: nn.Module) -> BackboneAdapter | None:
    """The adapter of ``model``'s family when its pooler is a bare Linear with the activation
    apart (and not replaced by a ``PoolerHead``), else None."""
    config = getattr(model, "config", None)
    adapter = find_adapter(getattr(config, "model_type", None))
    if adapter is None or not adapter.pooler_activation:
        return None
    return None if isinstance(getattr(model, "pooler", None), PoolerHead) else adapter


def pooler_head(model: nn.Module) -> nn.Module | None:
    """The model's pooler module over its last hidden states (its own, an attached
    ``PoolerHead``, or a ``SplitPooler`` over a pooler laid out as ALBERT's), or None."""
    head = getattr(model, "pooler", None)
    if not isinstance(head, nn.Module):
        return None
    adapter = _split_layout(model)
    if adapter is None:
        return head
    return SplitPooler(head, getattr(model, adapter.pooler_activation))


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
    simcse, else a ``PoolerHead`` of that kind in its slot, holding the same dense layer; for a
    pooler laid out as ALBERT's, ``linear`` by an identity in its activation's slot."""
    head = attach_pooler_head(encoder)
    if kind == "simcse":
        return head
    adapter = _split_layout(encoder)
    if adapter is not None:
        # the family's forward applies its activation after the Linear: "linear" drops it there
        if kind != "linear":
            raise ValueError(
                f"head '{kind}' puts the activation before the Linear; {adapter.family}'s pooler "
                "applies it after (heads: simcse, linear)"
            )
        setattr(encoder, adapter.pooler_activation, nn.Identity())
        return pooler_head(encoder)
    replacement = PoolerHead(encoder.config.hidden_size, kind)
    replacement.dense = head.dense
    encoder.pooler = replacement
    return replacement


def saved_head_keys(folder: Path) -> tuple[str, ...]:
    """The keys of the pooler's Linear in the model saved in ``folder``: its family's
    (``BackboneAdapter.head_keys``), BERT's for a family without an adapter."""
    config = folder / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    adapter = find_adapter(model_type)
    return adapter.head_keys() if adapter is not None else HEAD_KEYS


def saved_head_weights(model_dir: str | Path) -> dict[str, torch.Tensor] | None:
    """The pooler's Linear from a saved model's safetensors as ``dense.{weight,bias}``
    (``pooler.dense.*``, or ``pooler.*`` for a family whose activation is apart), or None if
    absent."""
    folder = Path(model_dir)
    head_keys = saved_head_keys(folder)
    index = folder / WEIGHTS_INDEX
    if index.is_file():
        files = json.loads(index.read_text())["weight_map"]
        located = {key: folder / files[key] for key in head_keys if key in files}
    elif (folder / WEIGHTS_FILE).is_file():
        with safe_open(folder / WEIGHTS_FILE, framework="pt") as f:
            names = set(f.keys())
        located = {key: folder / WEIGHTS_FILE for key in head_keys if key in names}
    else:
        return None
    if len(located) < len(head_keys):
        return None
    weights = {}
    for key, path in located.items():
        with safe_open(path, framework="pt") as f:
            weights["dense." + key.rsplit(".", 1)[1]] = f.get_tensor(key)
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
