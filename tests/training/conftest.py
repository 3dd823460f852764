from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import TINY, write_small_data

from stages.modeling.backbone import load_tokenizer
from stages.training.run_folder import stsb_dev_evaluator


@pytest.fixture(scope="session")
def small_data(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(corpus file, SentEval root) holding the first lines of the real data."""
    return write_small_data(shared_data, tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def corpus(small_data: tuple[Path, Path]) -> Path:
    return small_data[0]


@pytest.fixture(scope="session")
def dev_evaluator(small_data: tuple[Path, Path]):
    return stsb_dev_evaluator(small_data[1])


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tokenized")


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer(TINY)
