"""SentEval's logistic-regression classifier, many models trained at once.

SentEval (``senteval/tools/classifier.py``, ``MLP`` with ``nhid=0``) trains one ``nn.Linear`` per
(fold, L2 value) with cross-entropy (mean over the batch), Adam or RMSprop at PyTorch's default
learning rate and ``weight_decay`` = L2 on weight and bias, and early stopping:

* every classifier reseeds numpy and torch with the task seed, so all start from the same
  ``nn.Linear`` initialisation and draw the same permutation stream (one per training-set size);
* ``fit`` runs ``epoch_size`` epochs (a fresh ``np.random.permutation`` each, batches in that
  order, the last one smaller) and then scores the validation set, while ``nepoch <= max_epoch``;
* a better validation accuracy keeps a copy of the model; otherwise, once ``tenacity``
  non-improving evaluations have been counted (the count is never reset), training stops;
* the kept (best) model is the result, and its validation accuracy is the reported score.

Here the models of every problem (a training set and its validation set) and every L2 value are
stacked into one tensor of weights and updated with batched matrix products, so a whole
cross-validation trains in the time of one classifier. Each model keeps SentEval's semantics: its
own batches (padded, masked), optimiser state, step count and early-stopping state. A problem
whose models have all stopped is dropped from the stack. Weight and bias live in one matrix (the
inputs get a constant-one column), which is the same parametrisation and the same decay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

Optimizer = Literal["adam", "rmsprop"]


@dataclass(frozen=True)
class ClassifierSettings:
    """SentEval's classifier configuration (``params['classifier']`` plus ``kfold``)."""

    optimizer: Optimizer
    batch_size: int
    tenacity: int
    epoch_size: int
    kfold: int
    max_epoch: int = 200
    seed: int = 1111
    l2_grid: tuple[float, ...] = tuple(10.0**t for t in range(-5, -1))
    # the final refit of the cross-validated tasks early-stops on 5% of its training data
    final_validation_split: float = 0.05


# SimCSE's evaluation.py: 'fasttest' (and 'dev') use the fast settings, 'test' the full ones.
MODES = {
    "fasttest": ClassifierSettings(
        optimizer="rmsprop", batch_size=128, tenacity=3, epoch_size=2, kfold=5
    ),
    "test": ClassifierSettings(optimizer="adam", batch_size=64, tenacity=5, epoch_size=4, kfold=10),
}


@dataclass(frozen=True)
class Problem:
    """One training run of SentEval's classifier: the rows of X it trains on, in the order it
    indexes them, and the rows it early-stops on. ``split_from`` is the size of the training set
    a validation split was cut from (that cut drew one permutation from the classifier's RNG)."""

    fit: np.ndarray
    val: np.ndarray
    split_from: int | None = None


def validation_split_problem(train: np.ndarray, fraction: float, seed: int) -> Problem:
    """SentEval's ``fit(..., validation_split=fraction)``: the first draw of the freshly seeded
    RNG permutes the training rows; the first ``int(fraction * n)`` become the validation set."""
    permutation = np.random.RandomState(seed).permutation(len(train))
    cut = int(fraction * len(train))
    return Problem(
        fit=train[permutation[cut:]], val=train[permutation[:cut]], split_from=len(train)
    )


@dataclass(frozen=True)
class FittedModels:
    """The kept (best) model of each (problem, L2 value) and its validation accuracy."""

    weights: torch.Tensor  # (problems, l2 values * classes, features + 1); last column = bias
    val_correct: np.ndarray  # (problems, l2 values) correct validation predictions
    val_size: np.ndarray  # (problems,)
    nclasses: int
    epochs: np.ndarray  # (problems,) epochs trained before the problem's models all stopped

    def val_accuracy(self) -> np.ndarray:
        """SentEval's ``1.0 * correct / len(devX)`` per model, float64."""
        return self.val_correct / self.val_size[:, None]

    def predict(self, features: torch.Tensor, problem: int, l2_index: int) -> np.ndarray:
        """Class predictions of one model for rows ``features`` (n, d) (argmax of the logits)."""
        c = self.nclasses
        w = self.weights[problem, l2_index * c : (l2_index + 1) * c]
        logits = features @ w[:, :-1].T + w[:, -1]
        return logits.argmax(dim=1).cpu().numpy()


