"""Attention without dropout on the CPU: SDPA's kernel against two batched matrix products.

Why ``stages.modeling.unpadded`` evaluates batches of at most ``SHORT_CPU_LENGTH`` positions
with ``batched_attention``: for each length, q, k and v in all-MiniLM-L6-v2's head layout
(12 heads of 32) for about 2048 positions per batch, as views of one (batch, length, 3, heads,
head size) tensor like those the packed forward passes, a quarter of the rows padded at their last
quarter, under ``torch.inference_mode``; timed: ``F.scaled_dot_product_attention`` with the
boolean mask (what transformers' SDPA attention calls) and ``batched_attention`` with the
same mask, in interleaved rounds; a round's time is the median of its blocks, the reported time
the best round. Prints a markdown table and writes JSON with the load averages.

    python -m benchmarks.short_attention [--threads 2] [--rounds 5]
        [--output benchmarks/results/short_attention.json]
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils import benchmark

from benchmarks import harness
from stages.modeling.batched_attention import batched_attention
from stages.modeling.unpadded import SHORT_CPU_LENGTH

HEADS, HEAD_SIZE, POSITIONS = 12, 32, 2048
LENGTHS = (8, 16, 24, 32, 48, 64, 128, 256)


def inputs(length: int) -> tuple[torch.Tensor, ...]:
    batch = max(4, POSITIONS // length)
    generator = torch.Generator().manual_seed(length)
    # (batch, length, 3, heads, head_size) seen as q, k, v: the views the packed forward passes
    qkv = torch.randn(batch, length, 3, HEADS, HEAD_SIZE, generator=generator)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    keys = torch.ones(batch, length, dtype=torch.bool)
    keys[::4, length - length // 4 :] = False
    return q, k, v, keys[:, None, None, :]


def time_length(length: int, rounds: int) -> dict[str, float]:
    """Best-round median seconds of both attentions at one length, interleaved."""
    q, k, v, mask = inputs(length)
    names = {"q": q, "k": k, "v": v, "mask": mask, "scale": HEAD_SIZE**-0.5,
             "sdpa": F.scaled_dot_product_attention, "short": batched_attention}  # fmt: skip
    statements = {
        "sdpa": "sdpa(q, k, v, attn_mask=mask, scale=scale)",
        "short": "short(q, k, v, mask, scale)",
    }
    timers = {name: benchmark.Timer(stmt=stmt, globals=names) for name, stmt in statements.items()}
    best = harness.best_of_rounds(timers, rounds, min_run_time=0.3)
    return {"length": length, "batch": q.shape[0], "sdpa_ms": best["sdpa"] * 1e3,
            "short_ms": best["short"] * 1e3,
            "sdpa_over_short": best["sdpa"] / best["short"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", type=Path, default=harness.RESULTS / "short_attention.json")
    args = parser.parse_args()
    invocation = harness.begin(__file__)
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        rows = [time_length(length, args.rounds) for length in LENGTHS]
    print(f"attention products used up to length {SHORT_CPU_LENGTH}")
    print("| length | batch | SDPA ms | products ms | SDPA / products |")
    print("|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['length']} | {row['batch']} | {row['sdpa_ms']:.2f} | {row['short_ms']:.2f} "
            f"| {row['sdpa_over_short']:.2f} |"
        )
    harness.write_result(
        args.output,
        {
            "setup": {"heads": HEADS, "head_size": HEAD_SIZE, "positions_per_batch": POSITIONS,
                      "threads": args.threads, "rounds": args.rounds, "torch": torch.__version__,
                      "cpu": platform.processor() or platform.machine(),
                      "short_cpu_length": SHORT_CPU_LENGTH},
            "load_average_start": invocation.load_average_before,
            "load_average_end": harness.load_average(),
            "rows": rows,
        },
        invocation,
    )  # fmt: skip


if __name__ == "__main__":
    main()
