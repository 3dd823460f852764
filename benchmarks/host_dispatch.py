"""Operators a training step dispatches from the host, taken the GPU way on the CPU, for a
BERT-base-deep encoder: the count that bounds a GPU step's rate at batch 64 (docs/training.md,
"GPU estimate on paper").

    python benchmarks/host_dispatch.py [--steps 4]

On a GPU at batch 64, length 32, BERT-base's arithmetic is ~1.5 ms a step and the host's
dispatch ~15 µs an operator (measured on a lent H200), so the operators a step dispatches decide
its rate. This script counts them without a GPU: the stage's own loop trains a randomly
initialised 12-layer encoder (width 64: the count depends on the layers, not the width) on the
wiki1m head sample at batch 64 with every device-dependent choice as on a GPU: torch's dropout
modules (``FastDropout`` is the CPU's), SDPA attention, PyTorch's Linear (not oneDNN's), the
unpadded forward's dropout on the padded layout (``padded_dropout``'s GPU way), no filler rows.
Counted under torch.profiler: operators called from Python or by autograd (not those an
operator calls itself), per step, by the loop's phase (``step.*``) and by name; unpadded and
padded, fp32 and bf16 autocast. Where it differs from a GPU's: SDPA with dropout runs the
CPU's math composite, whose backward is ~8 autograd nodes a layer against a fused kernel's one
(~100 more a step); and it counts operators, not CUDA launches (one for most, none for views).

Writes benchmarks/results/host_dispatch.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness
from benchmarks.train_cpu import BATCH, no_evaluation, ours
from benchmarks.train_overhead import is_operator, save_tiny_model
from stages.core.schema.params import BackboneParams, RandomInit
from stages.modeling import unpadded
from stages.training import loop, parts, runtime

DEEP_NARROW = RandomInit(
    hidden_size=64, num_hidden_layers=12, num_attention_heads=2, intermediate_size=256
)


def the_gpu_way() -> list[mock._patch]:
    """Patches that make the CPU run the Python path a GPU runs (see the module docstring)."""
    resolve = loop.resolve_runtime

    def pytorch_linear(*args, **kwargs):
        return dataclasses.replace(resolve(*args, **kwargs), onednn_linear=False)

    return [
        mock.patch.object(unpadded, "_launch_bound", lambda device: True),
        mock.patch.object(parts, "use_fast_dropout", lambda model: 0),
        mock.patch.object(loop, "resolve_runtime", pytorch_linear),
        mock.patch.object(runtime.Runtime, "packed_rows_multiple", property(lambda self: 1)),
    ]


def dispatched(corpus: Path, model: Path, precision: str, unpad: bool, args, workdir: Path):
    """Operators per step of ``args.steps`` steps after ``args.warmup``, by phase and name."""
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    start, stop = args.warmup, args.warmup + args.steps  # and one step after: not the run's end

    def around(i: int) -> None:
        if i == start:
            prof.start()
        elif i == stop:
            prof.stop()

    patches = the_gpu_way()
    for patch in patches:
        patch.start()
    try:
        ours(
            corpus, stop + 1, precision, workdir, no_evaluation, 10**9,
            backbone=BackboneParams(model=str(model)), unpad=unpad, around_step=around,
        )  # fmt: skip
    finally:
        for patch in patches:
            patch.stop()
    by_phase: Counter = Counter()
    by_name: Counter = Counter()
    for event in prof.events():
        parent = event.cpu_parent
        if not is_operator(event.name) or (parent is not None and is_operator(parent.name)):
            continue
        while parent is not None and not parent.name.startswith("step."):
            parent = parent.cpu_parent
        by_phase[parent.name.removeprefix("step.") if parent is not None else "loop"] += 1
        by_name[event.name] += 1
    return {
        "per_step": sum(by_phase.values()) / args.steps,
        "by_phase": {k: v / args.steps for k, v in by_phase.most_common()},
        "by_operator": {k: v / args.steps for k, v in by_name.most_common(25)},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=4, help="steps counted")
    p.add_argument("--warmup", type=int, default=3, help="steps before them")
    p.add_argument("--data-dir", type=Path, default=harness.data_dir())
    p.add_argument("--out", type=Path, default=harness.RESULTS / "host_dispatch.json")
    args = p.parse_args()
    invocation = harness.begin(__file__)
    torch.set_num_threads(2)
    corpus = args.data_dir / "corpus" / "wiki1m_head_11913.txt"
    workdir = Path(tempfile.mkdtemp(prefix="bench-host-dispatch-"))
    model = save_tiny_model(workdir / "deep", DEEP_NARROW)
    result: dict[str, Any] = {
        "setup": {"model": "random BERT 12 x 64 (FFN 256), all-MiniLM-L6-v2 tokenizer",
                  "batch_size": BATCH, "max_seq_length": 32, "steps": args.steps,
                  "torch": torch.__version__},
    }  # fmt: skip
    for precision in ("fp32", "bf16"):
        for unpad in (True, False):
            key = f"{'unpadded' if unpad else 'padded'}_{precision}"
            result[key] = dispatched(corpus, model, precision, unpad, args, workdir)
            print(f"{key}: {json.dumps(result[key]['by_phase'])}", flush=True)
    print(json.dumps({k: v["per_step"] for k, v in result.items() if k != "setup"}, indent=2))
    harness.write_result(args.out, result, invocation)


if __name__ == "__main__":
    main()
