"""The experiments of a params file with content-addressed ids: the ``Plan`` of its runs and
baselines, built once (``plan``) and handed to every stage, the job graph and the report.

An experiment is what an evaluation scores (``Experiment``): a ``Run``, one (method, backbone,
seed) cell of ``experiments`` in params.yaml, trained; or a ``Baseline``, an untrained backbone.
A run carries its settings, its identity and id, and every path it reads or writes. Its id hashes
everything that determines its result:

- the method's objective, temperature schedule and train settings on that backbone, as their
  fields' id markers say (``stages.core.schema.id_markers``), the backbone by content, the seed;
- the data by content: the corpus and STS-B dev (checkpoint selection) by sha256, the masked
  triplets by their own id (which covers the masking code);
- the code: the fingerprint of every source file training runs (``code_identity``), including
  the loss module of its own objective and no other;
- with ``identity.environment: major_minor``, the torch and transformers versions.

So the same configuration always maps to the same ``runs/<run_id>/`` and is never trained twice,
changing one method's tau touches only that method's runs, and editing one loss's arithmetic
retrains exactly the runs that use it. Evaluations are addressed the same way
(``evaluation_id``): their run's id, their params section, their protocol's code and data.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from stages.core.errors import ParamsError, StageError
from stages.core.identity.backbones import (
    LOCK_FILE,
    backbone_content,
    is_commit,
    is_hub,
    local_folder,
    pinned_spec,
    read_lock,
    unpinned,
)
from stages.core.identity.code import code_files, code_identity
from stages.core.identity.environment import id_environment
from stages.core.schema.data_manifest import load_manifest
from stages.core.schema.evaluation_settings import EVALUATIONS
from stages.core.schema.id_markers import identity_settings
from stages.core.schema.objective_settings import OBJECTIVES, ObjectiveSettings
from stages.core.schema.params import (
    BackboneParams,
    BaselineParams,
    Params,
    ResolvedMethod,
    TrainParams,
)
from stages.core.storage import layout

# Bump only when the layout of the identity itself changes (code changes are covered by it).
ID_SCHEMA = 2
STSB_DEV = "senteval/downstream/STS/STSBenchmark/sts-dev.csv"
ID_LENGTH = 16

# The entry modules of each output kind; their import closures are the code they cover.
TRAIN_CODE = ("stages.train", "stages.objectives.temperature")
TRIPLETS_CODE = ("stages.triplets",)
FIGURES_CODE = ("stages.figures",)
REPORT_CODE = ("stages.report",)


def content_hash(payload: Any, length: int = ID_LENGTH) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:length]


def experiment_name(method: str, backbone: str, seed: int) -> str:
    return f"{method}.{backbone}.s{seed}"


def baseline_name(baseline: str) -> str:
    return f"baseline.{baseline}"


def loss_module(objective: ObjectiveSettings) -> str:
    return OBJECTIVES[type(objective)].split(":")[0]


def train_code_modules(objective: ObjectiveSettings) -> tuple[str, ...]:
    return (*TRAIN_CODE, loss_module(objective))


@cache
def _manifest_checksums() -> dict[str, str | None]:
    manifest = load_manifest()
    return {f.path: f.sha256 for d in manifest.datasets.values() for f in d.files}


def data_sha256(path: Path) -> str | None:
    """The manifest's sha256 of a file under data/ (what the download verified)."""
    return _manifest_checksums().get(path.relative_to(layout.DATA).as_posix())


def corpus_identity(params: Params) -> dict[str, Any]:
    """The training sentences, by content."""
    return {
        **identity_settings(params.data),
        "sha256": data_sha256(layout.corpus_file(params.data.corpus)),
    }


def dev_set_identity() -> str | None:
    """STS-B dev selects the best checkpoint, so it is part of what determines a run."""
    return _manifest_checksums()[STSB_DEV]


def local_model_folder(spec: BackboneParams) -> tuple[str, ...]:
    """The backbone's folder when it is a local one (a job dependency), else nothing."""
    folder = local_folder(spec)
    return (spec.model,) if folder else ()


def lock_deps(spec: BackboneParams) -> tuple[str, ...]:
    """backbones.lock for a hub backbone ``spec`` (as params write it) on a branch or tag: the
    ids hold the commit the lock gives it (``cse pin``), so a DVC job reading it depends on the
    file; else nothing (a commit names fixed weights; a package's version and files are in the
    ids, which Snakemake sees and DVC does not)."""
    return (str(LOCK_FILE),) if is_hub(spec) and not is_commit(spec.revision) else ()


def backbone_identity(spec: BackboneParams) -> dict[str, Any]:
    """The backbone's settings (a hub revision pinned to its commit: ``pinned_spec``) and the
    content they do not name (``backbones.backbone_content``)."""
    return {**identity_settings(spec), **backbone_content(spec)}


