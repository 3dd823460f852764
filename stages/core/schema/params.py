"""The schema of params.yaml, the pipeline's single source of truth.

Every entry point (each stage CLI, the Snakefile, the DVC pipeline generator) loads params through
``load_params``, which validates the whole file before any work starts and reports every problem
in one message, each naming its key path and what is allowed.
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Self, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StringConstraints,
    ValidationError,
    model_validator,
)

from stages.core.errors import ParamsError
from stages.core.schema.bounds import (
    Integer,
    NotANumber,
    Real,
    unusual_values,
    warning_line,
)
from stages.core.schema.evaluation_settings import (
    EVALUATIONS,
    FORMERLY_TOP_LEVEL,
    EvaluationSections,
    EvaluationSettings,
)
from stages.core.schema.id_markers import ExecutionOnly, InId
from stages.core.schema.objective_settings import SETTINGS_BY_NAME, ObjectiveConfig
from stages.core.schema.sweeps import GridError, expand_grids
from stages.core.schema.temperature_settings import TemperatureSchedule
from stages.core.schema.unread import refusals
from stages.core.storage.layout import DEFAULT_PARAMS
from stages.core.storage.shared_store import StoreSettings, url_problem

# Names that become parts of file paths and of experiment names: keep them path- and CLI-safe.
Key = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=64)]
# A method's name, or a point of a method's grid: arccse[margin_deg=5]
# (stages/core/schema/sweeps.py).
MethodName = Annotated[
    str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]*(\[[^\[\]\s/]+\])?$", max_length=128)
]
# Strict: YAML's `true` would pass a lax int field as 1 (and `2.0` as 2).
PositiveInt = Annotated[int, Field(strict=True, gt=0)]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]
# torch, numpy and Python's random all take a seed in [0, 2^32)
Seed = Annotated[int, Field(strict=True, ge=0, lt=2**32)]

POOLERS = ("cls", "cls_before_pooler", "mean", "first_last_mean")
Pooler = Literal["cls", "cls_before_pooler", "mean", "first_last_mean"]
Logger = Literal["dvclive", "tensorboard", "wandb"]


class Section(BaseModel):
    # inf and nan pass a bare `gt=0`; no setting the code can honour is infinite.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class DataParams(Section):
    source: Annotated[Literal["remote", "local"], ExecutionOnly()] = Field(
        "remote",
        description="remote: canonical public URLs; local: copy from local_dir (offline machines)",
    )
    local_dir: Annotated[str, ExecutionOnly()] = Field(
        "../shared/data",
        description="folder with corpus/, senteval/downstream/, sts_raw/ (env CSE_DATA_DIR wins)",
    )
    corpus: Literal["wiki1m", "wiki1m_head_11913", "wiki1m_random10k_seed42"] = Field(
        "wiki1m",
        description="training corpus, one sentence per line (core/schema/data_manifest.yaml)",
    )
    max_sentences: PositiveInt | None = Field(
        None, description="train on the first N sentences only (smoke tests, quick looks)"
    )

    def resolved_local_dir(self) -> Path:
        return Path(os.environ.get("CSE_DATA_DIR", self.local_dir))


class TripletsParams(Section):
    """ArcCSE's masked triplets (s, s', s''); the procedure is in
    stages/masked_triplets/masking.py."""

    short_mask_rate: Real("mask_rate") = Field(
        0.2, description="masked share of s in s' (one contiguous span), in units of s"
    )
    long_mask_rate: Real("mask_rate") = Field(
        0.4, description="masked share of s in s'' (the span of s' enlarged), in units of s"
    )
    unit: Literal["token", "word"] = Field(
        "token",
        description="masked unit: the backbone tokenizer's tokens, or whitespace-separated words",
    )
    replacement: Literal["mask_per_unit", "mask_per_span", "delete"] = Field(
        "mask_per_unit",
        description="mask_per_unit: one mask token per masked unit (keeps the length); "
        "mask_per_span: one mask token for the whole span; delete: drop the masked units",
    )
    min_words: PositiveInt = Field(
        25, description="sentences with fewer whitespace-separated words get no triplet"
    )
    seed: NonNegativeInt = Field(42, description="seeds the span positions of every line")

    @model_validator(mode="after")
    def _long_span_contains_short_span(self) -> Self:
        if self.long_mask_rate <= self.short_mask_rate:
            raise ValueError(
                f"long_mask_rate ({self.long_mask_rate}) must exceed short_mask_rate "
                f"({self.short_mask_rate}): s'' enlarges the masked span of s'"
            )
        return self


class SamParams(Section):
    enabled: StrictBool = False
    rho: Real("sam_rho") = Field(0.05, description="neighbourhood radius (SAM's default)")
    adaptive: StrictBool = False


def _contrastive_batch(size: int) -> int:
    if size < 2:
        raise ValueError(
            f"must be at least 2 (got {size}): each sentence's in-batch negatives are the "
            "other sentences of its batch"
        )
    return size


class TrainParams(Section):
    epochs: PositiveInt = 1
    max_steps: PositiveInt | None = Field(None, description="stop after this many updates")
    batch_size: Annotated[int, Field(strict=True), AfterValidator(_contrastive_batch)] = 64
    max_seq_length: Annotated[Integer, Field(gt=0, le=512)] = Field(
        32, description="truncation in tokens; at most 512, where every evaluation truncates"
    )
    learning_rate: Real("learning_rate") = 3e-5
    lr_schedule: Literal["linear", "constant"] = "linear"
    warmup_ratio: Real("warmup_ratio") = 0.0
    weight_decay: Real("weight_decay") = 0.0
    adam_betas: tuple[Real("adam_beta"), Real("adam_beta")] = (0.9, 0.999)
    adam_epsilon: Real("adam_epsilon") = 1e-8
    max_grad_norm: Real("max_grad_norm") | None = Field(1.0, description="clip; null disables")
    dropout: Real("dropout") | None = Field(
        None,
        description="every dropout of the backbone (its family's config keys, "
        "stages/modeling/backbone_adapters.py); null keeps the backbone's (BERT: 0.1; one "
        "with none, e.g. ModernBERT, is refused)",
    )
    pooler: Pooler = Field("cls", description="training representation; cls = [CLS] + MLP head")
    eval_pooler: Pooler = Field(
        "cls_before_pooler", description="representation used by every evaluator"
    )
    dev_pooler: Annotated[Pooler | None, InId(absent=None)] = Field(
        None,
        description="representation of the STS-B dev selection; null: eval_pooler's (SimCSE "
        "with --mlp_only_train; paper 002's code); cls: with the MLP head, as paper 003's "
        "released code selects (no --mlp_only_train)",
    )
    head: Annotated[Literal["simcse", "linear", "tanh_linear"], InId(absent="simcse")] = Field(
        "simcse",
        description="pooler cls's training head: simcse: Linear then tanh (SimCSE's MLPLayer); "
        "linear: Linear only (paper 002's released code on BERT); tanh_linear: tanh then "
        "Linear (its code on RoBERTa)",
    )
    head_init_std: Annotated[Real("head_init_std") | None, InId(absent=None)] = Field(
        None,
        description="null: the head's weights N(0, initializer_range^2), bias 0 (SimCSE); a "
        "number: weights and bias N(0, std^2) (paper 002's released code: 0.006)",
    )
    freeze_embeddings: Annotated[StrictBool, InId(absent=False)] = Field(
        False,
        description="the embedding layer (token, position and type embeddings, their "
        "LayerNorm) gets no gradient, as paper 002's released code trains",
    )
    eval_steps: PositiveInt = Field(125, description="STS-B dev evaluation interval (updates)")
    checkpoint_steps: Annotated[PositiveInt, ExecutionOnly()] = Field(
        500, description="resumable checkpoint interval"
    )
    log_steps: Annotated[PositiveInt, ExecutionOnly()] = 10
    sam: SamParams = SamParams()
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="auto: bf16 autocast on a GPU that computes bf16 natively (compute "
        "capability 8.0 on: A100, H100, RTX 30xx), fp32 elsewhere (CPU, V100, T4, RTX 20xx); "
        "objectives always in fp32",
    )
    device: Annotated[Literal["auto", "cpu", "cuda"], ExecutionOnly()] = "auto"
    compile: Annotated[
        Literal["auto", False, True, "reduce-overhead"], NotANumber, ExecutionOnly()
    ] = Field(
        "auto",
        description="auto: CUDA graphs over the padded forward for one GPU process without "
        "gradient accumulation or embedding_chunk_size, false otherwise, and false if compiling "
        "fails (config.json records what it resolved to and why); true: the training forward "
        "under torch.compile(dynamic=True); reduce-overhead: also replayed as CUDA graphs, one "
        "launch for a step's kernels (unpad: each step packed into one of a few fixed shapes, "
        "unmeasured on a GPU); not part of the run id",
    )
    unpad: Annotated[StrictBool, ExecutionOnly()] = Field(
        True,
        description="encoders with a packed forward (BERT, RoBERTa, XLM-R, DistilBERT, MPNet) "
        "compute only the real tokens, not the padding "
        "(the same numbers and dropout masks up to float rounding: not part of the run id)",
    )
    gradient_checkpointing: StrictBool = False
    embedding_chunk_size: Annotated[PositiveInt | None, ExecutionOnly()] = Field(
        None,
        description="encode a step's rows this many at a time and cache the embeddings' "
        "gradients (GradCache): the same update as unchunked, with the activations of one "
        "chunk, for one more forward; null: the whole batch at once (not part of the run id)",
    )
    gather_negatives: StrictBool = Field(
        True, description="with several GPUs, use every rank's batch as negatives"
    )
    triplet_batching: Literal["pool", "batch"] = Field(
        "pool",
        description="ArcCSE's triplets per step (the paper leaves it open, spec A.9.5): pool: "
        "triplet_batch_size triplets drawn from every sentence's, a seeded stream; batch: those of "
        "the step's own sentences (the ones with triplets.min_words words), 0 to batch_size",
    )
    triplet_batch_size: PositiveInt | None = Field(
        None, description="masked triplets per step with triplet_batching: pool; null: batch_size"
    )
    optimizer: Literal["adamw_hf42", "adamw_torch"] = Field(
        "adamw_hf42",
        description="adamw_hf42: transformers 4.2's AdamW as SimCSE trains (eps added to sqrt(v) "
        "before the bias correction, weight decay after the step); adamw_torch: torch's AdamW",
    )
    dev_precision: Literal["fp32", "train"] = Field(
        "fp32", description="STS-B dev encoding: fp32 as SimCSE, or the training precision"
    )
    gradient_accumulation_steps: PositiveInt = Field(
        1, description="micro-batches of batch_size (each its own contrastive batch) per update"
    )
    view_dropout: Literal["both", "first"] = Field(
        "both", description="dropout on both contrastive views (SimCSE) or the first only"
    )
    triplet_dropout: StrictBool = Field(
        False, description="dropout on in the triplet branch (ArcCSE: off; Table 3 ablation)"
    )
    sampling: Literal["uniform", "by_length"] = Field(
        "uniform",
        description="batch order: a uniform permutation (SimCSE), or batches of similar length "
        "(megabatches of 50 batches sorted by length, as transformers' group_by_length)",
    )
    loggers: Annotated[tuple[Logger, ...], ExecutionOnly()] = Field(
        ("dvclive",),
        description="live metrics (stages/training/live.py); wandb only if installed",
    )

    @model_validator(mode="after")
    def _cached_steps_run_eagerly(self) -> Self:
        if self.embedding_chunk_size is None:
            return self
        if self.compile not in (False, "auto"):
            raise ValueError(
                "embedding_chunk_size encodes each chunk twice with the same dropout masks, "
                "replayed by the trainer's own dropout, which a compiled forward does not use; "
                "set compile: false with it"
            )
        if self.gradient_checkpointing:
            raise ValueError(
                "embedding_chunk_size already keeps only one chunk's activations; set "
                "gradient_checkpointing: false with it"
            )
        return self

    @model_validator(mode="after")
    def _accumulation_runs_eagerly(self) -> Self:
        if self.gradient_accumulation_steps > 1 and self.compile not in (False, "auto"):
            raise ValueError(
                f"compile: {str(self.compile).lower()} with gradient_accumulation_steps: "
                f"{self.gradient_accumulation_steps}: a CUDA graph's replay reuses the memory the "
                "previous micro-batch's gradients live in, and no compiled run has accumulated "
                "gradients; set compile: auto (eager with accumulation) or false"
            )
        return self

    @model_validator(mode="after")
    def _head_settings_are_read(self) -> Self:
        if self.pooler != "cls":
            for key, changed in (
                ("head", self.head != "simcse"),
                ("head_init_std", self.head_init_std is not None),
            ):
                if changed:
                    raise ValueError(
                        f"{key}: only pooler cls trains a head (pooler is {self.pooler}); remove it"
                    )
        if self.head != "simcse" and self.eval_pooler == "cls":
            raise ValueError(
                f"eval_pooler cls with head {self.head}: the evaluators read a saved "
                "head back as Linear then tanh; evaluate without it (cls_before_pooler)"
            )
        if self.dev_pooler is not None and self.dev_pooler == self.eval_pooler:
            raise ValueError(
                f"dev_pooler: {self.dev_pooler} is eval_pooler's already (null selects "
                "with eval_pooler); remove it"
            )
        return self


class IdentityParams(Section):
    """What an output's id covers beyond params, data content and code (docs/identity.md)."""

    environment: Literal["recorded", "major_minor"] = Field(
        "recorded",
        description="recorded: every run and evaluation records python, torch, transformers, "
        "mteb, CUDA, device and dtype; major_minor: torch and transformers major.minor also "
        "enter every id (results of different stacks never mix)",
    )


