"""The transfer tasks: SentEval's features and model selection for each task.

MR, CR, SUBJ, MPQA: the sentence embedding, nested k-fold (``inner_kfold``). TREC: the sentence
embedding, k-fold on train then test. MRPC: the pair features ``[|u - v|, u * v]``, k-fold on
train then test, accuracy and F1 of the paraphrase class. SST2: train / dev / test (``split``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from sklearn.metrics import f1_score

from stages.senteval_protocol import validation
from stages.senteval_protocol.classifier import ClassifierSettings
from stages.senteval_protocol.loaders import LabelledSplit, TransferTask

Embed = Callable[[Sequence[str]], np.ndarray]


def features(split: LabelledSplit, embed: Embed) -> np.ndarray:
    """A sentence's embedding, or MRPC's ``np.c_[|u - v|, u * v]`` for a pair, as float32. The
    pair features are computed in the embeddings' own dtype and cast after, as SentEval's MRPC
    (its classifier casts to float32)."""
    if len(split.columns) == 1:
        return np.asarray(embed(split.columns[0]), dtype=np.float32)
    u, v = (np.asarray(embed(col)) for col in split.columns)
    return np.concatenate([np.abs(u - v), u * v], axis=1).astype(np.float32, copy=False)


def run_transfer(
    task: TransferTask, embed: Embed, settings: ClassifierSettings, device: torch.device
) -> dict[str, Any]:
    """SentEval's result dict for the task: devacc, acc (x100), ndev, ntest (+ f1 for MRPC),
    and ``majority_acc``: the accuracy of always predicting the scored samples' most frequent
    class (not SentEval's; the report flags an accuracy at that rate: nothing was learned)."""
    x = {name: _tensor(features(s, embed), device) for name, s in task.splits.items()}
    y = {name: torch.as_tensor(s.labels, device=device) for name, s in task.splits.items()}
    sizes = {name: len(s) for name, s in task.splits.items()}

    if set(task.splits) == {"all"}:
        chosen = validation.inner_kfold(x["all"], y["all"], task.nclasses, settings)
        result = {"ndev": sizes["all"], "ntest": sizes["all"]}
        scored = task.splits["all"].labels
    elif set(task.splits) == {"train", "test"}:
        test_labels = task.splits["test"].labels
        chosen = validation.kfold(
            x["train"], y["train"], x["test"], test_labels, task.nclasses, settings
        )
        result = {"ndev": sizes["train"], "ntest": sizes["test"]}
        scored = test_labels
        if task.name == "MRPC":
            result["f1"] = round(100 * float(f1_score(test_labels, chosen.test_predictions)), 2)
    else:
        ranges = np.cumsum([0, sizes["train"], sizes["dev"], sizes["test"]])
        train, dev, test = (np.arange(ranges[i], ranges[i + 1]) for i in range(3))
        chosen = validation.split(
            torch.cat([x["train"], x["dev"], x["test"]]),
            torch.cat([y["train"], y["dev"], y["test"]]),
            train,
            dev,
            test,
            task.nclasses,
            settings,
        )
        result = {"ndev": sizes["dev"], "ntest": sizes["test"]}
        scored = task.splits["test"].labels
    return {
        "devacc": chosen.devacc,
        "acc": chosen.acc,
        **result,
        "l2": chosen.l2,
        "majority_acc": majority_accuracy(scored),
    }


def majority_accuracy(labels: np.ndarray) -> float:
    """Accuracy (x100, 2 decimals) of always predicting the most frequent class of ``labels``."""
    counts = np.bincount(np.asarray(labels))
    return round(100 * float(counts.max()) / float(counts.sum()), 2)


def _tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(np.ascontiguousarray(array, dtype=np.float32), device=device)
