"""SentEval's three model-selection procedures (``senteval/tools/validation.py``), each training
all of its classifiers in one or two batched runs.

* ``inner_kfold`` (MR, CR, SUBJ, MPQA): stratified k-fold; in each outer fold an inner stratified
  k-fold picks the L2 value, then a refit on the outer training fold (early-stopped on a 5%
  validation split) is scored on the outer test fold. Reported: mean inner score, mean test score.
* ``kfold`` (TREC, MRPC): stratified k-fold on train picks the L2 value; a refit on all of train
  (5% validation split) predicts test.
* ``split`` (SST2): each L2 value trains on train, early-stopped on dev; the best on dev is scored
  on test (SentEval refits it with the same seed and data, which gives the same model).

Scores are rounded exactly where and how SentEval rounds them (the L2 choice depends on it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.model_selection import StratifiedKFold

from stages.senteval_protocol.classifier import (
    ClassifierSettings,
    Problem,
    fit_logistic_regressions,
    validation_split_problem,
)

# SentEval's InnerKFoldClassifier hard-codes this seed for its folds (KFoldClassifier uses the
# task seed, which defaults to the same value).
INNER_KFOLD_SEED = 1111


@dataclass
class Selection:
    """A procedure's outcome in SentEval's terms, plus the L2 values it chose."""

    devacc: float
    acc: float
    l2: list[float]
    test_predictions: np.ndarray | None = field(default=None, repr=False)
    epochs: list[int] = field(default_factory=list)


def inner_kfold(
    features: torch.Tensor, labels: torch.Tensor, nclasses: int, settings: ClassifierSettings
) -> Selection:
    y = labels.cpu().numpy()
    k, grid = settings.kfold, settings.l2_grid
    outer = list(_stratified_folds(y, k, INNER_KFOLD_SEED))
    inner = [
        Problem(fit=train[inner_train], val=train[inner_test])
        for train, _ in outer
        for inner_train, inner_test in _stratified_folds(y[train], k, INNER_KFOLD_SEED)
    ]
    search = fit_logistic_regressions(
        features, labels, inner, np.tile(grid, (len(inner), 1)), nclasses, settings
    )
    accuracy = search.val_accuracy().reshape(len(outer), k, len(grid))
    dev_results, chosen = [], []
    for fold_accuracy in accuracy:
        scores = [round(100 * np.mean(fold_accuracy[:, r]), 2) for r in range(len(grid))]
        chosen.append(grid[int(np.argmax(scores))])
        dev_results.append(np.max(scores))

    refits = [
        validation_split_problem(train, settings.final_validation_split, settings.seed)
        for train, _ in outer
    ]
    final = fit_logistic_regressions(
        features, labels, refits, np.array(chosen)[:, None], nclasses, settings
    )
    test_results = []
    for i, (_, test) in enumerate(outer):
        predicted = final.predict(features[test], i, 0)
        test_results.append(round(100 * _accuracy(predicted, y[test]), 2))
    return Selection(
        devacc=float(round(np.mean(dev_results), 2)),
        acc=float(round(np.mean(test_results), 2)),
        l2=chosen,
        epochs=[*search.epochs.tolist(), *final.epochs.tolist()],
    )


def kfold(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: np.ndarray,
    nclasses: int,
    settings: ClassifierSettings,
) -> Selection:
    y = train_labels.cpu().numpy()
    grid = settings.l2_grid
    folds = [
        Problem(fit=train, val=test)
        for train, test in _stratified_folds(y, settings.kfold, settings.seed)
    ]
    search = fit_logistic_regressions(
        train_features, train_labels, folds, np.tile(grid, (len(folds), 1)), nclasses, settings
    )
    accuracy = search.val_accuracy()
    scores = [round(100 * np.mean(accuracy[:, r]), 2) for r in range(len(grid))]
    best = grid[int(np.argmax(scores))]

    refit = validation_split_problem(
        np.arange(len(y)), settings.final_validation_split, settings.seed
    )
    final = fit_logistic_regressions(
        train_features, train_labels, [refit], np.array([[best]]), nclasses, settings
    )
    predicted = final.predict(test_features, 0, 0)
    return Selection(
        devacc=float(np.max(scores)),
        acc=round(100 * _accuracy(predicted, test_labels), 2),
        l2=[best],
        test_predictions=predicted,
        epochs=[*search.epochs.tolist(), *final.epochs.tolist()],
    )


def split(
    features: torch.Tensor,
    labels: torch.Tensor,
    train: np.ndarray,
    dev: np.ndarray,
    test: np.ndarray,
    nclasses: int,
    settings: ClassifierSettings,
) -> Selection:
    """``features``/``labels`` hold all three splits; ``train``/``dev``/``test`` index them."""
    grid = settings.l2_grid
    search = fit_logistic_regressions(
        features, labels, [Problem(fit=train, val=dev)], np.array([grid]), nclasses, settings
    )
    scores = [round(100 * a, 2) for a in search.val_accuracy()[0].tolist()]
    best = int(np.argmax(scores))
    predicted = search.predict(features[test], 0, best)
    return Selection(
        devacc=float(np.max(scores)),
        acc=round(100 * _accuracy(predicted, labels[test].cpu().numpy()), 2),
        l2=[grid[best]],
        epochs=search.epochs.tolist(),
    )


def _stratified_folds(y: np.ndarray, k: int, seed: int):
    return StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(np.zeros(len(y)), y)


def _accuracy(predicted: np.ndarray, gold: np.ndarray) -> float:
    """SentEval's ``1.0 * correct / len(devX)`` as a Python float."""
    return int((predicted == gold).sum()) / len(gold)
