"""When a setting is not read: one table, shared by params validation and the settings walk.

A setting that a configuration does not read changes nothing the run computes, so it must not
give an identical run a new id (the cache would train it twice and the report would show two
rows for one result). Each row of ``UNREAD`` states one such configuration; validation refuses a
value other than the setting's default there, one line naming its key path (``refusals``), so
every run id of a valid configuration is what it was. ``tests/test_settings_walk.py`` walks every
setting of the schema through every configuration the switches make (each other value of every
boolean and Literal setting, each objective's boolean switches) and each row's ``example``, and
checks that a setting is either refused naming it, or read (its value reaches the id), or
leaves the id unchanged where a row, an objective's ``unused_settings`` or a documented
exception (docs/identity.md, "Settings that are not read") says it is not read.

The objectives' own switches (paper 002's W, R, GD) are stated next to their fields:
``ObjectiveSettings.unused_settings`` in ``objective_settings.py``; a temperature schedule's
parameters under ``schedule: constant`` in ``temperature_settings.py``.

A row's ``scope`` is what ``applies`` sees: ``method``, a method resolved on one backbone
(``objective``, ``temperature``, ``train``), or ``evaluations.<name>``, that evaluation's
settings (the section, or a method's overrides of it applied). ``example`` is a configuration
in which it applies, in the scope's layout (the walk builds it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from stages.core.schema.evaluation_settings import SENTEVAL_STS_TASKS
from stages.core.schema.mteb_task_sets import STS7, task_names


@dataclass(frozen=True)
class Unread:
    key: str  # its key path in the scope: train.sam.rho
    scope: str  # method | evaluations.<name>
    applies: Callable[[Any], bool]  # the configuration does not read it
    why: str  # the message after the key path ({objective}: the objective's name)
    example: dict[str, Any]  # a configuration where it applies, in the scope's layout


def _no_triplets(m: Any) -> bool:
    return not m.objective.needs_triplets


def _no_dropout(m: Any) -> bool:
    return m.train.dropout == 0


def _sam_off(m: Any) -> bool:
    return not m.train.sam.enabled


def _mteb_tasks(e: Any) -> set[str]:
    return set(task_names(e.tasks))


def _mteb_reads_from(e: Any, folder: str) -> bool:
    """Whether mteb evaluation ``e`` reads a task from ``folder`` (sts_raw_dir, senteval_dir):
    where stages/mteb_protocol/local_data.py finds each task's local copy (local_root;
    tests/test_settings_walk.py checks the two agree)."""
    if not e.local_data:
        return False
    years = _mteb_tasks(e) & set(STS7[:5])
    if folder == "sts_raw_dir":
        return "STSBenchmark" in _mteb_tasks(e) or (e.local_source == "sts_raw" and bool(years))
    return e.local_source == "senteval" and bool(years or "SICK-R" in _mteb_tasks(e))


_SAM_OFF = {"train": {"sam": {"enabled": False}}}
_NO_DROPOUT = {"train": {"dropout": 0.0}}
_NO_TRIPLETS = {"objective": {"name": "infonce"}}
_NO_LOCAL_DATA = {"local_data": False}
_STS_ONLY = {"evaluations": {"senteval": {"tasks": list(SENTEVAL_STS_TASKS)}}}

UNREAD: tuple[Unread, ...] = (
    Unread(
        "train.sam.rho", "method", _sam_off,
        "SAM is off (train.sam.enabled: false), so its radius is not read; remove it, or set "
        "train.sam.enabled: true", _SAM_OFF,
    ),
    Unread(
        "train.sam.adaptive", "method", _sam_off,
        "SAM is off (train.sam.enabled: false), so it is not read; remove it, or set "
        "train.sam.enabled: true", _SAM_OFF,
    ),
    Unread(
        "train.view_dropout", "method", _no_dropout,
        "train.dropout is 0: neither view has dropout to turn off, so it is not read; remove it",
        _NO_DROPOUT,
    ),
    Unread(
        "train.triplet_dropout", "method", _no_triplets,
        "objective '{objective}' has no triplet branch", _NO_TRIPLETS,
    ),
    Unread(
        "train.triplet_dropout", "method", _no_dropout,
        "train.dropout is 0: the triplet branch has no dropout to keep on, so it is not read; "
        "remove it", _NO_DROPOUT,
    ),
    Unread(
        "train.triplet_batching", "method", _no_triplets,
        "objective '{objective}' has no triplet branch", _NO_TRIPLETS,
    ),
    Unread(
        "train.triplet_batch_size", "method", _no_triplets,
        "objective '{objective}' has no triplet branch", _NO_TRIPLETS,
    ),
    Unread(
        "train.triplet_batch_size", "method", lambda m: m.train.triplet_batching == "batch",
        "with triplet_batching: batch a step's triplets are those of its own sentences; remove "
        "it, or use triplet_batching: pool",
        {"objective": {"name": "arccse"}, "train": {"triplet_batching": "batch"}},
    ),
    Unread(
        "train.epochs", "method", lambda m: m.train.max_steps is not None,
        "train.max_steps sets the run's length (it stops early or continues into the next "
        "epochs), so epochs is not read; remove one of them", {"train": {"max_steps": 10}},
    ),
    Unread(
        "train.dev_precision", "method", lambda m: m.train.precision == "fp32",
        "train.precision is fp32, so the training precision is fp32 too and it is not read; "
        "remove it", {"train": {"precision": "fp32"}},
    ),
    Unread(
        "local_data", "evaluations.mteb", lambda e: not _mteb_tasks(e) & set(STS7),
        "no task of tasks has a local copy (STS12-16, STSBenchmark, SICK-R), so it is not read; "
        "remove it", {"tasks": ["Banking77Classification"]},
    ),
    Unread(
        "local_source", "evaluations.mteb",
        lambda e: not e.local_data or not _mteb_tasks(e) & set(STS7),
        "no task is read from local files (local_data false, or no task with a local copy), so "
        "it is not read; remove it", _NO_LOCAL_DATA,
    ),
    Unread(
        "sts_raw_dir", "evaluations.mteb", lambda e: not _mteb_reads_from(e, "sts_raw_dir"),
        "no task is read from it (it holds STSBenchmark, and STS12-16 with local_source "
        "sts_raw, read with local_data true), so it is not read; remove it", _NO_LOCAL_DATA,
    ),
    Unread(
        "senteval_dir", "evaluations.mteb", lambda e: not _mteb_reads_from(e, "senteval_dir"),
        "no task is read from it (it holds STS12-16 and SICK-R with local_source senteval, "
        "read with local_data true), so it is not read; remove it", {"local_source": "sts_raw"},
    ),
)  # fmt: skip


def _value(node: Any, path: str) -> Any:
    for part in path.split("."):
        node = getattr(node, part)
    return node


def _default(node: BaseModel, path: str) -> Any:
    """The schema default of ``path`` below ``node``: its section built from defaults."""
    head, _, rest = path.partition(".")
    if not rest:
        return type(node).model_fields[head].default
    return _value(type(getattr(node, head))(), rest)


def not_read(scope: str, settings: Any) -> tuple[Unread, ...]:
    """The rows of ``scope`` that apply to ``settings`` (one per key, the first)."""
    found: dict[str, Unread] = {}
    for row in UNREAD:
        if row.scope == scope and row.key not in found and row.applies(settings):
            found[row.key] = row
    return tuple(found.values())


def refusals(scope: str, settings: Any) -> list[str]:
    """One line per setting ``settings`` give another value than its default where they do not
    read it: ``key: why``."""
    objective = getattr(getattr(settings, "objective", None), "name", None)
    lines = []
    for key in dict.fromkeys(row.key for row in UNREAD if row.scope == scope):
        if _value(settings, key) == _default(settings, key):
            continue
        rows = [r for r in UNREAD if r.scope == scope and r.key == key and r.applies(settings)]
        if rows:
            lines.append(f"{key}: {rows[0].why.format(objective=objective)}")
    return lines


# Whole sections some configurations do not read: there the run id leaves them out (a method
# without a triplet branch has no triplets id), and they are never refused, since the section is
# the default of every method that does read it. A disabled evaluation (``is_enabled()`` false)
# likewise reads none of its settings and computes nothing; they are the defaults of the
# methods that enable it (``methods.<m>.evaluations.<name>``).
UNREAD_SECTIONS: dict[str, Callable[[Any], bool]] = {
    "triplets": lambda m: not m.objective.needs_triplets,
}

# The documented exceptions (docs/identity.md, "Settings that are not read").
# A method's keys that training does not read: they name its rows in the report and join them to
# the papers' numbers, so they are in no run id.
REPORT_ONLY_METHOD_KEYS = ("description", "method_key", "sweep", "readings")
# Kept in the id where not read, each with a configuration where it is not read: whether
# gather_negatives is read depends on the process count, which is not a setting; SentEval's mode
# and seed do not change an STS score, but its result records them (protocol) and carry-over
# matches stored results on them.
KEPT_IN_ID: dict[str, tuple[str, dict[str, Any]]] = {
    "train.gather_negatives": (
        "read only with several processes (torchrun's world size, not a setting): a "
        "one-process run with false computes what one with true computes", {},
    ),
    "evaluations.senteval.mode": (
        "read by the transfer tasks only; the result records it", _STS_ONLY,
    ),
    "evaluations.senteval.seed": (
        "read by the transfer tasks only; the result records it", _STS_ONLY,
    ),
}  # fmt: skip
