"""The sane range of every rate, weight, temperature and other real number in params.yaml, in one
table (``BOUNDS``), and the strict number types the schema builds from it.

Each row names the keys it applies to, the range a value must lie in (refused outside it, naming
the key and the range) and, where the papers leave room to explore, the narrower range they use
(a value between the two is accepted with a one-line warning). docs/training.md shows the table
(``bounds_markdown``; tests/test_params.py checks it is current).

Whatever the range, a boolean is never a number (YAML's ``true`` would otherwise be read as 1),
and nan or inf never a setting (each model's ``allow_inf_nan=False``). A string that reads as a
number still is one: PyYAML reads ``1e-5`` (no dot) as the string '1e-5'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field
from pydantic_core import PydanticCustomError


@dataclass(frozen=True)
class Interval:
    """A range written as in mathematics: ``(0, 1]``, ``[0, inf)``."""

    text: str
    low: float = field(init=False)
    high: float = field(init=False)
    low_open: bool = field(init=False)
    high_open: bool = field(init=False)

    def __post_init__(self) -> None:
        left, right = (part.strip() for part in self.text[1:-1].split(","))
        object.__setattr__(self, "low", float(left))
        object.__setattr__(self, "high", float(right))
        object.__setattr__(self, "low_open", self.text[0] == "(")
        object.__setattr__(self, "high_open", self.text[-1] == ")")
        if self.text[0] not in "([" or self.text[-1] not in ")]" or self.low >= self.high:
            raise ValueError(f"not an interval: {self.text!r}")

    def bounds(self) -> tuple[str, str]:
        return tuple(part.strip() for part in self.text[1:-1].split(","))  # type: ignore[return-value]

    def problem(self, value: float) -> str | None:
        """How ``value`` falls outside, in pydantic's words ('greater than 0'); None inside."""
        low, high = self.bounds()
        if value < self.low or (self.low_open and value == self.low):
            return f"greater than {low}" if self.low_open else f"greater than or equal to {low}"
        if value > self.high or (self.high_open and value == self.high):
            return f"less than {high}" if self.high_open else f"less than or equal to {high}"
        return None


@dataclass(frozen=True)
class Bound:
    keys: str  # the params keys it applies to, as a reader finds them
    allowed: Interval  # refused outside
    typical: Interval | None  # outside it (and inside allowed): accepted with a warning
    source: str  # where the range comes from


def _bound(keys: str, allowed: str, typical: str | None, source: str) -> Bound:
    return Bound(keys, Interval(allowed), Interval(typical) if typical else None, source)


TEMPERATURE = "(0, 10]", "[1e-3, 3]"

