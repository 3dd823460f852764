"""File hashes, cached: a multi-GB corpus is hashed once, not at every stage start.

A file's sha256 is kept in ``cache/sha256.json`` keyed by its path, size, modification and change
times and inode (``stat_key``): an unchanged file is not rehashed, and any write to it makes it
rehashed (a write sets the change time, which, unlike the modification time, no program can set
back).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from stages.core.storage import layout
from stages.core.storage.atomic import read_json_cache, write_text

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
