"""The settings of every training objective: the ``objective:`` block of a method in params.yaml.

These classes are the schema only (names, hyperparameters, their ranges and defaults, and what an
objective needs from the trainer); the losses themselves live in ``stages.objectives`` and are
imported only by the code that computes them (``stages.objectives.registry.build_objective``), so
validating params, planning runs and computing their ids never import torch.

Adding an objective: its settings class here and one entry in ``OBJECTIVES`` below (the settings
class and the ``module:Class`` of its loss), its loss module in ``stages/objectives/``, one test
file in ``tests/objectives/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from stages.core.schema.bounds import Real

# paper: the paper's equations; code: the authors' released code where it differs.
Implementation = Literal["paper", "code"]


# The papers the objectives come from, cited by a trained model's card after SimCSE
# (``ObjectiveSettings.paper``).
ARCCSE = (
    "Zhang et al. (2022). A Contrastive Framework for Learning Sentence Representations from "
    "Pairwise and Triple-wise Perspective in Angular Space (ArcCSE). ACL."
)
SIMACE = (
    "A Simple Angle-based Approach for Contrastive Learning of Unsupervised Sentence "
    "Representation (SimACE)."
)
ALIGN_UNIFORM = (
    "On the Inadequacy of Optimizing Alignment and Uniformity in Contrastive Learning of "
    "Sentence Representations."
)
UNIFIED_GRADIENT = (
    "Towards Better Understanding of Contrastive Sentence Representation Learning: A Unified "
    "Paradigm for Gradient."
)


class ObjectiveSettings(BaseModel):
    """Base class of every objective's settings. Subclasses set ``name: Literal[...]`` and their
    hyperparameters."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    # Whether the objective reads a temperature (and so accepts a temperature schedule); a
    # property where it depends on the configuration (paper 002's softmax_weight).
    uses_temperature: ClassVar[bool] = False
    # Whether the trainer must encode ArcCSE masked triplets (dropout off) for this objective.
    needs_triplets: ClassVar[bool] = False
    # The paper that defines the objective (its model card's citation after SimCSE's); none
    # for SimCSE's own loss. Not part of a run's id: it changes no number.
    paper: ClassVar[str] = ""

    def derived(self) -> dict[str, Any]:
        """What this module's code derives from the settings for the losses and the trainer to
        read (the class switches and every property, e.g. paper 002's ``modified``). Part of a
        run's id next to the settings: the core is outside code identity, so an edit of a
        derivation must reach the ids through the values it yields."""
        names = {"uses_temperature", "needs_triplets"} | {
            name
            for cls in type(self).__mro__
            if isinstance(cls, type) and issubclass(cls, ObjectiveSettings)
            for name, attribute in vars(cls).items()
            if isinstance(attribute, property)
        }
        return {name: getattr(self, name) for name in sorted(names)}

    def unused_settings(self) -> tuple[str, ...]:
        """Fields given explicitly (not left to their defaults) that this configuration does not
        read, so a setting that would silently change nothing is refused (params validation)."""
        return ()


def _margin_field(default: float) -> Any:
    # cos(theta + m) falls with theta only while theta + m <= 180 degrees; below 90 it does for
    # every positive pair within 90 degrees (all of them in practice), and the papers use 0-20
    # (the range: BOUNDS["arc_margin_deg"]).
    return Field(
        default,
        description="additive angular margin m on the positive pair, in degrees, in [0, 90) "
        "(ArcCSE: 10 on every backbone; 0 gives NT-Xent)",
    )


def _hardest_negative_implementation_field() -> Any:
    return Field(
        "paper",
        description="paper: hardest negative per anchor (row); code: the released code's "
        "hardest negative per positive (column), diagonal filled with cosine 0",
    )


class InfoNCESettings(ObjectiveSettings):
    """SimCSE (Gao et al., 2021): ``stages.objectives.infonce.InfoNCE``."""

    name: Literal["infonce"]
    tau: Real("tau") = Field(0.05, description="temperature (SimCSE: 0.05 on every backbone)")
    uses_temperature: ClassVar[bool] = True


class ArcConSettings(ObjectiveSettings):
    """ArcCSE (Zhang et al., 2022): ``stages.objectives.arccse.ArcCon``."""

    name: Literal["arccon"]
    paper: ClassVar[str] = ARCCSE
    tau: Real("tau") = Field(0.05, description="temperature (ArcCSE: 0.05 on every backbone)")
    margin_deg: Real("arc_margin_deg") = _margin_field(10.0)
    uses_temperature: ClassVar[bool] = True