# name -> Bound. Papers: 000 SimACE, 001 ArcCSE, 002 unified gradient, 003 alignment/uniformity,
# 004 cool-down (../shared/papers/spec-*.md).
BOUNDS: dict[str, Bound] = {
    "learning_rate": _bound(
        "train.learning_rate", "(0, 1]", "[1e-7, 1e-2]",
        "papers: 5e-6 to 1e-4 (grids 5e-6 to 5e-5)",
    ),
    "warmup_ratio": _bound(
        "train.warmup_ratio", "[0, 1)", None, "share of the updates warming up (papers: 0)"
    ),
    "weight_decay": _bound(
        "train.weight_decay", "[0, 1]", "[0, 0.1]", "papers: 0 (HF Trainer); AdamW's usual 0.01-0.1"
    ),
    "adam_beta": _bound("train.adam_betas (each)", "(0, 1)", None, "0.9, 0.999"),
    "adam_epsilon": _bound("train.adam_epsilon", "(0, 1]", "[1e-12, 1e-4]", "1e-8"),
    "max_grad_norm": _bound(
        "train.max_grad_norm", "(0, inf)", None, "1.0 (HF Trainer); null: no clipping"
    ),
    "dropout": _bound(
        "train.dropout", "[0, 1)", "[0, 0.5]", "BERT's 0.1; SimCSE's ablation 0-0.5"
    ),
    "head_init_std": _bound(
        "train.head_init_std", "(0, 1]", "[1e-3, 0.1]",
        "BERT's initializer_range 0.02; 002's code 0.006",
    ),
    "sam_rho": _bound(
        "train.sam.rho", "(0, 10]", "[1e-3, 2]", "SAM's 0.05; adaptive SAM up to 2"
    ),
    "mask_rate": _bound(
        "triplets.short_mask_rate, long_mask_rate", "(0, 1)", None,
        "001 Fig. 6: 10-60%, 20% and 40% chosen",
    ),
    "tau": _bound(
        "objective.tau, temperature.initial_tau, figures.weight_temperatures", *TEMPERATURE,
        "papers: 0.01-0.18, cool-down 0.06-0.12; 002 Fig. 6: 0.01-3, its script 3e-3",
    ),
    "step_ratio": _bound(
        "temperature.step_ratio", "(0, 1]", None, "004 Table 6: 0.013-0.028"
    ),
    "arc_margin_deg": _bound(
        "objective.margin_deg (arccon, arccse)", "[0, 90)", "[0, 30]",
        "001 Fig. 4: 0-20, 10 chosen; cos(θ + m) must fall with θ",
    ),
    "simace_margin_deg": _bound(
        "objective.margin_deg (simace)", "[-90, 90]", "[-30, 30]", "000: 10; Table 14: 0, -10"
    ),
    "triplet_weight": _bound(
        "objective.triplet_weight (arccse)", "(0, 100]", "(0, 2]", "001 Fig. 7: 0-1.2, 0.1 chosen"
    ),
    "triplet_margin": _bound(
        "objective.triplet_margin (arccse)", "[0, 2)", "[0, 1]", "001: 0 (a hinge on cosines)"
    ),
    "au_uniformity_weight": _bound(
        "objective.uniformity_weight (align_uniform)", "(0, 1)", None,
        "003 Table 2: 0.1-0.4, grid 0.1-0.9",
    ),
    "alpha": _bound("objective.alpha (align_uniform)", "(0, 10]", "[1, 3]", "003 grid: 1, 2, 3"),
    "t": _bound("objective.t (align_uniform)", "(0, 50]", "[1, 10]", "003: 6, grid 2-10"),
    "margin": _bound(
        "objective.margin (mpt, met; paper 002's GD threshold)", "[0, 2]", "[0, 1]",
        "on cosines or distances of unit vectors (at most 2); 003: 0.23-0.50, 002: 0.27-0.37, "
        "Fig. 6 up to 1",
    ),
    "margin_pi": _bound(
        "objective.margin_pi (mat)", "[0, 1]", "[0, 0.5]", "003 Table 2: 0.13-0.17, grid 0.10-0.20"
    ),
    "ratio": _bound(
        "objective.ratio (paper 002)", "(0, 10]", "[0.25, 2]", "002 Table 6: 1-1.75, Fig. 6: 0.25-2"
    ),
    "nu": _bound(
        "objective.off_diagonal_weight, covariance_weight, uniformity_weight (align_mhe, "
        "align_mhs)",
        "(0, 1000]", "[1e-3, 100]", "002's released scripts: 1, 10, 30 (tests: 0.005)",
    ),
    "sigma": _bound(
        "figures.sigma_pos, sigma_neg", "(0, 1]", None, "002 Fig. 2: 0.05, 0.10 radians"
    ),
    "angle_deg": _bound(
        "figures.weight_mu_pos_deg, curve_theta_neg_deg, curve_theta_pos_deg", "(0, 180)", None,
        "an angle between two directions",
    ),
    "min_gd": _bound("figures.weight_min_gd", "[0, 1)", None, "002's code: 0.01"),
    "min_effect": _bound(
        "report.min_effect", "(0, 10]", None, "points of Spearman x100 or accuracy %"
    ),
    "store_backoff_s": _bound(
        "store.backoff_s, max_backoff_s", "(0, 3600]", None,
        "seconds between a store transfer's attempts: 1, doubled, at most 30",
    ),
    "store_timeout_s": _bound(
        "store.timeout_s", "(0, 3600]", None, "S3 connect and read timeout: 60 s"
    ),
}  # fmt: skip


