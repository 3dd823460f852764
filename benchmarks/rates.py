"""The measured rates the estimates rest on (``stages/core/planning/measured_rates.json``), made
from the benchmark records in benchmarks/results/.

    python -m benchmarks.rates [--results DIR] [--out FILE]   regenerate the rates file

The records read: train_gpu.json (H200) and train_gpu_h100.json (H100), the stage's trainer on a
BERT-base-sized model at batch 64 (and 512 on the H200) and the H100's dev evaluations;
gpu_suite_<gpu>.json where a device has run benchmarks/gpu_suite.py (the default settings' rate
at BERT-base and -large size, preferred at its size); train_cpu.json (all-MiniLM-L6-v2) and
train_overhead.json (a 2-layer width-128 BERT), the trainer on the CPU at batch 64 in fp32 and
bf16; smoke_time.json, the smoke preset end to end on the CPU (the tiny model's step, dev
evaluation, SentEval and MTEB encoding, classifiers, and every stage's start-up); senteval.json,
SentEval's encoding, classifiers in both modes and model load for all-MiniLM-L6-v2 on the CPU;
mteb_minilm.json, MTEB's encoding of it. (step_throughput_cpu.json is read by no estimate: it
times a bare forward/backward loop, not the stage's trainer, on a busy machine, and its steps
are 10 to 50 times slower than the trainer's own records at the same sizes: train_overhead.json,
train_cpu.json.)

Why a generated file sits between these records and the estimates
(``stages/core/planning/estimates.py``): the records sit in the repository, not in the installed
package the estimates belong to; each benchmark script writes its own layout, which changes when
a script does; and the DAG of either orchestrator is built from the estimates, so a half-written
or reshaped result must not break it. A regenerated file is a reviewed diff of the figures every
estimate rests on; tests/test_rates.py checks that it is current.

Each record becomes ``Measured`` rates (seconds per item of a kind of work, at its FLOPs per
item, on a device kind, in a precision) with the fixed part per item of its group fitted by least
squares (``with_fixed_parts``), and each stage's start-up (``StartUp``).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, TypeVar

from stages.core.errors import StageError
from stages.core.planning.estimates import (
    BERT_BASE,
    BERT_LARGE,
    CLASSIFIER_MODES,
    GPU_KINDS,
    MINILM_L6,
    RATES_FILE,
    RESULTS,
    SENTEVAL_SENTENCES,
    STSB_DEV_SENTENCES,
    TRANSFER_TASKS,
    Architecture,
    Measured,
    StartUp,
    classifier_work,
    device_class,
    encode_flops,
    padded_length,
    train_step_flops,
    train_step_variant,
)
from stages.core.storage.atomic import write_text

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")

TRAIN_GPU_MAX_LENGTH = 32  # benchmarks/train_gpu.py's max_seq_length (its docstring)
ABOUT = (
    "Measured rates of stages/core/planning/estimates.py, written by `python -m "
    "benchmarks.rates` from benchmarks/results/*.json: rerun that, do not edit this."
)


def significant(x: float) -> float:
    """Six significant digits: the records' noise is in the second."""
    return float(f"{x:.6g}")


def gpu_kind(device_name: str) -> str:
    """A GPU's kind from its name as torch reports it ("NVIDIA H100 80GB HBM3")."""
    for kind in GPU_KINDS:
        if kind in device_name.lower():
            return kind
    raise ValueError(f"no rates are kept for the GPU {device_name!r} (known: {GPU_KINDS})")


def gpu_train_steps(file: str, device: str, runs: list[dict[str, Any]], at: str) -> list[Measured]:
    """benchmarks/train_gpu.py's runs (BERT-base size, bf16): the default (unpadded) forward
    without dev evaluation, its steady rate; the dev evaluation is estimated on its own."""
    kind = gpu_kind(device)
    return [
        Measured(
            "train_step",
            kind,
            "bf16",
            train_step_flops(BERT_BASE, r["batch_size"], padded_length(TRAIN_GPU_MAX_LENGTH)),
            1 / r["steady_steps_per_s"],
            f"{file} {at}[{i}] (BERT-base, batch {r['batch_size']}, bf16, training only: "
            f"{r['steady_steps_per_s']:.1f} steps/s)",
        )
        for i, r in enumerate(runs)
        if r["mode"] == "training_only" and r["unpad"]
    ]


