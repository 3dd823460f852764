"""The registries in the hand-written docs: the one table of the objectives (docs/objectives.md)
has a row for every registered objective and none for an unregistered one, the schedules table
one for every temperature schedule (which has its arithmetic), and the lists of
supported backbone families (README, docs/extending.md) name every adapter. A new objective or
family is described where readers look, not only registered."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stages.core.schema.objective_settings import OBJECTIVES, SETTINGS_BY_NAME
from stages.modeling.backbone_adapters import ADAPTERS

REPO = Path(__file__).resolve().parents[1]


def section(doc: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same level."""
    text = (REPO / doc).read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    level = heading.split()[0]
    end = text.find(f"\n{level} ", start + len(heading) + 2)
    return text[start : end if end >= 0 else None]


OBJECTIVES_TABLE = ("docs/objectives.md", "## Objectives and their defaults per backbone")


def test_the_objectives_table_has_a_row_for_every_registered_objective() -> None:
    rows = re.findall(r"^\| `(\w+)` \|", section(*OBJECTIVES_TABLE), re.MULTILINE)
    assert rows[0] == "name"  # the header
    registered = {name for name, cls in SETTINGS_BY_NAME.items() if cls in OBJECTIVES}
    missing = sorted(registered - set(rows[1:]))
    unregistered = sorted(set(rows[1:]) - registered)
    repeated = sorted({name for name in rows[1:] if rows[1:].count(name) > 1})
    where = f"{OBJECTIVES_TABLE[0]}, {OBJECTIVES_TABLE[1]!r}"
    assert not missing, f"{where} has no row for the registered objective(s) {', '.join(missing)}"
    assert not unregistered, f"{where} has rows for unregistered {', '.join(unregistered)}"
    assert not repeated, f"{where} has more than one row for {', '.join(repeated)}"


@pytest.mark.parametrize(
    ("doc", "heading"),
    [
        ("README.md", "## Adding an objective, a backbone or an evaluation"),
        ("docs/extending.md", "## Add a backbone"),
    ],
)
def test_the_docs_name_every_supported_backbone_family(doc: str, heading: str) -> None:
    text = section(doc, heading)
    assert [family for family in ADAPTERS if f"`{family}`" not in text] == []


SCHEDULES_TABLE = ("docs/objectives.md", "## Temperature schedules (cool-down paper, eqs. 2-4)")


def test_every_registered_schedule_has_its_arithmetic_and_a_row_in_the_docs() -> None:
    from stages.core.schema.temperature_settings import SCHEDULES, cool_downs
    from stages.objectives.temperature import COOL_DOWNS

    assert sorted(COOL_DOWNS) == sorted(cool_downs()), (
        "stages/objectives/temperature.py COOL_DOWNS must have one function per cool-down of "
        "SCHEDULES (stages/core/schema/temperature_settings.py)"
    )
    rows = re.findall(r"^\| `(\w+)` \|", section(*SCHEDULES_TABLE), re.MULTILINE)
    assert rows[0] == "schedule"  # the header
    assert sorted(rows[1:]) == sorted(SCHEDULES), f"{SCHEDULES_TABLE}: one row per schedule"
