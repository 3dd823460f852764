"""Where every stage reads and writes, relative to the repository root.

Trained runs and their evaluations are content-addressed under ``runs/<run_id>/``; the
per-experiment folders under ``experiments/<name>/`` hold small pointer/result files that the
orchestrators track, so renaming nothing and retraining nothing is ever needed to look up a run.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path

DATA = Path("data")
DEFAULT_PARAMS = Path("params.yaml")
# Runs are content-addressed, so one store can serve several checkouts, machines and DVC's
# queued experiments (which run in temporary copies of the repo): point CSE_RUNS_DIR at a
# folder on shared storage (docs/scale-out.md).
RUNS = Path(os.environ.get("CSE_RUNS_DIR", "runs"))
EXPERIMENTS = Path("experiments")
REPORTS = Path("reports")
CACHE = Path("cache")


def params_flag(params_file: str | Path | None) -> str:
    """`` --params FILE`` for a stage's command line (quoted for a shell), unless it is the
    default params.yaml."""
    if params_file is None or str(params_file) == str(DEFAULT_PARAMS):
        return ""
    return f" --params {shlex.quote(str(params_file))}"


def corpus_file(corpus: str) -> Path:
    return DATA / "corpus" / f"{corpus}.txt"


def senteval_dir() -> Path:
    return DATA / "senteval"


def sts_raw_dir() -> Path:
    return DATA / "sts_raw"


def triplets_file(triplets_id: str) -> Path:
    """Masked triplets by their id (corpus, tokenizer, settings, code:
    stages.core.identity.experiments)."""
    return DATA / "triplets" / f"{triplets_id}.parquet"


def triplets_stats_file(triplets_id: str) -> Path:
    return DATA / "triplets" / f"{triplets_id}.stats.json"


def run_dir(run_id: str) -> Path:
    return RUNS / run_id


def experiment_dir(name: str) -> Path:
    return EXPERIMENTS / name


def train_steps_file(name: str) -> Path:
    """Per-step training curve of an experiment (CSV, for DVC plots and the report)."""
    return experiment_dir(name) / "train_steps.csv"


def dev_curve_file(name: str) -> Path:
    """Per-evaluation STS-B dev curve of an experiment (CSV, for DVC plots and the report)."""
    return experiment_dir(name) / "dev_evals.csv"


def live_dir(name: str) -> Path:
    """Live training metrics of an experiment while it trains (DVCLive with its own dvc.yaml,
    TensorBoard): inside the workspace, so DVC's plots and experiments see them."""
    return experiment_dir(name) / "live"


def report_metrics_file() -> Path:
    """The report's flat summary for ``dvc metrics show``; beside reports/results/, because DVC
    cannot track a file inside a tracked folder."""
    return REPORTS / "metrics.json"


def report_job_file() -> Path:
    """The fingerprint of the report's job (``stages.core.planning.jobs.stage_fingerprint``)."""
    return REPORTS / "results" / "job.json"


def analyses_dir() -> Path:
    """The figures stage's output: the papers' analyses that need no training (PNG + CSV)."""
    return REPORTS / "analyses"


def embedding_cache_dir() -> Path:
    """SentEval embeddings per (encoder fingerprint, task): classifiers rerun without encoding."""
    return CACHE / "embeddings"


def code_manifest_file(stage: str, entry_modules: tuple[str, ...]) -> Path:
    """The code manifest of a stage's jobs with these entry modules (``stages.core.planning.jobs``):
    one file per distinct code, shared by the jobs that run the same code."""
    digest = hashlib.sha256("\n".join(entry_modules).encode()).hexdigest()[:12]
    return CACHE / "code" / f"{stage}-{digest}.json"


def evaluation_file(stage: str, evaluation_id: str) -> Path:
    """A finished evaluation, content-addressed beside the runs it scores: reused whenever the
    same evaluation is asked for again (a DVC rerun after a comment edit, another checkout)."""
    return RUNS / "evaluations" / f"{stage}-{evaluation_id}.json"


def evaluation_folders(stage: str, evaluation_id: str) -> Path:
    """Copies of the folders a finished evaluation wrote beside its results JSON (MTEB's
    ``mteb_results/``), stored with it so that reusing it writes them again."""
    return RUNS / "evaluations" / f"{stage}-{evaluation_id}"
