"""The masked-triplet file: written by the triplets stage, read by the trainer, checked against
``TRIPLETS_SCHEMA`` (names, dtypes, nulls) on every read. The file records the triplets id of
what it was made from (``stages.core.identity.experiments.triplets_id``) in its Parquet
metadata; one named by an id (``data/triplets/<id>.parquet``, where the trainer reads a run's)
is read only when it records that id."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import polars as pl

from stages.core.errors import StageError
from stages.core.storage.atomic import atomic_path
from stages.masked_triplets.masking import TRIPLETS_SCHEMA

# Fixed writer settings: with the same polars version, the same frame gives the same bytes.
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "statistics": True,
    "row_group_size": 65536,
}
# The Parquet metadata key of the triplets id the file was made as.
ID_KEY = "cse.triplets_id"
# A file name that is a triplets id (stages.core.identity.experiments.ID_LENGTH hex digits).
ID_NAME = re.compile(r"[0-9a-f]{16}")


def named_id(path: str | Path) -> str | None:
    """The triplets id a file's name says it holds (``<id>.parquet``), or None."""
    stem = Path(path).stem
    return stem if ID_NAME.fullmatch(stem) else None


def write_triplets(
    triplets: pl.DataFrame, path: str | Path, triplets_id: str | None = None
) -> None:
    metadata = {ID_KEY: triplets_id} if triplets_id else None
    with atomic_path(path) as tmp:
        triplets.rechunk().write_parquet(tmp, **PARQUET_OPTIONS, metadata=metadata)


def read_triplets(path: str | Path) -> pl.DataFrame:
    """The triplet file at ``path``, checked against ``TRIPLETS_SCHEMA`` (names, dtypes, nulls),
    and against the id its name says (a file named ``<id>.parquet`` must record it)."""
    path = Path(path)
    try:
        schema = pl.read_parquet_schema(path)
        recorded = pl.read_parquet_metadata(path).get(ID_KEY)
    except FileNotFoundError:
        raise StageError(f"triplets {path}: no such file") from None
    except (OSError, pl.exceptions.PolarsError) as err:
        raise StageError(f"triplets {path}: not a readable Parquet file ({err})") from None
    problems = [
        f"column {name!r} is missing (expected {dtype})"
        if name not in schema
        else f"column {name!r} has dtype {schema[name]}, expected {dtype}"
        for name, dtype in TRIPLETS_SCHEMA.items()
        if schema.get(name) != dtype
    ]
    problems += [f"unexpected column {name!r}" for name in schema if name not in TRIPLETS_SCHEMA]
    if problems:
        raise StageError(f"triplets {path}: " + "; ".join(problems))
    expected = named_id(path)
    if expected is not None and recorded != expected:
        raise StageError(
            f"triplets {path}: made as triplets id {recorded or '(none recorded)'}, not "
            f"{expected} as its name says: from other settings or data than those that read it "
            "expect; delete it and rerun the triplets stage"
        )
    triplets = pl.read_parquet(path)
    nulls = {name: n for name, n in triplets.null_count().row(0, named=True).items() if n}
    if nulls:
        listed = ", ".join(f"{name!r} ({n})" for name, n in nulls.items())
        raise StageError(f"triplets {path}: null values in column(s) {listed}")
    return triplets
