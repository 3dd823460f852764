"""The longest input a model takes, in tokens: training's ``max_seq_length`` may not exceed it,
and it is every evaluation's truncation (the exported sentence-transformers folders' too) unless
one is asked for."""

from __future__ import annotations

from transformers import PreTrainedConfig
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

# BERT's and RoBERTa's limit, and the cap for families with more positions (ModernBERT's 8192):
# the papers' trainings and evaluations stay within it.
LONGEST_INPUT = 512
# What the limit is made of, for the messages that refuse a longer length.
LIMIT_PARTS = (
    "the least of its max_position_embeddings, its tokenizer's model_max_length and "
    f"{LONGEST_INPUT}"
)


def max_model_length(config: PreTrainedConfig, tokenizer: PreTrainedTokenizerBase) -> int:
    """The least of the model's positions, its tokenizer's limit and ``LONGEST_INPUT`` (RoBERTa's
    514 positions include its padding offset, which its tokenizer's 512 accounts for)."""
    positions = getattr(config, "max_position_embeddings", LONGEST_INPUT)
    return min(positions, tokenizer.model_max_length, LONGEST_INPUT)
