"""The data the pipeline knows (``stages/core/schema/data_manifest.yaml``): for each dataset, the
files it must contain with their sha256, and where to fetch them.

Paths are relative to the data folder (``data/`` by default). A local source folder
(``data.local_dir`` or ``CSE_DATA_DIR``) has the same layout, so its files sit at the same paths.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Url = Annotated[str, StringConstraints(pattern=r"^https?://\S+$")]


def _relative_path(path: str) -> str:
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or str(pure) != path or path in ("", "."):
        raise ValueError(f"{path!r} must be a normalised relative path (a/b/c, no '..')")
    return path


RelPath = Annotated[str, AfterValidator(_relative_path)]


def is_under(path: str, root: str) -> bool:
    """Whether data path ``path`` is ``root`` itself or lies inside folder ``root``."""
    return path == root or path.startswith(root + "/")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataFile(_Frozen):
    path: RelPath
    sha256: Sha256


class RemoteSource(_Frozen):
    url: Url
    archive: Literal["tar", "zip"] | None = Field(
        None, description="tar (any compression) or zip; null: the download is the file itself"
    )
    sha256: Sha256 | None = Field(
        None,
        description="of the archive; null: unknown, recorded in the lock file at first download "
        "(after every extracted file passed its own check) and required from then on",
    )
    root: RelPath = Field(
        description="the data path this source provides: the file itself, or the folder that "
        "corresponds to the archive folder holding the files (found inside the archive)"
    )

    @model_validator(mode="after")
    def _archive_checksum_only(self) -> Self:
        if self.archive is None and self.sha256 is not None:
            raise ValueError("a plain-file source takes its sha256 from its entry under files")
        return self


class Dataset(_Frozen):
    description: str
    output: RelPath = Field(description="the file or folder that appears atomically when complete")
    files: tuple[DataFile, ...] = Field(min_length=1)
    remote: tuple[RemoteSource, ...] = ()
    remote_unavailable: str | None = Field(
        None, description="why there is no public URL (then only the local source works)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        problems = [
            f"file {f.path} is not under output {self.output}"
            for f in self.files
            if not is_under(f.path, self.output)
        ]
        if bool(self.remote) == bool(self.remote_unavailable):
            problems.append("give either remote sources or remote_unavailable (exactly one)")
        for source in self.remote:
            if source.archive is None and source.root not in {f.path for f in self.files}:
                problems.append(f"plain-file source {source.url}: root {source.root} is no file")
        if self.remote:
            for f in self.files:
                covering = [s.url for s in self.remote if is_under(f.path, s.root)]
                if len(covering) != 1:
                    problems.append(f"file {f.path} is provided by {len(covering)} sources")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def files_from(self, source: RemoteSource) -> tuple[DataFile, ...]:
        return tuple(f for f in self.files if is_under(f.path, source.root))


class Manifest(_Frozen):
    datasets: dict[str, Dataset]


def load_manifest(path: str | Path | None = None) -> Manifest:
    """The manifest at ``path``, by default the one shipped with the package (parsed once per
    process: every evaluation id of a DAG reads it)."""
    if path is None:
        return _shipped_manifest()
    return Manifest.model_validate(yaml.safe_load(Path(path).read_text(encoding="utf-8")))


@cache
def _shipped_manifest() -> Manifest:
    text = resources.files("stages.core.schema").joinpath("data_manifest.yaml").read_text("utf-8")
    return Manifest.model_validate(yaml.safe_load(text))
