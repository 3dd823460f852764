"""Every objective selectable by ``name`` in params.yaml.

Adding an objective: write one module with an ``ObjectiveParams`` subclass, add it to
``OBJECTIVES`` below, and add one test file. The params schema picks it up from here.
"""

from __future__ import annotations

from typing import Annotated, Union, get_args

from pydantic import Field

from stages.objectives.alignment_uniformity import DCL, AlignUniform, DCLPlus
from stages.objectives.arccse import ArcCon, ArcCSE
from stages.objectives.base import ObjectiveParams
from stages.objectives.hardest_negative import MAT, MET, MPT
from stages.objectives.infonce import InfoNCE
from stages.objectives.simace import SimACE
from stages.objectives.unified_gradient import AlignMHE, AlignMHS, BarlowTwins, VICReg

OBJECTIVES: tuple[type[ObjectiveParams], ...] = (
    InfoNCE,  # SimCSE (Gao et al., 2021)
    ArcCon,  # ArcCSE (Zhang et al., 2022)
    ArcCSE,
    SimACE,  # SimACE
    AlignUniform,  # Nie et al. (ICLR 2023)
    DCL,
    DCLPlus,
    MPT,
    MET,
    MAT,
    AlignMHE,  # Li, Zhang, Nie (ACL 2024)
    AlignMHS,
    BarlowTwins,
    VICReg,
)

ObjectiveConfig = Annotated[Union[OBJECTIVES], Field(discriminator="name")]  # noqa: UP007

OBJECTIVES_BY_NAME: dict[str, type[ObjectiveParams]] = {
    get_args(cls.model_fields["name"].annotation)[0]: cls for cls in OBJECTIVES
}
