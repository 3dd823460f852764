"""Where and in which precision training runs: one object holding every device-dependent choice,
so the training code itself has no device branches and runs unchanged on CPU and GPU.

- precision ``auto``: bf16 autocast on a GPU that computes bf16 natively (compute capability
  8.0 or newer: A100, H100, RTX 30xx on), fp32 elsewhere, older GPUs included (V100, T4 and
  RTX 20xx report bf16 support but emulate it; fp16 with a loss scaler is not built);
  ``bf16`` forces autocast (fast on CPUs with AVX512-BF16/AMX; without them torch emulates
  bf16 matrix products, many times slower than fp32, and a warning says so). Weights,
  optimizer state and the objectives stay fp32 in every mode (objectives switch autocast off
  and upcast their inputs themselves);
- pinned host buffers and non-blocking host-to-device copies on CUDA only;
- compile ``auto`` (``resolve_compile``): only what a GPU has measured, the padded forward
  under CUDA graphs for one GPU process without gradient accumulation,
  ``embedding_chunk_size`` or a part no GPU ran under graphs (``unmeasured_under_graphs``),
  eager elsewhere. Under graphs (``fixed_shapes``) a batch is laid out at its longest row
  rounded up to a multiple of ``data.LAYOUT_MULTIPLE`` (views up to ``max_seq_length``,
  triplets up to their own truncation length); the unpadded forward also rounds its packed rows
  up to a multiple of ``GRAPH_ROWS_MULTIPLE``.
"""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch

from stages.core.errors import StageError
from stages.core.schema.params import TrainParams
from stages.modeling.cpu_linear import fp32_matmuls_on_onednn, onednn_linear_available

CompileMode = bool | Literal["reduce-overhead"]
# Packed rows of the unpadded forward under CUDA graphs come in multiples of this: one graph per
# bucket (BERT-base, batch 64 x 2 views at length 32: at most 16 buckets and the full layout).
GRAPH_ROWS_MULTIPLE = 256
# Whether ``compile: auto`` runs CUDA graphs over the unpadded forward (with ``unpad: true``).
# False: the padded forward, the only graphs a GPU has run (docs/training.md); the bucketed
# unpadded graphs stay opt-in until a GPU has measured them.
AUTO_GRAPHS_UNPADDED = False
# GPUs from this compute capability on compute bf16 natively (Ampere); older ones emulate it.
NATIVE_BF16_CAPABILITY = (8, 0)

# Named phases of a step for torch.profiler (benchmarks/train_overhead.py); ~1 us each otherwise.
phase = torch.profiler.record_function


@dataclass(frozen=True)
class CompileChoice:
    """``train.compile`` resolved on a device: the mode, whether the training forward is the
    unpadded one, and why (config.json's ``execution``, ``cse status``)."""

    mode: CompileMode
    unpad: bool
    reason: str


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    autocast_dtype: torch.dtype | None  # None: fp32
    pin_memory: bool
    # the backbone's Linear layers run on oneDNN in fp32 (cpu_linear.py): a CPU, not compiled
    onednn_linear: bool = False
    compile: CompileMode = False  # train.compile resolved (resolve_compile)
    compile_reason: str = "eager: train.compile false"
    unpad: bool = True  # whether the training forward is the unpadded one (resolve_compile)

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

    def eager(self, reason: str) -> Runtime:
        """This runtime as ``compile: false`` runs it (the forward stays as resolved):
        ``reason`` says why."""
        return replace(
            self,
            compile=False,
            compile_reason=reason,
            onednn_linear=_onednn_linear(self.device, compiled=False),
        )


def resolve_compile(
    setting: CompileMode | Literal["auto"],
    device: torch.device,
    *,
    processes: int,
    chunked: bool,
    accumulation_steps: int,
    unpad: bool,
    unmeasured: tuple[str, ...] = (),
) -> CompileChoice:
    """``train.compile`` on ``device`` (``unpad``: ``train.unpad``). ``auto`` takes only what a
    GPU has measured: CUDA graphs over the padded forward for one GPU process (about twice the
    eager rate, docs/benchmarks.md#training-on-gpu), eager on a CPU (inductor's compile time is not
    won back by a short CPU run), with several processes (DDP's gradient hooks split a compiled
    forward's graph), with ``embedding_chunk_size`` (its replayed dropout masks need the
    trainer's own dropout) and with gradient accumulation (a graph's replay reuses the memory
    that the previous micro-batch's gradients live in), and where the step has a part that no GPU
    has run under graphs (``unmeasured``: ``unmeasured_under_graphs``). An explicit setting is
    taken as it is."""
    if setting != "auto":
        label = (
            "CUDA graphs" if setting == "reduce-overhead" else "compiled" if setting else "eager"
        )
        return CompileChoice(setting, unpad, f"{label}: train.compile {str(setting).lower()}")
    for eager, why in (
        (device.type != "cuda", "CPU"),
        (processes > 1, "several processes (DDP)"),
        (chunked, "embedding_chunk_size"),
        (accumulation_steps > 1, "gradient accumulation"),
        (bool(unmeasured), f"{', '.join(unmeasured)} (unmeasured under CUDA graphs)"),
    ):
        if eager:
            return CompileChoice(False, unpad, f"eager: {why}")
    graphs_unpadded = unpad and AUTO_GRAPHS_UNPADDED
    forward = "unpadded" if graphs_unpadded else "padded (measured)"
    return CompileChoice(
        "reduce-overhead", graphs_unpadded, f"CUDA graphs, {forward}: one GPU process"
    )