SUITE_ARCHITECTURES = {"base": BERT_BASE, "large": BERT_LARGE}  # benchmarks/gpu_suite.py's sizes


def gpu_suite_steps(file: str, data: dict[str, Any]) -> list[Measured]:
    """benchmarks/gpu_suite.py's default-settings runs (each size, batch 64): the steady rate
    with the dev evaluations' intervals left out. Listed before train_gpu's records, so that at
    the same size and GPU the default settings' rate is the one an estimate uses."""
    if data.get("smoke"):
        return []
    kind, batch = gpu_kind(data["device"]), data["protocol"]["batch_size"]
    length = padded_length(data["protocol"]["max_seq_length"])
    measured = []
    for i, c in enumerate(data["configs"]):
        rate = c.get("training_steps_per_s")
        if c["name"] != "default" or not rate or "error" in c:
            continue
        execution = c.get("execution") or {}
        forward = f"{'unpadded' if execution.get('unpadded') else 'padded'}, compile " + str(
            execution.get("compile")
        )
        measured.append(
            Measured(
                "train_step",
                kind,
                execution.get("precision", "bf16"),
                train_step_flops(SUITE_ARCHITECTURES[c["size"]], batch, length),
                1 / rate,
                f"{file} configs[{i}] (BERT-{c['size']}, batch {batch}, default settings: "
                f"{forward}; training only: {rate:.1f} steps/s)",
            )
        )
    return measured


def h100_dev_evaluations(data: dict[str, Any]) -> list[Measured]:
    """train_gpu_h100.json's STS-B dev evaluations (BERT-base, fp32 as the trainer's default
    dev_precision), each run's median (the first pays for warming up)."""
    return [
        Measured("dev_encode", gpu_kind(data["device"]), "fp32", encode_flops(BERT_BASE),
                 statistics.median(r["eval_seconds"]) / STSB_DEV_SENTENCES,
                 f"train_gpu_h100.json eager.runs[{i}] eval_seconds' median (BERT-base: "
                 f"{statistics.median(r['eval_seconds']):.3g} s per dev evaluation)")
        for i, r in enumerate(data["eager"]["runs"])
        if r["mode"] == "with_dev_eval" and r["unpad"]
    ]  # fmt: skip


def cpu_train_steps(
    file: str, data: dict[str, Any], arch: Architecture, key: str
) -> list[Measured]:
    """The stage trainer's ("ours") seconds per step in each precision of a CPU benchmark:
    the median over its interleaved rounds; ``key`` names the round entry, with {p} for the
    precision (steps per second or seconds per step, as its name says)."""
    setup = data["setup"]
    flops = train_step_flops(arch, setup["batch_size"], padded_length(setup["max_seq_length"]))
    measured = []
    for precision in ("fp32", "bf16"):
        name = key.format(p=precision)
        values = [r[name] for r in data["rounds"] if name in r]
        if values:
            value = statistics.median(values)
            seconds = 1 / value if name.endswith("steps_per_s") else value
            measured.append(Measured(
                "train_step", "cpu", precision, flops, seconds,
                f"{file} rounds' median {name} ({setup['model']}, batch {setup['batch_size']}, "
                f"{precision}: {seconds:.3g} s/step)",
            ))  # fmt: skip
    return measured


def classifier_step(task: str, mode: str, dim: int, seconds: float, record: str) -> Measured:
    """A task's measured classifier seconds as seconds per batched step (``classifier_work``)."""
    steps, work = classifier_work(task, mode, dim)
    return Measured("classifier_step", "cpu", "fp32", work, seconds / steps, record)