@dataclass(frozen=True)
class Backbone:
    """A backbone of params as the ids see it: its spec pinned (a locked branch's revision the
    commit) and its identity; resolved once per plan (a package's files are hashed once)."""

    spec: BackboneParams
    content: dict[str, Any]  # backbones.backbone_content

    @property
    def identity(self) -> dict[str, Any]:
        return {**identity_settings(self.spec), **self.content}


def resolve_backbones(params: Params, keys: Iterable[str] | None = None) -> dict[str, Backbone]:
    """The backbones ``keys`` of ``params`` (None: all), pinned by backbones.lock, with their
    content (a package that is not installed: a ParamsError naming its key)."""
    lock = read_lock()
    resolved = {}
    for key in params.backbones if keys is None else keys:
        spec = pinned_spec(params.backbones[key], lock)
        try:
            resolved[key] = Backbone(spec, backbone_content(spec))
        except ParamsError as err:
            raise ParamsError(f"backbones.{key}.model: {err}") from None
    return resolved


def triplets_id(
    params: Params, backbone: str, method: str, resolved: Backbone | None = None
) -> str:
    """Content address of the masked-triplet file ``method``'s runs on ``backbone`` read: the
    corpus, the tokenizer (model and pinned revision, a folder's or package's files), the
    method's triplets settings and the masking code. Methods with the same settings share one
    file. ``resolved``: the backbone as the plan resolved it (None: resolve it)."""
    found = resolved or resolve_backbones(params, [backbone])[backbone]
    spec = found.spec
    return content_hash(
        {
            "corpus": corpus_identity(params)["sha256"] or params.data.corpus,
            "tokenizer": f"{spec.model}@{spec.revision}",
            **found.content,
            "params": identity_settings(params.triplets_for(method)),
            "code": code_identity(TRIPLETS_CODE),
            "environment": id_environment(params.identity.environment),
        }
    )


@dataclass(frozen=True)
class Run:
    """One trained run: its settings, identity, id and paths."""

    name: str
    method: str
    backbone: str
    seed: int
    settings: ResolvedMethod
    backbone_spec: BackboneParams
    corpus: Path
    max_sentences: int | None
    triplets_id: str | None
    triplets: Path | None  # the masked-triplet file its objective reads (data/triplets/<id>)
    identity: dict[str, Any]

    @cached_property
    def run_id(self) -> str:
        return content_hash(self.identity)

    @property
    def device(self) -> str:
        return self.settings.train.device

    @property
    def needs_triplets(self) -> bool:
        return self.triplets_id is not None

    @property
    def run_dir(self) -> Path:
        """The finished run in the runs store (appears only when complete)."""
        return layout.run_dir(self.run_id)

    @property
    def partial_dir(self) -> Path:
        """Where the run trains and resumes until it is complete."""
        return self.run_dir.with_name(self.run_id + ".partial")

    @property
    def pointer_file(self) -> Path:
        """experiments/<name>/train.json: the small file the orchestrators track."""
        return layout.experiment_dir(self.name) / "train.json"

    @property
    def curve_files(self) -> tuple[Path, Path]:
        return layout.train_steps_file(self.name), layout.dev_curve_file(self.name)

    @property
    def code_modules(self) -> tuple[str, ...]:
        return train_code_modules(self.settings.objective)

    @property
    def code_files(self) -> tuple[str, ...]:
        return code_files(self.code_modules)

    def evaluated_identity(self) -> dict[str, Any]:
        """What its evaluations score (part of their ids): its best checkpoint, by the run id."""
        return {"run_id": self.run_id}

    def config(self) -> dict[str, Any]:
        """config.json of the run: its identity (what the id hashes) and resolved settings."""
        return {
            "run_id": self.run_id,
            "experiment": self.name,
            "method": self.method,
            "backbone": self.backbone,
            "seed": self.seed,
            "identity": self.identity,
            "settings": self.settings.model_dump(mode="json"),
            "backbone_spec": self.backbone_spec.model_dump(mode="json"),
            "corpus": str(self.corpus),
            "triplets": str(self.triplets) if self.triplets else None,
            "triplets_id": self.triplets_id,
        }


def train_identity(train: TrainParams) -> dict[str, Any]:
    """The train settings a run id covers, as their fields' id markers say: no execution-only
    key, and a key added later only where it is not at its frozen ``absent`` value."""
    return identity_settings(train)


