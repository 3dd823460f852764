"""SentEval's three model-selection procedures, batched, against their transcriptions: the same
folds, L2 choices, rounded dev and test accuracies."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import senteval_reference as reference
import torch

from stages.senteval_protocol import validation
from stages.senteval_protocol.classifier import MODES


@pytest.fixture
def settings():
    # small batches and few epochs keep the one-classifier-at-a-time reference quick
    return dataclasses.replace(MODES["fasttest"], batch_size=16, max_epoch=8, kfold=3)


def _data(n: int, c: int, seed: int, d: int = 8):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    score = x[:, 0] + 0.7 * x[:, 1] + 0.9 * rng.normal(size=n)
    y = np.digitize(score, np.quantile(score, np.linspace(0, 1, c + 1)[1:-1]))
    return x, y.astype(np.int64)


@pytest.mark.parity
def test_inner_kfold_matches_senteval(settings) -> None:
    x, y = _data(90, 2, seed=1)
    ours = validation.inner_kfold(torch.from_numpy(x), torch.from_numpy(y), 2, settings)
    devacc, acc, chosen = reference.inner_kfold(x, y, 2, settings)
    assert (ours.devacc, ours.acc, ours.l2) == (devacc, acc, chosen)


@pytest.mark.parity
def test_kfold_matches_senteval(settings) -> None:
    x, y = _data(120, 3, seed=2)
    train, test = slice(0, 90), slice(90, 120)
    ours = validation.kfold(
        torch.from_numpy(x[train]),
        torch.from_numpy(y[train]),
        torch.from_numpy(x[test]),
        y[test],
        3,
        settings,
    )
    devacc, acc, best, yhat = reference.kfold(x[train], y[train], x[test], y[test], 3, settings)
    assert (ours.devacc, ours.acc, ours.l2) == (devacc, acc, [best])
    np.testing.assert_array_equal(ours.test_predictions, yhat)


@pytest.mark.parity
def test_split_matches_senteval(settings) -> None:
    x, y = _data(150, 2, seed=3)
    parts = {"train": slice(0, 90), "valid": slice(90, 120), "test": slice(120, 150)}
    ours = validation.split(
        torch.from_numpy(x),
        torch.from_numpy(y),
        *(np.arange(150)[s] for s in parts.values()),
        2,
        settings,
    )
    devacc, acc, best = reference.split(
        {k: x[s] for k, s in parts.items()}, {k: y[s] for k, s in parts.items()}, 2, settings
    )
    assert (ours.devacc, ours.acc, ours.l2) == (devacc, acc, [best])


def test_folds_are_sentevals_stratified_shuffled_folds() -> None:
    # 6 samples per class, 3 folds: every test fold holds 2 of each class, and the folds
    # partition the data; the exact assignment is sklearn's with SentEval's seed 1111
    y = np.array([0, 1] * 6)
    folds = list(validation._stratified_folds(y, 3, 1111))
    tests = [test for _, test in folds]
    assert sorted(np.concatenate(tests).tolist()) == list(range(12))
    assert all(np.bincount(y[test]).tolist() == [2, 2] for test in tests)
    again = [test.tolist() for _, test in validation._stratified_folds(y, 3, 1111)]
    assert again == [t.tolist() for t in tests]
    assert again != [t.tolist() for _, t in validation._stratified_folds(y, 3, 1112)]