def _store_url(url: str | None) -> str | None:
    problem = url_problem(url) if url else None
    if problem:
        raise ValueError(problem)
    return url


class StoreParams(Section):
    """Where trained runs are shared beyond this workspace (docs/scale-out.md)."""

    url: Annotated[str | None, AfterValidator(_store_url)] = Field(
        None,
        description="null: runs stay in the workspace's runs/ ($CSE_RUNS_DIR); a path or an "
        "fsspec URL (s3://bucket/runs, gs://, az://, ssh://host/path): a train job fetches a "
        "run found there instead of training it, and publishes what it trains; $CSE_STORE_URL "
        "overrides",
    )
    retries: Annotated[Integer, Field(ge=0, le=100)] = Field(
        5,
        description="a fetch or publish tries each file, and the manifest, again this many "
        "times after a transient error (5xx, throttling, a reset, a timeout), then stops naming "
        "the run and the store (docs/scale-out.md)",
    )
    backoff_s: Real("store_backoff_s") = Field(
        1.0, description="the wait before the first retry, doubled before each next one"
    )
    max_backoff_s: Real("store_backoff_s") = Field(30.0, description="the longest wait")
    timeout_s: Real("store_timeout_s") = Field(
        60.0, description="S3: each request's connect and read timeout (others: the backend's)"
    )

    def settings(self) -> StoreSettings:
        return StoreSettings(
            retries=self.retries, backoff_s=self.backoff_s,
            max_backoff_s=self.max_backoff_s, timeout_s=self.timeout_s,
        )  # fmt: skip


