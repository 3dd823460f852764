"""One prepared device suite (issue 42): the GPU figures of a lent H100 or H200, in one command
that fits 8 minutes, written to one JSON.

    python -m benchmarks.gpu_suite                 # on the GPU: results/gpu_suite_<gpu>.json
    python -m benchmarks.gpu_suite --smoke --out /tmp/gpu_suite_smoke.json  # on a CPU: a check

The stage's trainer, through benchmarks/train_gpu.py's runs, on randomly initialised encoders of
BERT-base's and BERT-large's sizes, batch 64, max length 32, STS-B dev every 125 steps, every
other setting params.yaml's (precision auto: bf16 on the GPU):

- ``default``: params.yaml's train settings as they stand (compile auto: CUDA graphs for one
  process on a GPU, eager on a CPU); the settings the trainer resolved them to are recorded
  from its config.json's execution record (``execution``);
- ``unpadded_graphs``: ``compile: reduce-overhead``, ``unpad: true`` (each step packed into one
  of a few fixed token-count buckets); where the default resolved to these very settings, its
  run stands for this one (``same_as``) rather than being timed twice;
- ``padded_graphs``: ``compile: reduce-overhead``, ``unpad: false``;
- ``sharing`` (BERT-base): k = 1, 2 and 4 training processes on the one device at once, at the
  default settings, each a process of its own as the pipeline's jobs are: past its warm-up
  steps each waits at a file barrier, so that the k steady phases start together; each run's
  rate and their sum are taken over the window where all k train (from the barrier to the
  first run's last step);
- ``peer`` (BERT-base): sentence-transformers' trainer (train_gpu.py's peer) in the same
  precision, on the same corpus, at the same batch, training only;
- then benchmarks/gpu_checks.py's checks of the unpadded forward on the device.

Rates are steady: the interval between the ends of consecutive steps after the warm-up steps,
whose time (process start, model, compilation, CUDA graph recording) is recorded apart
(``warmup_s``). ``steady_steps_per_s`` includes the dev evaluations (the protocol's rate);
``training_steps_per_s`` leaves out the intervals that hold one.

``ratios`` (BERT-base, the issue's targets): ``default_steps_per_s``; the best single run's rate
and its config; ``sharing_summed_over_single`` (k runs' summed rate over one run's, per k);
``ours_over_peer`` (the default config's training rate over the peer's; ``..._with_dev``: ours
with its dev evaluations). ``by_size`` holds the same per size, where measured.

Time: ``PLAN`` gives every part's steps and its planned seconds on one H100, 8 minutes in all
(``BUDGET_S``); a part that would end past ``--limit-s`` (9 minutes: the device's command limit
is 10) is skipped and listed in ``skipped``. Each part's spent seconds are recorded (``budget``).
A part that fails is recorded with its error and the suite goes on; the exit status is then 1,
as it is when a check fails.

``--smoke``: the whole suite on the CPU in about a minute: tiny encoders, a few steps; a graph
config runs eager there (``ran_eager``: CUDA graphs need CUDA, and inductor's compilation costs
about a minute a config on 2 cores), recorded with the settings it stands for. Its JSON has the
same shape and never goes to benchmarks/results/.

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
from stages.core.schema.params import BackboneParams, load_params
from stages.training.run_folder import stsb_dev_evaluator

BATCH = 64
EVAL_STEPS = 125
WARMUP_STEPS = 25  # left out of the steady rates: allocation, compilation, graph recording
SIZES = ("base", "large")
KS = (1, 2, 4)
SHARING_SIZE = PEER_SIZE = "base"
# The settings each config sets over params.yaml's train section ("default": none).
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "unpadded_graphs": {"compile": "reduce-overhead", "unpad": True},
    "padded_graphs": {"compile": "reduce-overhead", "unpad": False},
}
# params.yaml's train settings that the benchmark sets itself (the protocol and the run length)
PROTOCOL_KEYS = (
    "batch_size", "max_seq_length", "epochs", "max_steps", "eval_steps", "checkpoint_steps",
    "log_steps",
)  # fmt: skip
WORKER_RESULT = "GPU_SUITE_WORKER_RESULT "
BARRIER_TIMEOUT_S = 600


# The time budget


BUDGET_S = 8 * 60  # the whole suite on one H100, from the command to the written JSON
LIMIT_S = 9 * 60  # a part that would end past this is skipped: the device's command limit is 10
START_S = 20  # interpreter, imports, tokenizing the corpus


@dataclass(frozen=True)
class Part:
    """A part of the suite and its plan on one H100: ``steps`` (per process), the steady rate
    expected of them, and ``warmup_s``, the seconds before the steady rate (process start,
    model, compilation, CUDA graph recording; a warm inductor cache shortens a repeat)."""

    name: str
    steps: int
    steps_per_s: float
    warmup_s: float

    @property
    def planned_s(self) -> float:
        return self.warmup_s + (self.steps / self.steps_per_s if self.steps else 0.0)


# Expected rates from the recorded H100/H200 runs (docs/benchmarks.md, "Training on GPU": 53.7
# steps/s with graphs, 22 eager, peer 16.8); BERT-large's from its ~3x FLOPs. Compilation
# times are estimates until a device run records them (each config's warmup_s). Steps: enough
# for 2-3 dev evaluations after the warm-up. The unpadded_graphs parts are planned as the
# default's run (same_as), which they are where the default resolves to CUDA graphs.
PLAN: dict[str, Part] = {
    part.name: part
    for part in (
        Part("base/default", 375, 50.0, 45.0),
        Part("base/unpadded_graphs", 0, 1.0, 0.0),
        Part("base/padded_graphs", 375, 55.0, 40.0),
        Part("base/peer", 250, 17.0, 15.0),
        Part("base/sharing_k1", 275, 50.0, 30.0),
        Part("base/sharing_k2", 275, 25.0, 35.0),
        Part("base/sharing_k4", 275, 13.0, 45.0),
        Part("large/default", 250, 20.0, 60.0),
        Part("large/unpadded_graphs", 0, 1.0, 0.0),
        Part("large/padded_graphs", 250, 22.0, 55.0),
        Part("gpu_checks", 0, 1.0, 20.0),
    )
}
# A config timed although the default's run stands for it (the default resolved otherwise).
UNPLANNED = {"base": Part("", 375, 50.0, 25.0), "large": Part("", 250, 20.0, 40.0)}
SMOKE_STEPS, SMOKE_EVAL_STEPS, SMOKE_WARMUP = 6, 3, 1


def planned_total() -> float:
    return START_S + sum(part.planned_s for part in PLAN.values())


class Budget:
    """Each part's spent seconds against its plan; ``allows`` says whether a part planned at
    ``seconds`` still ends before the limit (None: no limit, the smoke run)."""

    def __init__(self, limit_s: float | None) -> None:
        self.started = time.perf_counter()
        self.limit_s = limit_s
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
            "planned_s": {name: round(part.planned_s, 1) for name, part in PLAN.items()},
            "planned_total_s": round(planned_total(), 1),
            "spent_s": self.spent,
            "total_s": round(self.elapsed(), 1),
        }


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


def runs_on_cpu(args: argparse.Namespace) -> bool:
    return args.device == "cpu" or not torch.cuda.is_available()


def run_settings(settings: Mapping[str, Any], on_cpu: bool) -> tuple[dict[str, Any], bool]:
    """The settings a config runs with and whether it runs eager in their stead: CUDA graphs
    exist on CUDA alone, and a CPU run (the smoke run) is not worth inductor's compilation."""
    if on_cpu and settings.get("compile") not in (False, "auto"):
        return {**settings, "compile": False}, True
    return dict(settings), False


