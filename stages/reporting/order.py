"""The order methods appear in: by name, with the numbers in a name compared as numbers.

A grid expands into methods named ``simcse[tau=0.05]``, ``simcse[tau=0.0]``
(``stages/core/schema/sweeps.py``); sorted as text, 0.05 comes before 0.0 and 10 before 5. Every
table, legend and figure of the report orders methods by ``name_key`` instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import polars as pl

# A number; signed only as a grid point's value (after '='), where '-10' is minus ten, while the
# hyphen of 'simcse-tau-0_1' is part of the name.
_NUMBER = re.compile(r"((?<==)-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\d+(?:\.\d+)?)")


def name_key(name: str) -> tuple[tuple[tuple[str, float], ...], str]:
    """Sort key: the name's text pieces, each with the number after it (as a float), then the
    name itself to order names that differ only in how a number is written (0.1 and 0.10)."""
    parts = _NUMBER.split(name)
    pieces = tuple(
        (parts[i], float(parts[i + 1]) if i + 1 < len(parts) else -math.inf)
        for i in range(0, len(parts), 2)
    )
    return pieces, name


def sorted_names(names: Iterable[str]) -> list[str]:
    return sorted(set(names), key=name_key)


def sort_by_method(frame: pl.DataFrame, *then: str) -> pl.DataFrame:
    """``frame`` sorted by its ``method`` column in ``name_key`` order, then by ``then``."""
    rank = {name: i for i, name in enumerate(sorted_names(frame["method"].drop_nulls()))}
    order = pl.col("method").replace_strict(rank, default=None, return_dtype=pl.Int64)
    return frame.sort(order, *then, nulls_last=True)
