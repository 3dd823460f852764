"""The experiment matrix, expanded into runs with content-addressed ids.

A run is one (method, backbone, seed) cell of ``experiments`` in params.yaml. Its id is a hash
of everything that determines its result (the method's objective, temperature schedule and
train settings on that backbone, the backbone and its revision, the seed, and fingerprints of
the training data), so the same configuration always maps to the same ``runs/<run_id>/`` and
is never trained twice, and changing one method's tau touches only that method's runs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from stages import layout
from stages.data_manifest import load_manifest
from stages.params import BackboneParams, BaselineParams, Params, ResolvedMethod

# Settings that change how a run executes but not what it computes; left out of the id.
EXECUTION_ONLY_TRAIN_KEYS = frozenset(
    {"device", "log_steps", "checkpoint_steps", "compile", "loggers"}
)
# Bump when a change to the code changes what every run computes (invalidates all run ids).
ID_SCHEMA = 1
STSB_DEV = "senteval/downstream/STS/STSBenchmark/sts-dev.csv"


def content_hash(payload: Any, length: int = 16) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:length]


def experiment_name(method: str, backbone: str, seed: int) -> str:
    return f"{method}.{backbone}.s{seed}"


def baseline_name(baseline: str) -> str:
    return f"baseline.{baseline}"


def backbone_identity(spec: BackboneParams) -> dict[str, Any]:
    return spec.model_dump(mode="json")


@cache
def _manifest_checksums() -> dict[str, str | None]:
    manifest = load_manifest()
    return {f.path: f.sha256 for d in manifest.datasets.values() for f in d.files}


def corpus_identity(params: Params) -> dict[str, Any]:
    """The training sentences, by content (the manifest checksum the download verified)."""
    path = str(layout.corpus_file(params.data.corpus).relative_to(layout.DATA))
    return {
        "corpus": params.data.corpus,
        "sha256": _manifest_checksums()[path],
        "max_sentences": params.data.max_sentences,
    }


def dev_set_identity() -> str | None:
    """STS-B dev selects the best checkpoint, so it is part of what determines a run."""
    return _manifest_checksums()[STSB_DEV]


def triplets_id(params: Params, backbone: str) -> str:
    """Content address of the masked-triplet file a run on ``backbone`` reads."""
    from stages.triplets import triplets_address  # imports transformers: only when needed

    spec = params.backbones[backbone]
    corpus_sha256 = corpus_identity(params)["sha256"] or params.data.corpus
    return triplets_address(corpus_sha256, f"{spec.model}@{spec.revision}", params.triplets)


@dataclass(frozen=True)
class Run:
    name: str
    method: str
    backbone: str
    seed: int
    settings: ResolvedMethod
    backbone_spec: BackboneParams
    triplets_id: str | None
    identity: dict[str, Any]

    @property
    def run_id(self) -> str:
        return content_hash(self.identity)

    @property
    def needs_triplets(self) -> bool:
        return self.triplets_id is not None


def make_run(params: Params, method: str, backbone: str, seed: int) -> Run:
    settings = params.resolve(method, backbone)
    train = settings.train.model_dump(mode="json", exclude=set(EXECUTION_ONLY_TRAIN_KEYS))
    needs_triplets = settings.objective.needs_triplets
    tid = triplets_id(params, backbone) if needs_triplets else None
    identity = {
        "id_schema": ID_SCHEMA,
        "objective": settings.objective.model_dump(mode="json"),
        "temperature": settings.temperature.model_dump(mode="json"),
        "train": train,
        "backbone": backbone_identity(params.backbones[backbone]),
        "seed": seed,
        "corpus": corpus_identity(params),
        "triplets": tid,
        "dev_set": dev_set_identity(),
    }
    return Run(
        name=experiment_name(method, backbone, seed),
        method=method,
        backbone=backbone,
        seed=seed,
        settings=settings,
        backbone_spec=params.backbones[backbone],
        triplets_id=tid,
        identity=identity,
    )


def plan_runs(params: Params) -> dict[str, Run]:
    """Every run of the matrix by experiment name, in params order, duplicates merged."""
    runs: dict[str, Run] = {}
    for group in params.experiments:
        for method in group.methods:
            for backbone in group.backbones:
                for seed in group.seeds:
                    run = make_run(params, method, backbone, seed)
                    runs.setdefault(run.name, run)
    return runs


def plan_baselines(params: Params) -> dict[str, BaselineParams]:
    return {baseline_name(name): spec for name, spec in params.baselines.items()}
