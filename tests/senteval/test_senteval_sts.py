"""STS scoring on hand-built embeddings whose cosines and correlations are known by hand."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr

from stages.senteval_protocol.cache import EmbeddingCache
from stages.senteval_protocol.loaders import StsPairs, StsTask
from stages.senteval_protocol.protocol import EmbeddingTable
from stages.senteval_protocol.sts import (
    _uniformity,
    alignment_uniformity,
    cosine_similarities,
    headline,
    score_sts,
)


def _pairs(name: str, cosines: list[float], gold: list[float]) -> tuple[StsPairs, dict]:
    """Pairs whose embeddings have exactly the given cosines: [1, 0] vs [c, sqrt(1 - c^2)]."""
    vectors, s1, s2 = {}, [], []
    for i, c in enumerate(cosines):
        s1.append(f"{name} left {i}")
        s2.append(f"{name} right {i}")
        vectors[s1[-1]] = [2.0, 0.0]  # the norm does not matter
        vectors[s2[-1]] = [c, math.sqrt(1 - c * c)]
    return StsPairs(name, s1, s2, np.array(gold, dtype=np.float64)), vectors


def _lookup(vectors: dict):
    return lambda texts: np.array([vectors[t] for t in texts], dtype=np.float32)


def test_subset_correlations_and_the_three_aggregates() -> None:
    # subset A: cosines 0, 1/3, 2/3, 1 against gold ranks 0, 2, 1, 3 -> Pearson = Spearman = 0.8
    a, va = _pairs("A", [0, 1 / 3, 2 / 3, 1], [0, 2, 1, 3])
    # subset B: cosines 0, 1/2, 1 against 0, 1, 2 -> 1.0
    b, vb = _pairs("B", [0, 1 / 2, 1], [0, 1, 2])
    task = StsTask("STS13", (a, b), ())
    result = score_sts(task, _lookup(va | vb))

    assert result["subsets"]["A"]["spearman"] == pytest.approx(80.0)
    assert result["subsets"]["A"]["pearson"] == pytest.approx(80.0)
    assert result["subsets"]["B"]["spearman"] == pytest.approx(100.0)
    assert result["mean"]["spearman"] == pytest.approx(90.0)
    assert result["wmean"]["spearman"] == pytest.approx(100 * (4 * 0.8 + 3 * 1.0) / 7)
    # 'all': ranks of the 7 cosines (1.5, 3, 5, 6.5, 1.5, 4, 6.5) against the ranks of the gold
    # scores (1.5, 5.5, 3.5, 7, 1.5, 3.5, 5.5); both average 4, so rho = sum(dc*dg)/norms
    assert result["all"]["spearman"] == pytest.approx(100 * 21.75 / math.sqrt(27 * 26.5))
    assert result["n"] == 7
    assert headline("STS13", result) == result["all"]["spearman"]


def test_split_tasks_report_each_split_and_the_test_headline() -> None:
    dev, vd = _pairs("dev", [0.1, 0.5, 0.9], [1, 2, 3])
    test, vt = _pairs("test", [0.9, 0.5, 0.1, 0.3], [1, 2, 3, 4])
    result = score_sts(StsTask("STSBenchmark", (dev, test), ()), _lookup(vd | vt))
    assert set(result) == {"dev", "test"}
    assert result["dev"]["spearman"] == pytest.approx(100.0)
    # ranks of the cosines (4, 3, 1, 2) against 1..4: 1 - 6 * (9 + 1 + 4 + 4) / (4 * 15)
    assert headline("STSBenchmark", result) == pytest.approx(100 * (1 - 6 * 18 / 60))


def test_zero_vectors_score_zero_like_sentevals_nan_to_num() -> None:
    cos = cosine_similarities(
        np.array([[0.0, 0.0], [1.0, 1.0]]), np.array([[1.0, 0.0], [2.0, 2.0]])
    )
    np.testing.assert_allclose(cos, [0.0, 1.0])


def test_alignment_and_uniformity_by_hand() -> None:
    a = np.array([[3.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    b = np.array([[0.0, 2.0], [0.0, 5.0], [-1.0, 0.0]])
    scores = np.array([4.5, 5.0, 1.0])  # only the first two pairs are positives (> 4)
    out = alignment_uniformity(a, b, scores)
    # normalised pair distances^2: |e1 - e2|^2 = 2 and |e2 - e2|^2 = 0 -> mean 1
    assert out["alignment"] == pytest.approx(1.0)
    # the six unit vectors are e1, e2, e1, e2, e2, -e1: squared distances between all 15 pairs
    units = np.array([[1, 0], [0, 1], [1, 0], [0, 1], [0, 1], [-1, 0]], dtype=float)
    sq = [np.sum((units[i] - units[j]) ** 2) for i in range(6) for j in range(i + 1, 6)]
    assert out["uniformity"] == pytest.approx(math.log(np.mean(np.exp(-2 * np.array(sq)))))
    assert out["positive_pairs"] == 2 and out["sentences"] == 6
    with pytest.raises(ValueError, match="no pair has a gold score above 4"):
        alignment_uniformity(a, b, np.zeros(3))


@pytest.mark.parametrize("n", [7, 2500])  # one block; three blocks, the last one partial
def test_uniformity_equals_the_mean_over_pdists_pairs(n: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 48))
    x[1] = x[0]  # identical sentences share one embedding: distance 0
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    expected = math.log(np.mean(np.exp(-2 * pdist(x, "sqeuclidean"))))
    assert _uniformity(x, 2.0) == pytest.approx(expected, rel=1e-12)


def _senteval_spearman(pairs: StsPairs, batcher, batch_size: int = 7) -> float:
    """SentEval's ``STSEval.run`` loop and ``utils.cosine``, transcribed: the batcher's arrays
    as they are, one pair at a time."""

    def cosine(u, v):
        return np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v))

    def similarity(s1, s2):
        return np.nan_to_num(cosine(np.nan_to_num(s1), np.nan_to_num(s2)))

    sys_scores = []
    for ii in range(0, len(pairs.scores), batch_size):
        enc1 = batcher(pairs.sent1[ii : ii + batch_size])
        enc2 = batcher(pairs.sent2[ii : ii + batch_size])
        sys_scores += [similarity(enc1[kk], enc2[kk]) for kk in range(enc2.shape[0])]
    return 100 * float(spearmanr(sys_scores, pairs.scores)[0])


def _identical_pairs(n: int = 300) -> StsPairs:
    """SMTeuroparl-like: most pairs hold the same sentence twice (cosine 1 up to the last bits),
    gold scores spread over the near-ties."""
    rng = np.random.default_rng(0)
    sent1 = [f"sentence {i}" for i in range(n)]
    sent2 = [s if i % 5 else f"other {i}" for i, s in enumerate(sent1)]
    return StsPairs("SMTeuroparl", sent1, sent2, rng.uniform(0, 5, n).round(1))


def _vectors(texts, dtype) -> np.ndarray:
    return np.stack(
        [np.random.default_rng(zlib.crc32(t.encode())).normal(size=48) for t in texts]
    ).astype(dtype)


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # torch->numpy
@pytest.mark.parametrize(
    "batcher",
    [
        pytest.param(lambda texts: torch.from_numpy(_vectors(texts, np.float32)), id="torch32"),
        pytest.param(lambda texts: _vectors(texts, np.float64), id="numpy64"),
    ],
)
def test_identical_sentence_near_ties_rank_as_sentevals_per_pair_loop(batcher, tmp_path) -> None:
    pairs = _identical_pairs()
    reference = _senteval_spearman(pairs, batcher)
    texts = pairs.sent1 + pairs.sent2
    cache = EmbeddingCache(tmp_path, "enc")
    for source in ("encoded", "cache"):  # the cache keeps the encoder's dtype
        table = EmbeddingTable(batcher, 16, cache, empty_sentence="")
        assert table.add("STS12", texts) == source
        result = score_sts(StsTask("STS12", (pairs,), ()), table)
        assert result["subsets"]["SMTeuroparl"]["spearman"] == reference
    assert table(pairs.sent1).dtype == np.asarray(batcher(pairs.sent1[:1])).dtype
    # the float64 vectorised cosine this replaces orders the near-ties differently
    a, b = table(pairs.sent1).astype(np.float64), table(pairs.sent2).astype(np.float64)
    float64 = np.einsum("ij,ij->i", a, b) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    if table(pairs.sent1).dtype == np.float32:
        assert 100 * spearmanr(float64, pairs.scores)[0] != pytest.approx(reference, abs=1e-6)
