"""Writing outputs so that an interrupted stage never leaves a finished-looking file.

Everything is written under a temporary name in the destination's folder and renamed into
place (rename is atomic within one filesystem), so a reader sees either nothing or the whole.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(dest: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to ``dest``; on success rename it to ``dest``.

    Works for files and directories alike (whatever the body creates at the yielded path).
    On error the temporary is removed and ``dest`` is left as it was.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    work = tmp / (dest.name + suffix)
    try:
        yield work
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        os.replace(work, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(dest: str | Path, text: str) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(dest: str | Path, data: Any) -> None:
    write_text(dest, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
