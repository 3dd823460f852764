"""The benchmark harness: what every recorded measurement's ordering, arithmetic and ``meta``
block rest on (``benchmarks/harness.py``)."""

from __future__ import annotations

import errno
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import harness

REPO = Path(__file__).resolve().parents[1]


def recording(calls: list[str], name: str, result: float) -> Callable[[], float]:
    def run() -> float:
        calls.append(name)
        return result

    return run


def test_rounds_alternate_the_order_and_report_in_the_named_order() -> None:
    calls: list[str] = []
    set_up: list[int] = []

    def contestants(index: int) -> dict[str, Callable[[], float]]:
        set_up.append(index)
        return {name: recording(calls, name, 10 * index + i) for i, name in enumerate("abc")}

    rounds = list(harness.interleaved(3, contestants))
    assert calls == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert set_up == [0, 1, 2]
    assert [r.index for r in rounds] == [0, 1, 2]
    assert [list(r.results) for r in rounds] == [["a", "b", "c"]] * 3
    assert rounds[1].results == {"a": 10, "b": 11, "c": 12}
    for measured in rounds:
        assert len(measured.load_average_start) == len(measured.load_average_end) == 3


def test_rounds_keep_the_order_without_alternating() -> None:
    calls: list[str] = []
    runs = {name: recording(calls, name, 1.0) for name in ("padded", "unpadded")}
    list(harness.interleaved(3, lambda _: runs, alternate=False))
    assert calls == ["padded", "unpadded"] * 3


def test_each_round_is_reported_before_the_next_one_runs() -> None:
    calls: list[str] = []
    runs = {name: recording(calls, name, 1.0) for name in ("ours", "peer")}
    rounds = harness.interleaved(2, lambda _: runs)
    first = next(rounds)
    assert first.index == 0 and calls == ["ours", "peer"]


def test_round_results_by_name_and_the_fastest() -> None:
    rounds = [
        harness.Round(0, {"ours": 2.0, "peer": 5.0}, [0.0] * 3, [0.0] * 3),
        harness.Round(1, {"ours": 1.5, "peer": 6.0}, [0.0] * 3, [0.0] * 3),
        harness.Round(2, {"ours": 3.0, "peer": 4.0}, [0.0] * 3, [0.0] * 3),
    ]
    assert harness.by_name(rounds) == {"ours": [2.0, 1.5, 3.0], "peer": [5.0, 6.0, 4.0]}
    assert harness.fastest(rounds) == {"ours": 1.5, "peer": 4.0}


def test_best_of_rounds_takes_each_rounds_median_of_blocks_and_keeps_the_least() -> None:
    calls: list[tuple[str, float]] = []

    class Timer:
        def __init__(self, name: str, medians: list[float]) -> None:
            self.name, self.medians = name, iter(medians)

        def blocked_autorange(self, min_run_time: float) -> SimpleNamespace:
            calls.append((self.name, min_run_time))
            return SimpleNamespace(median=next(self.medians))

    timers = {"sdpa": Timer("sdpa", [3.0, 1.0, 2.0]), "short": Timer("short", [0.5, 0.7, 0.6])}
    best = harness.best_of_rounds(timers, 3, min_run_time=0.3)  # type: ignore[arg-type]
    assert best == {"sdpa": 1.0, "short": 0.5}
    assert calls == [("sdpa", 0.3), ("short", 0.3)] * 3


@pytest.mark.parametrize(
    ("per_round", "median", "least", "greatest"),
    [
        ([1.2, 3.0, 1.0], 1.2, 1.0, 3.0),  # a loaded round moves the median little
        ([1.0, 10.0, 2.0, 3.0], 2.5, 1.0, 10.0),  # an even count: the middle two's mean
        ([1.8], 1.8, 1.8, 1.8),
    ],
)
def test_a_ratio_is_summarised_by_its_median_and_range(
    per_round: list[float], median: float, least: float, greatest: float
) -> None:
    assert harness.ratio_summary("ratio_fp32", per_round) == {
        "ratio_fp32_median": median,
        "ratio_fp32_range": [least, greatest],
    }


def test_the_steady_step_time_leaves_out_the_warmup() -> None:
    ends = [0.0, 10.0, 11.0, 13.0, 16.0]  # the first step paid 10 s of warm-up
    assert harness.steady_seconds_per_step(ends, warmup=1) == 2.0
    assert harness.steady_seconds_per_step(ends, warmup=0) == 4.0
    with pytest.raises(ValueError, match="no interval"):
        harness.steady_seconds_per_step(ends, warmup=4)


