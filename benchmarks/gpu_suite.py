"""One prepared device suite (issues 42, 52): the GPU figures of a lent H100 or H200, in calls
that each fit 8 minutes, each written to one JSON as it goes.

    python -m benchmarks.gpu_suite                 # call 1 on the GPU: results/gpu_suite_<gpu>.json
    python -m benchmarks.gpu_suite --call 2        # then 2 and 3: gpu_suite_<gpu>_call<N>.json
    python -m benchmarks.gpu_suite --smoke --out /tmp/gpu_suite_smoke.json  # every part, on a CPU

The stage's trainer, through benchmarks/train_gpu.py's runs, on randomly initialised encoders of
BERT-base's and BERT-large's sizes, batch 64, max length 32, STS-B dev every 125 steps, every
other setting params.yaml's (precision auto: bf16 on the GPU), on a corpus of full batches (the
sample's lines cut to a multiple of 64: no short last batch, a new shape for CUDA graphs, falls
in a timed window):

- ``default``: params.yaml's train settings as they stand; the settings the trainer resolved
  them to are recorded from its config.json's execution record (``execution``);
- ``unpadded_graphs``: ``compile: reduce-overhead``, ``unpad: true`` (each step packed into one
  of a few fixed token-count buckets); ``padded_graphs``: ``compile: reduce-overhead``,
  ``unpad: false``. Where the default resolved to a config's very settings, its run stands for
  that config (``same_as``) rather than being timed twice;
- ``compiled_vs_eager``: for each graph config, gpu_checks.compiled_step_check: the compiled
  step's loss and gradients against the eager step's on one batch (dropout off, within the
  precision's bound), and two replays with dropout on drawing different masks;
- ``arccse``: ArcCSE at presets/arccse.yaml's settings for BERT-base (max_seq_length 512, the
  triplet stream at up to 512 tokens, SAM, length-grouped batches; triplets made from the
  corpus with the preset's masking), ``default`` as the preset states it and
  ``accumulation``: presets/arccse_ablation.yaml's arccse-bs32-acc2 (batch 32, 2 micro-batches
  per update), both with ``compile: auto`` as resolved (recorded in ``execution``);
- ``peer`` (BERT-base): sentence-transformers' trainer (train_gpu.py's peer) in the same
  precision, on the same corpus, at the same batch, training only;
- ``sharing`` (BERT-base): k = 1, 2 and 4 training processes on the one device at once, at the
  default settings, each a process of its own as the pipeline's jobs are: past its warm-up
  steps each waits at a file barrier, so that the k steady phases start together; each run's
  rate and their sum are taken over the window where all k train;
- then benchmarks/gpu_checks.py's checks of the unpadded forward on the device.

Rates are steady: the interval between the ends of consecutive steps after the warm-up steps,
whose time (process start, model, compilation, CUDA graph recording) is recorded apart
(``warmup_s``). ``steady_steps_per_s`` includes the dev evaluations (the protocol's rate);
``training_steps_per_s`` leaves out the intervals that hold one.

``decision`` is the reading that decides the default: whether the unpadded graphs are to
replace the padded ones (``train.compile: auto``'s choice on one GPU), i.e. the unpadded
graphs' training steps/s over the padded graphs' (BERT-base) and whether both compiled steps
agree with the eager step. ``ratios`` (BERT-base): the default's steps/s, the best single run's,
the k runs' summed rate over one run's, ours over the peer; ``by_size`` the same per size.

Time: ``PLAN`` gives every part, its call, its steps and its planned seconds on one H100, from
the measured ~65 s of a padded-graph compile of BERT-base (``COMPILE_S``); each call's plan,
the carried wheels' installation included, fits 8 minutes (``BUDGET_S``); a part that would
end past ``--limit-s`` (9 minutes: the device's command limit is 10) is skipped and listed in
``skipped``. The JSON is written (atomically) after every part, with ``finished: false`` until
the last: a call killed midway keeps every part it finished. A part that fails is recorded with
its error and the suite goes on; the exit status is then 1, as it is when a check fails.

``--smoke``: every call's parts on the CPU: tiny encoders, a few steps; the graph configs
compile for real under inductor (``torch.compile`` with ``mode="reduce-overhead"`` compiles as
on a GPU and runs without CUDA graphs, which need CUDA: ``cuda_graphs`` says where they ran).
Its JSON has the same shape and never goes to benchmarks/results/.

On the device the suite needs the corpus and STS-B dev (``CSE_DATA_DIR``) and, where the image
lacks them, the packages the peer and the pipeline's code import, carried as wheels:
benchmarks/carry_wheels.sh prepares both in .whl/ (docs/benchmarks.md, "GPU suite").
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gpu_checks, harness, train_gpu
from stages.core.schema.params import BackboneParams, TrainParams, load_params
from stages.core.storage.run_folders import CONFIG_FILE
from stages.masked_triplets.file_format import write_triplets
from stages.masked_triplets.masking import MaskingTokenizer, generate_triplets
from stages.modeling.backbone import load_tokenizer
from stages.objectives.registry import build_objective
from stages.training import loop
from stages.training.data import read_corpus
from stages.training.job import standalone_run
from stages.training.run_folder import stsb_dev_evaluator

BATCH = 64
EVAL_STEPS = 125
WARMUP_STEPS = 25  # left out of the steady rates: allocation, compilation, graph recording
SIZES = ("base", "large")
KS = (1, 2, 4)
SHARING_SIZE = PEER_SIZE = DECISION_SIZE = "base"
# The settings each config sets over params.yaml's train section ("default": none).
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "unpadded_graphs": {"compile": "reduce-overhead", "unpad": True},
    "padded_graphs": {"compile": "reduce-overhead", "unpad": False},
}
GRAPH_CONFIGS = ("unpadded_graphs", "padded_graphs")
# ArcCSE's configs: (preset, method), resolved for BERT-base.
ARCCSE_CONFIGS = {
    "default": ("presets/arccse.yaml", "arccse"),
    "accumulation": ("presets/arccse_ablation.yaml", "arccse-bs32-acc2"),
}
# The train settings every run's protocol sets (the rest are params.yaml's or the preset's).
PROTOCOL_KEYS = (
    "batch_size", "max_seq_length", "epochs", "max_steps", "eval_steps", "checkpoint_steps",
    "log_steps",
)  # fmt: skip
WORKER_RESULT = "GPU_SUITE_WORKER_RESULT "
BARRIER_TIMEOUT_S = 600


# The time budget


BUDGET_S = 8 * 60  # a whole device call, the wheels' installation included
LIMIT_S = 9 * 60  # a part that would end past this is skipped: the device's command limit is 10
INSTALL_S = 20  # pip installing the carried wheels, before the suite starts
START_S = 25  # interpreter, imports, the corpus cut to full batches and tokenised, triplets
COMPILE_S = 65  # measured: BERT-base's training step compiled for padded CUDA graphs (issue 52)


@dataclass(frozen=True)
class Part:
    """A part of the suite, the device call it belongs to, and its plan on one H100: ``steps``
    (per process), the steady rate expected of them, and ``warmup_s``, the seconds before the
    steady rate (process start, model, compilation, CUDA graph recording)."""

    name: str
    call: int
    steps: int
    steps_per_s: float
    warmup_s: float

    @property
    def planned_s(self) -> float:
        return self.warmup_s + (self.steps / self.steps_per_s if self.steps else 0.0)


# Rates from the recorded H100/H200 runs (docs/benchmarks.md, "Training on GPU": 53.7 steps/s
# with padded graphs, 22 eager, peer 16.8); BERT-large's from its ~3x FLOPs, its compile from
# its 2x layers; ArcCSE's (SAM's two passes over 64 pairs and 64 triplets of up to 512 tokens)
# and the 2-layer checks' compiles are estimates until a device run records them (each part's
# ``warmup_s``). k = 2's and 4's compiles are planned shorter than a cold one (45 and 60 s for
# k processes at once): they repeat k = 1's graph, from inductor's on-disk cache. Parts in the order
# they run, each call's by priority: the deciding figures first, the least certain plan (ArcCSE
# under graphs: a graph recorded for each new pair of lengths) last. ``padded_graphs``
# is planned as the default's run (same_as), which it is where ``auto`` resolves to padded
# graphs on one GPU.
PLAN: dict[str, Part] = {
    part.name: part
    for part in (
        Part("base/default", 1, 250, 55.0, COMPILE_S + 10),
        Part("base/unpadded_graphs", 1, 250, 50.0, COMPILE_S + 15),
        Part("base/padded_graphs", 1, 0, 1.0, 0.0),
        Part("compiled_vs_eager", 1, 0, 1.0, 80.0),
        Part("arccse/accumulation", 1, 60, 4.0, 15.0),
        Part("base/peer", 1, 250, 17.0, 15.0),
        Part("gpu_checks", 1, 0, 1.0, 20.0),
        Part("arccse/default", 1, 60, 3.0, COMPILE_S + 25),
        Part("large/default", 2, 250, 20.0, 2 * COMPILE_S),
        Part("large/unpadded_graphs", 2, 250, 18.0, 2 * COMPILE_S + 10),
        Part("large/padded_graphs", 2, 0, 1.0, 0.0),
        Part("base/sharing_k1", 3, 275, 55.0, COMPILE_S + 10),
        Part("base/sharing_k2", 3, 275, 28.0, 45.0),
        Part("base/sharing_k4", 3, 275, 14.0, 60.0),
    )
}
CALLS = (1, 2, 3)
# A config timed although the default's run was planned to stand for it (``auto`` resolved
# otherwise).
UNPLANNED = {"base": Part("", 0, 250, 55.0, COMPILE_S + 10), "large": PLAN["large/default"]}
SMOKE_STEPS, SMOKE_EVAL_STEPS, SMOKE_WARMUP = 6, 3, 1


def planned_total(call: int) -> float:
    """A device call's planned seconds, from the wheels' installation to the last part."""
    return INSTALL_S + START_S + sum(p.planned_s for p in PLAN.values() if p.call == call)


class Budget:
    """Each part's spent seconds against its plan; ``allows`` says whether a part planned at
    ``seconds`` still ends before the limit (None: no limit, the smoke run)."""

    def __init__(self, limit_s: float | None, calls: Sequence[int]) -> None:
        self.started = time.perf_counter()
        self.limit_s = limit_s
        self.calls = tuple(calls)
        self.spent: dict[str, float] = {}
        self.skipped: list[dict[str, Any]] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def allows(self, name: str, seconds: float) -> bool:
        if self.limit_s is None or self.elapsed() + seconds <= self.limit_s:
            return True
        reason = (
            f"{self.elapsed():.0f} s spent + {seconds:.0f} s planned > the {self.limit_s:.0f} s "
            "limit"
        )
        self.skipped.append({"part": name, "reason": reason})
        print(f"skipped {name}: {reason}", flush=True)
        return False

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.spent[name] = round(time.perf_counter() - began, 1)

    def record(self) -> dict[str, Any]:
        return {
            "budget_s": BUDGET_S,
            "limit_s": self.limit_s,
            "calls": list(self.calls),
            "planned_s": {
                name: round(part.planned_s, 1)
                for name, part in PLAN.items()
                if part.call in self.calls
            },
            "planned_total_s": {str(call): round(planned_total(call), 1) for call in self.calls},
            "spent_s": self.spent,
            "total_s": round(self.elapsed(), 1),
        }


# The data


def full_batches_corpus(corpus: Path, batch: int, workdir: Path) -> Path:
    """``corpus``, or its first lines in a multiple of ``batch`` written to ``workdir``: every
    batch of an epoch full (the 11,913-line sample's last would hold 9 rows, a shape of its
    own for CUDA graphs inside the timed window). Lines as the trainer reads them."""
    lines = read_corpus(corpus)
    whole = len(lines) - len(lines) % batch
    if whole == len(lines):
        return corpus
    if whole == 0:
        raise ValueError(f"{corpus}: {len(lines)} lines make no full batch of {batch}")
    trimmed = workdir / f"{corpus.stem}_first_{whole}.txt"
    trimmed.write_text("".join(line + "\n" for line in lines[:whole]), encoding="utf-8")
    return trimmed


def triplet_file(corpus: Path, backbone: BackboneParams, workdir: Path) -> Path:
    """ArcCSE's masked triplets of ``corpus`` with presets/arccse.yaml's masking, as the
    triplets stage makes them (the backbone's tokenizer)."""
    settings = load_params(harness.REPO / ARCCSE_CONFIGS["default"][0]).triplets
    tokenizer = MaskingTokenizer.from_pretrained(load_tokenizer(backbone))
    triplets, counts = generate_triplets(read_corpus(corpus), tokenizer, settings)
    path = workdir / "triplets.parquet"
    write_triplets(triplets, path)
    print(f"triplets: {counts.triplets} of {counts.lines} lines", flush=True)
    return path


# The runs


def run_args(args: argparse.Namespace, size: str) -> argparse.Namespace:
    """The namespace train_gpu.py's ``run`` and ``peer`` read, for encoder size ``size``."""
    return argparse.Namespace(
        size=size,
        smoke=args.smoke,
        precision=args.precision,
        device=args.device,
        compile=False,  # every run passes its settings
        gradient_checkpointing=False,
        log_steps=10,
        warmup=args.warmup,
        corpus=args.corpus,
    )


def default_settings(device: str) -> dict[str, Any]:
    """params.yaml's train settings but the protocol's and the run length (which the benchmark
    sets), on ``device``."""
    train = load_params(harness.REPO / "params.yaml").train.model_dump(mode="json")
    return {
        **{key: value for key, value in train.items() if key not in PROTOCOL_KEYS},
        "device": device,
    }


def on_cuda(args: argparse.Namespace) -> bool:
    return args.device != "cpu" and torch.cuda.is_available()


def cuda_graphs(compile_setting: Any, cuda: bool) -> bool:
    """Whether settings asking for ``compile_setting`` record CUDA graphs: reduce-overhead on
    CUDA; on a CPU inductor compiles the same graphs and runs them without."""
    return compile_setting == "reduce-overhead" and cuda


def resolved(measured: Mapping[str, Any]) -> tuple[Any, Any]:
    """(compile, unpadded) as a run executed them (its execution record)."""
    execution = measured.get("execution", {})
    return execution.get("compile"), execution.get("unpadded")


def timed_run(job: loop.TrainJob, evaluate, warmup: int, cuda: bool) -> dict[str, Any]:
    """``job`` trained with each step's end timed: its steady rates, warm-up, peak memory and
    execution record (an ArcCSE run: train_gpu.run builds SimCSE's)."""
    ends, hook = harness.timed_steps()
    torch._dynamo.reset()  # a fresh compilation cache, as train_gpu.run's
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    metrics = loop.train(job, evaluate, step_hook=hook)
    first = train_gpu.effective_warmup(ends, warmup)
    train = job.train
    result: dict[str, Any] = {
        "steps": len(ends),
        "seconds": metrics["timing"]["wall_s"],
        "steady_steps_per_s": train_gpu.steady_rate(ends, warmup),
        "warmup_steps": first,
        "warmup_s": ends[first] - started if ends else None,
        "execution": json.loads((job.out_dir / CONFIG_FILE).read_text())["execution"],
    }
    if train.eval_steps < len(ends):
        result["training_steps_per_s"] = train_gpu.training_rate(ends, warmup, train.eval_steps)
    if cuda:
        result["peak_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


@contextmanager
def failure_recorded(entry: dict[str, Any]) -> Iterator[None]:
    """A part that fails leaves its error in ``entry`` and the suite goes on: one broken part
    must not lose the figures of the others on a lent machine's single run."""
    try:
        yield
    except Exception as error:  # recorded, and the exit status says so
        traceback.print_exc()
        entry["error"] = f"{type(error).__name__}: {error}"


def shown(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An entry without its bulky execution record, for the progress lines."""
    return {key: value for key, value in entry.items() if key != "execution"}


# Runs sharing the device


def worker_spec(
    args: argparse.Namespace, k: int, index: int, steps: int, barrier: Path, workdir: Path
) -> dict[str, Any]:
    return {
        "size": SHARING_SIZE,
        "smoke": args.smoke,
        "precision": args.precision,
        "device": args.device,
        "warmup": args.warmup,
        "corpus": str(args.corpus),
        "senteval": str(args.senteval),
        "steps": steps,
        "eval_steps": SMOKE_EVAL_STEPS if args.smoke else EVAL_STEPS,
        "settings": default_settings(args.device),
        "k": k,
        "index": index,
        "barrier": str(barrier),
        "workdir": str(workdir),
    }


def barrier_hook(
    spec: Mapping[str, Any], clock_ends: list[float], waits: dict[str, float]
) -> Callable[[Callable[[], None]], None]:
    """A step hook that notes each step's end on the wall clock (comparable across processes)
    and, after the warm-up steps, waits until all ``k`` runs got there."""
    barrier, k, index = Path(spec["barrier"]), spec["k"], spec["index"]
    warmup = max(1, min(spec["warmup"], spec["steps"] - 2))

    def around(step: Callable[[], None]) -> None:
        step()
        clock_ends.append(time.time())
        if len(clock_ends) == warmup:
            began = time.time()
            (barrier / f"ready-{index}").touch()
            while len(list(barrier.glob("ready-*"))) < k:
                if time.time() - began > BARRIER_TIMEOUT_S:
                    raise RuntimeError(f"the other runs of k = {k} never reached the barrier")
                time.sleep(0.005)
            waits["released_at"] = time.time()
            waits["barrier_wait_s"] = waits["released_at"] - began

    return around


def worker(spec: dict[str, Any]) -> None:
    """One of the k runs sharing the device (a process of its own): prints its result."""
    args = argparse.Namespace(
        smoke=spec["smoke"], precision=spec["precision"], device=spec["device"],
        warmup=spec["warmup"], corpus=Path(spec["corpus"]),
    )  # fmt: skip
    clock_ends: list[float] = []
    waits: dict[str, float] = {}
    result = train_gpu.run(
        run_args(args, spec["size"]), BATCH, spec["steps"],
        stsb_dev_evaluator(Path(spec["senteval"])), spec["eval_steps"], Path(spec["workdir"]),
        around_step=barrier_hook(spec, clock_ends, waits), settings=spec["settings"],
    )  # fmt: skip
    result.update(waits, clock_ends=clock_ends, index=spec["index"])
    print(WORKER_RESULT + json.dumps(result), flush=True)


def run_workers(specs: list[dict[str, Any]], logs: Path, deadline: float) -> list[dict[str, Any]]:
    """Start the runs together and wait for all; one that fails (or the deadline) ends the
    others, which would otherwise wait at the barrier."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    processes = []
    for spec in specs:
        out = logs / f"k{spec['k']}-{spec['index']}.out"
        err = logs / f"k{spec['k']}-{spec['index']}.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            command = [sys.executable, "-m", "benchmarks.gpu_suite", "--worker", json.dumps(spec)]
            processes.append(
                subprocess.Popen(command, cwd=harness.REPO, env=env, stdout=stdout, stderr=stderr)
            )
    failure = None
    while any(p.poll() is None for p in processes):
        failed = [p for p in processes if p.returncode not in (None, 0)]
        if failed or time.perf_counter() > deadline:
            failure = "a run failed" if failed else "the suite's time limit passed"
            for p in processes:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.2)
    for p in processes:
        p.wait()
    results = []
    for spec, p in zip(specs, processes, strict=True):
        out = (logs / f"k{spec['k']}-{spec['index']}.out").read_text()
        lines = [line for line in out.splitlines() if line.startswith(WORKER_RESULT)]
        if p.returncode != 0 or not lines:
            tail = (logs / f"k{spec['k']}-{spec['index']}.err").read_text()[-3000:]
            print(tail, file=sys.stderr, flush=True)
            raise RuntimeError(
                f"run {spec['index']} of k = {spec['k']} exited {p.returncode}"
                + (f" ({failure})" if failure else "")
                + f": {tail.strip().splitlines()[-1] if tail.strip() else 'no output'}"
            )
        results.append(json.loads(lines[-1][len(WORKER_RESULT) :]))
    return results


def window_rates(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each run's steps per second over the window where all train: from the last release at
    the barrier to the first run's last step end, between its first and last step end there."""
    start = max(run["released_at"] for run in runs)
    end = min(run["clock_ends"][-1] for run in runs)
    per_run = []
    for run in runs:
        inside = [t for t in run["clock_ends"] if start < t <= end]
        if len(inside) >= 2:
            per_run.append((len(inside) - 1) / (inside[-1] - inside[0]))
        else:  # too short a window (a smoke run): the run's own steady rate
            per_run.append(run["steady_steps_per_s"])
    return {
        "window_s": end - start,
        "per_run_steps_per_s": per_run,
        "summed_steps_per_s": sum(per_run),
    }


def release_device() -> None:
    """Give back what this process's runs hold on the device (compiled graphs and their memory
    pools, cached blocks) before other processes train on it."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# The suite


class Suite:
    """The parts of the calls asked for, run in ``PLAN``'s order into one record, written
    (atomically, ``finished: false``) after every part: a call killed midway keeps the parts
    it finished."""

    def __init__(
        self,
        args: argparse.Namespace,
        invocation: harness.Invocation,
        device: str,
        workdir: Path,
    ) -> None:
        self.args, self.invocation, self.workdir = args, invocation, workdir
        self.cuda = on_cuda(args)
        self.budget = Budget(args.limit_s, args.calls)
        self.evaluate = stsb_dev_evaluator(args.senteval)
        self.eval_steps = SMOKE_EVAL_STEPS if args.smoke else EVAL_STEPS
        self.triplets: Path | None = None
        sizes = sorted({name.split("/")[0] for name in self.parts() if "/" in name} & set(SIZES))
        self.record: dict[str, Any] = {
            "finished": False,
            "device": device,
            "smoke": args.smoke,
            "calls": list(args.calls),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "load_average_before": invocation.load_average_before,
            "protocol": {
                "batch_size": BATCH,
                "max_seq_length": train_gpu.MAX_LENGTH,
                "eval_steps": self.eval_steps,
                "warmup_steps": args.warmup,
                "precision": args.precision,
                "device": args.device,
                "corpus": str(args.corpus),
                "senteval": str(args.senteval),
            },
            "sizes": {
                size: train_gpu.model_size(run_args(args, size)).model_dump() for size in sizes
            },
            "configs": [],
            "compiled_vs_eager": [],
            "arccse": [],
            "peer": None,
            "sharing": [],
            "gpu_checks": None,
        }

    def parts(self) -> list[str]:
        return [name for name, part in PLAN.items() if part.call in self.args.calls]

    def run(self) -> None:
        for name in self.parts():
            self.run_part(name)
            self.write()
        self.record["finished"] = True
        self.write()

    def run_part(self, name: str) -> None:
        group, _, item = name.partition("/")
        if group in SIZES and item in CONFIGS:
            self.config(group, item)
        elif group == "arccse":
            self.arccse(item)
        elif item == "peer":
            self.peer()
        elif item.startswith("sharing_k"):
            self.sharing(int(item.removeprefix("sharing_k")))
        elif name == "compiled_vs_eager":
            self.compiled_vs_eager()
        elif name == "gpu_checks":
            self.gpu_checks()
        else:
            raise ValueError(f"PLAN names a part the suite cannot run: {name}")

    def write(self) -> None:
        """The record as it stands, its figures derived anew (atomically: harness)."""
        configs, sharing, peer = self.record["configs"], self.record["sharing"], self.record["peer"]
        self.record.update(
            load_average_after=harness.load_average(),
            ratios=ratios(configs, sharing, peer, "base"),
            by_size={size: ratios(configs, sharing, peer, size) for size in self.record["sizes"]},
            decision=decision(configs, self.record["compiled_vs_eager"]),
            skipped=self.budget.skipped,
            budget=self.budget.record(),
        )
        harness.write_result(self.args.out, self.record, self.invocation)

    def failures(self) -> list[str]:
        """The parts that failed and the checks that did not pass."""
        record = self.record
        labelled = [
            *((f"{c['size']}/{c['name']}", c) for c in record["configs"]),
            *((f"compiled_vs_eager {c['config']}", c) for c in record["compiled_vs_eager"]),
            *((f"arccse/{c['name']}", c) for c in record["arccse"]),
            *((f"sharing k = {c['k']}", c) for c in record["sharing"]),
            ("peer", record["peer"]),
            ("gpu_checks", record["gpu_checks"]),
        ]
        failed = [
            f"{label}: {entry['error']}" for label, entry in labelled if entry and "error" in entry
        ]
        failed += [
            f"compiled_vs_eager {c['config']}: not passed"
            for c in record["compiled_vs_eager"]
            if c.get("passed") is False
        ]
        checks = record["gpu_checks"]
        if checks and "error" not in checks and checks["passed"] != checks["total"]:
            failed.append(f"gpu_checks: {checks['passed']} of {checks['total']} passed")
        return failed

    # The parts

    def config(self, size: str, name: str) -> None:
        """One of CONFIGS on an encoder of ``size``: the default's run first, a later config
        with its resolved settings ``same_as`` it."""
        part = f"{size}/{name}"
        settings = {**default_settings(self.args.device), **CONFIGS[name]}
        entry: dict[str, Any] = {
            "name": name,
            "size": size,
            "settings": {key: settings[key] for key in ("precision", "compile", "unpad")},
            "cuda_graphs": cuda_graphs(settings["compile"], self.cuda),
        }
        effective = (settings["compile"], settings["unpad"])
        timed = [c for c in self.record["configs"] if c["size"] == size and "execution" in c]
        twin = next((c for c in timed if resolved(c) == effective), None)
        if twin is not None:  # the default already ran with these settings: its run is this one
            entry["same_as"] = twin["name"]
            entry.update({k: v for k, v in twin.items() if k not in entry and k != "same_as"})
            self.record["configs"].append(entry)
            return
        plan = PLAN[part] if PLAN[part].steps else UNPLANNED[size]
        if not self.budget.allows(part, plan.planned_s):
            return
        steps = SMOKE_STEPS if self.args.smoke else plan.steps
        with self.budget.part(part), failure_recorded(entry):
            entry.update(
                train_gpu.run(
                    run_args(self.args, size),
                    BATCH,
                    steps,
                    self.evaluate,
                    self.eval_steps,
                    self.workdir,
                    settings=settings,
                )
            )
        print(json.dumps(shown(entry)), flush=True)
        self.record["configs"].append(entry)

    def compiled_vs_eager(self) -> None:
        """gpu_checks.compiled_step_check of each graph config, on gpu_checks.CHECK_SIZE's
        encoder in the smoke run too: the tiny smoke encoders embed every sentence alike, where
        the loss's gradient is all but cancelled and rounding alone moves it by 1e-3."""
        part = "compiled_vs_eager"
        if not self.budget.allows(part, PLAN[part].planned_s):
            return
        size = gpu_checks.CHECK_SIZE
        backbone = BackboneParams(model=gpu_checks.BACKBONE.model, random_init=size)
        with self.budget.part(part):
            for name in GRAPH_CONFIGS:
                settings = {**default_settings(self.args.device), **CONFIGS[name]}
                train = TrainParams(
                    **settings, batch_size=BATCH, max_seq_length=train_gpu.MAX_LENGTH,
                    max_steps=1, eval_steps=1, checkpoint_steps=10**9, log_steps=1,
                )  # fmt: skip
                entry: dict[str, Any] = {"config": name, "encoder": size.model_dump()}
                with failure_recorded(entry):
                    entry.update(
                        gpu_checks.compiled_step_check(
                            train, backbone, self.args.corpus, self.workdir
                        )
                    )
                print(json.dumps(entry), flush=True)
                self.record["compiled_vs_eager"].append(entry)
                self.write()

    def arccse(self, name: str) -> None:
        """ArcCSE at its preset's settings for BERT-base (ARCCSE_CONFIGS), BERT-base-sized."""
        part = f"arccse/{name}"
        if not self.budget.allows(part, PLAN[part].planned_s):
            return
        preset, method = ARCCSE_CONFIGS[name]
        entry: dict[str, Any] = {"name": name, "preset": preset, "method": method}
        steps = SMOKE_STEPS if self.args.smoke else PLAN[part].steps
        with self.budget.part(part), failure_recorded(entry):
            resolved_method = load_params(harness.REPO / preset).resolve(method, "bert-base")
            train = TrainParams.model_validate(
                {
                    **resolved_method.train.model_dump(),
                    "max_steps": steps, "eval_steps": self.eval_steps,
                    "checkpoint_steps": 10**9, "log_steps": 10,
                    "device": self.args.device, "precision": self.args.precision,
                }
            )  # fmt: skip
            entry["settings"] = {
                key: getattr(train, key)
                for key in (
                    "batch_size", "gradient_accumulation_steps", "max_seq_length", "sampling",
                    "triplet_batching", "compile", "unpad", "precision",
                )
            } | {"sam": train.sam.enabled}  # fmt: skip
            backbone = train_gpu.backbone_spec(run_args(self.args, "base"))
            if self.triplets is None:
                self.triplets = triplet_file(self.args.corpus, backbone, self.workdir)
            run = standalone_run(
                train, backbone, self.args.corpus, name=f"arccse-{name}",
                backbone_name="bert-base-size-random", temperature=resolved_method.temperature,
                triplets=self.triplets,
            )  # fmt: skip
            out = Path(tempfile.mkdtemp(dir=self.workdir))
            objective = build_objective(resolved_method.objective)
            job = loop.TrainJob(run, objective, out, self.workdir / "tokenized")
            entry.update(timed_run(job, self.evaluate, self.args.warmup, self.cuda))
            entry["cuda_graphs"] = cuda_graphs(entry["execution"]["compile"], self.cuda)
        print(json.dumps(shown(entry)), flush=True)
        self.record["arccse"].append(entry)

    def peer(self) -> None:
        part = f"{PEER_SIZE}/peer"
        if not self.budget.allows(part, PLAN[part].planned_s):
            return
        entry: dict[str, Any] = {"size": PEER_SIZE}
        steps = SMOKE_STEPS if self.args.smoke else PLAN[part].steps
        with self.budget.part(part), failure_recorded(entry):
            entry.update(train_gpu.peer(run_args(self.args, PEER_SIZE), BATCH, steps, self.workdir))
        print(json.dumps(entry), flush=True)
        self.record["peer"] = entry

    def sharing(self, k: int) -> None:
        """k runs of the default settings at once, each a process of its own."""
        part = f"{SHARING_SIZE}/sharing_k{k}"
        if not self.budget.allows(part, PLAN[part].planned_s):
            return
        release_device()
        steps = SMOKE_STEPS if self.args.smoke else PLAN[part].steps
        barrier = self.workdir / f"barrier-k{k}"
        barrier.mkdir()
        specs = [worker_spec(self.args, k, i, steps, barrier, self.workdir) for i in range(k)]
        settings = specs[0]["settings"]
        entry: dict[str, Any] = {
            "k": k,
            "size": SHARING_SIZE,
            "steps_per_run": steps,
            "settings": {key: settings[key] for key in ("precision", "compile", "unpad")},
        }
        limit = self.args.limit_s
        deadline = self.budget.started + limit if limit else float("inf")
        with self.budget.part(part), failure_recorded(entry):
            runs = run_workers(specs, self.workdir, deadline)
            entry.update(window_rates(runs))
            entry["runs"] = [
                {
                    "index": run["index"],
                    "steady_steps_per_s": run["steady_steps_per_s"],
                    "training_steps_per_s": run.get("training_steps_per_s"),
                    "warmup_s": run["warmup_s"],
                    "barrier_wait_s": run.get("barrier_wait_s"),
                    "peak_memory_allocated_gib": run.get("peak_memory_allocated_gib"),
                    "eval_seconds": run["eval_seconds"],
                    "execution": {
                        key: run["execution"].get(key)
                        for key in ("compile", "unpadded", "precision", "device_name")
                    },
                }
                for run in runs
            ]
        sharing = self.record["sharing"]
        sharing.append(entry)
        single = next((s for s in sharing if s["k"] == 1 and "summed_steps_per_s" in s), None)
        for shared in sharing:
            if single is not None and "summed_steps_per_s" in shared:
                shared["summed_over_single"] = (
                    shared["summed_steps_per_s"] / single["summed_steps_per_s"]
                )
        print(json.dumps(entry), flush=True)

    def gpu_checks(self) -> None:
        if not self.budget.allows("gpu_checks", PLAN["gpu_checks"].planned_s):
            return
        device = torch.device("cuda" if self.cuda else "cpu")
        size = train_gpu.SMOKE if self.args.smoke else train_gpu.BERT_BASE
        backbone = BackboneParams(model=gpu_checks.BACKBONE.model, random_init=size)
        entry: dict[str, Any] = {"device": str(device)}
        with self.budget.part("gpu_checks"), failure_recorded(entry):
            results = gpu_checks.forward_checks(device, self.args.corpus, backbone)
            passed = sum(r["passed"] for r in results)
            entry.update(passed=passed, total=len(results), checks=results)
            print(f"gpu_checks: {passed} of {len(results)} passed", flush=True)
        self.record["gpu_checks"] = entry


# The record


def ratios(
    configs: Sequence[Mapping[str, Any]],
    sharing: Sequence[Mapping[str, Any]],
    peer: Mapping[str, Any] | None,
    size: str,
) -> dict[str, Any]:
    """The figures the issue's targets read, for ``size`` (None where not measured)."""
    timed = [c for c in configs if c["size"] == size and "steady_steps_per_s" in c]
    default = next((c for c in timed if c["name"] == "default"), None)
    best = max(timed, key=lambda c: c["steady_steps_per_s"], default=None)
    peer_rate = peer.get("steady_steps_per_s") if peer and peer["size"] == size else None
    shared = [s for s in sharing if s["size"] == size and "summed_over_single" in s]
    return {
        "default_steps_per_s": default["steady_steps_per_s"] if default else None,
        "default_resolved": dict(zip(("compile", "unpadded"), resolved(default), strict=True))
        if default
        else None,
        "best_single_run_steps_per_s": best["steady_steps_per_s"] if best else None,
        "best_single_run_config": best["name"] if best else None,
        "sharing_summed_over_single": {str(s["k"]): s["summed_over_single"] for s in shared}
        or None,
        "ours_over_peer": default["training_steps_per_s"] / peer_rate
        if default and peer_rate and "training_steps_per_s" in default
        else None,
        "ours_with_dev_over_peer": default["steady_steps_per_s"] / peer_rate
        if default and peer_rate
        else None,
    }


def decision(
    configs: Sequence[Mapping[str, Any]], checks: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Whether the unpadded graphs are to replace the padded graphs as ``auto``'s choice on
    one GPU: only when measured faster (BERT-base's training steps/s, the dev evaluations'
    intervals left out: they are alike in both) and agreeing with the eager step, as the
    padded graphs must too."""
    rates = {
        c["name"]: c.get("training_steps_per_s")
        for c in configs
        if c["size"] == DECISION_SIZE and c["name"] in GRAPH_CONFIGS
    }
    agree = {c["config"]: c.get("passed") for c in checks}
    unpadded, padded = rates.get("unpadded_graphs"), rates.get("padded_graphs")
    ratio = unpadded / padded if unpadded and padded else None
    if ratio is None or not all(agree.get(name) is not None for name in GRAPH_CONFIGS):
        missing = [name for name in GRAPH_CONFIGS if not rates.get(name)]
        missing += [f"{name}'s check" for name in GRAPH_CONFIGS if agree.get(name) is None]
        verdict = f"undecided: not measured ({', '.join(missing)})"
    elif ratio > 1 and all(agree[name] for name in GRAPH_CONFIGS):
        verdict = (
            f"make unpadded graphs the default: {ratio:.3f}x the padded graphs' rate, both "
            "agreeing with eager"
        )
    else:
        reasons = [f"{ratio:.3f}x the padded graphs' rate"] + [
            f"{name} disagree with eager" for name in GRAPH_CONFIGS if not agree[name]
        ]
        verdict = f"keep padded graphs the default: unpadded graphs {'; '.join(reasons)}"
    return {
        "size": DECISION_SIZE,
        "unpadded_graphs_training_steps_per_s": unpadded,
        "padded_graphs_training_steps_per_s": padded,
        "unpadded_over_padded_graphs": ratio,
        "agrees_with_eager": {name: agree.get(name) for name in GRAPH_CONFIGS},
        "verdict": verdict,
    }


def device_slug(name: str) -> str:
    """'h100' or 'h200' from torch's name of the GPU ("NVIDIA H100 80GB HBM3"), else the name
    in lower case and underscores."""
    lowered = name.lower()
    for kind in ("h100", "h200"):
        if kind in lowered:
            return kind
    return re.sub(r"[^a-z0-9]+", "_", lowered).strip("_")


def record_name(device: str, calls: Sequence[int]) -> str:
    """gpu_suite_<gpu>.json for call 1, gpu_suite_<gpu>_call<N>.json for another."""
    suffix = "" if list(calls) == [1] else "_call" + "_".join(map(str, calls))
    return f"gpu_suite_{device_slug(device)}{suffix}.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny encoders, a few steps, on the CPU")
    p.add_argument(
        "--call",
        type=int,
        choices=CALLS,
        default=None,
        help="which call's parts (PLAN; default: 1; with --smoke: all)",
    )
    p.add_argument(
        "--device",
        default=None,
        choices=["auto", "cpu", "cuda"],
        help="default: auto (cpu with --smoke)",
    )
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--warmup", type=int, default=None, help=f"default {WARMUP_STEPS}")
    p.add_argument(
        "--limit-s",
        type=float,
        default=None,
        help=f"skip a part that would end past this (default {LIMIT_S}; none with --smoke)",
    )
    p.add_argument("--corpus", type=Path, default=None)
    p.add_argument("--senteval", type=Path, default=None)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: benchmarks/results/gpu_suite_<gpu>[_call<N>].json; with --smoke a "
        "temporary folder's (never benchmarks/results/)",
    )
    p.add_argument(
        "--commit",
        default=None,
        help="the commit the tree was copied from, recorded where it has no git (a "
        "lent device's copy; benchmarks/carry_wheels.sh writes it to .whl/commit)",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)  # one run of the sharing part
    args = p.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    invocation = harness.begin(__file__)
    if invocation.commit is None and args.commit:
        commit, _, state = args.commit.partition("+")
        invocation = dataclasses.replace(invocation, commit=commit, dirty=state == "dirty")
    if args.smoke and args.out and args.out.resolve().is_relative_to(harness.RESULTS.resolve()):
        p.error("--smoke never writes to benchmarks/results/: give --out elsewhere")
    args.calls = [args.call] if args.call else list(CALLS) if args.smoke else [1]
    args.device = args.device or ("cpu" if args.smoke else "auto")
    args.warmup = (
        args.warmup if args.warmup is not None else SMOKE_WARMUP if args.smoke else WARMUP_STEPS
    )
    if args.limit_s is None and not args.smoke:
        args.limit_s = LIMIT_S
    workdir = Path(tempfile.mkdtemp(prefix="bench-gpu-suite-"))
    if args.corpus is None:
        wiki = train_gpu.default_path("corpus/wiki1m.txt")
        args.corpus = (
            wiki if wiki.is_file() else train_gpu.default_path("corpus/wiki1m_head_11913.txt")
        )
    if not args.corpus.is_file():
        p.error(f"corpus {args.corpus}: no such file (--corpus, or CSE_DATA_DIR's corpus/)")
    try:
        args.corpus = full_batches_corpus(args.corpus, BATCH, workdir)
    except ValueError as err:
        p.error(str(err))
    args.senteval = args.senteval or train_gpu.default_path("senteval")
    device = torch.cuda.get_device_name() if on_cuda(args) else "cpu"
    if args.out is None:
        folder = workdir if args.smoke else harness.RESULTS
        args.out = folder / record_name(device if not args.smoke else "smoke", args.calls)
    suite = Suite(args, invocation, device, workdir)
    suite.run()
    failures = suite.failures()
    print(f"decision: {suite.record['decision']['verdict']}", flush=True)
    if failures:
        print(f"{len(failures)} failure(s): " + "; ".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
