"""Seconds per SimCSE training step on this machine for several encoder sizes, and the fit
seconds = overhead + FLOPs / rate by least squares.

    python -m benchmarks.step_throughput [--device cpu|cuda] [--steps 10] [--out PATH]

Times full training steps (two dropout views through a randomly initialised BERT encoder, InfoNCE,
backward, AdamW) with a bare loop, not the stage's trainer; the per-size rows show how well the
fit holds. No estimate reads its record (benchmarks/rates.py says why). Writes
benchmarks/results/step_throughput_<device>.json."""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import BertConfig, BertModel

from benchmarks import harness
from stages.core.planning.estimates import Architecture, train_step_flops
from stages.objectives.infonce import InfoNCE

# (layers, hidden, batch): from the smoke preset's size up to what two CPU cores time in seconds
CPU_SIZES = ((2, 64, 64), (2, 128, 64), (4, 256, 64), (6, 384, 64))
GPU_SIZES = ((6, 384, 64), (12, 768, 64), (24, 1024, 64), (12, 768, 128))
SEQ_LEN = 32
VOCAB = 30522


def time_steps(arch: Architecture, batch: int, device: str, steps: int) -> float:
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=arch.hidden,
        num_hidden_layers=arch.layers,
        num_attention_heads=max(1, arch.hidden // 64),
        intermediate_size=arch.intermediate,
    )
    model = BertModel(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    ids = torch.randint(1000, VOCAB, (batch, SEQ_LEN), device=device)
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=device == "cuda")
    infonce = InfoNCE(name="infonce", tau=0.05)

    def step() -> None:
        with autocast:
            cls = model(input_ids=torch.cat([ids, ids])).last_hidden_state[:, 0]
        loss = infonce(cls[:batch], cls[batch:], tau=0.05, triplets=None).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):  # warm-up: allocator, kernels
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    with harness.stopwatch() as elapsed:
        for _ in range(steps):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
    return elapsed.seconds / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--out", type=Path, help="default: benchmarks/results/step_throughput_<device>.json"
    )
    args = parser.parse_args()
    invocation = harness.begin(__file__)
    sizes = GPU_SIZES if args.device == "cuda" else CPU_SIZES

    rows = []
    for layers, hidden, batch in sizes:
        arch = Architecture(layers=layers, hidden=hidden, intermediate=4 * hidden)
        seconds = time_steps(arch, batch, args.device, args.steps)
        flops = train_step_flops(arch, batch, SEQ_LEN)
        rows.append({"layers": layers, "hidden": hidden, "batch": batch, "seq_len": SEQ_LEN,
                     "flops": flops, "seconds_per_step": round(seconds, 5)})  # fmt: skip
        print(f"{layers:>2} layers x {hidden:>4}, batch {batch:>3}: {seconds * 1e3:8.1f} ms/step")

    design = np.array([[1.0, r["flops"]] for r in rows])
    measured = np.array([r["seconds_per_step"] for r in rows])
    (overhead, seconds_per_flop), *_ = np.linalg.lstsq(design, measured, rcond=None)
    for row, fitted in zip(rows, design @ [overhead, seconds_per_flop], strict=True):
        row["fitted_seconds"] = round(float(fitted), 5)
    fit = {"flops_per_second": float(1 / seconds_per_flop), "step_seconds": float(overhead)}
    print(f"fit: {fit['flops_per_second'] / 1e9:.1f} GFLOP/s sustained, "
          f"{fit['step_seconds'] * 1e3:.1f} ms fixed per step")  # fmt: skip

    name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor()
    result = {
        "machine": {"device": args.device, "name": name, "cpus": os.cpu_count(),
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "threads": torch.get_num_threads()},
        "fit": fit,
        "rows": rows,
    }  # fmt: skip
    out = args.out or harness.RESULTS / f"step_throughput_{args.device}.json"
    harness.write_result(out, result, invocation)


if __name__ == "__main__":
    main()
