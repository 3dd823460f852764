"""What every benchmark script shares: timing, interleaved rounds, and the recorded result.

A recorded figure is worth what its context lets a reader judge: which code (the commit, and
whether the tree held changes no commit has), which machine, how loaded it was, and the command
that takes it again. ``begin`` notes what must be taken before measuring; ``write_result`` adds
it all as the result's ``meta`` block and writes atomically, so that an interrupted run never
leaves half a file where a recorded measurement stood.

Comparisons run interleaved (``interleaved``): every contestant once per round, so that load
from other processes, which drifts over minutes on a shared machine, hits each alike; a round's
ratio is then a fair one, and the spread of the rounds' ratios shows the noise.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from torch.utils import benchmark

from stages.core.storage.atomic import write_text

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
# Set on import, before any script imports transformers (which reads them once): the machines
# that run benchmarks have no network, and tokenizers' warning about forking would break up the
# tables the scripts print.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

T = TypeVar("T")
# The training loop's step hook (``stages.training.loop.train(..., step_hook=...)``): it is
# given the step and must call it once.
StepHook = Callable[[Callable[[], None]], None]


def data_dir() -> Path:
    """The shared data (``CSE_DATA_DIR``, else ``shared/data`` beside the checkout): benchmarks
    measure on the real corpora and evaluation sets the pipeline uses."""
    return Path(os.environ.get("CSE_DATA_DIR", REPO.parent / "shared" / "data"))


# Timing


@dataclass
class Elapsed:
    """Seconds a ``stopwatch`` block took; NaN until the block ends, so an early read shows."""

    seconds: float = float("nan")


@contextmanager
def stopwatch() -> Iterator[Elapsed]:
    """Wall-clock time of the block, by ``time.perf_counter`` (monotonic, the finest clock):
    what a user waits for, work in other threads and processes included."""
    elapsed = Elapsed()
    start = time.perf_counter()
    yield elapsed
    elapsed.seconds = time.perf_counter() - start


def timed_steps(run_step: StepHook | None = None) -> tuple[list[float], StepHook]:
    """A step hook for the stage's training loop and the list it fills with each optimizer
    step's end time: the interval between two ends is all a step costs (data, forward,
    backward, optimizer, logging), not the model's part alone. ``run_step(step)`` (optional)
    runs each step in the caller's context (a profiler, a counter)."""
    ends: list[float] = []

    def timed(step: Callable[[], None]) -> None:
        if run_step is None:
            step()
        else:
            run_step(step)
        ends.append(time.perf_counter())

    return ends, timed


def steady_seconds_per_step(ends: Sequence[float], warmup: int) -> float:
    """Mean interval between consecutive step ends after the first ``warmup`` steps, which pay
    once for allocation, kernel selection or compilation and would overstate a long run's."""
    intervals = [b - a for a, b in itertools.pairwise(ends[warmup:])]
    if not intervals:
        raise ValueError(f"{len(ends)} step ends leave no interval after {warmup} warm-up steps")
    return statistics.mean(intervals)


# Interleaving


@dataclass(frozen=True)
class Round(Generic[T]):
    """One round of an interleaved comparison: each contestant's result, in the order the
    contestants were named (whichever order they ran in), and the load around the round."""

    index: int
    results: dict[str, T]
    load_average_start: list[float]
    load_average_end: list[float]


def round_order(names: Sequence[str], index: int, *, alternate: bool) -> list[str]:
    """The order of round ``index``: as named, or with ``alternate`` reversed in odd rounds
    (A B C, C B A, ...), so that load rising or falling through a round favours no one."""
    return list(names)[::-1] if alternate and index % 2 else list(names)


def interleaved(
    rounds: int,
    contestants: Callable[[int], Mapping[str, Callable[[], T]]],
    *,
    alternate: bool = True,
) -> Iterator[Round[T]]:
    """``rounds`` rounds of every contestant once, each yielded as it ends (a long comparison
    reports as it goes). ``contestants(index)`` sets a round up: a round may need its own
    data, as a rerun on inputs seen before can flatter code that caches by shape."""
    for index in range(rounds):
        load_start = load_average()
        runs = contestants(index)
        order = round_order(list(runs), index, alternate=alternate)
        results = {name: runs[name]() for name in order}
        yield Round(index, {name: results[name] for name in runs}, load_start, load_average())


def by_name(rounds: Iterable[Round[T]]) -> dict[str, list[T]]:
    """Each contestant's results over the rounds, in round order."""
    results: dict[str, list[T]] = {}
    for measured in rounds:
        for name, result in measured.results.items():
            results.setdefault(name, []).append(result)
    return results


