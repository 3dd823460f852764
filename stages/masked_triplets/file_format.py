"""The masked-triplet file: written by the triplets stage, read by the trainer, checked against
``TRIPLETS_SCHEMA`` (names, dtypes, nulls) on every read."""

from __future__ import annotations

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


def write_triplets(triplets: pl.DataFrame, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        triplets.rechunk().write_parquet(tmp, **PARQUET_OPTIONS)


def read_triplets(path: str | Path) -> pl.DataFrame:
    """The triplet file at ``path``, checked against ``TRIPLETS_SCHEMA`` (names, dtypes, nulls)."""
    path = Path(path)
    try:
        schema = pl.read_parquet_schema(path)
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
    triplets = pl.read_parquet(path)
    nulls = {name: n for name, n in triplets.null_count().row(0, named=True).items() if n}
    if nulls:
        listed = ", ".join(f"{name!r} ({n})" for name, n in nulls.items())
        raise StageError(f"triplets {path}: null values in column(s) {listed}")
    return triplets
