"""Fixtures of the SentEval protocol tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from senteval_testing import BagOfWords, write_senteval_tree


@pytest.fixture
def senteval_root(tmp_path: Path) -> Path:
    return write_senteval_tree(tmp_path / "senteval")


@pytest.fixture
def bag_of_words() -> BagOfWords:
    return BagOfWords()