def resolved(measured: Mapping[str, Any]) -> tuple[Any, Any]:
    """(compile, unpadded) as a run executed them (its execution record)."""
    execution = measured.get("execution", {})
    return execution.get("compile"), execution.get("unpadded")


def config_runs(
    args: argparse.Namespace, size: str, evaluate, workdir: Path, budget: Budget
) -> list[dict[str, Any]]:
    """The default, unpadded_graphs and padded_graphs configs of ``size``, in that order."""
    on_cpu = runs_on_cpu(args)
    defaults = default_settings(args.device)
    results: list[dict[str, Any]] = []
    for name, overrides in CONFIGS.items():
        part = f"{size}/{name}"
        settings = {**defaults, **overrides}
        ran_with, eager = run_settings(settings, on_cpu)
        entry: dict[str, Any] = {
            "name": name,
            "size": size,
            "settings": {key: settings[key] for key in ("precision", "compile", "unpad")},
            "ran_eager": eager,
        }
        effective = (ran_with["compile"], ran_with["unpad"])
        twin = next((r for r in results if "execution" in r and resolved(r) == effective), None)
        if twin is not None:
            # the default already ran with these settings: its run is this config's
            entry["same_as"] = twin["name"]
            entry.update(
                {k: v for k, v in twin.items() if k not in entry and k not in ("same_as",)}
            )
            results.append(entry)
            continue
        plan = PLAN[part] if PLAN[part].steps else UNPLANNED[size]
        if not budget.allows(part, plan.planned_s):
            continue
        steps = SMOKE_STEPS if args.smoke else plan.steps
        eval_steps = SMOKE_EVAL_STEPS if args.smoke else EVAL_STEPS
        with budget.part(part), failure_recorded(entry):
            entry.update(
                train_gpu.run(
                    run_args(args, size),
                    BATCH,
                    steps,
                    evaluate,
                    eval_steps,
                    workdir,
                    settings=ran_with,
                )
            )
        print(json.dumps(shown(entry)), flush=True)
        results.append(entry)
    return results


