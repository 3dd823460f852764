"""Workspace data verified at every use: before a stage reads data/, each file it reads is
checked against the manifest's sha256 (``stages/core/data_manifest.yaml``).

Hashing a multi-GB corpus at every start would cost seconds, so a file's sha256 is cached keyed
by its path, size, modification and change times and inode (``cache/sha256.json``): an
unchanged file is not rehashed, and any write to it makes it rehashed (a write sets the change
time, which, unlike the modification time, no program can set back).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from stages.core import layout
from stages.core.atomic import read_json_cache, write_text
from stages.core.data_manifest import is_under, load_manifest
from stages.core.errors import StageError

HASH_CACHE = layout.CACHE / "sha256.json"
CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def stat_key(path: Path) -> str:
    """Changes with any write to the file at ``path`` (also one whose mtime is set back)."""
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ctime_ns}:{stat.st_ino}"


def cached_sha256(paths: list[Path]) -> dict[Path, str]:
    """sha256 of every file, rehashing only files written since (``stat_key``)."""
    stored = read_json_cache(HASH_CACHE)
    hashes, changed = {}, False
    for path in paths:
        key, name = stat_key(path), str(path.resolve())
        entry = stored.get(name)
        if entry is None or entry[0] != key:
            entry = [key, sha256_of(path)]
            stored[name], changed = entry, True
        hashes[path] = entry[1]
    if changed:
        write_text(HASH_CACHE, json.dumps(stored, sort_keys=True))
    return hashes


def folder_digest(folder: Path) -> str:
    """sha256 over the relative paths and contents of every file under ``folder`` (the files'
    hashes come from ``cached_sha256``, so an unchanged folder is not read again)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    hashes = cached_sha256(files)
    listing = "".join(f"{p.relative_to(folder).as_posix()}\0{hashes[p]}\n" for p in files)
    return hashlib.sha256(listing.encode()).hexdigest()


def verify_data(
    *data_paths: str, data: Path = layout.DATA, params_file: str | Path | None = None
) -> None:
    """Check every manifest file at or under ``data_paths`` (relative to ``data``, e.g.
    'corpus/wiki1m.txt' or 'senteval'): present and with its sha256. A mismatch stops the stage,
    naming the file, both hashes and the command that restores it (from ``params_file``'s data
    source), before anything is read."""
    expected: dict[Path, tuple[str, str]] = {}
    for name, dataset in load_manifest().datasets.items():
        for entry in dataset.files:
            if any(is_under(entry.path, root) for root in data_paths):
                expected[data / entry.path] = (entry.sha256, name)
    missing = [p for p in expected if not p.is_file()]
    if missing:
        name = expected[missing[0]][1]
        raise StageError(
            f"{missing[0]} is missing ({len(missing)} file(s) of the manifest): restore it with "
            f"`{restore_command(name, params_file)}`"
        )
    actual = cached_sha256(list(expected))
    for path, (sha, name) in expected.items():
        if actual[path] != sha:
            output = data / load_manifest().datasets[name].output
            raise StageError(
                f"{path} changed after download: sha256 {actual[path]}, the manifest says {sha}. "
                f"Nothing was computed from it. Restore it: delete {output} and run "
                f"`{restore_command(name, params_file)}`"
            )


def verify_workspace_data(*paths: Path, params_file: str | Path | None = None) -> None:
    """``verify_data`` for the files or folders a stage is about to read, where they lie in the
    workspace's data/ (a folder of the user's own outside data/ is not the manifest's)."""
    data = layout.DATA.resolve()
    relative = []
    for path in paths:
        try:
            relative.append(path.resolve().relative_to(data).as_posix())
        except ValueError:
            continue
    if relative:
        verify_data(*relative, params_file=params_file)


def restore_command(dataset: str, params_file: str | Path | None) -> str:
    """The download stage's command for ``dataset`` (every corpus is `corpus`) from
    ``params_file``'s data source."""
    argument = "corpus" if dataset.startswith("wiki1m") else dataset
    return f"python -m stages.download {argument}{layout.params_flag(params_file)}"
