"""``evaluate`` end to end on a synthetic SentEval tree with a bag-of-words encoder: the results
layout, encoding each sentence once, the cache, and loud failures on bad encoder output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from senteval_testing import BagOfWords

from stages.core.schema.evaluation_settings import SENTEVAL_STS_TASKS as STS_TASKS
from stages.core.schema.evaluation_settings import SENTEVAL_TASKS as TASKS
from stages.core.schema.evaluation_settings import SENTEVAL_TRANSFER_TASKS as TRANSFER_TASKS
from stages.senteval_protocol.cache import EmbeddingCache
from stages.senteval_protocol.embeddings import EncoderOutputError
from stages.senteval_protocol.loaders import downstream_dir, load_task
from stages.senteval_protocol.protocol import evaluate, table_average
from stages.senteval_protocol.stsb_dev import StsbDevEvaluation
from stages.senteval_protocol.transfer import majority_accuracy


def test_all_tasks_results_protocol_and_timings(
    senteval_root: Path, bag_of_words: BagOfWords
) -> None:
    out = evaluate(bag_of_words, TASKS, senteval_root, "fasttest", batch_size=16, device="cpu")
    assert set(out["tasks"]) == set(TASKS)
    for name in TRANSFER_TASKS:
        result = out["tasks"][name]
        assert 50 < result["acc"] <= 100, name  # the keywords make every task learnable
        assert {"devacc", "acc", "ndev", "ntest", "l2", "majority_acc"} <= set(result)
        assert result["acc"] > result["majority_acc"], name
    assert 0 <= out["tasks"]["MRPC"]["f1"] <= 100
    for name in STS_TASKS:
        assert -100 <= out["summary"]["sts"][name] <= 100
    assert set(out["tasks"]["STS15"]) == {"subsets", "all", "mean", "wmean", "n"}
    assert out["tasks"]["STS15"]["n"] == 5 * 11  # one unscored pair per subset dropped
    assert set(out["tasks"]["SICKRelatedness"]) == {"dev", "test"}
    assert out["summary"]["transfer_avg"] == pytest.approx(
        np.mean([out["tasks"][t]["acc"] for t in TRANSFER_TASKS])
    )
    # SimCSE's evaluation.py averages the printed ("%.2f") cells
    printed = [float(f"{out['summary']['sts'][t]:.2f}") for t in STS_TASKS]
    assert out["summary"]["sts_avg"] == pytest.approx(np.mean(printed), abs=1e-12)
    protocol = out["protocol"]
    assert protocol["mode"] == "fasttest"
    assert protocol["classifier"]["kfold"] == 5 and protocol["classifier"]["optimizer"] == "rmsprop"
    assert protocol["classifier"]["l2_grid"] == [1e-5, 1e-4, 1e-3, 1e-2]
    assert len(protocol["data"]["files"]["MR"]) == 2
    assert {"alignment", "uniformity"} <= set(out["alignment_uniformity"])
    assert set(out["timings"]["tasks"]["MR"]) == {"encode_s", "classifier_s", "embeddings"}


def test_each_distinct_sentence_is_encoded_once_in_batches(
    senteval_root: Path, bag_of_words: BagOfWords
) -> None:
    tasks = ["STS12", "STS13", "MRPC", "CR"]
    evaluate(bag_of_words, tasks, senteval_root, "fasttest", batch_size=8, device="cpu")
    down = downstream_dir(senteval_root)
    distinct = set().union(*(load_task(down, t).texts for t in tasks))
    assert len(bag_of_words.encoded) == len(distinct)
    assert set(bag_of_words.encoded) == distinct  # CR's empty line is sent as ''
    assert max(len(call) for call in bag_of_words.calls) == 8

    whole = BagOfWords()
    evaluate(whole, tasks, senteval_root, "fasttest", batch_size=None, device="cpu")
    assert len(whole.calls) == len(tasks) and sorted(whole.encoded) == sorted(distinct)


def test_empty_sentence_text_is_configurable(senteval_root: Path, bag_of_words: BagOfWords) -> None:
    evaluate(bag_of_words, ["CR"], senteval_root, "fasttest", device="cpu", empty_sentence=".")
    assert "." in bag_of_words.encoded and "" not in bag_of_words.encoded


def test_cache_makes_a_rerun_encode_nothing(senteval_root: Path, tmp_path: Path) -> None:
    first_encoder, second_encoder = BagOfWords(), BagOfWords()
    cache = EmbeddingCache(tmp_path / "cache", "fp1")
    tasks = ["STS16", "TREC"]
    first = evaluate(first_encoder, tasks, senteval_root, "fasttest", cache=cache, device="cpu")
    second = evaluate(second_encoder, tasks, senteval_root, "fasttest", cache=cache, device="cpu")
    assert first_encoder.calls and not second_encoder.calls
    assert second["tasks"] == first["tasks"]
    assert second["timings"]["tasks"]["TREC"]["embeddings"] == "cache"

    # changed data: the stale entry is ignored and rewritten
    trec = senteval_root / "downstream" / "TREC" / "TREC_10.label"
    trec.write_text(trec.read_text(encoding="latin-1") + "HUM:ind Who is new here ?\n", "latin-1")
    third_encoder = BagOfWords()
    evaluate(third_encoder, ["TREC"], senteval_root, "fasttest", cache=cache, device="cpu")
    assert third_encoder.calls


def test_an_unreadable_cache_entry_is_encoded_again_and_rewritten(
    senteval_root: Path, tmp_path: Path
) -> None:
    cache = EmbeddingCache(tmp_path / "cache", "fp1")
    first = evaluate(BagOfWords(), ["STS16"], senteval_root, "fasttest", cache=cache, device="cpu")
    stored = cache.path("STS16").read_bytes()
    cache.path("STS16").write_bytes(stored[: len(stored) // 2])  # a write cut short elsewhere
    encoder = BagOfWords()
    with pytest.warns(UserWarning, match="STS16.npz: unreadable cache entry"):
        again = evaluate(encoder, ["STS16"], senteval_root, "fasttest", cache=cache, device="cpu")
    assert encoder.calls and again["tasks"] == first["tasks"]
    assert cache.path("STS16").read_bytes() == stored


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (lambda s: np.full((len(s), 4), np.nan), "non-finite embedding"),
        (lambda s: np.zeros((len(s) + 1, 4)), r"shape \(\d+, 4\) for \d+ sentences"),
        (lambda s: np.zeros(len(s)), "shape"),
    ],
)
def test_bad_encoder_output_fails_loudly(senteval_root: Path, broken, message: str) -> None:
    with pytest.raises(EncoderOutputError, match=message):
        evaluate(broken, ["STS13"], senteval_root, "fasttest")


def test_unknown_task_or_mode(senteval_root: Path, bag_of_words: BagOfWords) -> None:
    with pytest.raises(ValueError, match="unknown SentEval task"):
        evaluate(bag_of_words, ["STS17"], senteval_root)
    with pytest.raises(ValueError, match="unknown mode 'dev'"):
        evaluate(bag_of_words, ["STS13"], senteval_root, "dev")


def test_stsb_dev_evaluation_is_the_evaluators_own_numbers(
    senteval_root: Path, bag_of_words: BagOfWords
) -> None:
    dev = StsbDevEvaluation(senteval_root)(bag_of_words)
    full = evaluate(BagOfWords(), ["STSBenchmark"], senteval_root, "fasttest", device="cpu")
    assert dev.spearman == full["tasks"]["STSBenchmark"]["dev"]["spearman"]
    assert dev.pearson == full["tasks"]["STSBenchmark"]["dev"]["pearson"]
    assert dev.alignment == full["alignment_uniformity"]["alignment"]
    assert dev.uniformity == full["alignment_uniformity"]["uniformity"]
    assert len(bag_of_words.encoded) == len(set(bag_of_words.encoded))


def test_majority_accuracy_is_always_predicting_the_most_frequent_scored_class(
    senteval_root: Path,
) -> None:
    """Over the samples each task scores: all of a cross-validated task, the test split else."""
    root = downstream_dir(senteval_root)
    for name, scored in (("CR", "all"), ("TREC", "test"), ("SST2", "test")):
        labels = load_task(root, name).splits[scored].labels
        expected = 100 * np.bincount(labels).max() / len(labels)
        result = evaluate(BagOfWords(), [name], senteval_root, "fasttest", device="cpu")
        assert result["tasks"][name]["majority_acc"] == pytest.approx(expected, abs=0.005), name
    assert majority_accuracy(np.array([0, 1, 1, 2])) == 50.0


def test_table_averages_are_means_of_the_printed_cells() -> None:
    """SimCSE's evaluation.py: float("%.2f" % score) per cell, then their mean."""
    assert table_average([70.004, 80.008]) == pytest.approx((70.00 + 80.01) / 2, abs=1e-12)
    assert table_average([70.004, 80.004]) == pytest.approx(75.0, abs=1e-12)  # not 75.004


def test_mrpc_pair_features_are_computed_in_the_embeddings_dtype() -> None:
    """SentEval's MRPC builds np.c_[|u - v|, u * v] from the batcher's arrays; its classifier
    casts to float32 after."""
    from stages.senteval_protocol.loaders import LabelledSplit
    from stages.senteval_protocol.transfer import features

    rng = np.random.default_rng(0)
    table = {t: rng.standard_normal(4) for t in ("a", "b", "c", "d")}
    split = LabelledSplit(columns=(["a", "b"], ["c", "d"]), labels=np.array([0, 1]))
    embed = lambda texts: np.stack([table[t] for t in texts])  # noqa: E731 (float64)
    u, v = embed(["a", "b"]), embed(["c", "d"])
    expected = np.c_[np.abs(u - v), u * v].astype(np.float32)
    got = features(split, embed)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