def peer_run(args: argparse.Namespace, workdir: Path, budget: Budget) -> dict[str, Any] | None:
    part = f"{PEER_SIZE}/peer"
    if not budget.allows(part, PLAN[part].planned_s):
        return None
    entry: dict[str, Any] = {"size": PEER_SIZE}
    steps = SMOKE_STEPS if args.smoke else PLAN[part].steps
    with budget.part(part), failure_recorded(entry):
        entry.update(train_gpu.peer(run_args(args, PEER_SIZE), BATCH, steps, workdir))
    print(json.dumps(entry), flush=True)
    return entry


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
    settings, eager = run_settings(default_settings(args.device), runs_on_cpu(args))
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
        "settings": settings,
        "ran_eager": eager,
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


def sharing_runs(args: argparse.Namespace, workdir: Path, budget: Budget) -> list[dict[str, Any]]:
    release_device()
    results: list[dict[str, Any]] = []
    for k in args.ks:
        part = f"{SHARING_SIZE}/sharing_k{k}"
        plan = PLAN.get(part, Part(part, 275, 50.0 / k, 45.0))
        if not budget.allows(part, plan.planned_s):
            continue
        steps = SMOKE_STEPS if args.smoke else plan.steps
        barrier = workdir / f"barrier-k{k}"
        barrier.mkdir()
        specs = [worker_spec(args, k, i, steps, barrier, workdir) for i in range(k)]
        entry: dict[str, Any] = {
            "k": k,
            "size": SHARING_SIZE,
            "steps_per_run": steps,
            "settings": {
                key: specs[0]["settings"][key] for key in ("precision", "compile", "unpad")
            },
            "ran_eager": specs[0]["ran_eager"],
        }
        deadline = budget.started + args.limit_s if args.limit_s else float("inf")
        with budget.part(part), failure_recorded(entry):
            runs = run_workers(specs, workdir, deadline)
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
        print(json.dumps(entry), flush=True)
        results.append(entry)
    single = next((r for r in results if r["k"] == 1 and "summed_steps_per_s" in r), None)
    for entry in results:
        if single is not None and "summed_steps_per_s" in entry:
            entry["summed_over_single"] = entry["summed_steps_per_s"] / single["summed_steps_per_s"]
    return results


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


def checks(args: argparse.Namespace, budget: Budget) -> dict[str, Any] | None:
    if not budget.allows("gpu_checks", PLAN["gpu_checks"].planned_s):
        return None
    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    size = train_gpu.SMOKE if args.smoke else train_gpu.BERT_BASE
    backbone = BackboneParams(model=gpu_checks.BACKBONE.model, random_init=size)
    entry: dict[str, Any] = {"device": str(device)}
    with budget.part("gpu_checks"), failure_recorded(entry):
        results = gpu_checks.forward_checks(device, args.corpus, backbone)
        entry.update(passed=sum(r["passed"] for r in results), total=len(results), checks=results)
        print(f"gpu_checks: {entry['passed']} of {entry['total']} passed", flush=True)
    return entry


