"""Where and in which precision training runs: one object holding every device-dependent choice,
so the training code itself has no device branches and runs unchanged on CPU and GPU.

- precision ``auto``: bf16 autocast on a GPU that supports it, fp32 elsewhere; ``bf16`` forces
  autocast (fast on CPUs with AVX512-BF16/AMX; without them torch emulates bf16 matrix products,
  many times slower than fp32, and a warning says so). Weights, optimizer state and the
  objectives stay fp32 in every mode (objectives switch autocast off and upcast their inputs
  themselves);
- pinned host buffers and non-blocking host-to-device copies on CUDA only;
- compile ``auto``: CUDA graphs (``reduce-overhead``) for one process on a GPU, eager
  elsewhere (``resolve_compile``); with graphs the unpadded forward packs each step into one
  of a few fixed shapes (``fixed_shapes``: the layout padded to ``max_seq_length``, the packed
  rows rounded up to a multiple of ``GRAPH_ROWS_MULTIPLE``).
"""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from stages.core.errors import StageError
from stages.modeling.cpu_linear import fp32_matmuls_on_onednn, onednn_linear_available

CompileMode = bool | Literal["reduce-overhead"]
# Packed rows of the unpadded forward under CUDA graphs come in multiples of this: one graph per
# bucket (BERT-base, batch 64 x 2 views at length 32: at most 16 buckets and the full layout).
GRAPH_ROWS_MULTIPLE = 256

# Named phases of a step for torch.profiler (benchmarks/train_overhead.py); ~1 us each otherwise.
phase = torch.profiler.record_function


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    autocast_dtype: torch.dtype | None  # None: fp32
    pin_memory: bool
    # the backbone's Linear layers run on oneDNN in fp32 (cpu_linear.py): a CPU, not compiled
    onednn_linear: bool = False
    compile: CompileMode = False  # train.compile resolved (resolve_compile)

    @property
    def precision(self) -> str:
        return "fp32" if self.autocast_dtype is None else "bf16"

    @property
    def fixed_shapes(self) -> bool:
        """Whether a step's tensors come in a few fixed shapes: CUDA graphs replay a graph
        recorded for exactly one shape."""
        return self.compile == "reduce-overhead"

    @property
    def packed_rows_multiple(self) -> int:
        """Filler rows round an unpadded batch up to this many rows (``unpadded.Packing``):
        ``GRAPH_ROWS_MULTIPLE`` under CUDA graphs; 64 where the products run on oneDNN, which
        builds a kernel for every new matrix shape (the CPU in bf16, and in fp32 with
        ``onednn_linear``); else 1."""
        if self.fixed_shapes:
            return GRAPH_ROWS_MULTIPLE
        on_onednn = self.autocast_dtype is not None or self.onednn_linear
        return 64 if self.device.type == "cpu" and on_onednn else 1

    def autocast(self) -> AbstractContextManager[None]:
        return torch.autocast(
            self.device.type,
            dtype=self.autocast_dtype or torch.float32,
            enabled=self.autocast_dtype is not None,
        )

    def fp32_matmuls(self) -> AbstractContextManager[None]:
        """Around the training loop: with ``onednn_linear``, torch's fp32 matrix products on
        oneDNN where that stays fp32 (``cpu_linear.fp32_matmuls_on_onednn``; the attention's,
        the objectives'); else nothing changes."""
        return fp32_matmuls_on_onednn() if self.onednn_linear else nullcontext()

    def to_device(self, array: np.ndarray) -> torch.Tensor:
        """A host array on the device without waiting for the copy (pinned source on CUDA)."""
        tensor = torch.from_numpy(array)
        if self.pin_memory:
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)


def resolve_compile(
    setting: CompileMode | Literal["auto"], device: torch.device, processes: int, chunked: bool
) -> CompileMode:
    """``train.compile`` on ``device``: ``auto`` is CUDA graphs (``reduce-overhead``) for one
    process on a GPU, and eager on a CPU (inductor's compile time is not won back by a short CPU
    run), with several processes (DDP's gradient hooks split a compiled forward's graph) and
    with ``embedding_chunk_size`` (its replayed dropout masks need the trainer's own dropout)."""
    if setting != "auto":
        return setting
    return "reduce-overhead" if device.type == "cuda" and processes == 1 and not chunked else False


def resolve_runtime(
    device: str,
    precision: str,
    local_rank: int = 0,
    compile: CompileMode | Literal["auto"] = False,
    *,
    processes: int = 1,
    chunked: bool = False,
) -> Runtime:
    """``device`` in {auto, cpu, cuda}, ``precision`` in {auto, fp32, bf16} (params.yaml);
    ``compile``: ``train.compile`` (resolved here; compiled, the compiler computes the Linear
    layers); ``processes``, ``chunked``: what ``resolve_compile`` reads."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise StageError("train.device is 'cuda' but no CUDA device is available")
    on_gpu = device == "cuda"
    if precision == "auto":
        precision = "bf16" if on_gpu and torch.cuda.is_bf16_supported() else "fp32"
    if precision == "bf16" and not on_gpu and not cpu_has_bf16_units():
        warnings.warn(
            "train.precision is 'bf16' on a CPU without bf16 matrix units (AVX512-BF16 or AMX): "
            "torch emulates its bf16 matrix products, which is many times slower than fp32 "
            "here (about 11x on a 2-core AVX2 machine); fp32 ('auto') is faster",
            stacklevel=2,
        )
    where = torch.device(device, local_rank) if on_gpu else torch.device("cpu")
    compiled = resolve_compile(compile, where, processes, chunked)
    return Runtime(
        device=where,
        autocast_dtype=torch.bfloat16 if precision == "bf16" else None,
        pin_memory=on_gpu,
        onednn_linear=not on_gpu and not compiled and onednn_linear_available(),
        compile=compiled,
    )


def cpu_has_bf16_units() -> bool:
    """Whether oneDNN runs bf16 matrix products natively on this CPU (AVX512-BF16 or AMX);
    True when torch cannot tell."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True


def device_name(device: torch.device) -> str:
    """The accelerator's model name (``torch.cuda.get_device_name``), or 'cpu'."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
