"""Unsupervised STS scoring as SentEval's ``STSEval`` (and SimCSE's STS-B / SICK-R variant) does:
the cosine of the two sentence embeddings against the gold score, Pearson and Spearman x100.

For STS12-16 SentEval aggregates the subsets three ways: ``all`` (one correlation over the pairs of
every subset concatenated: the papers' number), ``mean`` (unweighted mean of the subsets'
correlations) and ``wmean`` (mean weighted by the subsets' pair counts).

Alignment and uniformity (Wang & Isola, 2020) are computed the way SimCSE and paper 003 report them
on STS-B: on L2-normalised embeddings, alignment over pairs with gold score > 4, uniformity over
every sentence of the split with t = 2.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.stats import pearsonr, spearmanr

from stages.senteval_protocol.loaders import STS_YEARS, StsPairs, StsTask

Embed = Callable[[Sequence[str]], np.ndarray]

ALIGNMENT_THRESHOLD = 4.0
UNIFORMITY_T = 2.0


def cosine_similarities(emb1: np.ndarray, emb2: np.ndarray) -> np.ndarray:
    """Each pair's cosine as SentEval's ``STSEval`` computes it: one pair at a time,
    ``np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v))`` in the embeddings' own dtype (float32
    for SimCSE's torch batcher), a zero vector scoring 0 (``np.nan_to_num``). Pairs of identical
    sentences have cosine 1 up to the last bits, and Spearman ranks those near-ties by exactly these
    bits: a vectorised or float64 cosine orders them differently (up to 0.18 Spearman on STS12's
    SMTeuroparl)."""
    u, v = np.asarray(emb1), np.asarray(emb2)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = [
            np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))
            for a, b in zip(u, v, strict=True)
        ]
    return np.nan_to_num(np.array(cos, dtype=np.result_type(u, v)))


def correlations(system: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Pearson and Spearman x100 of system scores against gold scores."""
    return {
        "pearson": 100 * float(pearsonr(system, gold)[0]),
        "spearman": 100 * float(spearmanr(system, gold)[0]),
        "n": len(gold),
    }


def aggregate(subsets: dict[str, dict[str, float]], all_pairs: dict[str, float]) -> dict[str, Any]:
    """SentEval's 'all', 'mean' and 'wmean' over the subsets of one STS year."""
    weights = np.array([s["n"] for s in subsets.values()], dtype=np.float64)
    out: dict[str, Any] = {"all": {k: all_pairs[k] for k in ("pearson", "spearman")}}
    for name, w in (("mean", None), ("wmean", weights)):
        out[name] = {
            k: float(np.average([s[k] for s in subsets.values()], weights=w))
            for k in ("pearson", "spearman")
        }
    return out


def score_sts(task: StsTask, embed: Embed) -> dict[str, Any]:
    """Correlations per subset (STS12-16) or per split (STS-B, SICK-R) and the aggregates."""
    system = {part.name: _pair_cosines(part, embed) for part in task.parts}
    parts = {part.name: correlations(system[part.name], part.scores) for part in task.parts}
    if task.name not in STS_YEARS:
        return parts
    everything = correlations(
        np.concatenate(list(system.values())), np.concatenate([p.scores for p in task.parts])
    )
    return {"subsets": parts, **aggregate(parts, everything), "n": everything["n"]}


def headline(task_name: str, result: dict[str, Any]) -> float:
    """The number the papers' tables report: 'all' Spearman, or test Spearman for STS-B/SICK-R."""
    return result["all"]["spearman"] if task_name in STS_YEARS else result["test"]["spearman"]


def alignment_uniformity(
    emb1: np.ndarray,
    emb2: np.ndarray,
    scores: np.ndarray,
    threshold: float = ALIGNMENT_THRESHOLD,
    t: float = UNIFORMITY_T,
) -> dict[str, float]:
    """Alignment over pairs scored above ``threshold``; uniformity over all sentences of both
    columns (duplicates included, as the embeddings of the split's pairs)."""
    a, b = _normalise(emb1), _normalise(emb2)
    positive = scores > threshold
    if not positive.any():
        raise ValueError(f"no pair has a gold score above {threshold}: alignment is undefined")
    alignment = float(np.mean(np.sum((a[positive] - b[positive]) ** 2, axis=1)))
    uniformity = _uniformity(np.concatenate([a, b]), t)
    return {
        "alignment": alignment,
        "uniformity": uniformity,
        "positive_pairs": int(positive.sum()),
        "sentences": 2 * len(scores),
    }


def _uniformity(x: np.ndarray, t: float, block: int = 1024) -> float:
    """log of the mean of exp(−t·|x_i − x_j|²) over the pairs i < j of the rows of ``x``.
    The squared distances come from matrix products, |x_i|² + |x_j|² − 2 x_i·x_j, a block of
    rows at a time (memory stays at block × n): scipy's pdist takes one core and ~0.7 s for STS-B
    dev's 3,000 sentences at width 768, at every dev evaluation of a training run. The mean over
    ordered pairs i ≠ j equals the mean over i < j (the distance is symmetric)."""
    n = len(x)
    squared_norms = np.einsum("ij,ij->i", x, x)
    total = 0.0
    for start in range(0, n, block):
        rows = slice(start, min(start + block, n))
        sq = squared_norms[rows, None] + squared_norms[None, :] - 2 * (x[rows] @ x.T)
        kernel = np.exp(-t * np.maximum(sq, 0))
        own = np.arange(rows.start, rows.stop)
        total += kernel.sum() - kernel[own - start, own].sum()
    return float(np.log(total / (n * (n - 1))))


def _normalise(emb: np.ndarray) -> np.ndarray:
    x = np.asarray(emb, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _pair_cosines(part: StsPairs, embed: Embed) -> np.ndarray:
    return cosine_similarities(embed(part.sent1), embed(part.sent2))
