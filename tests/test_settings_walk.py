"""Every setting of the params schema, walked through every configuration the schema's switches
make: a setting is refused with a line naming it, or read (its value reaches the id), or, where
it is not read, leaves the id unchanged. Nothing is listed by hand: the settings are the fields of
the pydantic models (a new one is walked as soon as it exists), the configurations are each
switch's values (every bool and Literal train setting, each objective's boolean switches), and
where a setting is not read is stated once, in ``stages/core/schema/unread.py`` (and
``unused_settings`` next to each objective's fields), which validation reads too.

The documented exceptions (docs/identity.md, "Settings that are not read") are checked here too:
the execution-only keys (their fields' ``ExecutionOnly`` marker, ``stages.core.schema.id_markers``)
and the report-only method keys leave the id unchanged although they are read, and each exception
names a setting of the schema.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from stages.core.errors import ParamsError
from stages.core.identity.experiments import Plan, make_run
from stages.core.schema.evaluation_settings import EVALUATIONS
from stages.core.schema.id_markers import ExecutionOnly, markers
from stages.core.schema.objective_settings import OBJECTIVES
from stages.core.schema.params import MethodParams, TrainParams, TripletsParams, parse_params
from stages.core.schema.temperature_settings import TemperatureSchedule
from stages.core.schema.unread import (
    KEPT_IN_ID,
    REPORT_ONLY_METHOD_KEYS,
    UNREAD,
    UNREAD_SECTIONS,
    not_read,
)

REPO = Path(__file__).resolve().parents[1]
METHOD = "m"
BASE: dict[str, Any] = {
    "backbones": {"tiny": {"model": "org/tiny-bert"}},
    "methods": {METHOD: {"objective": {"name": "infonce"}}},
    "experiments": [{"methods": [METHOD], "backbones": ["tiny"], "seeds": [42]}],
}
# The settings whose other value their types cannot suggest: a named set (validated by name), a
# string of a pattern.
# Settings whose type admits values their validation refuses (a registry's names: a schedule)
ALTERNATIVES: dict[str, Any] = {
    "evaluations.mteb.tasks": "simace56",
    "sweep": "tau=0.07",
    "schedule": "linear",
}
# The settings whose field is marked execution-only, by their key in the walk's scopes.
EXECUTION_ONLY = {
    f"{prefix}{key}"
    for prefix, model in [
        ("train.", TrainParams),
        *((f"evaluations.{name}.", e.settings) for name, e in EVALUATIONS.items()),
    ]
    for key, marker in markers(model)
    if isinstance(marker, ExecutionOnly)
}
CODE_MEMO: dict[tuple[str, ...], dict[str, str]] = {}


# -- the schema's settings ---------------------------------------------------------------------


def leaves(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every setting below ``model``: its dotted key and its field (sub-sections walked)."""
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from leaves(field.annotation, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", field


def literals(annotation: Any) -> list[Any]:
    """The values of every Literal inside ``annotation``."""
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    return [v for arg in get_args(annotation) for v in literals(arg)]


def candidates(annotation: Any, current: Any) -> list[Any]:
    """Values to try for a setting now at ``current``, from its type."""
    choices = literals(annotation)
    if isinstance(current, bool):
        return [not current]
    if isinstance(current, int):
        return [current + 1, current * 2, 1]
    if isinstance(current, float):
        return [current * 1.5, current / 2, current + 0.1, 0.1]
    if isinstance(current, str):
        return [*choices, current + "x"]
    if isinstance(current, tuple):
        return [current[::-1], current[:1], *[(c,) for c in choices], ("x",)]
    if isinstance(current, dict):
        return [{"own": "own.tsv"}, {"other": "other.tsv"}]
    return [*choices, 0.1, 0.5, 1, 2, 16, "x"]  # None: any value of the type


def other_value(key: str, field: FieldInfo, current: Any) -> Any:
    """A value of the setting's type other than ``current`` (its own validation passes)."""
    if key in ALTERNATIVES:
        return ALTERNATIVES[key]
    annotation = field.annotation
    if field.metadata:
        annotation = Annotated[annotation, *field.metadata]  # type: ignore[misc]
    adapter = TypeAdapter(annotation)
    for value in candidates(field.annotation, current):
        try:
            if adapter.validate_python(value) != current:
                return value
        except ValidationError:
            continue
    raise AssertionError(f"{key}: no other value found for {current!r}; add it to ALTERNATIVES")


def switches(model: type[BaseModel]) -> Iterator[tuple[str, Any]]:
    """Every other value of every boolean or Literal setting of ``model``: the configurations."""
    defaults = model()
    for key, field in leaves(model):
        current = _get(defaults, key)
        if isinstance(current, bool):
            values = [not current]
        elif get_origin(field.annotation) in (Literal, Union, UnionType):
            values = literals(field.annotation)
        else:
            values = []  # a tuple of choices (tasks) is a list, not a switch
        yield from ((key, v) for v in values if v != current and v is not None)


def _get(node: Any, key: str) -> Any:
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def _set(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    edited = copy.deepcopy(raw)
    *parents, last = key.split(".")
    node = edited
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return edited


def _merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


# -- outcomes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    refused: str | None  # the message
    ids: dict[str, str | None]  # run and evaluation ids (None: the evaluation does not run)
    params: Any = None


def outcome(raw: dict[str, Any], evaluations: bool = True) -> Outcome:
    try:
        params = parse_params(raw, source="walk")
    except ParamsError as err:
        return Outcome(str(err), {})
    run = make_run(params, METHOD, "tiny", 42, CODE_MEMO)
    plan = Plan(params, {run.name: run}, {})
    ids: dict[str, str | None] = {"run": run.run_id}
    for name in EVALUATIONS if evaluations else ():
        enabled = params.evaluation_settings(name, METHOD).is_enabled()
        ids[name] = plan.evaluation_id(name, run) if enabled else None
    return Outcome(None, ids, params)


def names(message: str, key: str) -> bool:
    """Whether a line of ``message`` names setting ``key`` (its path, or its section's path and
    its name: 'temperature: initial_tau and step_ratio only apply ...')."""
    parent, _, leaf = key.rpartition(".")
    for line in message.splitlines():
        path = line.removeprefix("  - ").split(": ", 1)[0]  # 'objective.margin, objective.ratio'
        if key in path or (parent and path.endswith(parent) and leaf in line):
            return True
    return False


@dataclass(frozen=True)
class Case:
    scope: str  # method | triplets | evaluations.<name>
    where: str  # where the configuration's settings are written in params.yaml
    config: dict[str, Any]  # the configuration, in the layout of `where`
    label: str

    def raw(self, key: str | None = None, value: Any = None) -> dict[str, Any]:
        settings = copy.deepcopy(self.config)
        if key is not None:
            settings = _set(settings, key, value)
        return _set(BASE, self.where, _merged(_get_or_empty(BASE, self.where), settings))


def _get_or_empty(raw: dict[str, Any], key: str) -> dict[str, Any]:
    try:
        return copy.deepcopy(_get(raw, key))
    except KeyError:
        return {}


def method_cases() -> list[Case]:
    """A method resolved on a backbone: each objective with each combination of its boolean
    switches; SimCSE with each other value of each train switch, with a cool-down, with ArcCSE's
    triplets; and every configuration a row of UNREAD names."""
    cases = []
    for settings in OBJECTIVES:
        bools = [k for k, f in settings.model_fields.items() if f.annotation is bool]
        name = get_args(settings.model_fields["name"].annotation)[0]
        for values in itertools.product((False, True), repeat=len(bools)):
            objective = {"name": name, **dict(zip(bools, values, strict=True))}
            cases.append(
                Case("method", f"methods.{METHOD}", {"objective": objective}, str(objective))
            )
    for key, value in switches(TrainParams):
        cases.append(
            Case("method", f"methods.{METHOD}", _set({}, f"train.{key}", value), f"{key}={value}")
        )
        arccse = {"objective": {"name": "arccse"}, **_set({}, f"train.{key}", value)}
        cases.append(Case("method", f"methods.{METHOD}", arccse, f"arccse {key}={value}"))
    cooldown = {"schedule": "tcc", "initial_tau": 0.1, "step_ratio": 0.5}
    cases.append(Case("method", f"methods.{METHOD}", {"temperature": cooldown}, "cool-down"))
    for row in UNREAD:
        if row.scope == "method":
            cases.append(Case("method", f"methods.{METHOD}", row.example, f"{row.key} unread"))
    return cases


def evaluation_cases() -> list[Case]:
    cases = []
    for name, evaluation in EVALUATIONS.items():
        scope = f"evaluations.{name}"
        cases.append(Case(scope, scope, {}, "defaults"))
        for key, value in switches(evaluation.settings):
            cases.append(Case(scope, scope, {key: value}, f"{key}={value}"))
        if not evaluation.settings().is_enabled():
            files = {"files": {"own": "own.tsv"}} if name == "sts_tsv" else {"enabled": True}
            cases.append(Case(scope, scope, files, "enabled"))
        for row in UNREAD:
            if row.scope == scope:
                cases.append(Case(scope, scope, row.example, f"{row.key} unread"))
    return cases


def triplets_cases() -> list[Case]:
    where = f"methods.{METHOD}"
    return [
        Case("triplets", where, {"objective": {"name": name}}, name)
        for name in ("infonce", "arccse")
    ]


# The settings walked in each scope: (key as the case writes it, key in the scope, field).
def method_settings(case: Case, params: Any) -> Iterator[tuple[str, str, FieldInfo]]:
    objective = type(params.resolve(METHOD, "tiny").objective)
    for key, field in leaves(objective):
        if key != "name":
            yield f"objective.{key}", f"objective.{key}", field
    for key, field in leaves(TemperatureSchedule):
        yield f"temperature.{key}", f"temperature.{key}", field
    for key, field in leaves(TrainParams):
        yield f"train.{key}", f"train.{key}", field
    for key in REPORT_ONLY_METHOD_KEYS:
        yield key, key, MethodParams.model_fields[key]


def check(case: Case, key: str, scope_key: str, field: FieldInfo, base: Outcome) -> str | None:
    """What is wrong with setting ``key`` in ``case``, or None."""
    current = _current(case, base, scope_key)
    value = other_value(
        scope_key if case.scope == "method" else f"{case.scope}.{key}", field, current
    )
    if case.scope == "triplets":
        raw = {**case.raw(), "triplets": {key: value}}
    else:
        raw = case.raw(key, value)
    found = outcome(raw, evaluations=case.scope.startswith("evaluations."))
    label = f"{case.label}: {scope_key} {current!r} -> {value!r}"
    if found.refused is not None:
        named = names(found.refused, scope_key) or any(
            names(found.refused, written) for written in _written_keys(case.config)
        )
        return None if named else f"{label}: refused without naming it: {found.refused}"
    which = "run" if case.scope in ("method", "triplets") else case.scope.split(".")[1]
    if found.ids[which] is None and base.ids[which] is None:
        return None  # the evaluation runs in neither: it reads none of its settings
    unread = declared_unread(case, found.params, scope_key)
    full_key = scope_key if case.scope in ("method", "triplets") else f"{case.scope}.{scope_key}"
    out_of_id = unread or full_key in EXECUTION_ONLY or scope_key in REPORT_ONLY_METHOD_KEYS
    same = found.ids[which] == base.ids[which]
    if same and not out_of_id:
        return f"{label}: accepted, read, and the {which} id is unchanged"
    if not same and out_of_id:
        return f"{label}: accepted where not read, and it gives a new {which} id"
    return None


def _current(case: Case, base: Outcome, scope_key: str) -> Any:
    params = base.params
    if case.scope == "method":
        if scope_key in REPORT_ONLY_METHOD_KEYS:
            return getattr(params.methods[METHOD], scope_key)
        return _get(params.resolve(METHOD, "tiny"), scope_key)
    if case.scope == "triplets":
        return _get(params.triplets, scope_key)
    return _get(params.evaluation_settings(case.scope.split(".")[1], METHOD), scope_key)


def _written_keys(config: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in config.items():
        if isinstance(value, dict):
            keys += _written_keys(value, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys


def declared_unread(case: Case, params: Any, scope_key: str) -> bool:
    if case.scope == "method":
        resolved = params.resolve(METHOD, "tiny")
        return any(row.key == scope_key for row in not_read("method", resolved))
    if case.scope == "triplets":
        return UNREAD_SECTIONS["triplets"](params.resolve(METHOD, "tiny"))
    name = case.scope.split(".")[1]
    settings = params.evaluation_settings(name, METHOD)
    return any(row.key == scope_key for row in not_read(case.scope, settings))


def walk(cases: list[Case], settings) -> tuple[list[str], int]:
    problems, checked = [], 0
    for case in cases:
        base = outcome(case.raw(), evaluations=case.scope.startswith("evaluations."))
        if base.refused is not None:
            continue  # a combination the schema refuses (e.g. triplet_batching: batch on SimCSE)
        for key, scope_key, field in settings(case, base.params):
            checked += 1
            problem = check(case, key, scope_key, field, base)
            if problem:
                problems.append(problem)
    return problems, checked


# -- the walk ----------------------------------------------------------------------------------


def test_every_method_setting_is_refused_read_or_without_effect_on_the_run_id() -> None:
    problems, checked = walk(method_cases(), method_settings)
    assert checked > 2000
    assert not problems, "\n".join(problems)


def test_every_triplets_setting_is_read_by_arccse_and_leaves_other_runs_alone() -> None:
    def settings(case: Case, params: Any) -> Iterator[tuple[str, str, FieldInfo]]:
        for key, field in leaves(TripletsParams):
            yield key, key, field

    problems, checked = walk(triplets_cases(), settings)
    assert checked == 2 * len(TripletsParams.model_fields)
    assert not problems, "\n".join(problems)


def test_every_evaluation_setting_is_refused_read_or_without_effect_on_its_id() -> None:
    def settings(case: Case, params: Any) -> Iterator[tuple[str, str, FieldInfo]]:
        for key, field in leaves(EVALUATIONS[case.scope.split(".")[1]].settings):
            yield key, key, field

    problems, checked = walk(evaluation_cases(), settings)
    assert checked > 100
    assert not problems, "\n".join(problems)


def test_without_the_refusals_the_walk_finds_the_known_cases(monkeypatch) -> None:
    """The walk is what catches a setting that is not read: with validation's refusals switched
    off (as before issue 46), it reports the cases the issue names, and one evaluation's."""
    import stages.core.schema.params as params_module

    monkeypatch.setattr(params_module, "refusals", lambda scope, settings: [])
    known = ("train.sam.rho unread", "train.view_dropout unread")
    problems, _ = walk([c for c in method_cases() if c.label in known], method_settings)
    for key in ("train.sam.rho", "train.sam.adaptive", "train.view_dropout"):
        assert any(f": {key} " in p and p.endswith("gives a new run id") for p in problems), key

    def settings(case: Case, params: Any) -> Iterator[tuple[str, str, FieldInfo]]:
        yield (
            "local_source",
            "local_source",
            EVALUATIONS["mteb"].settings.model_fields["local_source"],
        )

    problems, _ = walk(
        [c for c in evaluation_cases() if c.label == "local_source unread"], settings
    )
    assert problems and all(p.endswith("gives a new mteb id") for p in problems), problems


def test_each_row_names_a_setting_and_its_example_is_a_configuration_where_it_applies() -> None:
    """Otherwise the walk would never meet the configuration the row describes."""
    for row in UNREAD:
        if row.scope == "method":
            params = parse_params(
                _set(BASE, f"methods.{METHOD}", _merged(BASE["methods"][METHOD], row.example))
            )
            settings: Any = params.resolve(METHOD, "tiny")
            assert row.key.split(".")[0] in ("train", "objective", "temperature"), row.key
        else:
            params = parse_params(_set(BASE, row.scope, row.example))
            settings = params.evaluation_settings(row.scope.split(".")[1], METHOD)
        _get(settings, row.key)  # a setting of the schema
        assert row.applies(settings), row


@pytest.mark.parametrize(
    ("train", "key"),
    [
        ({"sam": {"enabled": False, "rho": 0.1}}, "train.sam.rho"),
        ({"sam": {"adaptive": True}}, "train.sam.adaptive"),
        ({"dropout": 0.0, "view_dropout": "first"}, "train.view_dropout"),
        ({"max_steps": 100, "epochs": 3}, "train.epochs"),
        ({"precision": "fp32", "dev_precision": "train"}, "train.dev_precision"),
        ({"triplet_batch_size": 16}, "train.triplet_batch_size"),
    ],
)
def test_the_known_cases_are_refused_naming_the_key(train: dict[str, Any], key: str) -> None:
    """Issue 46: accepted before, each gave an identical run a new id."""
    raw = _set(BASE, f"methods.{METHOD}.train", train)
    with pytest.raises(ParamsError) as err:
        parse_params(raw)
    lines = [line for line in str(err.value).splitlines() if line.startswith("  - ")]
    assert len(lines) == 1 and lines[0].startswith(f"  - methods.{METHOD}.{key}: "), lines


def test_a_shared_train_setting_not_read_is_named_once_where_it_is_written() -> None:
    raw = _set(BASE, "methods.other", {"objective": {"name": "simace"}})
    raw["experiments"][0]["methods"] = [METHOD, "other"]
    with pytest.raises(ParamsError) as err:
        parse_params(_set(raw, "train", {"sam": {"rho": 0.1}}))
    lines = [line for line in str(err.value).splitlines() if line.startswith("  - ")]
    assert len(lines) == 1 and lines[0].startswith("  - train.sam.rho: SAM is off"), lines
    assert lines[0].endswith(f"(in methods.{METHOD}, methods.other)")
    # written in a backbone's override, it is named there
    raw = _set(BASE, f"methods.{METHOD}.per_backbone", {"tiny": {"train": {"epochs": 2}}})
    with pytest.raises(ParamsError, match=rf"methods\.{METHOD}\.per_backbone\.tiny\.train\.epochs"):
        parse_params(_set(raw, "train", {"max_steps": 10}))


def test_a_triplet_dropout_without_dropout_is_refused() -> None:
    raw = _set(BASE, f"methods.{METHOD}", {
        "objective": {"name": "arccse"}, "train": {"dropout": 0.0, "triplet_dropout": True},
    })  # fmt: skip
    with pytest.raises(ParamsError, match=rf"methods\.{METHOD}\.train\.triplet_dropout: train"):
        parse_params(raw)


def test_the_default_value_of_a_setting_not_read_is_accepted_and_keeps_the_id() -> None:
    """The presets write every default (sam: {enabled: false, rho: 0.05, adaptive: false})."""
    plain = outcome(BASE)
    written = outcome(_set(BASE, f"methods.{METHOD}.train", {
        "sam": {"enabled": False, "rho": 0.05, "adaptive": False},
        "dropout": 0.0, "view_dropout": "both", "max_steps": 10, "epochs": 1,
    }))  # fmt: skip
    assert written.refused is None
    dropped = outcome(_set(BASE, f"methods.{METHOD}.train", {"dropout": 0.0, "max_steps": 10}))
    assert written.ids == dropped.ids != plain.ids


def test_an_evaluation_setting_not_read_is_refused_where_the_evaluation_runs() -> None:
    mteb = {"local_data": False, "local_source": "sts_raw"}
    with pytest.raises(
        ParamsError, match=r"evaluations\.mteb\.local_source: no task is read from local files"
    ):
        parse_params(_set(BASE, "evaluations.mteb", mteb))
    # a disabled section is the default of the methods that enable it: nothing to refuse
    parse_params(_set(BASE, "evaluations.mteb", {**mteb, "enabled": False}))
    disabled = _set(BASE, "evaluations.mteb", {"enabled": False})
    overrides = _set(disabled, f"methods.{METHOD}.evaluations", {"mteb": {**mteb, "enabled": True}})
    with pytest.raises(ParamsError, match=rf"methods\.{METHOD}\.evaluations\.mteb\.local_source"):
        parse_params(overrides)


def test_the_mteb_folders_are_where_the_mteb_evaluation_finds_each_local_copy() -> None:
    """unread.py states which folder each task with a local copy is read from (the core cannot
    import the MTEB protocol); stages/mteb_protocol/local_data.py is where it is read."""
    from stages.core.schema.evaluation_settings import MtebParams
    from stages.core.schema.unread import _mteb_reads_from
    from stages.mteb_protocol.local_data import local_root, local_tasks

    for source in ("senteval", "sts_raw"):
        for task in local_tasks(source):
            root = local_root(task, source, Path("/raw"), Path("/senteval"))
            folder = "sts_raw_dir" if root.is_relative_to("/raw") else "senteval_dir"
            settings = MtebParams(tasks=(task,), local_source=source)
            assert _mteb_reads_from(settings, folder), (source, task, folder)
            other = {"sts_raw_dir", "senteval_dir"} - {folder}
            assert not _mteb_reads_from(settings, other.pop()), (source, task)
        off = MtebParams(local_source=source, local_data=False)
        assert not any(_mteb_reads_from(off, f) for f in ("sts_raw_dir", "senteval_dir"))


# -- the exceptions ----------------------------------------------------------------------------


def test_the_exceptions_name_settings_of_the_schema_and_are_documented() -> None:
    assert {f"train.{key}" for key in ("device", "compile", "unpad")} <= EXECUTION_ONLY
    assert set(REPORT_ONLY_METHOD_KEYS) <= set(MethodParams.model_fields)
    for key in KEPT_IN_ID:
        section, _, leaf = key.rpartition(".")
        model = TrainParams if section == "train" else EVALUATIONS[section.split(".")[1]].settings
        assert leaf in model.model_fields, key
    doc = (REPO / "docs" / "identity.md").read_text()
    section = doc.split("## Settings that are not read", 1)[1].split("\n## ", 1)[0]
    for key in (*EXECUTION_ONLY, *REPORT_ONLY_METHOD_KEYS):
        assert f"`{key}`" in doc, key
    for key in KEPT_IN_ID:
        assert f"`{key}`" in section, key
    for row in UNREAD:
        written = row.key if row.scope == "method" else f"{row.scope}.{row.key}"
        assert f"`{written}`" in section, written


@pytest.mark.parametrize("key", sorted(KEPT_IN_ID))
def test_a_setting_kept_in_the_id_where_not_read_changes_it(key: str) -> None:
    """The documented exceptions of the other direction: accepted, and a new id."""
    _, example = KEPT_IN_ID[key]
    section, _, leaf = key.rpartition(".")
    if section == "train":
        where, model, which = f"methods.{METHOD}.train", TrainParams, "run"
    else:
        where, model, which = section, EVALUATIONS[section.split(".")[1]].settings, section[12:]
    base = _merged(BASE, example)
    field = model.model_fields[leaf]
    value = other_value(key, field, model.model_fields[leaf].default)
    before, after = outcome(base), outcome(_set(base, f"{where}.{leaf}", value))
    assert before.refused is None and after.refused is None, after.refused
    assert after.ids[which] != before.ids[which]
