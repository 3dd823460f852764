"""Atomic writes: a killed writer's temporary is removed by the next write of the same output,
and only then: never one of a live process, of another machine (until it has been untouched
for a week) or of another output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from stages.core.atomic import FOREIGN_STALE_S, HOST_TAG, write_text

REPO = Path(__file__).resolve().parents[1]
KILLED_WRITER = """
import os, signal, sys
from stages.core.atomic import atomic_path
with atomic_path(sys.argv[1]) as tmp:
    tmp.write_text("half")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_next_write_removes_what_a_killed_writer_left(tmp_path: Path) -> None:
    dest = tmp_path / "experiments" / "x" / "senteval.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writer = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(dest)], env=env, check=False)
    assert writer.returncode == -signal.SIGKILL
    (left,) = dest.parent.iterdir()  # hidden, never taken for the output
    assert left.name.startswith(".senteval.json.") and left.name.endswith(".tmp")

    write_text(dest, "whole")
    assert [p.name for p in dest.parent.iterdir()] == ["senteval.json"]
    assert dest.read_text() == "whole"


def test_temporaries_of_live_writers_other_machines_and_other_outputs_stay(
    tmp_path: Path,
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    kept = [
        f".out.json.{HOST_TAG}-{os.getppid()}.abcd1234.tmp",  # a live process of this host
        ".out.json.elsewhere-1.abcd1234.tmp",  # another machine: its writer may live
        f".other.json.{HOST_TAG}-{dead.pid}.abcd1234.tmp",  # another output's
        ".out.json.abcd1234.tmp",  # named before owners were: whose is unknown
    ]
    for name in kept:
        (tmp_path / name).mkdir()
    write_text(tmp_path / "out.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, "out.json"])


def test_another_machines_temporary_goes_once_nothing_in_it_changed_for_a_week(
    tmp_path: Path,
) -> None:
    week_ago = time.time() - FOREIGN_STALE_S - 60
    abandoned = tmp_path / ".out.json.elsewhere-1.abcd1234.tmp"
    (abandoned / "nested").mkdir(parents=True)
    (abandoned / "nested" / "part").write_text("half")
    busy = tmp_path / ".out.json.elsewhere-2.efgh5678.tmp"
    (busy / "nested").mkdir(parents=True)
    (busy / "nested" / "part").write_text("being written")  # written just now
    for path in (abandoned / "nested" / "part", abandoned / "nested", abandoned, busy / "nested",
                 busy):  # fmt: skip
        os.utime(path, (week_ago, week_ago))
    write_text(tmp_path / "out.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([busy.name, "out.json"])
