"""The encoder as the contrastive objectives see it.

- Two dropout views from ONE forward pass over the batch duplicated (2N rows, SimCSE): rows i
  and N + i are the same sentence under independent dropout masks.
- Pooler ``cls`` trains SimCSE's MLP head (Linear + tanh over [CLS], freshly initialised). It
  lives in the backbone's own pooler slot (``encoder.pooler``; attached for a family without
  one, ``stages.modeling.pooler_head``), so the saved model carries the trained head and an
  evaluator's ``cls`` reads it back; ``cls_before_pooler`` skips it.
- The ArcCSE triplet branch runs with dropout off (every dropout of the encoder, hidden and
  attention) for that forward only; gradients still flow through it.
- ArcCSE's Table 3 switches: ``view_dropout='first'`` encodes the second view with dropout off
  (its own forward), ``triplet_dropout=True`` keeps dropout on in the triplet branch.
- ``unpad`` (default on): families with a packed forward compute only the real tokens
  (``stages.modeling.unpadded``); other encoders, or ``unpad=False``, run the padded Hugging Face
  forward, with a ready 4-D attention mask in the form their attention implementation expects
  where the family's adapter allows it (``ready_mask``), else the 2-D mask.

The encoder's family must have an adapter (``stages.modeling.backbone_adapters``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from transformers import PreTrainedModel

from stages.modeling.backbone_adapters import adapter_for
from stages.modeling.pooler_head import attach_pooler_head, pooler_head
from stages.modeling.pooling import (
    needs_hidden_states,
    pool,
    pool_packed,
    reads_first_tokens_only,
)
from stages.modeling.unpadded import (
    Packing,
    attention_bias,
    packed_forward,
    unpadding_unsupported,
)


def reset_mlp_head(encoder: PreTrainedModel, seed: int) -> None:
    """Re-initialise the pooler's dense layer as SimCSE's fresh ``MLPLayer``: weights
    N(0, initializer_range^2), zero bias (the backbone's ``_init_weights`` for Linear). A family
    without a pooler gets one attached first."""
    dense = attach_pooler_head(encoder).dense
    generator = torch.Generator().manual_seed(seed)
    std = getattr(encoder.config, "initializer_range", 0.02)
    with torch.no_grad():
        weight = torch.randn(dense.weight.shape, generator=generator) * std
        dense.weight.copy_(weight)
        dense.bias.zero_()


def freeze_unused_head(encoder: PreTrainedModel) -> None:
    """A head the training pooler does not read gets no gradient; freezing it keeps it out of
    the optimizer and keeps DDP from waiting for its gradients."""
    head = getattr(encoder, "pooler", None)
    if isinstance(head, nn.Module):
        head.requires_grad_(False)


@contextmanager
def dropout_disabled(module: nn.Module) -> Iterator[None]:
    """Dropout off (eval-mode behaviour) for the enclosed forward; autograd is unaffected."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def enable_gradient_checkpointing(encoder: PreTrainedModel) -> None:
    """Recompute layer activations in backward (non-reentrant, dropout masks replayed).

    transformers only checkpoints layers in training mode, so the dropout-off triplet forward
    keeps its activations: its recomputation could otherwise run with dropout back on.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(encoder, "activation_checkpointing_enable"):
        encoder.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        encoder.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class ContrastiveModel(nn.Module):
    """Maps a batch to (z, z_pos) and, for triplet objectives, (h0, h1, h2).

    ``packing``/``triplet_packing`` (optional) describe the masks' real tokens, built on the
    host (``Packing.from_mask``) so the unpadded forward never waits for the device; without
    them they are derived from the masks.
    """

    def __init__(
        self,
        encoder: PreTrainedModel,
        pooler: str,
        view_dropout: str = "both",
        triplet_dropout: bool = False,
        unpad: bool = True,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.adapter = adapter_for(encoder.config.model_type)
        if pooler == "cls" and pooler_head(encoder) is None:
            raise ValueError(
                f"pooler 'cls': {self.adapter.family} has no pooler of its own and none was "
                "trained (only training with pooler cls attaches one); use cls_before_pooler, "
                "mean or first_last_mean"
            )
        self.pooler = pooler
        self.view_dropout = view_dropout
        self.triplet_dropout = triplet_dropout
        self.unpad = unpad

    @property
    def unpadded(self) -> bool:
        """Whether ``embed`` computes only the real tokens."""
        return self.unpad and unpadding_unsupported(self.encoder) is None

    def embed(
        self, ids: torch.Tensor, mask: torch.Tensor, packing: Packing | None = None
    ) -> torch.Tensor:
        if self.unpadded:
            packing = packing or Packing.from_mask(mask)
            states = packed_forward(
                self.encoder,
                ids,
                mask,
                packing,
                keep_first_layer=needs_hidden_states(self.pooler),
                first_tokens_only=reads_first_tokens_only(self.pooler),
            )
            return pool_packed(states, packing, self.pooler, pooler_head(self.encoder))
        if self.adapter.ready_mask:
            mask_in = attention_bias(
                mask, self.encoder.config._attn_implementation, self.encoder.dtype
            )
        else:  # the 0/1 integers transformers documents (DeBERTa's convolution computes 1 - mask)
            mask_in = mask.long()
        outputs = self.encoder(
            input_ids=ids,
            attention_mask=mask_in,
            output_hidden_states=needs_hidden_states(self.pooler),
        )
        return pool(outputs, mask, self.pooler, pooler_head(self.encoder))

    def forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        triplet_ids: torch.Tensor | None = None,
        triplet_mask: torch.Tensor | None = None,
        packing: Packing | None = None,
        triplet_packing: Packing | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...] | None]:
        z, z_pos = self._views(ids, mask, packing)
        triplets = None
        if triplet_ids is not None and triplet_mask is not None:
            with nullcontext() if self.triplet_dropout else dropout_disabled(self.encoder):
                embedded = self.embed(triplet_ids, triplet_mask, triplet_packing)
                triplets = tuple(torch.tensor_split(embedded, 3))
        return z, z_pos, triplets

    def _views(
        self, ids: torch.Tensor, mask: torch.Tensor, packing: Packing | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.view_dropout == "first":
            first = self.embed(ids, mask, packing)
            with dropout_disabled(self.encoder):
                return first, self.embed(ids, mask, packing)
        n = ids.size(0)
        doubled = packing.repeated(2) if packing is not None else None
        views = self.embed(torch.cat([ids, ids]), torch.cat([mask, mask]), doubled)
        return views[:n], views[n:]