class ReportParams(Section):
    baseline_method: MethodName | None = Field(
        "simcse", description="significance tests compare each method against this one"
    )
    significance_test: Literal["paired_t", "wilcoxon"] = Field(
        "paired_t", description="paired over seeds: t-test (scipy ttest_rel) or signed-rank"
    )
    min_effect: Real("min_effect") = Field(
        0.5,
        description="the smallest difference worth detecting, in points (Spearman x100, "
        "accuracy %): the summary counts how many seeds detect it, and calls a comparison "
        "'too few seeds' where the run seeds could not",
    )


class FiguresParams(Section):
    """The analyses that need no training (stage: figures). The objectives' hyperparameters are
    their own defaults (the papers' values); these are the simulations' settings."""

    seed: NonNegativeInt = Field(0, description="seeds paper 002's simulated angles")
    batches: PositiveInt = Field(1000, description="paper 002: simulated batches per mu pair")
    negatives: PositiveInt = Field(127, description="paper 002: negative angles per batch")
    grid_points: Annotated[Integer, Field(ge=2)] = Field(
        100, description="paper 002: mu_pos and mu_neg values (linspace, endpoints included)"
    )
    sigma_pos: Real("sigma") = Field(0.05, description="paper 002: std of theta_ii' (radians)")
    sigma_neg: Real("sigma") = Field(0.10, description="paper 002: std of theta_ij' (radians)")
    weight_mu_pos_deg: Real("angle_deg") = Field(
        30.0, description="paper 002 Fig. 3: the fixed mu_pos (pi/6; the released code: 0.5 rad)"
    )
    weight_temperatures: tuple[Real("tau"), ...] = Field(
        (0.3, 0.1, 0.05, 0.03, 0.01, 0.005),
        min_length=1,
        description="paper 002 Fig. 3: one curve per temperature (the released code's list)",
    )
    weight_min_gd: Real("min_gd") = Field(
        0.01, description="paper 002 Fig. 3: keep batches whose InfoNCE GD is at least this [C]"
    )
    heatmap_points: Annotated[Integer, Field(ge=2)] = Field(
        91, description="paper 003: angles per axis over [0, pi] (91: two degrees apart)"
    )
    negative_counts: tuple[PositiveInt, ...] = Field(
        (64, 256, 1024, 4096),
        min_length=1,
        description="paper 003 Fig. 2a: L_cl's negative counts; the first is every other panel's",
    )
    curve_theta_neg_deg: Real("angle_deg") = Field(
        90.0, description="paper 003 curves: the fixed theta_ij' of the positive-part curves"
    )
    curve_theta_pos_deg: Real("angle_deg") = Field(
        30.0, description="paper 003 curves: the fixed theta_ii' of the negative-part curves"
    )


