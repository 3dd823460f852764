"""Sentence representations from a Hugging Face encoder's outputs (SimCSE's poolers).

- ``cls``: the [CLS] state through the dense + tanh head (during training SimCSE's fresh MLP,
  saved into the backbone's pooler slot, so evaluators read it back: ``pooler_output`` of a
  family with a pooler of its own, else the attached ``pooler_head.PoolerHead``);
- ``cls_before_pooler``: the raw last-layer [CLS] state (SimCSE's unsupervised evaluation);
- ``mean``: the mean of last-layer token states over the attention mask;
- ``first_last_mean``: the masked mean of the average of the first and last layers' states
  (SimCSE's ``avg_first_last``: hidden_states[1], the first Transformer layer, not embeddings).
"""

from __future__ import annotations

from typing import Any

import torch

from stages.core.schema.params import POOLERS
from stages.modeling.unpadded import PackedStates, Packing


def needs_hidden_states(pooler: str) -> bool:
    return pooler == "first_last_mean"


def reads_first_tokens_only(pooler: str) -> bool:
    """The pooler reads the last layer at each row's first token alone ([CLS] or <s>)."""
    return pooler in ("cls", "cls_before_pooler")


def masked_mean(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)


def pool(
    outputs: Any, attention_mask: torch.Tensor, pooler: str, head: torch.nn.Module | None = None
) -> torch.Tensor:
    """(batch, hidden) sentence vectors from a model output with ``last_hidden_state``
    (``head``: the model's pooler module, for ``cls`` when the output has no ``pooler_output``)."""
    if pooler == "cls":
        if getattr(outputs, "pooler_output", None) is not None:
            return outputs.pooler_output
        if head is None:
            raise ValueError("pooler 'cls' needs a backbone with a pooler (dense + tanh) layer")
        return head(outputs.last_hidden_state)
    if pooler == "cls_before_pooler":
        return outputs.last_hidden_state[:, 0]
    if pooler == "mean":
        return masked_mean(outputs.last_hidden_state, attention_mask)
    if pooler == "first_last_mean":
        if outputs.hidden_states is None:
            raise ValueError("pooler 'first_last_mean' needs output_hidden_states=True")
        first, last = outputs.hidden_states[1], outputs.hidden_states[-1]
        return masked_mean((first + last) / 2, attention_mask)
    raise ValueError(f"unknown pooler '{pooler}'; allowed: {', '.join(POOLERS)}")


def pool_packed(
    states: PackedStates, packing: Packing, pooler: str, head: torch.nn.Module | None
) -> torch.Tensor:
    """``pool`` for the packed token states of ``packed_forward`` (``head``: the backbone's
    pooler module, for ``cls``); equal to pooling the padded forward's outputs."""
    if pooler == "cls":
        if head is None:
            raise ValueError("pooler 'cls' needs a backbone with a pooler (dense + tanh) layer")
        return head(states.first_tokens(packing)[:, None])
    if pooler == "cls_before_pooler":
        return states.first_tokens(packing)
    if states.first_tokens_only:
        raise ValueError(f"pooler '{pooler}' needs every token's states, not the first tokens'")
    if pooler == "mean":
        return packed_mean(states.last, packing)
    if pooler == "first_last_mean":
        if states.first_layer is None:
            raise ValueError("pooler 'first_last_mean' needs the first layer's states")
        return packed_mean((states.first_layer + states.last) / 2, packing)
    raise ValueError(f"unknown pooler '{pooler}'; allowed: {', '.join(POOLERS)}")


def packed_mean(packed: torch.Tensor, packing: Packing) -> torch.Tensor:
    """Each row's mean over its real tokens (summed in the padded layout, as ``masked_mean``)."""
    total = packing.unpack(packed).sum(dim=1)
    return total / packing.lengths.to(total.dtype)[:, None]