def test_the_step_hook_runs_each_step_once_and_notes_its_end() -> None:
    done: list[str] = []
    around: list[str] = []

    def run_step(step: Callable[[], None]) -> None:
        around.append("before")
        step()
        around.append("after")

    ends, hook = harness.timed_steps(run_step)
    before = time.perf_counter()
    for i in range(3):
        hook(lambda i=i: done.append(f"step {i}"))
    assert done == ["step 0", "step 1", "step 2"]
    assert around == ["before", "after"] * 3
    assert len(ends) == 3 and before <= ends[0] <= ends[1] <= ends[2]
    plain_ends, plain = harness.timed_steps()
    plain(lambda: done.append("plain"))
    assert done[-1] == "plain" and len(plain_ends) == 1


def test_the_stopwatch_reads_nan_until_the_block_ends() -> None:
    with harness.stopwatch() as elapsed:
        assert math.isnan(elapsed.seconds)
        time.sleep(0.02)
    assert 0.02 <= elapsed.seconds < 5


def test_the_cpu_model_comes_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654\n")
    assert harness.cpu_model(cpuinfo) == "AMD EPYC 9654"
    assert harness.cpu_model(tmp_path / "absent") != ""


def test_the_command_reproduces_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    script = str(REPO / "benchmarks" / "train_cpu.py")
    invocation = harness.begin(script, ["--steps", "3", "--out", "/tmp/a b.json"])
    assert invocation.command == "python -m benchmarks.train_cpu --steps 3 --out '/tmp/a b.json'"
    monkeypatch.setattr(sys, "argv", ["benchmarks/noop.py", "--repeats", "1"])
    assert harness.begin("benchmarks/noop.py").command == "python -m benchmarks.noop --repeats 1"


def test_the_meta_block_says_which_code_machine_load_and_command() -> None:
    invocation = harness.begin("benchmarks/objectives.py", ["--rounds", "1"])
    meta = harness.meta(invocation)
    assert list(meta) == [
        "date",
        "commit",
        "dirty",
        "machine",
        "load_average_before",
        "load_average_after",
        "command",
    ]
    date = datetime.fromisoformat(meta["date"])
    assert date.utcoffset() == UTC.utcoffset(None)
    assert abs((datetime.now(UTC) - date).total_seconds()) < 60
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    assert meta["commit"] == head and isinstance(meta["dirty"], bool)
    assert set(meta["machine"]) == {"cpu", "cores", "gpu", "torch"}
    assert meta["machine"]["cores"] >= 1 and meta["machine"]["cpu"]
    for key in ("load_average_before", "load_average_after"):
        assert len(meta[key]) == 3 and all(x >= 0 for x in meta[key])
    assert meta["command"] == "python -m benchmarks.objectives --rounds 1"


def test_a_tree_with_changes_is_dirty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    repo = tmp_path / "repo"
    repo.mkdir()
    assert harness.git_state(repo) == (None, None)

    def git(*args: str) -> str:
        identity = ["-c", "user.name=bench", "-c", "user.email=bench@example.org"]
        command = ["git", *identity, *args]
        return subprocess.run(command, cwd=repo, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    (repo / "a.txt").write_text("a\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "a")
    commit = git("rev-parse", "--short", "HEAD").strip()
    assert harness.git_state(repo) == (commit, False)
    (repo / "a.txt").write_text("b\n")
    assert harness.git_state(repo) == (commit, True)
    (repo / "a.txt").write_text("a\n")
    assert harness.git_state(repo) == (commit, False)
    (repo / "new.txt").write_text("untracked\n")
    assert harness.git_state(repo) == (commit, True)


def test_the_result_is_written_with_its_meta_block_first(tmp_path: Path) -> None:
    invocation = harness.begin("benchmarks/unpadding.py", [])
    result = {"setup": {"threads": 2}, "rounds": [{"ratio_fp32": 1.5}]}
    path = harness.write_result(tmp_path / "deep" / "unpadding.json", result, invocation)
    written = json.loads(path.read_text())
    assert list(written) == ["meta", "setup", "rounds"]
    assert {k: v for k, v in written.items() if k != "meta"} == result
    assert written["meta"]["command"] == "python -m benchmarks.unpadding"
    with pytest.raises(ValueError, match="meta"):
        harness.write_result(path, {"meta": {}}, invocation)


def test_an_interrupted_write_leaves_the_recorded_result_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = tmp_path / "train_cpu.json"
    recorded.write_text('{"summary": "recorded"}\n')
    write_text = Path.write_text

    def full_disk(self: Path, text: str, *args, **kwargs) -> int:
        write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError):
        harness.write_result(recorded, {"summary": "new"}, harness.begin("train_cpu.py", []))
    monkeypatch.undo()
    assert recorded.read_text() == '{"summary": "recorded"}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["train_cpu.json"]
