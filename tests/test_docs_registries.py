"""The registries in the hand-written docs: README's objectives table has a row for every
registered objective, and the lists of supported backbone families (README, docs/extending.md)
name every adapter. A new objective or family is described where readers look, not only
registered."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stages.core.schema.objective_settings import SETTINGS_BY_NAME
from stages.modeling.backbone_adapters import ADAPTERS

REPO = Path(__file__).resolve().parents[1]


def section(doc: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same level."""
    text = (REPO / doc).read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    level = heading.split()[0]
    end = text.find(f"\n{level} ", start + len(heading) + 2)
    return text[start : end if end >= 0 else None]


def test_readme_has_a_row_for_every_objective() -> None:
    rows = re.findall(r"^\| `(\w+)` \|", section("README.md", "## Objectives"), re.MULTILINE)
    assert rows[0] == "name"  # the header
    assert sorted(rows[1:]) == sorted(SETTINGS_BY_NAME)


@pytest.mark.parametrize(
    ("doc", "heading"), [("README.md", "## Backbones"), ("docs/extending.md", "## Add a backbone")]
)
def test_the_docs_name_every_supported_backbone_family(doc: str, heading: str) -> None:
    text = section(doc, heading)
    assert [family for family in ADAPTERS if f"`{family}`" not in text] == []
