"""One writer per run: a lock file beside the run in the runs store, created atomically with
its content (a hard link, which fails if the name exists, on local disks and on NFS v3+ shared
by several machines), holding the host, pid and start time of the trainer, and refreshed (its
mtime) every ``HEARTBEAT_S`` while it trains. A second trainer of the same run stops with a
message naming the holder. A lock is stale, and taken over, when its holder is a process of this
machine that no longer exists, or when it has not been refreshed for ``STALE_AFTER_S`` (a holder
on another machine that died). "This machine" is the host name, its boot and the pid namespace
(``machine``): two machines of two sites, or two containers of one host, can share a host name,
and a pid means something only within one boot and one pid namespace.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stages.core.errors import StageError

HEARTBEAT_S = 30.0
STALE_AFTER_S = 600.0


class RunLocked(StageError):
    """Another trainer holds the run's lock."""


def lock_path(run_dir: Path) -> Path:
    return run_dir.with_name(run_dir.name + ".lock")


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def process_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@functools.cache
def machine() -> str:
    """Where this process's pids are comparable: host name, boot id and pid namespace."""
    parts = [socket.gethostname()]
    for read in (
        lambda: Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        lambda: str(os.stat("/proc/self/ns/pid").st_ino),
    ):
        try:
            parts.append(read())
        except OSError:  # not Linux: the host name alone
            parts.append("-")
    return "/".join(parts)


def held_on_this_host(holder: dict[str, Any]) -> bool:
    """Whether a lock's or lease's ``holder`` is a process of this machine (its pid can be
    asked). A holder recorded without its machine (an older lock) is not."""
    return holder.get("machine") == machine() and isinstance(holder.get("pid"), int)


def is_stale(path: Path, now: float | None = None) -> bool:
    holder = _read(path)
    if held_on_this_host(holder):
        return not process_exists(holder["pid"])
    try:
        age = (now or time.time()) - path.stat().st_mtime
    except FileNotFoundError:
        return True
    return age > STALE_AFTER_S


def lock_holder(path: Path) -> str:
    """'host h, pid 12, since 2026-11-24 07:30:00 UTC' from a lock file."""
    return _describe(_read(path))


def _describe(holder: dict[str, Any]) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder.get("started", 0)))
    return f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, since {started}"


def _create(path: Path, holder: dict[str, Any]) -> bool:
    """Create the lock with its content at once: written to a file of this process, then
    hard-linked to the lock's name (atomic, and failing if the name exists, on local disks and
    NFS alike), so another trainer never reads an empty lock that names no holder."""
    text = json.dumps(holder)
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # no hard links on this filesystem: create exclusively, then write
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return True
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def run_lock(run_dir: Path, experiment: str) -> Iterator[None]:
    """Hold the lock of the run stored at ``run_dir`` while the block runs."""
    path = lock_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = {"host": socket.gethostname(), "machine": machine(), "pid": os.getpid(),
              "started": time.time(), "experiment": experiment}  # fmt: skip
    if not _create(path, holder):
        if not is_stale(path):
            raise RunLocked(
                f"run {run_dir.name} ({experiment}) is being trained by another process "
                f"({lock_holder(path)}); this one stops. Rerun when it has finished (the "
                f"run is then a cache hit); if that process is gone for good, delete {path}"
            )
        path.unlink(missing_ok=True)  # stale: its holder is gone
        if not _create(path, holder):
            raise RunLocked(f"run {run_dir.name} ({experiment}): {path} was taken meanwhile")
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(HEARTBEAT_S):
            os.utime(path)

    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        path.unlink(missing_ok=True)