def _not_a_boolean(kind: str) -> Any:
    def check(value: Any) -> Any:
        if isinstance(value, bool):
            raise PydanticCustomError(f"{kind}_type", f"Input should be a valid {kind}")
        return value

    return BeforeValidator(check)


def _within(name: str) -> Any:
    allowed = BOUNDS[name].allowed

    def check(value: float) -> float:
        problem = allowed.problem(value)
        if problem:
            raise PydanticCustomError(
                "out_of_range", f"Input should be {problem}, in {allowed.text}"
            )
        return value

    return AfterValidator(check)


def Real(name: str) -> Any:
    """A finite real number, not a boolean, within row ``name`` of ``BOUNDS``."""
    return Annotated[float, _not_a_boolean("number"), BOUNDS[name], _within(name)]


# An integer: not a boolean, nor 2.0 or '2' (as every count and seed of the schema).
Integer = Annotated[int, Field(strict=True)]


def _not_a_number(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise PydanticCustomError("bool_type", "Input should be a valid boolean (true or false)")
    return value


# A switch that also takes a string (train.compile's 'reduce-overhead'): never a number.
NotANumber = BeforeValidator(_not_a_number)


def _bound_of(annotation: Any) -> tuple[Bound | None, bool]:
    """The row an annotation is bounded by, and whether it bounds each item of a tuple."""
    origin = get_origin(annotation)
    if origin is Annotated:
        found = [m for m in annotation.__metadata__ if isinstance(m, Bound)]
        return (found[0], False) if found else _bound_of(get_args(annotation)[0])
    if origin is tuple:
        bound, _ = _bound_of(get_args(annotation)[0])
        return bound, True
    if origin is Union or (origin is not None and type(None) in get_args(annotation)):
        for arg in get_args(annotation):
            bound, each = _bound_of(arg)
            if bound:
                return bound, each
    return None, False


def unusual_values(model: BaseModel, prefix: str = "") -> list[tuple[str, float, Bound]]:
    """Every bounded value of ``model`` (and the models it holds) outside its row's typical
    range: (key path, value, row)."""
    found: list[tuple[str, float, Bound]] = []
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(value, BaseModel):
            found += unusual_values(value, path)
            continue
        own = [m for m in info.metadata if isinstance(m, Bound)]  # Annotated's, taken apart
        bound, each = (own[0], False) if own else _bound_of(info.annotation)
        if bound is None or bound.typical is None or value is None:
            continue
        for i, item in enumerate(value if each else (value,)):
            if bound.typical.problem(item):
                found.append((f"{path}.{i}" if each else path, item, bound))
    return found


def warning_line(path: str, value: float, bound: Bound) -> str:
    assert bound.typical is not None
    return (
        f"{path}: {value:g} is outside {bound.typical.text}, where the papers stay "
        f"({bound.source}); accepted (refused outside {bound.allowed.text})"
    )


def bounds_markdown() -> str:
    """``BOUNDS`` as the Markdown table docs/training.md shows."""
    lines = [
        "| keys | allowed (refused outside) | typical (a warning outside) | from |",
        "|---|---|---|---|",
    ]
    for bound in BOUNDS.values():
        typical = bound.typical.text if bound.typical else "–"
        keys, _, which = bound.keys.partition(" (")
        shown = ", ".join(f"`{key.strip()}`" for key in keys.split(",")) + (
            f" ({which}" if which else ""
        )
        lines.append(f"| {shown} | {bound.allowed.text} | {typical} | {bound.source} |")
    return "\n".join(lines) + "\n"


def _check_table() -> None:
    for name, bound in BOUNDS.items():
        typical = bound.typical
        if typical and (typical.low < bound.allowed.low or typical.high > bound.allowed.high):
            raise ValueError(f"BOUNDS[{name!r}]: {typical.text} exceeds {bound.allowed.text}")


_check_table()