def smoke_rates(data: dict[str, Any]) -> tuple[list[Measured], dict[str, float]]:
    """benchmarks/smoke_time.py's record: the tiny model's rates on the CPU from what each
    stage timed itself (medians over the preset's runs and evaluations), each stage's start-up
    (its job's wall time less that), and the encoding and classifier rates of the preset's real
    encoder (its baseline), measured as users run the jobs: one per core."""
    model = data["model"]
    arch = Architecture(model["layers"], model["hidden"], model["intermediate"])
    shape = f"{arch.layers} x {arch.hidden} random BERT"
    # the tiny model's jobs (the preset's baseline evaluates a real encoder)
    jobs = [job for job in data["jobs"] if job.get("backbone") == model["backbone"]]
    by_stage = {stage: [job["self_timed"] for job in jobs if job["stage"] == stage]
                for stage in ("train", "senteval", "mteb")}  # fmt: skip
    plain = [r for r in by_stage["train"] if not (r["sam"] or r["triplets"])]
    step = statistics.median((r["seconds"] - sum(r["eval_s"])) / r["steps"] for r in plain)
    dev = statistics.median(s / STSB_DEV_SENTENCES for r in by_stage["train"] for s in r["eval_s"])
    file = "smoke_time.json"
    train_flops = train_step_flops(
        arch, model["batch_size"], padded_length(model["max_seq_length"])
    )
    measured = [
        Measured("train_step", "cpu", model["precision"], train_flops, step,
                 f"{file} plain runs' median ({shape}, batch {model['batch_size']}: "
                 f"{step:.3g} s/step)"),
        Measured("dev_encode", "cpu", "fp32", encode_flops(arch), dev,
                 f"{file} dev evaluations' median ({shape}: {dev * 1e3:.3g} ms/sentence)"),
        *evaluation_rates(by_stage, arch, shape, model["senteval_mode"]),
    ]  # fmt: skip
    variants: dict[str, list[float]] = {}
    for r in by_stage["train"]:
        if r["sam"] or r["triplets"]:
            seconds = (r["seconds"] - sum(r["eval_s"])) / r["steps"]
            variants.setdefault(train_step_variant(r["sam"], r["triplets"]), []).append(seconds)
    for variant, seconds in sorted(variants.items()):
        median = statistics.median(seconds)
        work = train_flops * ((2 + 3) / 2 if variant.endswith("+triplets") else 1)
        measured.append(Measured(variant, "cpu", model["precision"], work, median,
                                 f"{file} {variant} runs' median ({shape}, batch "
                                 f"{model['batch_size']}: {median:.3g} s/step)"))  # fmt: skip
    for name, layers in data.get("other_backbones", {}).items():
        other = Architecture(**layers)
        timed = {stage: [job["self_timed"] for job in data["jobs"]
                         if job.get("backbone") == name and job.get("stage") == stage]
                 for stage in ("senteval", "mteb")}  # fmt: skip
        described = f"{name}, {other.layers} x {other.hidden}, one job per core"
        measured += evaluation_rates(timed, other, described, model["senteval_mode"])
    start = {
        stage: statistics.median(job["start_up_s"] for job in jobs if job["stage"] == stage)
        for stage in by_stage
    }
    return measured, start


