"""The compiled training forward, watched. torch.compile compiles at the first call, inside a
process's first step: under ``compile: auto`` a compilation failure there (no C compiler, a GPU
Triton does not support, a backend's bug) reruns the step eagerly from the state before it, so
the run equals a ``compile: false`` run with the same forward; an explicit setting stops with
one line naming it. dynamo's counts over the run go into config.json's ``execution``, and a
forward dynamo stopped compiling part-way (its recompile limit, after which it runs eagerly
without a word) is said there and in one warning line."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch._dynamo.exc
import torch._inductor.exc
from torch._dynamo.utils import counters

from stages.core.errors import StageError
from stages.training.checkpoints import restore_rng_state, rng_state

if TYPE_CHECKING:
    from stages.training.parts import TrainingParts

# What compiling raises, and nothing a compiled step computes: a backend's failure (inductor's
# wrapped as InductorError, a missing or broken C compiler within), Triton missing or too old
# for the GPU, dynamo's own internal errors.
COMPILE_FAILURES: tuple[type[Exception], ...] = (
    torch._dynamo.exc.BackendCompilerFailed,
    torch._dynamo.exc.InternalTorchDynamoError,
    torch._inductor.exc.TritonMissing,
    torch._inductor.exc.GPUTooOldForTriton,
    torch._inductor.exc.InvalidCxxCompiler,
    torch._inductor.exc.CppCompileError,
)
# The graph-break type dynamo counts when a function exceeds its recompile limit; from then on
# that function runs eagerly.
RECOMPILE_LIMIT = "Dynamo recompile limit exceeded"


def failure_cause(error: BaseException) -> str:
    """One line naming what failed: the backend's own exception where dynamo wrapped one."""
    inner = getattr(error, "inner_exception", None) or error
    lines = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {lines[0] if lines else ''}".rstrip(": ")[:300]


def first_compiled_step(run: TrainingParts, take_step: Callable[[], None]) -> bool:
    """``take_step()`` (the process's first, compiling step) under ``run``'s compiled forward;
    True when it fell back to eager. The weights (SAM moves them inside a step), the gradients
    and the RNG state are put back before the eager rerun; the optimizer and the schedule step
    after every compiled call of the step, so a compilation failure never reaches them."""
    setting = run.job.train.compile
    if setting != "auto":
        try:
            take_step()
        except COMPILE_FAILURES as error:
            raise StageError(
                f"train.compile: {str(setting).lower()} failed to compile the training forward "
                f"({failure_cause(error)}); set train.compile to false (or auto)"
            ) from None
        return False
    # copies on the host: the first step's peak device memory stays as it was
    weights = {name: t.detach().to("cpu", copy=True) for name, t in run.model.state_dict().items()}
    rng = rng_state(run.runtime.device)
    try:
        take_step()
        return False
    except COMPILE_FAILURES as error:
        cause = failure_cause(error)
    run.model.load_state_dict(weights)
    for param in run.params:
        param.grad = None
    restore_rng_state(rng, run.runtime.device)
    step = run.step + 1
    run.fall_back_to_eager(f"eager: compiling failed at step {step} ({cause})")
    warnings.warn(
        f"train.compile: auto fell back to eager at step {step}, as train.compile: false "
        f"runs: compiling the training forward failed ({cause})",
        stacklevel=2,
    )
    take_step()
    return True


@dataclass(frozen=True)
class DynamoCounts:
    """dynamo's counters (``torch._dynamo.utils.counters``, process-wide): frames compiled
    (first compilations, recompilations and the resumptions after graph breaks), graphs,
    graph breaks, functions given up at the recompile limit."""

    frames_compiled: int
    graphs: int
    graph_breaks: int
    recompile_limit_hits: int

    @classmethod
    def now(cls) -> DynamoCounts:
        return cls(
            frames_compiled=counters["frames"]["ok"],
            graphs=counters["stats"]["unique_graphs"],
            graph_breaks=sum(counters["graph_break"].values()),
            recompile_limit_hits=sum(
                n for msg, n in counters["unimplemented"].items() if msg.startswith(RECOMPILE_LIMIT)
            ),
        )

    def since(self, start: DynamoCounts) -> dict[str, int]:
        """The counts from ``start`` to these, as config.json records them."""
        before = asdict(start)
        return {key: value - before[key] for key, value in asdict(self).items()}


def record_dynamo_counts(run: TrainingParts, start: DynamoCounts) -> None:
    """``run.dynamo``: dynamo's counts since ``start``; when it gave up compiling part-way, the
    compile reason says so and one warning line."""
    run.dynamo = DynamoCounts.now().since(start)
    if run.dynamo["recompile_limit_hits"]:
        warnings.warn(
            "train.compile: the training forward ran eagerly part-way: dynamo hit its recompile "
            "limit (torch._dynamo.config.recompile_limit); config.json's execution says so",
            stacklevel=2,
        )
        reason = f"{run.runtime.compile_reason}; eager part-way (dynamo's recompile limit)"
        run.runtime = replace(run.runtime, compile_reason=reason)