class RandomInit(Section):
    """A randomly initialised encoder of the backbone's architecture (tests, timing)."""

    hidden_size: PositiveInt = 64
    num_hidden_layers: PositiveInt = 2
    num_attention_heads: PositiveInt = 2
    intermediate_size: PositiveInt = 128

    @model_validator(mode="after")
    def _heads_divide_the_hidden_size(self) -> Self:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads}): each head gets an equal share of it"
            )
        return self


# ``model: package:<module>``: the model folder an installed package ships (its
# ``get_model_path()``), e.g. the offline all-MiniLM-L6-v2 of the tests.
PACKAGE_PREFIX = "package:"


class BackboneParams(Section):
    model: str = Field(description="Hugging Face model id or local directory")
    revision: str = Field("main", description="hub revision (a commit hash pins the weights)")
    random_init: RandomInit | None = Field(
        None, description="ignore the weights and initialise this size randomly"
    )
    layers: Annotated[PositiveInt | None, InId(absent=None)] = Field(
        None,
        description="keep the pretrained encoder's first N transformer layers (a smaller "
        "encoder with real weights, e.g. for a study on a CPU); null: all of them",
    )

    @model_validator(mode="after")
    def _layers_of_pretrained_weights(self) -> Self:
        if self.layers is not None and self.random_init is not None:
            raise ValueError(
                "layers keeps pretrained layers and random_init ignores the weights: give "
                "random_init.num_hidden_layers instead"
            )
        return self