def fit_logistic_regressions(
    features: torch.Tensor,
    labels: torch.Tensor,
    problems: list[Problem],
    l2: np.ndarray,
    nclasses: int,
    settings: ClassifierSettings,
) -> FittedModels:
    """Train one model per (problem p, L2 value ``l2[p, r]``) as SentEval would, all at once.

    ``features`` (n, d) float32 and ``labels`` (n,) int64 live on the device to train on; the
    problems index their rows.
    """
    device = features.device
    n_problems, n_l2 = l2.shape
    if n_problems != len(problems):
        raise ValueError(f"l2 has {n_problems} rows for {len(problems)} problems")
    c, d = nclasses, features.shape[1]
    x = torch.cat([features, features.new_ones(len(features), 1)], dim=1)
    # (classes, n): row j marks the samples of class j
    onehot = torch.nn.functional.one_hot(labels, c).to(features.dtype).T.contiguous()

    # weights[p, r * c + j] = class j's weights (and bias, last) of the model with L2 l2[p, r]
    weights = _senteval_init(d, c, settings.seed).to(device).repeat(n_problems, n_l2, 1)
    decay = torch.as_tensor(np.repeat(l2, c, axis=1), dtype=features.dtype, device=device)
    decay = decay[:, :, None]
    optimizer = _Optimizer(settings.optimizer, weights)

    val_size = np.array([len(p.val) for p in problems])
    val_rows, val_mask = _padded([p.val for p in problems], device)
    x_val = x[val_rows]  # (P, nv, d + 1)
    y_val = torch.where(val_mask, labels[val_rows], -1)  # padding never counts as correct

    stopping = _EarlyStopping(weights, n_l2, c, settings.tenacity)
    epochs = np.zeros(n_problems, dtype=np.int64)
    live = np.arange(n_problems)  # problems still training; the state tensors hold only these
    orders = _EpochOrders(settings.seed)
    nepoch = 0
    while len(live) and nepoch <= settings.max_epoch:
        for epoch in range(nepoch, nepoch + settings.epoch_size):
            live_problems = [problems[p] for p in live]
            steps = _epoch_steps(live_problems, orders, epoch, settings.batch_size, device)
            for rows, row_weight, stepping in steps:
                grad = _cross_entropy_gradient(x, onehot, rows, row_weight, weights, n_l2)
                optimizer.step(weights, grad, decay, stepping)
        nepoch += settings.epoch_size
        epochs[live] = nepoch

        logits = torch.bmm(x_val, weights.transpose(1, 2)).unflatten(2, (n_l2, c))
        correct = (logits.argmax(dim=3) == y_val[:, :, None]).sum(dim=1)
        keep = stopping.update(torch.as_tensor(live, device=device), correct, weights)
        if len(keep) < len(live):
            live = live[keep.cpu().numpy()]
            weights, decay, x_val, y_val = weights[keep], decay[keep], x_val[keep], y_val[keep]
            optimizer.select(keep)

    return FittedModels(
        weights=stopping.best_weights,
        val_correct=stopping.best_correct.cpu().numpy(),
        val_size=val_size,
        nclasses=c,
        epochs=epochs,
    )