def unmeasured_under_graphs(
    *, sam: bool, triplets: bool, gradient_checkpointing: bool
) -> tuple[str, ...]:
    """The parts of a step that no GPU has run under CUDA graphs: the measured step is one
    forward and backward of the two views (SimCSE's, docs/benchmarks.md). SAM runs a second
    forward and backward through the same graphs, ArcCSE's triplet branch a second forward of
    other shapes, gradient checkpointing a recomputed forward inside the backward."""
    parts = (
        ("SAM", sam),
        ("the triplet branch", triplets),
        ("gradient checkpointing", gradient_checkpointing),
    )
    return tuple(name for name, used in parts if used)


def compile_inputs(train: TrainParams, *, needs_triplets: bool) -> dict[str, Any]:
    """What ``resolve_compile`` reads of a run's train settings (and whether its objective has
    a triplet branch), besides the setting itself, the device and the process count."""
    return {
        "chunked": train.embedding_chunk_size is not None,
        "accumulation_steps": train.gradient_accumulation_steps,
        "unpad": train.unpad,
        "unmeasured": unmeasured_under_graphs(
            sam=train.sam.enabled,
            triplets=needs_triplets,
            gradient_checkpointing=train.gradient_checkpointing,
        ),
    }


def resolve_precision(precision: str, device: torch.device) -> str:
    """``train.precision`` on ``device``: ``auto`` is bf16 on a GPU that computes it natively
    (``NATIVE_BF16_CAPABILITY``), fp32 elsewhere (the project measures no fp16 path)."""
    if precision != "auto":
        return precision
    native = device.type == "cuda" and (
        torch.cuda.get_device_capability(device) >= NATIVE_BF16_CAPABILITY
    )
    return "bf16" if native else "fp32"


def resolve_runtime(
    device: str,
    precision: str,
    local_rank: int = 0,
    compile: CompileMode | Literal["auto"] = False,
    *,
    processes: int = 1,
    chunked: bool = False,
    accumulation_steps: int = 1,
    unpad: bool = True,
    unmeasured: tuple[str, ...] = (),
) -> Runtime:
    """``device`` in {auto, cpu, cuda}, ``precision`` in {auto, fp32, bf16} (params.yaml);
    ``compile``: ``train.compile`` (resolved here; compiled, the compiler computes the Linear
    layers); ``processes``, ``chunked``, ``accumulation_steps``, ``unpad``, ``unmeasured``: what
    ``resolve_compile`` reads."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise StageError("train.device is 'cuda' but no CUDA device is available")
    on_gpu = device == "cuda"
    where = torch.device(device, local_rank) if on_gpu else torch.device("cpu")
    precision = resolve_precision(precision, where)
    if precision == "bf16" and not on_gpu and not cpu_has_bf16_units():
        warnings.warn(
            "train.precision is 'bf16' on a CPU without bf16 matrix units (AVX512-BF16 or AMX): "
            "torch emulates its bf16 matrix products, which is many times slower than fp32 "
            "here (about 11x on a 2-core AVX2 machine); fp32 ('auto') is faster",
            stacklevel=2,
        )
    choice = resolve_compile(
        compile,
        where,
        processes=processes,
        chunked=chunked,
        accumulation_steps=accumulation_steps,
        unpad=unpad,
        unmeasured=unmeasured,
    )
    return Runtime(
        device=where,
        autocast_dtype=torch.bfloat16 if precision == "bf16" else None,
        pin_memory=on_gpu,
        onednn_linear=_onednn_linear(where, compiled=bool(choice.mode)),
        compile=choice.mode,
        compile_reason=choice.reason,
        unpad=choice.unpad,
    )


def _onednn_linear(device: torch.device, *, compiled: bool) -> bool:
    """Whether the Linear layers run on oneDNN (cpu_linear.py): eager on a CPU that has it."""
    return device.type == "cpu" and not compiled and onednn_linear_available()


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
