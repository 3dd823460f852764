"""Writing outputs so that an interrupted stage never leaves a finished-looking file.

Everything is written under a temporary name in the destination's folder and renamed into
place (rename is atomic within one filesystem), so a reader sees either nothing or the whole.
A folder being replaced is first renamed into the temporary, never deleted in place; of two
writers of one folder at once, the first to finish keeps its output.

Before the rename every file and folder of the output is flushed to the disk (fsync), and the
destination's folder after it: a filesystem may commit a rename before the data it names (ext4's
delayed allocation does), so a machine that crashed just after it would show a
finished-looking output of empty files, and a run's only checkpoint could be one.

A SIGKILL runs no cleanup, so a killed writer leaves its temporary behind: hidden, never taken
for the output. Its name says whose it is, ``.<dest name>.<host>-<pid>.<random>.tmp``, so the
next write of the same destination removes those of processes of this host that are gone. Whether
the writer of another machine's temporary lives cannot be told from here (a shared filesystem),
so such a temporary stays until nothing in it has changed for ``FOREIGN_STALE_S`` (a week: no
write of this project pauses that long).
The one writer of a folder (the holder of a run's lock) removes every temporary in it
(``remove_temporaries``).

Inside a stage's ``input_guard`` block, each rename first checks that the stage's input files
(its params file) are as it read them, and stops the stage when one is not.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from stages.core.storage.input_guard import confirm_inputs_unchanged
from stages.core.storage.run_lock import process_exists

# The host part of a temporary's name: no dots, which separate the name's parts.
HOST_TAG = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())
# mkdtemp's random part is [a-z0-9_]; the dest name may hold dots and dashes.
_OWNED = re.compile(r"\.(?P<dest>.+)\.(?P<host>[^.]+)-(?P<pid>\d+)\.[a-z0-9_]+\.tmp")
# Any temporary of atomic_path, also those named before the owner was (.<dest>.<random>.tmp).
_ANY = re.compile(r"\..+\.[a-z0-9_]+\.tmp")
FOREIGN_STALE_S = 7 * 24 * 3600.0
# How Rust libraries (polars) report an OSError: in the message, often not as an OSError, with
# the path after it when one is known (a file read), without one when writing.
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)(?::\s*(?P<path>\S.*))?")


@contextmanager
def temporary_beside(dest: Path) -> Iterator[Path]:
    """A new folder next to ``dest``, named as this process's temporary of it and removed on
    exit; the temporaries of ``dest`` that killed processes of this host left are removed first."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(dest)
    prefix = f".{dest.name}.{HOST_TAG}-{os.getpid()}."
    tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=dest.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def atomic_path(dest: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to ``dest``; on success rename it to ``dest``.

    Works for files and directories alike (whatever the body creates at the yielded path).
    On error the temporary is removed and ``dest`` is left as it was; an operating-system error
    that names no file (a full disk under ``Path.write_text``, ``np.savez`` or polars) is raised
    as an OSError naming ``dest``.
    """
    dest = Path(dest)
    with temporary_beside(dest) as tmp:
        work = tmp / (dest.name + suffix)
        try:
            yield work
            sync_tree(work)
        except Exception as err:
            named = _naming(err, dest)
            if named is err:
                raise
            raise named from err
        confirm_inputs_unchanged(destination_of(dest))
        if dest.is_dir() and not dest.is_symlink():
            # moved aside, not deleted in place, so that neither a reader nor a kill meets a
            # half-deleted folder (it is gone for an instant); the temporary's removal deletes it
            with suppress(FileNotFoundError):  # a concurrent writer moved it first
                os.replace(dest, tmp / "replaced")
        try:
            os.replace(work, dest)
        except OSError as err:
            # a concurrent writer of the same folder put its whole output there first
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        sync_folder(dest.parent)


def rename_durably(src: Path, dest: Path) -> None:
    """Rename ``src``, a finished file or folder, to ``dest`` so that even a machine crash shows
    all of it or nothing: its contents reach the disk before the new name, the name after."""
    sync_tree(src)
    confirm_inputs_unchanged(destination_of(dest))
    os.replace(src, dest)
    sync_folder(dest.parent)


def sync_tree(path: Path) -> None:
    """Flush ``path`` to the disk: a file, or a folder with every file and folder under it
    (links are not followed: they point at something already durable or not ours)."""
    if path.is_symlink():
        return
    if not path.is_dir():
        if path.exists():
            _sync_file(path)
        return
    for root, _folders, files in os.walk(path):
        for name in files:
            file = os.path.join(root, name)
            if not os.path.islink(file):
                _sync_file(file)
        sync_folder(Path(root))


def _sync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # an error here (EIO, ENOSPC of a delayed write) is the write's own
    finally:
        os.close(fd)


def sync_folder(folder: Path) -> None:
    """Flush ``folder``'s entries (the names renamed into it); skipped where the filesystem
    cannot sync a folder (some network filesystems refuse it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP, errno.EACCES):
            raise
    finally:
        os.close(fd)


def _naming(err: Exception, dest: Path) -> Exception:
    """``err`` as an OSError with its error number and a file name (the one it names, else
    ``dest``), where it has neither."""
    if isinstance(err, OSError) and err.errno is not None:
        if err.filename is None:
            err.filename = str(dest)
        return err
    found = _RUST_OS_ERROR.search(str(err))
    if found is None:
        return err
    code = int(found[1])
    return OSError(code, os.strerror(code), found["path"] or str(dest))


def remove_stale_temporaries(dest: Path) -> None:
    """Remove the temporaries of ``dest`` whose writer, a process of this host, is gone, and
    those of other hosts in which nothing has changed for ``FOREIGN_STALE_S``."""
    for entry in dest.parent.iterdir():
        owner = _OWNED.fullmatch(entry.name)
        if not owner or owner["dest"] != dest.name:
            continue
        if owner["host"] == HOST_TAG:
            stale = not process_exists(int(owner["pid"]))
        else:
            stale = time.time() - last_change(entry) > FOREIGN_STALE_S
        if stale:
            shutil.rmtree(entry, ignore_errors=True)


def last_change(folder: Path) -> float:
    """The newest modification time of ``folder`` and everything under it."""
    newest = folder.lstat().st_mtime
    for root, folders, files in os.walk(folder):
        for name in folders + files:
            try:
                newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
            except FileNotFoundError:  # removed meanwhile
                continue
    return newest


def destination_of(path: Path) -> Path:
    """The output that a temporary of ``atomic_path``, or a path inside one, is being written
    for; ``path`` itself when it is neither."""
    for folder in (path, *path.parents):
        owner = _OWNED.fullmatch(folder.name)
        if owner:
            return folder.parent / owner["dest"]
    return path


def remove_temporaries(folder: Path) -> None:
    """Remove every temporary ``atomic_path`` left in ``folder``, whoever wrote it. Only for the
    one writer of ``folder`` (the holder of a run's lock): it would break another's write."""
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.is_dir() and _ANY.fullmatch(entry.name):
            shutil.rmtree(entry, ignore_errors=True)


def write_text(dest: str | Path, text: str) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(dest: str | Path, data: Any) -> None:
    write_text(dest, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json_cache(path: str | Path) -> dict[str, Any]:
    """A cache file written by ``write_json``/``write_text``; empty when absent or unreadable
    (a cache is rebuilt, never trusted half-read)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