class MethodOverride(Section):
    """Hyperparameters that differ for one backbone (the papers' per-backbone tables)."""

    objective: dict[str, Any] = {}
    temperature: dict[str, Any] = {}
    train: dict[str, Any] = {}


class MethodParams(Section):
    description: str = ""
    objective: ObjectiveConfig
    temperature: TemperatureSchedule = TemperatureSchedule()
    train: dict[str, Any] = Field({}, description="overrides of the train section")
    triplets: dict[str, Any] = Field(
        {}, description="overrides of the triplets section for this method (e.g. a masking rate)"
    )
    evaluations: dict[str, dict[str, Any]] = Field(
        {},
        description="overrides of an evaluation's section for this method's runs, by the "
        "evaluation's name, where it takes them (mteb: e.g. its tasks)",
    )
    per_backbone: dict[Key, MethodOverride] = {}
    method_key: Key | None = Field(
        None,
        description="the method_key of the method's rows in stages/reference/published.csv "
        "(docs/published.md); null: the method's own name",
    )
    sweep: str | None = Field(
        None,
        pattern=r"^[a-z_]+=[^;=]+(;[a-z_]+=[^;=]+)*$",
        description="the sweep point of its published rows, name=value[;name=value] as in "
        "published.csv's sweep column (tau=0.07)",
    )
    readings: tuple[str, ...] = Field(
        (),
        description="where the paper is ambiguous, the reading chosen: 'ambiguity -> reading "
        "(spec section)', one entry per ambiguity (reports print them next to the results)",
    )


def _distinct(values: tuple[Any, ...]) -> tuple[Any, ...]:
    repeated = sorted({v for v in values if values.count(v) > 1}, key=values.index)
    if repeated:
        # the matrix would hold each once: [42, 42] is one seed, not the two a test over seeds needs
        raise ValueError(f"{', '.join(map(str, repeated))} listed more than once")
    return values


class ExperimentGroup(Section):
    """One cross product of the matrix: every method on every backbone with every seed."""

    methods: Annotated[tuple[MethodName, ...], AfterValidator(_distinct)] = Field(min_length=1)
    backbones: Annotated[tuple[Key, ...], AfterValidator(_distinct)] = Field(min_length=1)
    seeds: Annotated[tuple[Seed, ...], AfterValidator(_distinct)] = Field((42,), min_length=1)


class BaselineParams(Section):
    """An untrained encoder evaluated as is (the papers' 'BERT first-last avg.' rows)."""

    backbone: Key
    pooler: Pooler = "first_last_mean"


