"""``evaluate``: score any ``encode(list[str]) -> array`` with the SentEval protocol.

This is SentEval's batcher model: the protocol hands the encoder batches of sentences (SentEval's
tokens joined by spaces) and gets back one row per sentence. With the default encoding
(``distinct``) each distinct sentence is encoded once across all tasks of a call, in batches of
similar length; with a cache, a task's embeddings are read back instead of encoded. With
``senteval_batches`` the encoder gets SentEval's own batches (``senteval_batches.py``). The
result records the protocol settings next to the numbers.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stages.core.schema.evaluation_settings import SENTEVAL_TASKS, SENTEVAL_TRANSFER_TASKS
from stages.senteval_protocol.cache import EmbeddingCache
from stages.senteval_protocol.classifier import MODES
from stages.senteval_protocol.embeddings import EmbeddingTable, Encode
from stages.senteval_protocol.loaders import (
    STS_YEARS,
    StsTask,
    downstream_dir,
    load_task,
)
from stages.senteval_protocol.senteval_batches import SentEvalBatches
from stages.senteval_protocol.sts import (
    ALIGNMENT_THRESHOLD,
    UNIFORMITY_T,
    alignment_uniformity,
    headline,
    score_sts,
)
from stages.senteval_protocol.transfer import run_transfer

log = logging.getLogger(__name__)

ENCODINGS = ("distinct", "senteval_batches")


def evaluate(
    encode: Encode,
    tasks: Sequence[str] = SENTEVAL_TASKS,
    data_dir: str | Path = "data/senteval",
    mode: str = "test",
    *,
    batch_size: int | None = 128,
    seed: int = 1111,
    device: str | torch.device | None = None,
    cache: EmbeddingCache | None = None,
    empty_sentence: str = "",
    encoder: dict[str, Any] | None = None,
    encoding: str = "distinct",
) -> dict[str, Any]:
    """Run the SentEval protocol on ``tasks`` and return the results dict.

    ``data_dir`` is SentEval's data root (the folder holding ``downstream/``); ``mode`` is
    SimCSE's classifier setting, 'fasttest' or 'test'; ``device`` trains the classifiers (default:
    CUDA when available). ``batch_size`` is the number of sentences per ``encode`` call
    (SentEval's batch size; sentences sorted by length); None passes all of a task's new
    sentences in one call, for encoders that batch by token length themselves (such as
    ``SentenceEncoder``), which avoids most padding. ``empty_sentence`` is the text sent for
    an empty line (CR and MPQA have a few): SimCSE's batcher sends '' (the default); SentEval's
    example batchers send '.'. ``encoder`` describes the encoder, for the results.
    ``encoding`` 'senteval_batches' sends SentEval's own batches instead (each task's samples in
    its order, ``batch_size`` per call, every occurrence; the cache is not used): for an encoder
    that pads each batch as SentEval's batcher does, SentEval's embeddings to the bit.
    """
    unknown = [t for t in tasks if t not in SENTEVAL_TASKS]
    if unknown:
        raise ValueError(
            f"unknown SentEval task(s) {', '.join(unknown)}; known: {', '.join(SENTEVAL_TASKS)}"
        )
    if mode not in MODES:
        raise ValueError(f"unknown mode '{mode}'; allowed: {', '.join(MODES)}")
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown encoding '{encoding}'; allowed: {', '.join(ENCODINGS)}")
    if encoding == "senteval_batches" and batch_size is None:
        raise ValueError("encoding 'senteval_batches' sends SentEval's batches: give a batch_size")
    settings = dataclasses.replace(MODES[mode], seed=seed)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    downstream = downstream_dir(data_dir)
    loaded = {name: load_task(downstream, name) for name in dict.fromkeys(tasks)}  # fail early

    table = EmbeddingTable(encode, batch_size, cache, empty_sentence)
    batches = (
        SentEvalBatches(encode, batch_size, empty_sentence)
        if encoding == "senteval_batches" and batch_size
        else None
    )
    results: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    alignment: dict[str, float] | None = None
    for name, loaded_task in loaded.items():
        start = time.perf_counter()
        if batches:
            task, embed, source = batches.add(loaded_task), batches, "encoded"
        else:
            task, embed, source = loaded_task, table, table.add(name, loaded_task.texts)
        encoded = time.perf_counter()
        if isinstance(task, StsTask):
            results[name] = score_sts(task, embed)
        else:
            results[name] = run_transfer(task, embed, settings, device)
        done = time.perf_counter()
        if name == "STSBenchmark":  # while the table holds this task's rows
            dev = next(p for p in task.parts if p.name == "dev")
            alignment = alignment_uniformity(embed(dev.sent1), embed(dev.sent2), dev.scores)
        timings[name] = {
            "encode_s": encoded - start,
            ("score_s" if isinstance(task, StsTask) else "classifier_s"): done - encoded,
            "embeddings": source,
        }
        log.info(
            "%s: %s (encode %.1f s, then %.1f s)",
            name,
            _brief(name, results[name]),
            encoded - start,
            done - encoded,
        )

    out: dict[str, Any] = {
        "protocol": _protocol(
            settings, mode, loaded, data_dir, batch_size, empty_sentence, device, encoding
        ),
        "encoder": encoder,
        "tasks": results,
        "summary": _summary(results),
        "timings": {
            "tasks": timings,
            "encode_s": sum(t["encode_s"] for t in timings.values()),
            "classifier_s": sum(t.get("classifier_s", 0.0) for t in timings.values()),
        },
    }
    if alignment is not None:
        out["alignment_uniformity"] = alignment
    return out


def _brief(name: str, result: dict[str, Any]) -> str:
    if name in SENTEVAL_TRANSFER_TASKS:
        return f"acc {result['acc']:.2f}"
    return f"spearman {headline(name, result):.2f}"


def _summary(results: dict[str, Any]) -> dict[str, Any]:
    """The papers' table rows: STS Spearman x100 and transfer test accuracy, with averages."""
    sts = {n: headline(n, r) for n, r in results.items() if n not in SENTEVAL_TRANSFER_TASKS}
    transfer = {n: r["acc"] for n, r in results.items() if n in SENTEVAL_TRANSFER_TASKS}
    summary: dict[str, Any] = {"sts": sts, "transfer": transfer}
    if sts:
        summary["sts_avg"] = table_average(sts.values())
    if transfer:
        summary["transfer_avg"] = table_average(transfer.values())
    return summary


