"""Loss + backward time of every training objective on CPU (fp32), against InfoNCE.

For N in {64, 512} anchors of dimension d = 768 (BERT-base), times one forward and backward pass
of each objective (default hyperparameters; paper 002's objectives also fully modified, and the
released-code variants) with torch.utils.benchmark, and reports its ratio to InfoNCE at the
same N. Each configuration is timed in several interleaved rounds (so a load spike from other
processes hits every objective alike); a round's time is the median of its blocks, the reported
time the best round. ArcCSE is timed with N triplets (every sentence long enough), its worst
case. One thread by default: on a shared 2-core machine two OpenMP threads contend and inflate
times by two orders of magnitude. Prints a markdown table and writes JSON.

    python -m benchmarks.objectives [--output benchmarks/results/objectives.json] [--threads 2]
"""

from __future__ import annotations

import argparse
import platform
from typing import Any

import torch
from torch.utils import benchmark

from benchmarks import harness
from stages.objectives.registry import all_loss_classes

SIZES = (64, 512)
DIM = 768
MODIFIED = {"gradient_dissipation": True, "softmax_weight": True, "static_ratio": True}


def variants() -> list[tuple[str, str, dict[str, Any]]]:
    """(label, objective name, hyperparameters) of every timed configuration."""
    rows = [(name, name, {}) for name in all_loss_classes()]
    for name in ("align_uniform", "mpt", "met", "mat"):
        rows.append((f"{name} (code)", name, {"implementation": "code"}))
    for name in ("align_mhe", "align_mhs", "barlow_twins", "vicreg"):
        switches = {
            k: v for k, v in MODIFIED.items() if name != "align_mhs" or k != "softmax_weight"
        }
        rows.append((f"{name} +GD+W+R", name, switches))
        rows.append((f"{name} +GD+W+R (code)", name, switches | {"implementation": "code"}))
    return rows


def loss_and_backward_timer(
    name: str, hyperparameters: dict, n: int, threads: int
) -> benchmark.Timer:
    """A timer of one loss + backward pass on random N x 768 views."""
    objective = all_loss_classes()[name](name=name, **hyperparameters)
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(n, DIM, generator=generator).requires_grad_()
    z_pos = (z.detach() + 0.5 * torch.randn(n, DIM, generator=generator)).requires_grad_()
    triplets = None
    if objective.needs_triplets:
        triplets = tuple(
            torch.randn(n, DIM, generator=generator).requires_grad_() for _ in range(3)
        )

    def step() -> None:
        objective(z, z_pos, triplets=triplets).loss.backward()

    return benchmark.Timer(stmt="step()", globals={"step": step}, num_threads=threads)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", default=harness.RESULTS / "objectives.json")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    args = p.parse_args(argv)
    invocation = harness.begin(__file__, argv)

    configurations = variants()
    results = [
        {"objective": label, "name": name, "hyperparameters": hp}
        for label, name, hp in configurations
    ]
    for n in SIZES:
        timers = {
            label: loss_and_backward_timer(name, hp, n, args.threads)
            for label, name, hp in configurations
        }
        seconds = harness.best_of_rounds(timers, args.rounds, min_run_time=0.2)
        for row in results:
            row[f"ms_n{n}"] = 1e3 * seconds[row["objective"]]
    baseline = next(r for r in results if r["name"] == "infonce")
    for row in results:
        for n in SIZES:
            row[f"ratio_n{n}"] = row[f"ms_n{n}"] / baseline[f"ms_n{n}"]

    header = "| objective | " + " | ".join(f"N={n} ms | x InfoNCE" for n in SIZES) + " |"
    print(header)
    print("|---|" + "---:|---:|" * len(SIZES))
    for row in results:
        cells = " | ".join(f"{row[f'ms_n{n}']:.2f} | {row[f'ratio_n{n}']:.2f}" for n in SIZES)
        print(f"| {row['objective']} | {cells} |")

    harness.write_result(
        args.output,
        {
            "dim": DIM,
            "sizes": list(SIZES),
            "threads": args.threads,
            "rounds": args.rounds,
            "device": "cpu",
            "dtype": "float32",
            "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(),
            "results": results,
        },
        invocation,
    )


if __name__ == "__main__":
    main()
