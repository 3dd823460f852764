"""Workspace data verified at every use: before a stage reads data/, each file it reads is
checked against the manifest's sha256 (``stages/core/schema/data_manifest.yaml``); the hashes
come from ``stages.core.storage.hashing``, so an unchanged file is not read again.
"""

from __future__ import annotations

from pathlib import Path

from stages.core.errors import StageError
from stages.core.schema.data_manifest import is_under, load_manifest
from stages.core.storage import layout
from stages.core.storage.hashing import cached_sha256


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