class _EarlyStopping:
    """SentEval's early stopping, per model: keep a copy of the model at every better validation
    accuracy; stop at a non-improving evaluation once ``tenacity`` non-improving evaluations
    have been counted (the count never resets)."""

    def __init__(self, weights: torch.Tensor, n_l2: int, nclasses: int, tenacity: int) -> None:
        self.nclasses = nclasses
        self.tenacity = tenacity
        self.best_weights = weights.clone()
        shape = (len(weights), n_l2)
        self.best_correct = torch.full(shape, -1, dtype=torch.long, device=weights.device)
        self.bad_evals = torch.zeros_like(self.best_correct)
        self.stopped = torch.zeros_like(self.best_correct, dtype=torch.bool)

    def update(
        self, problems: torch.Tensor, correct: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """Record an evaluation of ``problems`` (their rows of ``weights`` and their correct
        counts); return the positions (within ``problems``) of those still training."""
        stopped = self.stopped[problems]
        improved = (correct > self.best_correct[problems]) & ~stopped
        self.best_correct[problems] = torch.where(improved, correct, self.best_correct[problems])
        keep_rows = improved.repeat_interleave(self.nclasses, dim=1)[:, :, None]
        self.best_weights[problems] = torch.where(keep_rows, weights, self.best_weights[problems])
        worse = ~improved & ~stopped
        bad = self.bad_evals[problems]
        self.stopped[problems] = stopped | (worse & (bad >= self.tenacity))
        self.bad_evals[problems] = bad + worse.long()
        return (~self.stopped[problems].all(dim=1)).nonzero().squeeze(1)


def _cross_entropy_gradient(
    x: torch.Tensor,
    onehot: torch.Tensor,
    rows: torch.Tensor,
    row_weight: torch.Tensor,
    weights: torch.Tensor,
    n_l2: int,
) -> torch.Tensor:
    """Gradient of each model's mean cross-entropy on its batch, shaped like ``weights``.

    d(loss)/d(logit_j) = (softmax_j - onehot_j) / batch size. Softmax ignores a shift of the
    logits and these derivatives sum to zero over the classes, so only the c - 1 differences
    to class 0 are computed (half the work for binary tasks) and class 0 gets minus the sum of
    the other classes' gradients.
    """
    n_problems, batch_size = row_weight.shape
    c = onehot.shape[0]
    xb = x.index_select(0, rows).view(n_problems, batch_size, -1)  # (P, B, d + 1)
    w = weights.view(n_problems, n_l2, c, -1)
    relative = (w[:, :, 1:] - w[:, :, :1]).flatten(1, 2)  # (P, R * (c - 1), d + 1)
    shifted = torch.bmm(relative, xb.transpose(1, 2)).view(n_problems, n_l2, c - 1, batch_size)
    logits = torch.cat([torch.zeros_like(shifted[:, :, :1]), shifted], dim=2)  # (P, R, c, B)
    e = (logits - logits.amax(dim=2, keepdim=True)).exp_()
    probs = e[:, :, 1:].div_(e.sum(dim=2, keepdim=True))
    labels = onehot[1:].index_select(1, rows).view(c - 1, n_problems, batch_size)
    g = probs.sub_(labels.transpose(0, 1)[:, None]).mul_(row_weight[:, None, None])
    grad = torch.bmm(g.flatten(1, 2), xb).view(n_problems, n_l2, c - 1, -1)
    return torch.cat([-grad.sum(dim=2, keepdim=True), grad], dim=2).flatten(1, 2)


def _senteval_init(d: int, c: int, seed: int) -> torch.Tensor:
    """``nn.Linear(d, c)`` right after ``torch.manual_seed(seed)`` (SentEval's MLP init), as a
    (c, d + 1) matrix with the bias as last column; the global RNG is left untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        linear = torch.nn.Linear(d, c)
    return torch.cat([linear.weight.detach(), linear.bias.detach()[:, None]], dim=1)


class _EpochOrders:
    """The training permutations each classifier draws from its freshly seeded numpy RNG.

    Classifiers whose draws so far had the same sizes see the same permutations, so each distinct
    stream (one per training-set size and validation cut) is drawn once and shared. All problems
    advance epoch by epoch together, so only the current epoch's permutation is kept.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._streams: dict[tuple[int | None, int], tuple[np.random.RandomState, int, Any]] = {}

    def permutation(self, problem: Problem, epoch: int) -> np.ndarray:
        key = (problem.split_from, len(problem.fit))
        if key not in self._streams:
            rng = np.random.RandomState(self.seed)
            if problem.split_from is not None:
                rng.permutation(problem.split_from)
            self._streams[key] = (rng, -1, None)
        rng, drawn_epoch, permutation = self._streams[key]
        if epoch == drawn_epoch + 1:
            permutation = rng.permutation(len(problem.fit))
            self._streams[key] = (rng, epoch, permutation)
        elif epoch != drawn_epoch:
            raise ValueError(f"epoch {epoch} requested after epoch {drawn_epoch}")
        return permutation


def _epoch_steps(
    problems: list[Problem], orders: _EpochOrders, epoch: int, batch_size: int, device
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Per step: the rows of every problem's batch, flat (P * batch_size), each row's loss
    weight (P, batch_size) (1 / its batch's size; 0 for padding), and which problems take a
    step (None: all). A problem with fewer steps this epoch than the others sits them out."""
    sequences = [p.fit[orders.permutation(p, epoch)] for p in problems]
    rows, mask = _padded(sequences, device, multiple=batch_size)
    n_steps = rows.shape[1] // batch_size
    # step-major, so that each step's rows are one contiguous block
    rows = rows.view(len(problems), n_steps, batch_size).transpose(0, 1).reshape(n_steps, -1)
    mask = mask.view(len(problems), n_steps, batch_size).transpose(0, 1)
    sizes = mask.sum(dim=2, keepdim=True)
    row_weight = mask.float() / sizes.clamp_min(1)
    takes_step = sizes.squeeze(2) > 0
    everyone = bool(takes_step.all())
    return [(rows[t], row_weight[t], None if everyone else takes_step[t]) for t in range(n_steps)]


def _padded(
    sequences: list[np.ndarray], device, multiple: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-index sequences of unequal lengths as a (P, L) tensor padded with row 0, and the
    mask of real entries; L is rounded up to a multiple of ``multiple``."""
    longest = max(len(s) for s in sequences)
    length = -(-longest // multiple) * multiple
    rows = np.zeros((len(sequences), length), dtype=np.int64)
    mask = np.zeros((len(sequences), length), dtype=bool)
    for i, s in enumerate(sequences):
        rows[i, : len(s)] = s
        mask[i, : len(s)] = True
    return torch.from_numpy(rows).to(device), torch.from_numpy(mask).to(device)


class _Optimizer:
    """PyTorch's single-tensor Adam / RMSprop (default hyperparameters), one state per problem.

    ``weight_decay`` adds ``decay * w`` to the gradient, as ``torch.optim`` does. Adam's step
    counts are per problem (a problem sits out the steps it has not got), so its bias
    corrections are per problem too; while all counts agree they are plain scalars.
    """

    ADAM_LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8
    RMSPROP_LR, ALPHA = 1e-2, 0.99

    def __init__(self, name: Optimizer, weights: torch.Tensor) -> None:
        self.name = name
        self.state = [torch.zeros_like(weights)]
        if name == "adam":
            self.state.append(torch.zeros_like(weights))
        self.steps = np.zeros(len(weights), dtype=np.int64)

    def select(self, keep: torch.Tensor) -> None:
        self.state = [s[keep] for s in self.state]
        self.steps = self.steps[keep.cpu().numpy()]

    def step(
        self,
        weights: torch.Tensor,
        grad: torch.Tensor,
        decay: torch.Tensor,
        stepping: torch.Tensor | None,
    ) -> None:
        if stepping is None:
            self.steps += 1
            self._update(weights, grad, decay, self.state, self.steps)
            return
        idx = stepping.nonzero().squeeze(1)
        host_idx = idx.cpu().numpy()
        self.steps[host_idx] += 1
        w, state = weights[idx], [s[idx] for s in self.state]
        self._update(w, grad[idx], decay[idx], state, self.steps[host_idx])
        weights[idx] = w
        for full, part in zip(self.state, state, strict=True):
            full[idx] = part

    def _update(self, w, grad, decay, state, steps: np.ndarray) -> None:
        grad = grad.addcmul(decay, w)
        if self.name == "rmsprop":
            (square_avg,) = state
            square_avg.mul_(self.ALPHA).addcmul_(grad, grad, value=1 - self.ALPHA)
            w.addcdiv_(grad, square_avg.sqrt().add_(self.EPS), value=-self.RMSPROP_LR)
            return
        exp_avg, exp_avg_sq = state
        exp_avg.lerp_(grad, 1 - self.BETA1)
        exp_avg_sq.mul_(self.BETA2).addcmul_(grad, grad, value=1 - self.BETA2)
        step_size = self.ADAM_LR / (1 - self.BETA1 ** steps.astype(np.float64))
        bias_correction2_sqrt = (1 - self.BETA2 ** steps.astype(np.float64)) ** 0.5
        if (steps == steps[0]).all():
            denom = exp_avg_sq.sqrt().div_(float(bias_correction2_sqrt[0])).add_(self.EPS)
            w.addcdiv_(exp_avg, denom, value=-float(step_size[0]))
            return
        per_problem = {"dtype": w.dtype, "device": w.device}
        bc2 = torch.as_tensor(bias_correction2_sqrt, **per_problem)[:, None, None]
        denom = exp_avg_sq.sqrt().div_(bc2).add_(self.EPS)
        w.sub_(exp_avg.div(denom).mul_(torch.as_tensor(step_size, **per_problem)[:, None, None]))
