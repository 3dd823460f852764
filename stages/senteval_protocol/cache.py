"""Embeddings cached on disk per (encoder fingerprint, task), so re-running the classifiers (a
different mode, a protocol change) costs no encoding.

``<root>/<fingerprint>/<task>.npz`` holds the task's distinct texts' embeddings (sorted text
order) and the sha256 of those texts; a file whose texts differ (changed data), or that cannot
be read (truncated, damaged), is ignored and rewritten. Files are written atomically.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import numpy as np

from stages.core.errors import UNREADABLE_NPZ
from stages.core.storage.atomic import atomic_path


def texts_digest(texts: list[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8") + b"\0")
    return digest.hexdigest()


class EmbeddingCache:
    def __init__(self, root: str | Path, fingerprint: str) -> None:
        self.folder = Path(root) / fingerprint
        self.fingerprint = fingerprint

    def path(self, task: str) -> Path:
        return self.folder / f"{task}.npz"

    def load(self, task: str, texts: list[str]) -> np.ndarray | None:
        """The embeddings of ``texts`` (in that order) if cached for exactly these texts."""
        path = self.path(task)
        if not path.is_file():
            return None
        try:  # the file opened here: np.load leaves its own handle open when the archive is damaged
            with path.open("rb") as file, np.load(file) as stored:
                if str(stored["texts_sha256"]) != texts_digest(texts):
                    return None
                return stored["embeddings"]
        except UNREADABLE_NPZ as err:
            warnings.warn(
                f"{path}: unreadable cache entry ({type(err).__name__}: {err}); encoding the "
                "task again and rewriting it",
                stacklevel=2,
            )
            return None

    def store(self, task: str, texts: list[str], embeddings: np.ndarray) -> None:
        with atomic_path(self.path(task)) as tmp, tmp.open("wb") as f:
            np.savez(f, embeddings=embeddings, texts_sha256=np.array(texts_digest(texts)))