class ArcCSESettings(ObjectiveSettings):
    """ArcCSE (Zhang et al., 2022): ``stages.objectives.arccse.ArcCSE``."""

    name: Literal["arccse"]
    paper: ClassVar[str] = ARCCSE
    tau: Real("tau") = Field(0.05, description="temperature of ArcCon (0.05 on every backbone)")
    margin_deg: Real("arc_margin_deg") = _margin_field(10.0)
    triplet_weight: Real("triplet_weight") = Field(
        0.1, description="lambda, weight of the triplet loss (0.1 on every backbone)"
    )
    triplet_margin: Real("triplet_margin") = Field(
        0.0, description="m of the triplet hinge on cosines (0 on every backbone)"
    )
    uses_temperature: ClassVar[bool] = True
    needs_triplets: ClassVar[bool] = True


class SimACESettings(ObjectiveSettings):
    """SimACE: ``stages.objectives.simace.SimACE``."""

    name: Literal["simace"]
    paper: ClassVar[str] = SIMACE
    tau: Real("tau") = Field(
        0.06, description="temperature (Table 7: 0.06 BERT-base/large, 0.05 RoBERTa)"
    )
    margin_deg: Real("simace_margin_deg") = Field(
        10.0,
        description="m in degrees, subtracted from the positive's angular similarity "
        "(Table 7: 10 on every backbone; Table 14 ablates 0 and -10)",
    )
    uses_temperature: ClassVar[bool] = True


class AlignUniformSettings(ObjectiveSettings):
    """Nie et al. (ICLR 2023), paper 003: ``stages.objectives.alignment_uniformity``."""

    name: Literal["align_uniform"]
    paper: ClassVar[str] = ALIGN_UNIFORM
    uniformity_weight: Real("au_uniformity_weight") = Field(
        0.1,
        description="lambda (Table 2: 0.1 BERT-base/large, 0.2 RoBERTa-base, 0.4 RoBERTa-large)",
    )
    alpha: Real("alpha") = Field(2.0, description="alignment exponent (Table 2: 2)")
    t: Real("t") = Field(6.0, description="uniformity scale (Table 2: 6; the metric uses 2)")
    implementation: Implementation = Field(
        "paper",
        description="paper: cross-view uniformity of eq. 29; code: the released code's "
        "within-view uniformity averaged over both views (+2t)",
    )


class DCLSettings(ObjectiveSettings):
    """Nie et al. (ICLR 2023), paper 003: ``stages.objectives.alignment_uniformity.DCL``."""

    name: Literal["dcl"]
    paper: ClassVar[str] = ALIGN_UNIFORM
    tau: Real("tau") = Field(
        0.03,
        description="temperature (Table 2: 0.03 BERT-base, 0.01 BERT-large, "
        "0.02 RoBERTa-base/large)",
    )
    uses_temperature: ClassVar[bool] = True


class DCLPlusSettings(ObjectiveSettings):
    """Nie et al. (ICLR 2023), paper 003: ``stages.objectives.alignment_uniformity.DCLPlus``."""

    name: Literal["dcl_plus"]
    paper: ClassVar[str] = ALIGN_UNIFORM
    tau: Real("tau") = Field(
        0.17,
        description="temperature (Table 2: 0.17 BERT-base, 0.18 BERT-large, "
        "0.15 RoBERTa-base, 0.17 RoBERTa-large)",
    )
    uses_temperature: ClassVar[bool] = True


class MPTSettings(ObjectiveSettings):
    """Nie et al. (ICLR 2023), paper 003: ``stages.objectives.hardest_negative.MPT``."""

    name: Literal["mpt"]
    paper: ClassVar[str] = ALIGN_UNIFORM
    margin: Real("margin") = Field(
        0.23,
        description="m on cosines (Table 2: 0.23 BERT-base, 0.24 BERT-large, "
        "0.29 RoBERTa-base, 0.31 RoBERTa-large)",
    )
    implementation: Implementation = _hardest_negative_implementation_field()