def device_slug(name: str) -> str:
    """'h100' or 'h200' from torch's name of the GPU ("NVIDIA H100 80GB HBM3"), else the name
    in lower case and underscores."""
    lowered = name.lower()
    for kind in ("h100", "h200"):
        if kind in lowered:
            return kind
    return re.sub(r"[^a-z0-9]+", "_", lowered).strip("_")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny encoders, a few steps, on the CPU")
    p.add_argument(
        "--device",
        default=None,
        choices=["auto", "cpu", "cuda"],
        help="default: auto (cpu with --smoke)",
    )
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=SIZES)
    p.add_argument("--ks", nargs="*", type=int, default=list(KS), help="runs sharing the device")
    p.add_argument("--no-peer", dest="peer", action="store_false")
    p.add_argument("--no-checks", dest="checks", action="store_false")
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
        help="default: benchmarks/results/gpu_suite_<gpu>.json; with --smoke a "
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
    args.device = args.device or ("cpu" if args.smoke else "auto")
    args.warmup = (
        args.warmup if args.warmup is not None else SMOKE_WARMUP if args.smoke else WARMUP_STEPS
    )
    if args.limit_s is None and not args.smoke:
        args.limit_s = LIMIT_S
    if args.corpus is None:
        wiki = train_gpu.default_path("corpus/wiki1m.txt")
        args.corpus = (
            wiki if wiki.is_file() else train_gpu.default_path("corpus/wiki1m_head_11913.txt")
        )
    args.senteval = args.senteval or train_gpu.default_path("senteval")
    on_gpu = args.device != "cpu" and torch.cuda.is_available()
    device = torch.cuda.get_device_name() if on_gpu else "cpu"
    if args.smoke and args.out and args.out.resolve().is_relative_to(harness.RESULTS.resolve()):
        p.error("--smoke never writes to benchmarks/results/: give --out elsewhere")
    workdir = Path(tempfile.mkdtemp(prefix="bench-gpu-suite-"))
    if args.out is None:
        args.out = (
            workdir / "gpu_suite_smoke.json"
            if args.smoke
            else harness.RESULTS / f"gpu_suite_{device_slug(device)}.json"
        )
    budget = Budget(args.limit_s)
    evaluate = stsb_dev_evaluator(args.senteval)
    configs: list[dict[str, Any]] = []
    sharing: list[dict[str, Any]] = []
    peer = None
    for size in args.sizes:
        configs += config_runs(args, size, evaluate, workdir, budget)
        if size == PEER_SIZE and args.peer:
            peer = peer_run(args, workdir, budget)
        if size == SHARING_SIZE and args.ks:
            sharing = sharing_runs(args, workdir, budget)
    checked = checks(args, budget) if args.checks else None
    report: dict[str, Any] = {
        "device": device,
        "smoke": args.smoke,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "load_average_before": invocation.load_average_before,
        "load_average_after": harness.load_average(),
        "protocol": {
            "batch_size": BATCH,
            "max_seq_length": train_gpu.MAX_LENGTH,
            "eval_steps": SMOKE_EVAL_STEPS if args.smoke else EVAL_STEPS,
            "warmup_steps": args.warmup,
            "precision": args.precision,
            "device": args.device,
            "corpus": str(args.corpus),
            "senteval": str(args.senteval),
        },
        "sizes": {
            size: train_gpu.model_size(run_args(args, size)).model_dump() for size in args.sizes
        },
        "ratios": ratios(configs, sharing, peer, "base") if "base" in args.sizes else None,
        "by_size": {size: ratios(configs, sharing, peer, size) for size in args.sizes},
        "configs": configs,
        "sharing": sharing,
        "peer": peer,
        "gpu_checks": checked,
        "skipped": budget.skipped,
        "budget": budget.record(),
    }
    harness.write_result(args.out, report, invocation)
    errors = [entry for entry in [*configs, *sharing, peer, checked] if entry and "error" in entry]
    failed_checks = checked is not None and checked.get("passed") != checked.get("total")
    if errors or failed_checks:
        print(f"{len(errors)} part(s) failed; checks failed: {failed_checks}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
