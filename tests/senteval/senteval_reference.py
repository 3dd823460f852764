"""SentEval's classifier loop (``senteval/tools/classifier.py``, ``MLP`` with ``nhid=0``),
transcribed for modern PyTorch on CPU: the reference the batched trainer is tested against."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn


class SentEvalLogReg:
    def __init__(self, inputdim, nclasses, l2reg, settings):
        np.random.seed(settings.seed)
        torch.manual_seed(settings.seed)
        self.batch_size = settings.batch_size
        self.tenacity = settings.tenacity
        self.epoch_size = settings.epoch_size
        self.max_epoch = settings.max_epoch
        self.model = nn.Sequential(nn.Linear(inputdim, nclasses))
        self.loss_fn = nn.CrossEntropyLoss()
        optim = torch.optim.Adam if settings.optimizer == "adam" else torch.optim.RMSprop
        self.optimizer = optim(self.model.parameters())
        self.optimizer.param_groups[0]["weight_decay"] = l2reg

    def fit(self, X, y, validation_data=None, validation_split=None):
        self.nepoch = 0
        bestaccuracy = -1
        stop_train = False
        early_stop_count = 0
        if validation_data is not None:
            trainX, trainy = X, y
            devX, devy = validation_data
        else:
            permutation = np.random.permutation(len(X))
            trainidx = permutation[int(validation_split * len(X)) :]
            devidx = permutation[0 : int(validation_split * len(X))]
            trainX, trainy = X[trainidx], y[trainidx]
            devX, devy = X[devidx], y[devidx]
        trainX, trainy = torch.FloatTensor(trainX), torch.LongTensor(trainy)
        while not stop_train and self.nepoch <= self.max_epoch:
            self.trainepoch(trainX, trainy, epoch_size=self.epoch_size)
            accuracy = self.score(devX, devy)
            if accuracy > bestaccuracy:
                bestaccuracy = accuracy
                bestmodel = copy.deepcopy(self.model)
            else:
                if early_stop_count >= self.tenacity:
                    stop_train = True
                early_stop_count += 1
        self.model = bestmodel
        return bestaccuracy

    def trainepoch(self, X, y, epoch_size=1):
        self.model.train()
        for _ in range(self.nepoch, self.nepoch + epoch_size):
            permutation = np.random.permutation(len(X))
            for i in range(0, len(X), self.batch_size):
                idx = torch.LongTensor(permutation[i : i + self.batch_size])
                output = self.model(X.index_select(0, idx))
                loss = self.loss_fn(output, y.index_select(0, idx))
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
        self.nepoch += epoch_size

    def predict(self, X):
        with torch.no_grad():
            return self.model(torch.FloatTensor(X)).argmax(dim=1).numpy()

    def score(self, X, y):
        return 1.0 * int((self.predict(X) == np.asarray(y)).sum()) / len(X)


def _folds(y, k, seed):
    from sklearn.model_selection import StratifiedKFold

    return StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(np.zeros(len(y)), y)


def inner_kfold(X, y, nclasses, settings):
    """SentEval's InnerKFoldClassifier.run (pytorch branch)."""
    regs = list(settings.l2_grid)
    devresults, testresults, chosen = [], [], []
    for train_idx, test_idx in _folds(y, settings.kfold, 1111):
        X_train, X_test = X[train_idx], X[test_idx]
        y_train, y_test = y[train_idx], y[test_idx]
        scores = []
        for reg in regs:
            regscores = []
            for inner_train_idx, inner_test_idx in _folds(y_train, settings.kfold, 1111):
                clf = SentEvalLogReg(X.shape[1], nclasses, reg, settings)
                clf.fit(
                    X_train[inner_train_idx],
                    y_train[inner_train_idx],
                    validation_data=(X_train[inner_test_idx], y_train[inner_test_idx]),
                )
                regscores.append(clf.score(X_train[inner_test_idx], y_train[inner_test_idx]))
            scores.append(round(100 * np.mean(regscores), 2))
        optreg = regs[np.argmax(scores)]
        chosen.append(optreg)
        devresults.append(np.max(scores))
        clf = SentEvalLogReg(X.shape[1], nclasses, optreg, settings)
        clf.fit(X_train, y_train, validation_split=0.05)
        testresults.append(round(100 * clf.score(X_test, y_test), 2))
    return round(np.mean(devresults), 2), round(np.mean(testresults), 2), chosen


def kfold(train_X, train_y, test_X, test_y, nclasses, settings):
    """SentEval's KFoldClassifier.run (pytorch branch); also returns yhat."""
    regs = list(settings.l2_grid)
    scores = []
    for reg in regs:
        scanscores = []
        for train_idx, test_idx in _folds(train_y, settings.kfold, settings.seed):
            clf = SentEvalLogReg(train_X.shape[1], nclasses, reg, settings)
            clf.fit(
                train_X[train_idx],
                train_y[train_idx],
                validation_data=(train_X[test_idx], train_y[test_idx]),
            )
            scanscores.append(clf.score(train_X[test_idx], train_y[test_idx]))
        scores.append(round(100 * np.mean(scanscores), 2))
    optreg = regs[np.argmax(scores)]
    clf = SentEvalLogReg(train_X.shape[1], nclasses, optreg, settings)
    clf.fit(train_X, train_y, validation_split=0.05)
    return np.max(scores), round(100 * clf.score(test_X, test_y), 2), optreg, clf.predict(test_X)


def split(X, y, nclasses, settings):
    """SentEval's SplitClassifier.run (pytorch branch); X and y are dicts train/valid/test."""
    regs = list(settings.l2_grid)
    scores = []
    for reg in regs:
        clf = SentEvalLogReg(X["train"].shape[1], nclasses, reg, settings)
        clf.fit(X["train"], y["train"], validation_data=(X["valid"], y["valid"]))
        scores.append(round(100 * clf.score(X["valid"], y["valid"]), 2))
    optreg = regs[np.argmax(scores)]
    clf = SentEvalLogReg(X["train"].shape[1], nclasses, optreg, settings)
    clf.fit(X["train"], y["train"], validation_data=(X["valid"], y["valid"]))
    return np.max(scores), round(100 * clf.score(X["test"], y["test"]), 2), optreg
