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
from typing import NamedTuple

import torch
from torch import nn
from transformers import PreTrainedModel

from stages.modeling.backbone_adapters import adapter_for
from stages.modeling.pooler_head import pooler_head, use_head_kind
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


def reset_mlp_head(
    encoder: PreTrainedModel, seed: int, kind: str = "simcse", init_std: float | None = None
) -> None:
    """Re-initialise the pooler's dense layer as SimCSE's fresh ``MLPLayer``: weights
    N(0, initializer_range^2), zero bias (the backbone's ``_init_weights`` for Linear). A family
    without a pooler gets one attached first. ``kind`` (``train.head``) and ``init_std``
    (``train.head_init_std``): paper 002's released head, weights and bias N(0, init_std^2)."""
    dense = use_head_kind(encoder, kind).dense
    generator = torch.Generator().manual_seed(seed)
    std = getattr(encoder.config, "initializer_range", 0.02) if init_std is None else init_std
    with torch.no_grad():
        weight = torch.randn(dense.weight.shape, generator=generator) * std
        dense.weight.copy_(weight)
        if init_std is None:
            dense.bias.zero_()
        else:
            dense.bias.copy_(torch.randn(dense.bias.shape, generator=generator) * init_std)


def freeze_embeddings(encoder: PreTrainedModel) -> None:
    """The embedding layer (token, position and type embeddings and their LayerNorm: every
    parameter outside the layers and the pooler) gets no gradient, as paper 002's released code
    trains (its ``custom_param_init``)."""
    embeddings = getattr(encoder, "embeddings", None)
    if not isinstance(embeddings, nn.Module):
        raise ValueError(f"train.freeze_embeddings: {type(encoder).__name__} has no embeddings")
    embeddings.requires_grad_(False)


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
        passes = self.passes(ids, mask, triplet_ids, triplet_mask, packing, triplet_packing)
        return self.assemble([self.run_pass(p) for p in passes])

    def passes(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        triplet_ids: torch.Tensor | None = None,
        triplet_mask: torch.Tensor | None = None,
        packing: Packing | None = None,
        triplet_packing: Packing | None = None,
    ) -> list[EmbeddingPass]:
        """The encoder forwards of a step, in order: the two views (one forward over the batch
        doubled, or, with ``view_dropout='first'``, one with dropout and one without), then the
        triplets (anchor, short, long stacked) if any."""
        if self.view_dropout == "first":
            views = [
                EmbeddingPass("view1", ids, mask, packing, True),
                EmbeddingPass("view2", ids, mask, packing, False),
            ]
        else:
            doubled = packing.repeated(2) if packing is not None else None
            both = EmbeddingPass("views", torch.cat([ids, ids]), torch.cat([mask, mask]), doubled)
            views = [both]
        if triplet_ids is None or triplet_mask is None:
            return views
        triplets = EmbeddingPass(
            "triplets", triplet_ids, triplet_mask, triplet_packing, self.triplet_dropout
        )
        return [*views, triplets]

    def run_pass(self, p: EmbeddingPass) -> torch.Tensor:
        """The pass's embeddings, dropout on or off as it says."""
        with nullcontext() if p.dropout else dropout_disabled(self.encoder):
            return self.embed(p.ids, p.mask, p.packing)

    def assemble(
        self, embedded: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """(z, z_pos, triplets) from the embeddings of ``passes``, in their order."""
        if self.view_dropout == "first":
            z, z_pos, *rest = embedded
        else:
            views, *rest = embedded
            z, z_pos = torch.tensor_split(views, 2)
        triplets = tuple(torch.tensor_split(rest[0], 3)) if rest else None
        return z, z_pos, triplets


class EmbeddingPass(NamedTuple):
    """One encoder forward of a step: its rows, where their real tokens are, and whether dropout
    is on (``ContrastiveModel.passes``; a named tuple, which ``torch.compile`` traces)."""

    name: str
    ids: torch.Tensor
    mask: torch.Tensor
    packing: Packing | None
    dropout: bool = True

    @property
    def rows(self) -> int:
        return self.ids.size(0)