class METSettings(ObjectiveSettings):
    """Nie et al. (ICLR 2023), paper 003: ``stages.objectives.hardest_negative.MET``."""

    name: Literal["met"]
    paper: ClassVar[str] = ALIGN_UNIFORM
    margin: Real("margin") = Field(
        0.45,
        description="m on distances (Table 2: 0.45 BERT-base, 0.50 "
        "BERT-large, 0.43 RoBERTa-base, 0.45 RoBERTa-large)",
    )
    implementation: Implementation = _hardest_negative_implementation_field()


class MATSettings(ObjectiveSettings):
    """Nie et al. (ICLR 2023), paper 003: ``stages.objectives.hardest_negative.MAT``."""

    name: Literal["mat"]
    paper: ClassVar[str] = ALIGN_UNIFORM
    margin_pi: Real("margin_pi") = Field(
        0.15,
        description="m in units of pi (Table 2: 0.15 BERT-base, 0.17 "
        "BERT-large, 0.14 RoBERTa-base, 0.13 RoBERTa-large)",
    )
    implementation: Implementation = _hardest_negative_implementation_field()


class _UnifiedGradientSettings(ObjectiveSettings):
    """Paper 002's switches, common to its four objectives."""

    paper: ClassVar[str] = UNIFIED_GRADIENT

    gradient_dissipation: StrictBool = Field(
        False, description="GD: stop the gradient of anchors with h_i.h'_i - max_k h_i.h'_k >= m"
    )
    static_ratio: StrictBool = Field(False, description="R: the positive's pull is r * sum_j W_ij")
    margin: Real("margin") = Field(
        0.30,
        description="m of the GD test (Table 6: 0.30 BERT-base; RoBERTa-base "
        "0.30 MHE, 0.27 MHS, 0.37 BT and VICReg)",
    )
    ratio: Real("ratio") = Field(1.5, description="r, the static ratio")
    implementation: Implementation = Field(
        "paper",
        description="paper: the paper's equations (cross-view GD, R = r exactly); code: the "
        "released code (same-view GD, positive pulled by both views, MHE t = 1/2, MHS "
        "neighbour in the other view)",
    )

    def unused_settings(self) -> tuple[str, ...]:
        """tau and nu belong to W (tau only with softmax_weight, nu only without), r to R, m to
        GD; the same field explicitly set where its switch leaves it unread is refused."""
        softmax_weight = getattr(self, "softmax_weight", None)
        unread = {
            "tau": softmax_weight is False,
            "uniformity_weight": softmax_weight is True,
            "off_diagonal_weight": softmax_weight is True,
            "covariance_weight": softmax_weight is True,
            "ratio": not self.static_ratio,
            "margin": not self.gradient_dissipation,
        }
        return tuple(sorted(f for f in self.model_fields_set if unread.get(f, False)))

    @property
    def modified(self) -> bool:
        # MHS has no softmax_weight switch: its weight needs no modification (Table 5).
        softmax_weight = getattr(self, "softmax_weight", False)
        return self.gradient_dissipation or softmax_weight or self.static_ratio


class AlignMHESettings(_UnifiedGradientSettings):
    """Li, Zhang, Nie (ACL 2024), paper 002: ``stages.objectives.unified_gradient.AlignMHE``."""

    name: Literal["align_mhe"]
    softmax_weight: StrictBool = Field(
        False, description="W: nu := 1 and uniformity log sum_{k<l} e^{h_k.h_l / tau}"
    )
    uniformity_weight: Real("nu") = Field(
        10.0, description="nu^u of the original (released scripts: 10; unused with W)"
    )
    tau: Real("tau") = Field(0.05, description="temperature of the W modification (Table 6)")
    ratio: Real("ratio") = Field(1.75, description="r (Table 6: 1.75 BERT-base, 1.25 RoBERTa-base)")

    @property
    def uses_temperature(self) -> bool:  # type: ignore[override]
        """Only the W modification (softmax_weight) has a temperature."""
        return self.softmax_weight


class AlignMHSSettings(_UnifiedGradientSettings):
    """Li, Zhang, Nie (ACL 2024), paper 002: ``stages.objectives.unified_gradient.AlignMHS``."""

    name: Literal["align_mhs"]
    uniformity_weight: Real("nu") = Field(
        1.0, description="nu^u multiplying the anchors' mean MHS term (released scripts: 1)"
    )
    ratio: Real("ratio") = Field(1.75, description="r (Table 6: 1.75 BERT-base, 1.00 RoBERTa-base)")