def table_average(scores: Iterable[float]) -> float:
    """The mean of the scores as the tables print them: SimCSE's evaluation.py averages the
    "%.2f" strings of its cells (``float(score)``), not the unrounded values, so its average
    can differ from the unrounded mean in the second decimal."""
    return float(np.mean([float(f"{score:.2f}") for score in scores]))


def _protocol(
    settings, mode, loaded, data_dir, batch_size, empty_sentence, device, encoding
) -> dict:
    return {
        "reference": "SentEval (facebookresearch/SentEval) as SimCSE's evaluation.py runs it",
        "mode": mode,
        "tasks": list(loaded),
        "encoding": encoding,
        "text": {
            "sentences": "SentEval's whitespace tokens joined by single spaces, then the "
            "encoder's tokenizer",
            "empty_sentence": empty_sentence,
            "sentences_per_encode_call": batch_size or "all new sentences of a task",
            "batches": _ENCODING_TEXT[encoding],
        },
        "sts": {
            "similarity": "cosine u.v / (|u| |v|) per pair with numpy in the embeddings' own "
            "dtype, as SentEval (a zero vector scores 0)",
            "scale": "correlation x 100",
            "aggregation": {
                "all": "one correlation over the pairs of all subsets concatenated (headline)",
                "mean": "unweighted mean of the subsets' correlations",
                "wmean": "mean of the subsets' correlations weighted by their pair counts",
            },
            "STSBenchmark_SICKRelatedness": "unsupervised cosine per split (dev, test); "
            "headline: test Spearman",
            "unscored_pairs": "dropped (empty gold lines)",
        },
        "classifier": {
            "model": "logistic regression (SentEval MLP, nhid=0), cross-entropy averaged over "
            "the batch, weight decay = L2 on weight and bias",
            "learning_rate": 1e-3 if settings.optimizer == "adam" else 1e-2,
            **dataclasses.asdict(settings),
            "l2_grid": list(settings.l2_grid),
            "folds": "sklearn StratifiedKFold(shuffle=True); inner k-fold seed 1111 (SentEval's "
            "constant), k-fold seed = seed",
            "device": str(device),
        },
        "alignment_uniformity": {
            "data": "STSBenchmark dev, L2-normalised embeddings",
            "alignment": f"mean squared distance of pairs with gold score > {ALIGNMENT_THRESHOLD}",
            "uniformity": f"log mean exp(-{UNIFORMITY_T} * squared distance) over all pairs of "
            "the split's sentences (both columns)",
        },
        "data": {
            "dir": str(data_dir),
            "files": {n: [dataclasses.asdict(f) for f in t.files] for n, t in loaded.items()},
        },
        "sts_years": {n: list(STS_YEARS[n]) for n in loaded if n in STS_YEARS},
    }


_ENCODING_TEXT = {
    "distinct": "each distinct sentence of the evaluation encoded once, sorted by length",
    "senteval_batches": "SentEval's batches: per task, its samples in SentEval's order (STS12-16 "
    "pairs sorted by (len(tokens1), len(tokens2), gold score), each chunk's first then second "
    "sentences), every occurrence encoded",
}
