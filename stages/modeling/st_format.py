"""Trained checkpoints as sentence-transformers model directories, built with the library itself.

A checkpoint folder is a Hugging Face model folder (``AutoModel.from_pretrained`` loads it); this
module adds the sentence-transformers files beside it (``modules.json``,
``config_sentence_transformers.json``, ``sentence_bert_config.json`` and one folder per module),
so ``SentenceTransformer(path)`` computes exactly the evaluation pooler of ``encoder.json``:

- ``cls_before_pooler``: Pooling ``cls`` (the last layer's [CLS] state, no BERT pooler);
- ``mean``: Pooling ``mean`` over the attention mask;
- ``cls``: Pooling ``cls`` then Dense + tanh carrying the trained pooler's weights (the checkpoint's
  ``pooler.dense``, SimCSE's MLP head; read from the saved weights, since for a family without a
  pooler of its own, ``stages.modeling.pooler_head``, AutoModel does not load them);
- ``first_last_mean``: sentence-transformers has no such pooling mode, so it is built from two of
  its stock modules: WeightedLayerPooling over hidden_states[1:] with weight 1 on the first
  Transformer layer and on the last and 0 between, then Pooling ``mean``. The layers come from
  the model's ``output_hidden_states``, which this pooler sets to true in ``config.json``
  (the project's encoder asks for the hidden states it needs explicitly, so it is unaffected).

No custom code is written, so no ``trust_remote_code`` is ever needed to load a checkpoint.
Only the sentence-transformers files are copied in: the weights and tokenizer stay the bytes
``save_pretrained`` wrote.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer

from stages.modeling.input_length import max_model_length
from stages.modeling.pooler_head import saved_head_weights

ST_MODULES_FILE = "modules.json"
# What sentence-transformers writes for its first module (the transformer) into the model's own
# folder; everything else it writes is its own.
_HF_FILES = {"config.json", "model.safetensors", "pytorch_model.bin"}


def max_sequence_length(model_dir: Path) -> int:
    """The evaluation's truncation: the project encoder's default, the longest input the model
    takes."""
    return max_model_length(
        AutoConfig.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    )


def sentence_transformer_modules(model_dir: Path, pooler: str) -> list[torch.nn.Module]:
    """The sentence-transformers module stack that computes ``pooler`` on ``model_dir``."""
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Pooling,
        Transformer,
        WeightedLayerPooling,
    )

    transformer = Transformer(str(model_dir), max_seq_length=max_sequence_length(model_dir))
    dim = transformer.get_embedding_dimension()
    if pooler == "cls_before_pooler":
        return [transformer, Pooling(dim, "cls")]
    if pooler == "mean":
        return [transformer, Pooling(dim, "mean")]
    if pooler == "cls":
        weights = saved_head_weights(model_dir)
        if weights is None:
            raise ValueError(f"{model_dir}: pooler 'cls' needs the model's pooler (dense + tanh)")
        dense = Dense(dim, dim, bias=True, activation_function=torch.nn.Tanh())
        dense.linear.load_state_dict(
            {name.removeprefix("dense."): value for name, value in weights.items()}
        )
        return [transformer, Pooling(dim, "cls"), dense]
    if pooler == "first_last_mean":
        layers = transformer.model.config.num_hidden_layers
        weights = torch.zeros(layers, dtype=torch.float)
        weights[0] = weights[-1] = 1.0  # hidden_states[1] and hidden_states[-1]
        layer_pool = WeightedLayerPooling(
            dim, num_hidden_layers=layers, layer_start=1, layer_weights=torch.nn.Parameter(weights)
        )
        return [transformer, layer_pool, Pooling(dim, "mean")]
    raise ValueError(f"unknown pooler '{pooler}'")


def write_sentence_transformers_files(model_dir: str | Path, pooler: str) -> None:
    """Add the sentence-transformers files for ``pooler`` to a Hugging Face model folder."""
    from sentence_transformers import SentenceTransformer

    model_dir = Path(model_dir)
    if pooler == "first_last_mean":
        config = AutoConfig.from_pretrained(model_dir)
        config.output_hidden_states = True
        config.save_pretrained(model_dir)
    model = SentenceTransformer(
        modules=sentence_transformer_modules(model_dir, pooler), device="cpu"
    )
    with tempfile.TemporaryDirectory(dir=model_dir.parent) as tmp:
        model.save(tmp, create_model_card=False)
        for path in sorted(Path(tmp).iterdir()):
            if path.name in _HF_FILES or (model_dir / path.name).exists():
                continue
            if path.is_dir():
                shutil.copytree(path, model_dir / path.name)
            else:
                shutil.copy2(path, model_dir / path.name)