def evaluation_rates(
    by_stage: dict[str, list[dict[str, Any]]], arch: Architecture, shape: str, mode: str
) -> list[Measured]:
    """SentEval's encoding and classifiers and MTEB's encoding of one encoder in smoke_time's
    record (medians over its jobs; a stage it has no job of gives none)."""
    file, flops, measured = "smoke_time.json", encode_flops(arch), []
    if by_stage["senteval"]:
        encode = statistics.median(
            sum(t["encode_s"] for t in r["tasks"].values())
            / sum(SENTEVAL_SENTENCES[name] for name in r["tasks"])
            for r in by_stage["senteval"]
        )
        measured.append(Measured("encode", "cpu", "fp32", flops, encode,
                                 f"{file} SentEval jobs' median ({shape}: "
                                 f"{encode * 1e3:.3g} ms/sentence)"))  # fmt: skip
        transfer = sorted(
            {name for r in by_stage["senteval"] for name in r["tasks"]} & set(TRANSFER_TASKS)
        )
        for name in transfer:
            runs = by_stage["senteval"]
            seconds = statistics.median(r["tasks"][name]["classifier_s"] for r in runs)
            measured.append(classifier_step(
                name, mode, arch.hidden, seconds,
                f"{file} SentEval jobs' median {name} classifiers ({shape}, {mode})"))  # fmt: skip
    if by_stage["mteb"]:
        mteb = statistics.median(r["encode_s"] / r["texts_encoded"] for r in by_stage["mteb"])
        measured.append(Measured("mteb_encode", "cpu", "fp32", flops, mteb,
                                 f"{file} MTEB jobs' median ({shape}: "
                                 f"{mteb * 1e3:.3g} ms/sentence)"))  # fmt: skip
    return measured


def senteval_rates(data: dict[str, Any]) -> tuple[list[Measured], float]:
    """benchmarks/senteval.py's record (all-MiniLM-L6-v2 on the CPU): SentEval's encoding per
    sentence (fasttest: the test mode's reads its cache), each transfer task's classifiers in
    each mode, and the model's load time per parameter."""
    file, results = "senteval.json", data["results"]
    timings = results["fasttest"]["timings"]
    sentences = sum(SENTEVAL_SENTENCES[name] for name in timings["tasks"])
    encode = timings["encode_s"] / sentences
    measured = [
        Measured("encode", "cpu", "fp32", encode_flops(MINILM_L6), encode,
                 f"{file} fasttest encode_s over its tasks' sentences (all-MiniLM-L6-v2: "
                 f"{encode * 1e3:.3g} ms/sentence)"),
        *(classifier_step(name, mode, MINILM_L6.hidden, task["classifier_s"],
                          f"{file} {mode} {name} classifiers (dim {MINILM_L6.hidden})")
          for mode in CLASSIFIER_MODES
          for name, task in results[mode]["timings"]["tasks"].items() if name in TRANSFER_TASKS),
    ]  # fmt: skip
    return measured, data["wall_s"]["model_load_s"] / MINILM_L6.parameters


def mteb_rate(data: dict[str, Any]) -> Measured:
    """benchmarks/mteb_minilm.py's record: MTEB's encoding of the STS tasks (local copies)."""
    tasks = data["sources"]["senteval"]["tasks"].values()
    texts = sum(t["texts_encoded"] for t in tasks)
    seconds = sum(t["texts_encoded"] / t["texts_per_s"] for t in tasks) / texts
    return Measured("mteb_encode", "cpu", "fp32", encode_flops(MINILM_L6), seconds,
                    f"mteb_minilm.json sources.senteval, all tasks (all-MiniLM-L6-v2: "
                    f"{seconds * 1e3:.3g} ms/sentence)")  # fmt: skip


def fixed_part(group: Sequence[Measured]) -> float:
    """The least-squares intercept of seconds on FLOPs over a group's records, within
    [0, its fastest record's seconds] (a noisy fit says no more than that)."""
    works, seconds = [m.work for m in group], [m.seconds for m in group]
    mean_work, mean_seconds = statistics.fmean(works), statistics.fmean(seconds)
    slope = sum((w - mean_work) * (s - mean_seconds) for w, s in zip(works, seconds, strict=True))
    slope /= sum((w - mean_work) ** 2 for w in works)
    return min(max(mean_seconds - slope * mean_work, 0.0), min(seconds))