class ResolvedMethod(Section):
    """A method's hyperparameters on one backbone, per-backbone overrides applied."""

    objective: ObjectiveConfig
    temperature: TemperatureSchedule
    train: TrainParams

    @model_validator(mode="after")
    def _schedule_needs_a_temperature(self) -> Self:
        if self.temperature.schedule != "constant" and not self.objective.uses_temperature:
            raise ValueError(
                f"temperature.schedule '{self.temperature.schedule}': objective "
                f"'{self.objective.name}' has no temperature to schedule in this configuration"
            )
        # a setting this configuration does not read (stages/core/schema/unread.py)
        problems = refusals("method", self)
        unused = self.objective.unused_settings()
        if unused:
            problems.append(
                f"objective.{', objective.'.join(unused)}: objective '{self.objective.name}' does "
                "not read it in this configuration (see its switches); remove it"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self


class Params(Section):
    # The file as written (grids unexpanded): what DVC compares to decide a rerun.
    _written: dict[str, Any] = PrivateAttr(default_factory=dict)

    data: DataParams = DataParams()
    triplets: TripletsParams = TripletsParams()
    train: TrainParams = TrainParams()
    evaluations: EvaluationSections = Field(  # type: ignore[valid-type]
        EvaluationSections(),
        description="the settings of each registered evaluation "
        "(stages/core/schema/evaluation_settings.py), by its name",
    )
    report: ReportParams = ReportParams()
    figures: FiguresParams = FiguresParams()
    identity: IdentityParams = IdentityParams()
    store: StoreParams = StoreParams()
    backbones: dict[Key, BackboneParams] = Field(min_length=1)
    methods: dict[MethodName, MethodParams] = Field(min_length=1)
    experiments: tuple[ExperimentGroup, ...] = Field(min_length=1)
    baselines: dict[Key, BaselineParams] = {}

    @model_validator(mode="after")
    def _references_and_overrides_resolve(self) -> Self:
        problems: list[str] = []
        for g, group in enumerate(self.experiments):
            problems += _unknown(f"experiments.{g}.methods", group.methods, self.methods)
            problems += _unknown(f"experiments.{g}.backbones", group.backbones, self.backbones)
        for name, baseline in self.baselines.items():
            problems += _unknown(f"baselines.{name}.backbone", [baseline.backbone], self.backbones)
            spec = self.backbones.get(baseline.backbone)
            if spec is not None and spec.random_init is not None:
                problems.append(
                    f"baselines.{name}.backbone: '{baseline.backbone}' is randomly initialised "
                    "(random_init); a baseline evaluates pretrained weights"
                )
        if "baseline_method" in self.report.model_fields_set:
            baseline = self.report.baseline_method
            problems += _unknown(
                "report.baseline_method", [baseline] if baseline else [], self.methods
            )
        shared: dict[str, list[str]] = {}  # a train section setting's problem: where resolved
        for name, method in self.methods.items():
            problems += _unknown(
                f"methods.{name}.per_backbone", method.per_backbone, self.backbones
            )
            try:
                self.triplets_for(name)
            except ValidationError as err:
                problems += _describe(err, prefix=f"methods.{name}.triplets", root=TripletsParams)
            for evaluation in method.evaluations:
                where = f"methods.{name}.evaluations.{evaluation}"
                if evaluation not in EVALUATIONS:
                    problems += _unknown(f"methods.{name}.evaluations", [evaluation], EVALUATIONS)
                elif not EVALUATIONS[evaluation].method_overrides:
                    problems.append(
                        f"{where}: {evaluation} takes no per-method settings (every run is "
                        f"scored alike); set evaluations.{evaluation} instead"
                    )
                else:
                    try:
                        self.evaluation_settings(evaluation, name)
                    except ValidationError as err:
                        root = EVALUATIONS[evaluation].settings
                        problems += _describe(err, prefix=where, root=root)
            for backbone in [None, *method.per_backbone]:
                try:
                    self.resolve(name, backbone)
                except ValidationError as err:
                    where = f"methods.{name}" + (f".per_backbone.{backbone}" if backbone else "")
                    override = method.per_backbone[backbone].train if backbone else {}
                    for line in _describe(err, prefix=where, root=ResolvedMethod):
                        written = _where_written(line, where, name, override, method.train)
                        if written.startswith("train."):  # the shared section: one line
                            shared.setdefault(written, []).append(where)
                        else:
                            problems.append(written)
        problems += [f"{line} (in {', '.join(wheres)})" for line, wheres in shared.items()]
        problems += self._unread_evaluation_settings()
        if problems:
            raise ValueError("\n".join(dict.fromkeys(problems)))
        return self

    def _unread_evaluation_settings(self) -> list[str]:
        """Evaluation settings given where the evaluation does not read them
        (stages/core/schema/unread.py): the section's, and each method's overrides."""
        lines: list[str] = []
        for evaluation in EVALUATIONS:
            for method in [None, *self.methods]:
                own = method is not None and evaluation in self.methods[method].evaluations
                if method is not None and not own:
                    continue  # the section's settings, checked once
                try:
                    settings = self.evaluation_settings(evaluation, method)
                except ValidationError:
                    continue  # named above
                if settings.is_enabled():
                    where = f"methods.{method}." if own else ""
                    found = refusals(f"evaluations.{evaluation}", settings)
                    lines += [f"{where}evaluations.{evaluation}.{line}" for line in found]
        return lines

    def unusual_settings(self) -> tuple[str, ...]:
        """One line per bounded value outside the range the papers use (a row of
        ``bounds.BOUNDS``; accepted, with a warning), at the key path where it is written."""
        seen: set[tuple[str | None, str, float]] = set()
        lines: list[str] = []

        def note(owner: str | None, found: list[tuple[str, float, Any]], prefix: str) -> None:
            for path, value, bound in found:
                if (None, path, value) not in seen and (owner, path, value) not in seen:
                    seen.add((owner, path, value))
                    lines.append(warning_line(prefix + path, value, bound))

        note(None, unusual_values(self), "")  # the sections (methods: as resolved, below)
        for method, spec in self.methods.items():
            where = f"methods.{method}."
            note(method, unusual_values(self.triplets_for(method), "triplets"), where)
            for backbone in [None, *spec.per_backbone]:
                where = f"methods.{method}." + (f"per_backbone.{backbone}." if backbone else "")
                note(method, unusual_values(self.resolve(method, backbone)), where)
        return tuple(lines)

    def written(self) -> dict[str, Any]:
        """The params file as written (grids unexpanded, defaults not filled in): what DVC
        reads; for params built in code, their full dump."""
        return self._written or self.model_dump(mode="json")

    def method_key(self, method: str) -> str:
        """The key under which the papers' published numbers for ``method`` are filed."""
        return self.methods[method].method_key or method

    def triplets_for(self, method: str) -> TripletsParams:
        """The masked-triplet settings of ``method``'s runs: the section, its overrides applied."""
        return _overridden(self.triplets, self.methods[method].triplets)

    def evaluation_settings(self, evaluation: str, method: str | None) -> EvaluationSettings:
        """The settings of registered evaluation ``evaluation`` for ``method``'s runs (None: a
        baseline's): its section, the method's overrides applied where it takes them."""
        section: EvaluationSettings = getattr(self.evaluations, evaluation)
        if method is None or not EVALUATIONS[evaluation].method_overrides:
            return section
        return _overridden(section, self.methods[method].evaluations.get(evaluation))

    def planned_evaluations(self) -> tuple[str, ...]:
        """The registered evaluations enabled for a baseline or for some method's runs."""
        methods: list[str | None] = [None, *self.methods]
        return tuple(
            name
            for name in EVALUATIONS
            if any(self.evaluation_settings(name, method).is_enabled() for method in methods)
        )

    def resolve(self, method: str, backbone: str | None) -> ResolvedMethod:
        """The method's objective, schedule and train settings on ``backbone``."""
        m = self.methods[method]
        override = m.per_backbone.get(backbone) if backbone else None
        resolved = {
            # exclude_unset: the resolved objective knows which fields were given (unused_settings)
            "objective": _merge(
                m.objective.model_dump(exclude_unset=True), override and override.objective
            ),
            "temperature": _merge(m.temperature.model_dump(), override and override.temperature),
            "train": _merge(_merge(self.train.model_dump(), m.train), override and override.train),
        }
        return ResolvedMethod.model_validate(resolved)


SectionT = TypeVar("SectionT", bound=BaseModel)


def _overridden(section: SectionT, overrides: dict[str, Any] | None) -> SectionT:
    """``section`` with a method's ``overrides`` of it applied (validated as the section)."""
    if not overrides:
        return section
    return type(section).model_validate(_merge(section.model_dump(), overrides))


def _merge(base: dict[str, Any], update: dict[str, Any] | None) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in (update or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _where_written(
    line: str, where: str, method: str, override: dict[str, Any], own: dict[str, Any]
) -> str:
    """A resolved train setting's problem at the key path where the setting is written: the
    backbone's override, the method's train, or else the train section every method shares
    (one line, however many methods resolve it)."""
    head = f"{where}.train."
    if not line.startswith(head):
        return line
    key = line[len(head) :].split(":", 1)[0].split(".")
    if _written(override, key):
        return line
    if _written(own, key):
        return f"methods.{method}.train." + line[len(head) :]
    return "train." + line[len(head) :]


def _written(overrides: dict[str, Any], key: list[str]) -> bool:
    node: Any = overrides
    for part in key:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _unknown(path: str, names: Iterable[str], known: dict[str, Any]) -> list[str]:
    allowed = ", ".join(sorted(known)) or "(none defined)"
    return [f"{path}: unknown name '{n}'; defined: {allowed}" for n in names if n not in known]


def _describe(
    err: ValidationError, prefix: str = "", root: type[BaseModel] | None = None
) -> list[str]:
    """One line per problem: the dotted key path, what is wrong, and what is allowed."""
    errors = err.errors(include_url=False)
    locs = [e["loc"] for e in errors]
    lines = []
    for e in errors:
        loc = e["loc"]
        if e["type"] == "too_short" and any(o[: len(loc)] == loc and o != loc for o in locs):
            continue  # a container emptied by its failing items: the items' errors say why
        if not loc and e["type"] == "value_error":
            found = e["msg"].removeprefix("Value error, ").splitlines()  # paths below prefix
            lines += [f"{prefix}.{line}" if prefix else line for line in found]
            continue
        shown = [str(p) for i, p in enumerate(loc) if not _is_objective_tag(loc, i)]
        msg = e["msg"].removeprefix("Value error, ")
        if "[key]" in shown:
            shown.remove("[key]")
            msg = f"invalid name ({msg}: lowercase letters, digits, '-' and '_')"
        path = ".".join(([prefix] if prefix else []) + shown) or "(top level)"
        if e["type"] == "extra_forbidden":
            allowed = _fields_at(root or Params, loc[:-1])
            msg = "unknown key" + (f"; allowed keys: {', '.join(allowed)}" if allowed else "")
        elif e["type"] not in ("missing", "value_error") and "input" in e:
            msg += f" (got {e['input']!r})"
        lines.append(f"{path}: {msg}")
    return lines


def _is_objective_tag(loc: tuple[Any, ...], i: int) -> bool:
    # pydantic inserts the tag of a discriminated union into the location; it is noise here.
    return i > 0 and loc[i - 1] == "objective" and loc[i] in SETTINGS_BY_NAME


def _fields_at(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the model found by following ``loc`` from ``root`` (for hints)."""
    ann: Any = root
    for i, part in enumerate(loc):
        ann = _unwrap(ann)
        if _is_objective_tag(loc, i):
            ann = SETTINGS_BY_NAME[part]
        elif get_origin(ann) is dict:
            ann = get_args(ann)[1]
        elif get_origin(ann) is tuple:
            ann = get_args(ann)[0]
        elif isinstance(ann, type) and issubclass(ann, BaseModel) and part in ann.model_fields:
            ann = ann.model_fields[part].annotation
        else:
            return []
    ann = _unwrap(ann)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return list(ann.model_fields)
    return []


def _unwrap(ann: Any) -> Any:
    """Strip Annotated[...] and Optional[...] down to the underlying type."""
    while True:
        if get_origin(ann) is Annotated:
            ann = get_args(ann)[0]
        elif get_origin(ann) in (Union, UnionType) and type(None) in get_args(ann):
            rest = [a for a in get_args(ann) if a is not type(None)]
            ann = rest[0] if len(rest) == 1 else Union[tuple(rest)]  # noqa: UP007
        else:
            return ann


def parse_params(raw: Any, source: str = "params.yaml") -> Params:
    """Validate an already-parsed params mapping; raise ParamsError listing every problem."""
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: expected a mapping of sections, got {type(raw).__name__}")
    early = moved_keys(raw) or swept_method_problems(raw)
    if early:
        listed = "\n".join(f"  - {line}" for line in early)
        raise ParamsError(f"{source} is invalid:\n{listed}")
    try:
        params = Params.model_validate(expand_grids(raw))
    except GridError as err:
        raise ParamsError(f"{source} is invalid:\n  - {err}") from None
    except ValidationError as err:
        problems = "\n".join(f"  - {line}" for line in _describe(err))
        raise ParamsError(f"{source} is invalid:\n{problems}") from None
    params._written = copy.deepcopy(raw)
    return params


def swept_method_problems(raw: dict[str, Any]) -> list[str]:
    """What is wrong with a method that has a grid, as written: every point replaces the swept
    keys, so a bad value there would otherwise be dropped without a word."""
    methods = raw.get("methods")
    train = raw.get("train") if isinstance(raw.get("train"), dict) else {}
    problems: list[str] = []
    for name, method in (methods if isinstance(methods, dict) else {}).items():
        if not isinstance(method, dict) or "grid" not in method:
            continue
        written = {k: v for k, v in method.items() if k != "grid"}
        try:
            parsed = MethodParams.model_validate(written)
            TrainParams.model_validate(_merge(train, parsed.train))
        except ValidationError as err:
            root = TrainParams if err.title == TrainParams.__name__ else MethodParams
            prefix = f"methods.{name}" + (".train" if root is TrainParams else "")
            problems += _describe(err, prefix=prefix, root=root)
    return problems


def moved_keys(raw: dict[str, Any]) -> list[str]:
    """Where a key of an older params layout is now, one line per key found."""
    problems = [
        f"{name}: moved to evaluations.{name} (every evaluation's settings are under "
        "`evaluations:`, by the evaluation's name)"
        for name in FORMERLY_TOP_LEVEL
        if name in raw
    ]
    methods = raw.get("methods")
    for method, spec in (methods if isinstance(methods, dict) else {}).items():
        for name in FORMERLY_TOP_LEVEL:
            if isinstance(spec, dict) and name in spec:
                problems.append(
                    f"methods.{method}.{name}: moved to methods.{method}.evaluations.{name}"
                )
    return problems


def duplicate_keys(node: yaml.Node, path: tuple[str, ...] = ()) -> list[str]:
    """Keys given twice in one mapping, at any depth (YAML would keep the last silently)."""
    problems = []
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value)
            line = key.start_mark.line + 1
            if name in first_line and name != "<<":
                where = ".".join((*path, name))
                problems.append(f"{where}: given twice, at lines {first_line[name]} and {line}")
            first_line.setdefault(name, line)
            problems += duplicate_keys(value, (*path, name))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            problems += duplicate_keys(item, (*path, str(i)))
    return problems


def load_params(path: str | Path = DEFAULT_PARAMS) -> Params:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        duplicates = duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader))
        raw = yaml.safe_load(text)
    except FileNotFoundError:
        raise ParamsError(f"{path}: no such params file") from None
    except UnicodeDecodeError as err:
        raise ParamsError(
            f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); "
            "save it as UTF-8"
        ) from None
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from None
    if duplicates:
        listed = "\n".join(f"  - {d}" for d in duplicates)
        raise ParamsError(f"{path} is invalid:\n{listed}")
    params = parse_params(raw, source=str(path))
    for line in params.unusual_settings():
        if (str(path), line) not in _WARNED:  # once a process (a Snakefile loads it often)
            _WARNED.add((str(path), line))
            print(f"warning: {path}: {line}", file=sys.stderr)
    return params


_WARNED: set[tuple[str, str]] = set()
