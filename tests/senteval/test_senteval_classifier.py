"""The batched trainer against SentEval's own classifier loop (``senteval_reference``): the same
kept models, validation accuracies and epoch counts, model by model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from senteval_reference import SentEvalLogReg

from stages.senteval_protocol.classifier import (
    MODES,
    Problem,
    fit_logistic_regressions,
    validation_split_problem,
)


def _data(n: int = 260, d: int = 12, c: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = (x[:, 0] + 0.8 * rng.normal(size=n) > 0).astype(np.int64) + (x[:, 1] > 0.9)
    return x, y % c


@pytest.mark.parity
@pytest.mark.parametrize("mode", ["fasttest", "test"])
def test_every_model_matches_sentevals_loop(mode: str) -> None:
    x, y = _data()
    settings = dataclasses.replace(MODES[mode], batch_size=32, max_epoch=24)
    problems = [
        Problem(fit=np.arange(0, 192), val=np.arange(192, 250)),  # 6 steps per epoch
        Problem(fit=np.arange(20, 220), val=np.arange(220, 260)),  # 7 steps: the last is short
        validation_split_problem(np.arange(30, 250), 0.05, settings.seed),
    ]
    l2 = np.array([settings.l2_grid, settings.l2_grid[::-1], settings.l2_grid])
    fitted = fit_logistic_regressions(
        torch.from_numpy(x), torch.from_numpy(y), problems, l2, 3, settings
    )
    for p, problem in enumerate(problems):
        for r, reg in enumerate(l2[p]):
            reference = SentEvalLogReg(x.shape[1], 3, reg, settings)
            if problem.split_from is None:
                best = reference.fit(
                    x[problem.fit], y[problem.fit], validation_data=(x[problem.val], y[problem.val])
                )
            else:
                train = np.arange(30, 250)
                best = reference.fit(x[train], y[train], validation_split=0.05)
            assert fitted.val_accuracy()[p, r] == best
            linear = reference.model[0]
            expected = torch.cat([linear.weight, linear.bias[:, None]], dim=1).detach()
            ours = fitted.weights[p, r * 3 : (r + 1) * 3]
            torch.testing.assert_close(ours, expected, atol=2e-5, rtol=1e-4)
            np.testing.assert_array_equal(
                fitted.predict(torch.from_numpy(x), p, r), reference.predict(x)
            )
        assert fitted.epochs[p] >= settings.epoch_size


def test_epochs_stop_at_max_epoch_and_problems_stop_independently() -> None:
    x, y = _data(c=2)
    settings = dataclasses.replace(MODES["fasttest"], batch_size=64, tenacity=0, max_epoch=6)
    problems = [
        Problem(np.arange(0, 200), np.arange(200, 260)),
        Problem(np.arange(60), np.arange(60, 70)),
    ]
    fitted = fit_logistic_regressions(
        torch.from_numpy(x), torch.from_numpy(y), problems, np.array([[1e-5], [1e-2]]), 2, settings
    )
    # SentEval evaluates at nepoch 2, 4, 6, 8 at most (while nepoch <= max_epoch before training)
    assert all(e in (4, 6, 8) for e in fitted.epochs)
    for p, problem in enumerate(problems):
        reference = SentEvalLogReg(x.shape[1], 2, [1e-5, 1e-2][p], settings)
        reference.fit(
            x[problem.fit], y[problem.fit], validation_data=(x[problem.val], y[problem.val])
        )
        assert fitted.epochs[p] == reference.nepoch


def test_validation_split_is_sentevals_first_draw() -> None:
    train = np.arange(100, 140)
    problem = validation_split_problem(train, 0.05, 1111)
    permutation = np.random.RandomState(1111).permutation(40)
    np.testing.assert_array_equal(problem.val, train[permutation[:2]])
    np.testing.assert_array_equal(problem.fit, train[permutation[2:]])
    assert problem.split_from == 40
