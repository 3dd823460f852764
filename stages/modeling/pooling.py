"""Sentence representations from a Hugging Face encoder's outputs (SimCSE's poolers).

- ``cls``: the [CLS] state through the dense + tanh head (during training SimCSE's fresh MLP,
  saved into the backbone's pooler slot, so evaluators read it back as ``pooler_output``);
- ``cls_before_pooler``: the raw last-layer [CLS] state (SimCSE's unsupervised evaluation);
- ``mean``: the mean of last-layer token states over the attention mask;
- ``first_last_mean``: the masked mean of the average of the first and last layers' states
  (SimCSE's ``avg_first_last``: hidden_states[1], the first Transformer layer, not embeddings).
"""

from __future__ import annotations

from typing import Any

import torch

from stages.core.params import POOLERS


def needs_hidden_states(pooler: str) -> bool:
    return pooler == "first_last_mean"


def masked_mean(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)


def pool(outputs: Any, attention_mask: torch.Tensor, pooler: str) -> torch.Tensor:
    """(batch, hidden) sentence vectors from a model output with ``last_hidden_state``."""
    if pooler == "cls":
        if getattr(outputs, "pooler_output", None) is None:
            raise ValueError("pooler 'cls' needs a backbone with a pooler (dense + tanh) layer")
        return outputs.pooler_output
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
