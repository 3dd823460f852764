"""Fixtures for the triplet tests: the packaged all-MiniLM-L6-v2 tokenizer (BERT WordPiece)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from stages.masked_triplets.masking import MaskingTokenizer


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm_path: str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(minilm_path)


@pytest.fixture(scope="session")
def masking_tokenizer(minilm_tokenizer: PreTrainedTokenizerBase) -> MaskingTokenizer:
    return MaskingTokenizer.from_pretrained(minilm_tokenizer)
