"""Snakemake and DVC never work in one workspace at once: Snakemake shares DVC's workspace lock.

Each tool deletes a job's outputs before it runs the job, so the two together would delete each
other's finished outputs (seen: `dvc repro` stopping with "output ... does not exist" after
Snakemake's download job removed the file DVC's stage had just written), and train one run from
both (the second trainer stops on the run's lock). DVC holds ``.dvc/tmp/lock`` (an exclusive
``flock``, DVC's ``zc.lockfile``) while it plans and records stages, but lets go of it while a
stage's command runs; the stage's outputs are then listed, with DVC's pid, in
``.dvc/tmp/rwlock``. Before its first job Snakemake takes a *shared* ``flock`` on the same file
(the kernel drops it however Snakemake ends; jobs do not inherit it) and, holding it, looks for
a live DVC process in the rwlock file: if there is none, it keeps the lock to the end, so that a
`dvc repro` or `dvc exp run` started meanwhile stops with DVC's "Unable to acquire lock" before
its first stage (or, were one mid-command, at its next); otherwise Snakemake stops here, before
any job, naming that process. Two Snakemake calls share the lock: Snakemake's own lock
(``.snakemake/locks``) refuses the second of two whose jobs overlap.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import IO

from stages.core.storage.run_lock import process_exists

DVC_TMP = Path(".dvc") / "tmp"

_held: list[IO[str]] = []  # the open lock file: the lock lasts as long as this process


def _alive(pid: object) -> bool:
    return isinstance(pid, int) and pid > 0 and process_exists(pid)


def dvc_at_work(tmp: Path = DVC_TMP) -> str:
    """'pid 123: dvc repro' of a live DVC process whose stage is running (DVC's rwlock file),
    or ''."""
    try:
        table = json.loads((tmp / "rwlock").read_text(encoding="utf-8"))
        infos = [*table.get("write", {}).values()]
        infos += [info for readers in table.get("read", {}).values() for info in readers]
    except (OSError, ValueError, AttributeError):
        return ""
    for info in infos:
        if isinstance(info, dict) and _alive(info.get("pid")):
            return f"pid {info['pid']}: {info.get('cmd', 'dvc')}"
    return ""


def dvc_holder(tmp: Path = DVC_TMP) -> str:
    """'pid 123' from DVC's lock file (it writes its pid there), or ''."""
    try:
        pid = (tmp / "lock").read_text(encoding="utf-8").strip()
    except OSError:
        return ""
    return f"pid {pid}" if pid.isdigit() else ""


def share_dvc_lock(tmp: Path = DVC_TMP) -> str | None:
    """Take (and keep) a shared hold on DVC's workspace lock; the message to stop with when a DVC
    command is working here. A workspace without ``.dvc/`` has nothing to share."""
    if not tmp.parent.is_dir():
        return None
    tmp.mkdir(exist_ok=True)
    lock = (tmp / "lock").open("a+", encoding="utf-8")  # not inherited by jobs (O_CLOEXEC)
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        working = dvc_at_work(tmp)
    except OSError:
        working = dvc_holder(tmp) or f"it holds {tmp / 'lock'}"
    if working:
        lock.close()
        return (
            f"a DVC command is working in this workspace ({working}); Snakemake stops before any "
            "job, since each tool deletes a job's outputs before running it. Rerun when it has "
            "finished: the runs and evaluations it finished are then cache hits"
        )
    _held.append(lock)
    return None