def with_fixed_parts(measured: Sequence[Measured]) -> list[Measured]:
    """Each record with its group's fitted fixed part (what, device kind, precision), where the
    group has records of at least two sizes; otherwise another kind's of its class, if any."""
    groups: dict[tuple[str, str, str], list[Measured]] = {}
    for m in measured:
        groups.setdefault((m.what, m.device, m.precision), []).append(m)
    fitted = {key: fixed_part(g) for key, g in groups.items() if len({m.work for m in g}) > 1}

    def fixed(m: Measured) -> float | None:
        if (m.what, m.device, m.precision) in fitted:
            return fitted[m.what, m.device, m.precision]
        others = [value for (what, device, precision), value in fitted.items()
                  if (what, device_class(device), precision)
                  == (m.what, device_class(m.device), m.precision)]  # fmt: skip
        return min(min(others), m.seconds) if others else None

    return [replace(m, fixed=fixed(m)) for m in measured]


def train_overhead_steps(data: dict[str, Any]) -> list[Measured]:
    """benchmarks/train_overhead.py's record: its model's shape is in its description."""
    small = re.search(r"(\d+) x (\d+) \(FFN (\d+)\)", data["setup"]["model"])
    if small is None:
        raise ValueError(f"no 'L x H (FFN F)' in setup.model {data['setup']['model']!r}")
    arch = Architecture(*map(int, small.groups()))
    return cpu_train_steps("train_overhead.json", data, arch, "ours_{p}_steps_per_s")


def parsed(path: Path, parse: Callable[[dict[str, Any]], T]) -> T:
    """``parse`` of the record at ``path``; a record that is missing, not JSON or not in the
    layout ``parse`` reads is a StageError naming it."""
    if not path.is_file():
        raise StageError(
            f"{path} not found: the measured rates are made of the benchmark records there "
            "(--results names another folder)"
        )
    try:
        return parse(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise StageError(
            f"{path}: not a record benchmarks/rates.py can read ({type(e).__name__}: {e})"
        ) from e


def measured_rates(results: Path) -> dict[str, Any]:
    """measured_rates.json's content from the benchmark results in ``results``."""
    h100_steps, h100_dev = parsed(results / "train_gpu_h100.json", lambda data: (
        gpu_train_steps("train_gpu_h100.json", data["device"], data["eager"]["runs"],
                        "eager.runs"),
        h100_dev_evaluations(data),
    ))  # fmt: skip
    smoke, start = parsed(results / "smoke_time.json", smoke_rates)
    senteval, load = parsed(results / "senteval.json", senteval_rates)
    measured = [
        *(m for path in sorted(results.glob("gpu_suite_*.json"))
          for m in parsed(path, functools.partial(gpu_suite_steps, path.name))),
        *parsed(results / "train_gpu.json", lambda data: gpu_train_steps(
            "train_gpu.json", data["device"], data["runs"], "runs")),
        *h100_steps,
        *parsed(results / "train_cpu.json", lambda data: cpu_train_steps(
            "train_cpu.json", data, MINILM_L6, "ours_{p}_s_per_step")),
        *parsed(results / "train_overhead.json", train_overhead_steps),
        *h100_dev,
        *smoke,
        *senteval,
        parsed(results / "mteb_minilm.json", mteb_rate),
    ]  # fmt: skip
    rounded = [replace(m, work=significant(m.work), seconds=significant(m.seconds))
               for m in measured]  # fmt: skip
    return {
        "about": ABOUT,
        "measured": [
            {**asdict(m), "fixed": None if m.fixed is None else significant(m.fixed)}
            for m in with_fixed_parts(rounded)
        ],
        "start_up": asdict(StartUp(
            {stage: significant(s) for stage, s in start.items()}, significant(load),
            "smoke_time.json, each stage's median job time less its own timing; senteval.json "
            "model_load_s per parameter",
        )),
    }  # fmt: skip


def write_rates(results: Path = REPO / RESULTS, path: Path = RATES_FILE) -> Path:
    """Regenerate measured_rates.json from the benchmark results."""
    write_text(path, json.dumps(measured_rates(results), indent=1) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=REPO / RESULTS)
    parser.add_argument("--out", type=Path, default=RATES_FILE)
    args = parser.parse_args(argv)
    try:
        print(f"wrote {write_rates(args.results, args.out)}")
    except StageError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
