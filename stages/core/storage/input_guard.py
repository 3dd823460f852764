"""A stage writes its outputs only from the inputs it read: an input file (the params file)
edited while the stage ran stops it before its outputs are written.

Snakemake and DVC record a job's params as they are when the job ends (DVC's dvc.lock), or as
they were planned (Snakemake's params fingerprint), not as the job read them; an edit while a
stage runs would have them record the new params against a result of the old ones, and every
later run trust it. So a stage notes the sha256 of each input file's bytes before it reads it
(``watch``), and inside ``guarding()`` every output it renames into place (``atomic.atomic_path``,
``atomic.rename_durably``: the one place outputs are published) first checks that the files are
unchanged; when one is not, nothing more is written and the stage stops with one line naming the
file (``InputChanged``). The check runs once more as the block ends, for a stage whose outputs
were already as it would write them (nothing renamed).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from stages.core.errors import StageError


class InputChanged(StageError):
    """An input file changed between the stage's reading it and its writing an output."""


def file_sha256(path: Path) -> str | None:
    """sha256 of the file's bytes; None when there is no such file."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


@dataclass
class ReadInputs:
    """The input files a stage read, by the sha256 of their bytes when it read them."""

    digests: dict[Path, str | None] = field(default_factory=dict)

    def add(self, path: Path, sha256: str | None = None) -> None:
        """Note ``path`` as read: with the digest of the bytes read (``sha256``), else of the
        file now (before the stage reads it: a change after this is seen)."""
        self.digests[path] = file_sha256(path) if sha256 is None else sha256

    def changed(self) -> list[Path]:
        return [path for path, digest in self.digests.items() if file_sha256(path) != digest]

    def confirm(self, dest: Path | None = None) -> None:
        """Raise ``InputChanged`` when an input changed, naming it (and ``dest``, the output
        about to be written)."""
        changed = self.changed()
        if not changed:
            return
        files = " and ".join(str(path) for path in changed)
        written = (
            f"{dest} was not written"
            if dest is not None
            else "the stage stops unfinished (what it wrote is of the version it read)"
        )
        raise InputChanged(
            f"{files} changed while this stage ran, after it was read: {written}, so that no "
            "orchestrator records the new version against a result of the old one; rerun it"
        )

    @contextmanager
    def guarding(self) -> Iterator[None]:
        """Check the inputs before every output renamed into place in the block, and at its
        end."""
        global _guard
        previous, _guard = _guard, self
        try:
            yield
        finally:
            _guard = previous
        self.confirm()


_guard: ReadInputs | None = None  # the inputs of the stage in its guarding() block


def watch(*paths: Path) -> ReadInputs:
    """The inputs ``paths`` as they are now, before the stage reads them."""
    inputs = ReadInputs()
    for path in paths:
        inputs.add(path)
    return inputs


def confirm_inputs_unchanged(dest: Path) -> None:
    """Called just before ``dest`` is renamed into place: stop if the stage in a ``guarding()``
    block had an input changed."""
    if _guard is not None:
        _guard.confirm(dest)