def fastest(rounds: Iterable[Round[float]]) -> dict[str, float]:
    """Each contestant's least time over the rounds: other processes' load only ever adds
    time, so the least is the nearest to the code's own cost."""
    return {name: min(times) for name, times in by_name(rounds).items()}


def best_of_rounds(
    timers: Mapping[str, benchmark.Timer], rounds: int, *, min_run_time: float
) -> dict[str, float]:
    """Seconds per call of each timer's statement, interleaved over ``rounds``: a round's time
    is the median of its blocks (a spike inside the round moves it little), the result the
    least round (``fastest``)."""

    def median_of_blocks(timer: benchmark.Timer) -> Callable[[], float]:
        return lambda: timer.blocked_autorange(min_run_time=min_run_time).median

    runs = {name: median_of_blocks(timer) for name, timer in timers.items()}
    return fastest(interleaved(rounds, lambda _: runs, alternate=False))


def ratio_summary(name: str, per_round: Sequence[float]) -> dict[str, Any]:
    """``<name>_median`` and ``<name>_range`` ([least, greatest]) of a ratio taken in each
    round: the median is the figure to quote, the range how far the machine's load moved it."""
    return {
        f"{name}_median": statistics.median(per_round),
        f"{name}_range": [min(per_round), max(per_round)],
    }


def print_round(measured: Round[Any], row: Mapping[str, Any], digits: int) -> None:
    """A finished round's figures on one line, with the load it started under, so that a long
    comparison shows early whether the machine is quiet enough to be worth finishing."""
    shown = {
        key: round(value, digits) if isinstance(value, float) else value
        for key, value in row.items()
        if not key.startswith("load")
    }
    print(
        f"round {measured.index + 1} (load {measured.load_average_start}): {json.dumps(shown)}",
        flush=True,
    )


# The machine and the code


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` processes each keeping one core spinning in pure Python (another user's job
    on a shared machine) while the block runs."""
    processes = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for process in processes:
            process.kill()
            process.wait()


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages: other jobs on a shared machine slow a run down,
    and these tell a reader how busy the machine was while a figure was taken."""
    return [round(x, 2) for x in os.getloadavg()]


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (``platform.processor()`` says only "x86_64" on Linux); the
    architecture where /proc/cpuinfo names no model (not Linux, some ARM kernels)."""
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """The hardware and software a figure belongs to: torch's kernels change from release to
    release as much as from one CPU to another."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
    }


def git_state(repo: Path = REPO) -> tuple[str | None, bool | None]:
    """HEAD's short hash and whether the tree differs from it (changed or untracked files): a
    dirty tree's figure belongs to code no commit holds. ``(None, None)`` outside a checkout."""

    def git(*args: str) -> str:
        # --no-optional-locks: reading the state must not rewrite the index under another writer
        command = ["git", "--no-optional-locks", *args]
        return subprocess.run(
            command, cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        return git("rev-parse", "--short", "HEAD"), git("status", "--porcelain") != ""
    except (OSError, subprocess.CalledProcessError):
        return None, None


# The result


@dataclass(frozen=True)
class Invocation:
    """What a result records of how it was taken, noted before the measuring begins: the
    command that takes it again, when, the code (a run of hours may outlast the tree it
    started from: the code that ran is the one it imported), and the load already there."""

    command: str
    date: str
    commit: str | None
    dirty: bool | None
    load_average_before: list[float]


def begin(script: str, argv: Sequence[str] | None = None) -> Invocation:
    """Call first in a script's ``main`` with its ``__file__`` and the arguments it parses
    (default: the command line's)."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    command = shlex.join(["python", "-m", f"benchmarks.{Path(script).stem}", *arguments])
    date = datetime.now(UTC).isoformat(timespec="seconds")
    return Invocation(command, date, *git_state(), load_average())


def meta(invocation: Invocation) -> dict[str, Any]:
    """The ``meta`` block of a result whose measuring ends now."""
    return {
        "date": invocation.date,
        "commit": invocation.commit,
        "dirty": invocation.dirty,
        "machine": machine(),
        "load_average_before": invocation.load_average_before,
        "load_average_after": load_average(),
        "command": invocation.command,
    }


def write_result(path: str | Path, result: Mapping[str, Any], invocation: Invocation) -> Path:
    """Write ``result`` as JSON with the ``meta`` block first, atomically (a temporary beside
    ``path``, renamed over it). Values JSON has no type for (numpy's float32) are written as
    text rather than lose a long run's result at its end."""
    if "meta" in result:
        raise ValueError("a result's 'meta' key is the harness's")
    path = Path(path)
    write_text(path, json.dumps({"meta": meta(invocation), **result}, indent=2, default=str) + "\n")
    print(f"wrote {path}")
    return path
