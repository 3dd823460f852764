"""Sweeps in params.yaml: a method may declare a grid over any of its keys,

    methods:
      arccse:
        objective: {name: arccse, tau: 0.05, margin_deg: 10.0, ...}
        grid:
          objective.margin_deg: [0, 5, 10, 15, 20]

which expands, before validation, into one method per point of the grid's cross product, named
``arccse[margin_deg=5]`` (several keys: ``arccse[margin_deg=5,tau=0.07]``). A point is exactly
the hand-written method with those values, so its runs have the same ids and nothing trained
before reruns. Each point files its results under the method's ``method_key`` with the sweep
point as ``sweep`` (``margin_deg=5``), so the report draws the swept key against the metric next
to the paper's published curve. An experiment group naming the method gets every point.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

SECTIONS = ("objective", "temperature", "train")


class GridError(ValueError):
    """A grid that cannot be expanded; the message names the key path."""


def sweep_point(values: dict[str, Any]) -> list[str]:
    """'margin_deg=5' for each swept key (its last name) and value."""
    return [f"{key.rsplit('.', 1)[-1]}={value}" for key, value in values.items()]


def point_name(method: str, values: dict[str, Any]) -> str:
    return f"{method}[{','.join(sweep_point(values))}]"


def base_method(name: str) -> str:
    """The method a grid point was expanded from (the name itself for a hand-written method)."""
    return name.partition("[")[0]


def _set(tree: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise GridError(f"{path}: '{part}' is not a section")
    node[last] = value


def _points(method: str, grid: Any) -> list[dict[str, Any]]:
    where = f"methods.{method}.grid"
    if not isinstance(grid, dict) or not grid:
        raise GridError(f"{where}: expected a mapping of keys to lists of values")
    for key, values in grid.items():
        if not isinstance(key, str) or key.split(".", 1)[0] not in SECTIONS or "." not in key:
            raise GridError(
                f"{where}.{key}: a grid key is a dotted path into {', '.join(SECTIONS)}, e.g. "
                "objective.margin_deg"
            )
        if not isinstance(values, list) or not values:
            raise GridError(f"{where}.{key}: expected a non-empty list of values")
        for i, value in enumerate(values):
            if isinstance(value, dict | list):  # a point's name would not be a name
                raise GridError(
                    f"{where}.{key}.{i}: expected one value (a number, string, true/false or "
                    f"null), got a {'mapping' if isinstance(value, dict) else 'list'}"
                )
    short = [key.rsplit(".", 1)[-1] for key in grid]
    if len(set(short)) != len(short):
        raise GridError(f"{where}: two keys end in the same name ({', '.join(grid)})")
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


def _points_of(method: Any, points_of: dict[str, list[str]]) -> list[Any]:
    """The points of a swept method named in an experiment group; anything else as written
    (validated as a method name later, whatever its type)."""
    return points_of.get(method, [method]) if isinstance(method, str) else [method]


def expand_grids(raw: dict[str, Any]) -> dict[str, Any]:
    """params with every method's grid expanded into named methods (``raw`` is not changed)."""
    methods = raw.get("methods")
    if not isinstance(methods, dict) or not any(
        isinstance(m, dict) and "grid" in m for m in methods.values()
    ):
        return raw
    expanded: dict[str, Any] = {}
    points_of: dict[str, list[str]] = {}
    for name, method in methods.items():
        if not isinstance(method, dict) or "grid" not in method:
            expanded[name] = method
            continue
        base = {k: v for k, v in method.items() if k != "grid"}
        points_of[name] = []
        for values in _points(name, method["grid"]):
            point = copy.deepcopy(base)
            for key, value in values.items():
                _set(point, key, value)
            point.setdefault("method_key", method.get("method_key") or name)
            point["sweep"] = ";".join(sweep_point(values))
            expanded[point_name(name, values)] = point
            points_of[name].append(point_name(name, values))
    result = {**raw, "methods": expanded}
    groups = raw.get("experiments")
    if isinstance(groups, list):
        result["experiments"] = [
            {**g, "methods": [p for m in g["methods"] for p in _points_of(m, points_of)]}
            if isinstance(g, dict) and isinstance(g.get("methods"), list)
            else g
            for g in groups
        ]
    report = raw.get("report")
    baseline = report.get("baseline_method") if isinstance(report, dict) else None
    if isinstance(baseline, str) and baseline in points_of:
        raise GridError(
            f"report.baseline_method: '{baseline}' has a grid; name one of its points "
            f"({', '.join(points_of[baseline])})"
        )
    return result
