"""Where every stage reads and writes, relative to the repository root.

Trained runs and their evaluations are content-addressed under ``runs/<run_id>/``; the
per-experiment folders under ``experiments/<name>/`` hold small pointer/result files that the
orchestrators track, so renaming nothing and retraining nothing is ever needed to look up a run.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path("data")
RUNS = Path("runs")
EXPERIMENTS = Path("experiments")
REPORTS = Path("reports")
CACHE = Path("cache")


def corpus_file(corpus: str) -> Path:
    return DATA / "corpus" / f"{corpus}.txt"


def senteval_dir() -> Path:
    return DATA / "senteval"


def sts_raw_dir() -> Path:
    return DATA / "sts_raw"


def triplets_file(backbone: str) -> Path:
    """Masked triplets for runs on ``backbone`` (token units use its tokenizer)."""
    return DATA / "triplets" / f"{backbone}.parquet"


def triplets_stats_file(backbone: str) -> Path:
    return DATA / "triplets" / f"{backbone}.stats.json"


def run_dir(run_id: str) -> Path:
    return RUNS / run_id


def experiment_dir(name: str) -> Path:
    return EXPERIMENTS / name
