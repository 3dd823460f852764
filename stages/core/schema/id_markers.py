"""Whether a setting enters the id of what it computes: declared once, on its field.

Every setting an output reads is in that output's id (a run's, an evaluation's, the masked
triplets'), unless its field says otherwise with one of these markers in its ``Annotated`` type:

- ``ExecutionOnly()``: read, but it changes how an output is computed, not what (the device, the
  compiled or padded forward, logging); left out of every id.
- ``InId(absent=value)``: a key added after outputs were stored under ids that did not hold it.
  ``absent`` is the frozen value that computes what those outputs computed before the key
  existed: at that value the key is left out (a stored output keeps its id), at any other it is
  in the id. It is not the field's default and never follows it, so changing a default changes
  the id of every configuration that does not write the key.

``identity_settings`` is what ids hash of a settings model; ``stages.core.identity`` reads it,
the settings walk (tests/test_settings_walk.py) reads ``markers``, and docs/identity.md's table of
them is generated from them (``cse docs``; ``with_markers_table``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class ExecutionOnly:
    """Read, but out of every id: it changes how an output is computed, not what."""


@dataclass(frozen=True)
class InId:
    """In the id, except at ``absent`` (a JSON value: what the key's field dumps to), the value
    that computes what outputs stored before the key existed computed."""

    absent: Any


Marker = ExecutionOnly | InId


def marker(field: FieldInfo) -> Marker | None:
    """The id marker of a field, if it has one."""
    found = [m for m in field.metadata if isinstance(m, ExecutionOnly | InId)]
    if len(found) > 1:
        raise TypeError(f"a field has {len(found)} id markers; give it one: {found}")
    return found[0] if found else None


def markers(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Marker]]:
    """Every marked setting below ``model`` (sub-sections walked), by its dotted key."""
    for name, field in model.model_fields.items():
        found = marker(field)
        if found is not None:
            yield f"{prefix}{name}", found
        elif _is_model(field.annotation):
            yield from markers(field.annotation, f"{prefix}{name}.")
        elif get_origin(field.annotation) is dict and _is_model(get_args(field.annotation)[1]):
            # a section of named entries (backbones: {name: BackboneParams})
            yield from markers(get_args(field.annotation)[1], f"{prefix}{name}.<name>.")


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def identity_settings(settings: BaseModel) -> dict[str, Any]:
    """``settings`` as ids hash them: their JSON dump, without the execution-only keys and the
    keys at their ``absent`` value."""
    return _in_id(settings, settings.model_dump(mode="json"))


def _in_id(settings: BaseModel, dumped: dict[str, Any]) -> dict[str, Any]:
    for name, field in type(settings).model_fields.items():
        found = marker(field)
        if isinstance(found, ExecutionOnly) or (
            isinstance(found, InId) and dumped[name] == found.absent
        ):
            del dumped[name]
        elif isinstance(value := getattr(settings, name), BaseModel):
            dumped[name] = _in_id(value, dumped[name])
    return dumped


DOCS_BEGIN = "<!-- id markers: generated from the schema's fields (cse docs) -->\n"
DOCS_END = "<!-- end of id markers -->\n"


def markers_markdown(model: type[BaseModel]) -> str:
    """Every marked setting below ``model`` (params.yaml's root) as a Markdown table."""
    lines = ["| setting | in the ids |", "|---|---|"]
    for key, found in markers(model):
        if isinstance(found, ExecutionOnly):
            lines.append(f"| `{key}` | no: execution only |")
        else:
            absent = json.dumps(found.absent)
            lines.append(f"| `{key}` | yes, but left out at `{absent}` (added later: `InId`) |")
    return "\n".join(lines) + "\n"


def with_markers_table(text: str, model: type[BaseModel]) -> str:
    """``text`` (docs/identity.md) with the table between its markers generated anew."""
    head, begin, rest = text.partition(DOCS_BEGIN)
    _, end, tail = rest.partition(DOCS_END)
    if not begin or not end:
        raise ValueError(f"no {DOCS_BEGIN.strip()} ... {DOCS_END.strip()} block")
    return head + DOCS_BEGIN + markers_markdown(model) + DOCS_END + tail