def make_run(
    params: Params,
    method: str,
    backbone: str,
    seed: int,
    code_memo: dict[tuple[str, ...], dict[str, str]] | None = None,
    backbones: dict[str, Backbone] | None = None,
) -> Run:
    """The run of (method, backbone, seed). ``code_memo`` shares the code identities of a
    matrix's runs: they differ only by loss module, and the import closure is read from disk;
    ``backbones``, the backbones as the plan resolved them (None: resolve them)."""
    resolved = (backbones or resolve_backbones(params, [backbone]))[backbone]
    spec = resolved.spec
    settings = params.resolve(method, backbone)
    modules = train_code_modules(settings.objective)
    memo = {} if code_memo is None else code_memo
    if modules not in memo:
        memo[modules] = code_identity(modules)
    needs_triplets = settings.objective.needs_triplets
    tid = triplets_id(params, backbone, method, resolved) if needs_triplets else None
    identity = {
        "id_schema": ID_SCHEMA,
        "objective": identity_settings(settings.objective),
        "objective_derived": settings.objective.derived(),
        "temperature": identity_settings(settings.temperature),
        "train": train_identity(settings.train),
        "backbone": resolved.identity,
        "seed": seed,
        "corpus": corpus_identity(params),
        "triplets": tid,
        "dev_set": dev_set_identity(),
        "code": memo[modules],
        "environment": id_environment(params.identity.environment),
    }
    return Run(
        name=experiment_name(method, backbone, seed),
        method=method,
        backbone=backbone,
        seed=seed,
        settings=settings,
        backbone_spec=spec,
        corpus=layout.corpus_file(params.data.corpus),
        max_sentences=params.data.max_sentences,
        triplets_id=tid,
        triplets=layout.triplets_file(tid) if tid else None,
        identity=identity,
    )


@dataclass(frozen=True)
class Baseline:
    """An untrained backbone evaluated as is (the papers' 'BERT first-last avg.' rows), named
    ``baseline.<key>``: it has no run and no method."""

    name: str
    key: str
    spec: BaselineParams
    backbone_spec: BackboneParams
    # how the plan's training would run (the estimates' device), though a baseline trains none
    device: str

    method: None = None

    @property
    def backbone(self) -> str:
        return self.spec.backbone

    def evaluated_identity(self) -> dict[str, Any]:
        """What its evaluations score (part of their ids): the pooler and the backbone."""
        return {
            "baseline": identity_settings(self.spec),
            "backbone": backbone_identity(self.backbone_spec),
        }


# What an evaluation scores: a trained run (its best checkpoint) or a baseline.
Experiment = Run | Baseline


@dataclass(frozen=True)
class Plan:
    """The matrix of a params file: its runs and baselines by experiment name, built once and
    handed to every stage, the job graph and the report, which look experiments up here and
    nowhere else."""

    params: Params
    runs: dict[str, Run]
    baselines: dict[str, Baseline]

    @property
    def experiments(self) -> dict[str, Experiment]:
        return {**self.runs, **self.baselines}

    def experiment(self, name: str) -> Experiment:
        """The planned run or baseline ``name``; a StageError listing them otherwise."""
        found = self.experiments.get(name)
        if found is None:
            planned = ", ".join(self.experiments) or "(none)"
            raise StageError(f"unknown experiment '{name}'; planned: {planned}")
        return found

    def run(self, name: str) -> Run:
        """The planned run ``name``; a StageError for a baseline (it has none) or a name the
        plan does not hold."""
        experiment = self.experiment(name)
        if not isinstance(experiment, Run):
            raise StageError(f"{name} is a baseline, evaluated as is: it has no trained run")
        return experiment

    def unpinned_backbones(self) -> dict[str, BackboneParams]:
        """The planned experiments' hub backbones on a branch or tag that backbones.lock does
        not pin, by their key (their specs are pinned where it does)."""
        return {
            e.backbone: e.backbone_spec
            for e in self.experiments.values()
            if unpinned(e.backbone_spec, {})
        }

    def evaluation_id(self, evaluation: str, experiment: Experiment) -> str:
        """Content address of registered evaluation ``evaluation`` of ``experiment``: what it
        scores, its settings, its data, its stage module's code and the environment switch."""
        settings = self.params.evaluation_settings(evaluation, experiment.method)
        return content_hash(
            {
                "stage": evaluation,
                "evaluated": experiment.evaluated_identity(),
                "params": identity_settings(settings),
                "data": content_hash(settings.data_identity()),
                "code": code_identity(EVALUATIONS[evaluation].code_modules),
                "environment": id_environment(self.params.identity.environment),
            }
        )


def plan_experiments(params: Params) -> Plan:
    """Every run of the matrix by experiment name, in params order (a run listed by two
    experiment groups once), then the baselines."""
    runs: dict[str, Run] = {}
    code_memo: dict[tuple[str, ...], dict[str, str]] = {}
    # the planned ones only: a backbone no experiment uses needs no content (nor its package)
    used = [b for group in params.experiments for b in group.backbones]
    used += [baseline.backbone for baseline in params.baselines.values()]
    backbones = resolve_backbones(params, dict.fromkeys(used))
    for group in params.experiments:
        for method in group.methods:
            for backbone in group.backbones:
                for seed in group.seeds:
                    name = experiment_name(method, backbone, seed)
                    if name not in runs:
                        runs[name] = make_run(params, method, backbone, seed, code_memo, backbones)
    baselines = {
        baseline_name(key): Baseline(
            baseline_name(key),
            key,
            spec,
            backbones[spec.backbone].spec,
            params.train.device,
        )
        for key, spec in params.baselines.items()
    }
    return Plan(params, runs, baselines)
