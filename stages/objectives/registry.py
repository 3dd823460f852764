"""Every objective selectable by ``name`` in params.yaml.

Adding an objective: write one module with an ``ObjectiveParams`` subclass, add it to
``OBJECTIVES`` below, and add one test file. The params schema picks it up from here.
"""

from __future__ import annotations

from typing import Annotated, Union, get_args

from pydantic import Field

from stages.objectives.base import ObjectiveParams
from stages.objectives.infonce import InfoNCE

OBJECTIVES: tuple[type[ObjectiveParams], ...] = (InfoNCE,)

ObjectiveConfig = Annotated[Union[OBJECTIVES], Field(discriminator="name")]  # noqa: UP007

OBJECTIVES_BY_NAME: dict[str, type[ObjectiveParams]] = {
    get_args(cls.model_fields["name"].annotation)[0]: cls for cls in OBJECTIVES
}
