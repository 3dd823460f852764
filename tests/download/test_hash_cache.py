"""The data checks' sha256 cache: a file is rehashed after any write, and only then."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from stages.core.storage import hashing


def test_a_file_rewritten_with_its_time_set_back_is_rehashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same size, same inode, modification time restored (``cp -p``, ``rsync -t`` or a script
    can do that): the change time still moves, so the cache cannot vouch for the old content."""
    monkeypatch.setattr(hashing, "HASH_CACHE", tmp_path / "sha256.json")
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"first line\nsecond line\n")
    before = os.stat(corpus)
    assert (
        hashing.cached_sha256([corpus])[corpus] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    )

    time.sleep(0.05)  # older kernels keep a file's change time in coarse ticks
    with corpus.open("r+b") as f:  # in place: the inode stays
        f.seek(3)
        f.write(b"X")
    os.utime(corpus, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(corpus)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size, before.st_mtime_ns, before.st_ino
    )  # fmt: skip
    assert (
        hashing.cached_sha256([corpus])[corpus] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    )


def test_an_unchanged_file_is_not_rehashed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashing, "HASH_CACHE", tmp_path / "sha256.json")
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"a line\n")
    hashing.cached_sha256([corpus])
    monkeypatch.setattr(hashing, "sha256_of", lambda path: pytest.fail("rehashed"))
    assert hashing.cached_sha256([corpus])[corpus]
