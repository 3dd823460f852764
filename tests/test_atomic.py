"""Atomic writes: a killed writer's temporary is removed by the next write of the same output,
and only then: never one of a live process, of another machine (until it has been untouched
for a week) or of another output."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stages.core.storage import atomic
from stages.core.storage.atomic import FOREIGN_STALE_S, HOST_TAG, write_text

REPO = Path(__file__).resolve().parents[1]
KILLED_WRITER = """
import os, signal, sys
from stages.core.storage.atomic import atomic_path
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


FOLDER_WRITER = """
import sys
from stages.core.storage.atomic import atomic_path
for i in range(int(sys.argv[2])):
    with atomic_path(sys.argv[1]) as tmp:
        tmp.mkdir()
        for name in "abcdefgh":
            (tmp / name).write_text(sys.argv[3] * 1000)
"""


def test_writers_of_one_folder_at_once_never_fail(tmp_path: Path) -> None:
    """Two reports at once used to fail now and then: one deleting the folder the other was
    deleting."""
    dest = tmp_path / "reports" / "results"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = [
        subprocess.Popen([sys.executable, "-c", FOLDER_WRITER, str(dest), "150", tag], env=env,
                         stderr=subprocess.PIPE, text=True)
        for tag in "xy"
    ]  # fmt: skip
    errors = [w.communicate()[1] for w in writers]
    assert [w.returncode for w in writers] == [0, 0], errors
    assert {p.name for p in dest.iterdir()} == set("abcdefgh")
    assert [p.name for p in dest.parent.iterdir()] == ["results"]  # no temporaries left


def write_folder(dest: Path, name: str) -> None:
    with atomic.atomic_path(dest) as tmp:
        tmp.mkdir()
        (tmp / name).write_text(name)


def test_a_replaced_folder_is_moved_aside_before_it_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleted in place, a folder was half-deleted under its final name for a moment (for good,
    if the writer was killed then)."""
    dest = tmp_path / "results"
    write_folder(dest, "old")
    seen_at_deletion = []
    real_rmtree = shutil.rmtree

    def watching(path: Path, *args, **kwargs) -> None:
        seen_at_deletion.append(sorted(p.name for p in dest.iterdir()))
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(atomic.shutil, "rmtree", watching)
    write_folder(dest, "new")
    assert seen_at_deletion == [["new"]]


def test_an_output_is_on_the_disk_before_its_name_and_its_name_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename can reach the disk before the data it names (ext4's delayed allocation): without
    the flushes, a crash just after it showed a finished-looking output of empty files."""
    dest = tmp_path / "runs" / "r1"
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        events.append(("rename", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with atomic.atomic_path(dest) as tmp:
        (tmp / "best").mkdir(parents=True)
        (tmp / "best" / "model.safetensors").write_bytes(b"weights")
        (tmp / "metrics.json").write_text("{}")

    renamed = events.index(("rename", str(dest)))
    before = {Path(path).relative_to(tmp).as_posix() for _, path in events[:renamed]
              if Path(path).is_relative_to(tmp)}  # fmt: skip
    assert before == {".", "best", "best/model.safetensors", "metrics.json"}
    assert events[renamed + 1 :] == [("fsync", str(dest.parent))]


def test_a_write_the_disk_refuses_at_the_flush_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delayed write fails at fsync (ENOSPC, EIO): the output is not renamed into place."""
    dest = tmp_path / "metrics.json"

    def failing(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="No space left") as raised:
        write_text(dest, "{}")
    assert raised.value.filename == str(dest)
    assert list(tmp_path.iterdir()) == []
