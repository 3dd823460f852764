"""What differs between encoder families, declared once per Hugging Face ``model_type``.

The training and evaluation code is written once for every backbone; each family's
``BackboneAdapter`` states the rest:

- ``dropout_keys``: the config keys of every dropout the encoder applies. ``train.dropout`` sets
  them all (the two SimCSE views differ only by these masks); the triplet branch and the
  dropout-off view switch them off together by eval mode (``training.model.dropout_disabled``).
- ``has_pooler``: AutoModel builds BERT's pooler (``pooler.dense`` + tanh) when given
  ``add_pooling_layer=True``. Pooler ``cls`` trains SimCSE's MLP head in that slot; a family
  without one gets the same Linear + tanh head attached as ``encoder.pooler``
  (``stages.modeling.pooler_head``), saved with the checkpoint and restored by the evaluators.
- ``pooler_activation``: where a family's pooler is a bare Linear (``encoder.pooler``, saved as
  ``pooler.weight``/``pooler.bias``) with its tanh in another attribute, that attribute's name
  (ALBERT: ``pooler_activation``); empty for BERT's layout, one module holding both
  (``pooler.dense`` + ``pooler.activation``). The training head and the evaluators read the
  Linear and the tanh where it says (``pooler_head.pooler_head``, ``saved_head_weights``).
- ``attention``: the attention implementations that compute the right thing with the masks the
  project hands over, the preferred first (flash and flex attention take other mask forms;
  MPNet and DeBERTa-v2 have eager attention only).
- ``ready_mask``: the padded forward may take the ready 4-D mask of
  ``unpadded.attention_bias``: transformers passes a 4-D mask through, and skipping its own
  preparation avoids a wait for the device per forward. DeBERTa-v2 also multiplies its
  embeddings by the 2-D mask and ModernBERT derives its sliding-window mask from it, so those
  two get the 2-D mask.
- ``packed_layout``: the packed (unpadded) forward of ``stages.modeling.unpadded`` that runs it;
  None with ``padded_only`` saying why the padded forward is used instead (logged once per
  process when such a family is loaded: ``log_padded_only``).
- ``token_type_ids``: the model takes token type ids (a tokenizer may return them regardless).
- ``config_names``: ``random_init``'s BERT names that the family's config spells otherwise
  (where transformers' ``attribute_map`` does not already translate them); ``derived_keys``:
  config keys computed from those sizes, recomputed when ``random_init`` changes them.

Every family's longest input is its config's ``max_position_embeddings`` capped by its
tokenizer's limit (``input_length.max_model_length``), so nothing per family is needed there.
The papers' learning rates and batch sizes per backbone are the presets' ``per_backbone``
entries (the papers ran BERT and RoBERTa only); none is invented here for the other families.

To add a family: one ``BackboneAdapter`` in ``ADAPTERS`` below and its tiny config in
``tests/training/test_backbone_adapters.py`` (docs/extending.md, "Add a backbone").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

REGISTRY_FILE = "stages/modeling/backbone_adapters.py"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackboneAdapter:
    model_type: str
    family: str  # for messages and docs
    dropout_keys: tuple[str, ...]
    has_pooler: bool
    attention: tuple[str, ...]
    ready_mask: bool
    token_type_ids: bool
    packed_layout: str | None = None
    padded_only: str = ""
    pooler_activation: str = ""
    config_names: Mapping[str, str] = field(default_factory=dict)
    derived_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.packed_layout is None) == (not self.padded_only):
            raise ValueError(f"{self.model_type}: give a packed_layout or say why padded_only")
        if self.pooler_activation and not self.has_pooler:
            raise ValueError(f"{self.model_type}: pooler_activation needs has_pooler=True")

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the AutoModel constructor (BERT's pooler when it has one)."""
        return {"add_pooling_layer": True} if self.has_pooler else {}

    def head_keys(self) -> tuple[str, str]:
        """The state-dict keys of the pooler's Linear (weight, bias) in a saved model."""
        stem = "pooler" if self.pooler_activation else "pooler.dense"
        return f"{stem}.weight", f"{stem}.bias"

    def dropout_overrides(self, dropout: float) -> dict[str, float]:
        return dict.fromkeys(self.dropout_keys, dropout)

    def config_name(self, name: str) -> str:
        return self.config_names.get(name, name)


BERT_DROPOUT = ("hidden_dropout_prob", "attention_probs_dropout_prob")

ADAPTERS: dict[str, BackboneAdapter] = {
    adapter.model_type: adapter
    for adapter in (
        BackboneAdapter(
            "bert", "BERT (and MiniLM checkpoints)", BERT_DROPOUT, has_pooler=True,
            attention=("sdpa", "eager"), ready_mask=True, token_type_ids=True,
            packed_layout="bert",
        ),
        BackboneAdapter(
            "roberta", "RoBERTa", BERT_DROPOUT, has_pooler=True, attention=("sdpa", "eager"),
            ready_mask=True, token_type_ids=True, packed_layout="bert",
        ),
        BackboneAdapter(
            "xlm-roberta", "XLM-RoBERTa", BERT_DROPOUT, has_pooler=True,
            attention=("sdpa", "eager"), ready_mask=True, token_type_ids=True,
            packed_layout="bert",
        ),
        BackboneAdapter(
            "distilbert", "DistilBERT", ("dropout", "attention_dropout"), has_pooler=False,
            attention=("sdpa", "eager"), ready_mask=True, token_type_ids=False,
            packed_layout="distilbert", config_names={"intermediate_size": "hidden_dim"},
        ),
        BackboneAdapter(
            # pooler_dropout belongs to the classification heads' ContextPooler, not AutoModel
            "deberta-v2", "DeBERTa-v2 and -v3", BERT_DROPOUT, has_pooler=False,
            attention=("eager",), ready_mask=False, token_type_ids=True, packed_layout="deberta",
        ),
        BackboneAdapter(
            "modernbert", "ModernBERT", ("embedding_dropout", "attention_dropout", "mlp_dropout"),
            has_pooler=False, attention=("sdpa", "eager"), ready_mask=False,
            token_type_ids=False, derived_keys=("layer_types",), packed_layout="modernbert",
        ),
        BackboneAdapter(
            "mpnet", "MPNet", BERT_DROPOUT, has_pooler=True, attention=("eager",),
            ready_mask=True, token_type_ids=False, packed_layout="mpnet",
        ),
    )
}  # fmt: skip


def find_adapter(model_type: str | None) -> BackboneAdapter | None:
    return ADAPTERS.get(model_type or "")


_ANNOUNCED_PADDED: set[str] = set()


def log_padded_only(adapter: BackboneAdapter | None) -> None:
    """One warning per process that a family without a packed layout runs the padded forward
    (computing the padding too: slower, same numbers), and why."""
    if adapter is None or not adapter.padded_only or adapter.model_type in _ANNOUNCED_PADDED:
        return
    _ANNOUNCED_PADDED.add(adapter.model_type)
    log.warning(
        "%s runs the padded forward (no packed layout: %s)", adapter.family, adapter.padded_only
    )


def adapter_for(model_type: str | None) -> BackboneAdapter:
    """The family's adapter; an unknown ``model_type`` is refused, naming what is supported."""
    adapter = find_adapter(model_type)
    if adapter is None:
        raise ValueError(
            f"backbone model_type {model_type!r} is not supported; supported: "
            f"{', '.join(sorted(ADAPTERS))}. To add one, declare its BackboneAdapter in "
            f"{REGISTRY_FILE} (docs/extending.md, 'Add a backbone')"
        )
    return adapter