class BarlowTwinsSettings(_UnifiedGradientSettings):
    """Li, Zhang, Nie (ACL 2024), paper 002: ``stages.objectives.unified_gradient.BarlowTwins``."""

    name: Literal["barlow_twins"]
    softmax_weight: StrictBool = Field(
        False, description="W: nu := 1 and W_ij = e^{h'_i.h'_j/tau} / sum_{k != l} e^{...}"
    )
    off_diagonal_weight: Real("nu") = Field(
        30.0, description="nu^B of the original (released scripts: 30; unused with W)"
    )
    tau: Real("tau") = Field(0.05, description="temperature of the W modification (Table 6)")
    ratio: Real("ratio") = Field(1.5, description="r (Table 6: 1.50 BERT-base, 1.25 RoBERTa-base)")

    @property
    def uses_temperature(self) -> bool:  # type: ignore[override]
        """Only the W modification (softmax_weight) has a temperature."""
        return self.softmax_weight


class VICRegSettings(_UnifiedGradientSettings):
    """Li, Zhang, Nie (ACL 2024), paper 002: ``stages.objectives.unified_gradient.VICReg``."""

    name: Literal["vicreg"]
    softmax_weight: StrictBool = Field(
        False, description="W: nu := 1 and W_ij = e^{h_i.h_j/tau} / sum_{k != l} e^{...}"
    )
    covariance_weight: Real("nu") = Field(
        30.0, description="nu^V of eq. 11 (released scripts: 30; unused with W)"
    )
    tau: Real("tau") = Field(0.05, description="temperature of the W modification (Table 6)")
    ratio: Real("ratio") = Field(1.5, description="r (Table 6: 1.50 BERT-base, 1.25 RoBERTa-base)")

    @property
    def uses_temperature(self) -> bool:  # type: ignore[override]
        """Only the W modification (softmax_weight) has a temperature."""
        return self.softmax_weight


# Every selectable objective: its settings and the ``module:Class`` of its loss (imported lazily).
OBJECTIVES: dict[type[ObjectiveSettings], str] = {
    InfoNCESettings: "stages.objectives.infonce:InfoNCE",
    ArcConSettings: "stages.objectives.arccse:ArcCon",
    ArcCSESettings: "stages.objectives.arccse:ArcCSE",
    SimACESettings: "stages.objectives.simace:SimACE",
    AlignUniformSettings: "stages.objectives.alignment_uniformity:AlignUniform",
    DCLSettings: "stages.objectives.alignment_uniformity:DCL",
    DCLPlusSettings: "stages.objectives.alignment_uniformity:DCLPlus",
    MPTSettings: "stages.objectives.hardest_negative:MPT",
    METSettings: "stages.objectives.hardest_negative:MET",
    MATSettings: "stages.objectives.hardest_negative:MAT",
    AlignMHESettings: "stages.objectives.unified_gradient:AlignMHE",
    AlignMHSSettings: "stages.objectives.unified_gradient:AlignMHS",
    BarlowTwinsSettings: "stages.objectives.unified_gradient:BarlowTwins",
    VICRegSettings: "stages.objectives.unified_gradient:VICReg",
}


def check_registry() -> None:
    """A mistyped entry is named here, not met as a missing file in the code identity."""
    for settings, location in OBJECTIVES.items():
        module, _, cls = location.partition(":")
        if not cls or not _source_file(module).is_file():
            raise ImportError(
                f"OBJECTIVES[{settings.__name__}] = '{location}': expected "
                f"'stages.objectives.<module>:<Class>' of an existing module "
                f"({_source_file(module)} is not a file)"
            )


def _source_file(module: str) -> Path:
    """Where ``stages`` module ``module`` lies (without importing it: the losses need torch)."""
    return Path(__file__).resolve().parents[3].joinpath(*module.split(".")).with_suffix(".py")


check_registry()

ObjectiveConfig = Annotated[Union[tuple(OBJECTIVES)], Field(discriminator="name")]  # noqa: UP007

SETTINGS_BY_NAME: dict[str, type[ObjectiveSettings]] = {
    get_args(cls.model_fields["name"].annotation)[0]: cls for cls in OBJECTIVES
}


def loss_location(name: str) -> tuple[str, str]:
    """The module and class name of objective ``name``'s loss."""
    module, cls = OBJECTIVES[SETTINGS_BY_NAME[name]].split(":")
    return module, cls
