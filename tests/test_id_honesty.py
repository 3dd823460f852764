"""The cache never lies: on a mini workspace, change one input at a time and check that every
output that reads it gets a new id (and the others keep theirs), or that the change is refused
before anything is computed, or that the input is declared result-neutral (``ExecutionOnly``).

The inputs: each params setting (the schema's fields, walked), each data file an output reads
(the manifest's, verified at use; the user's own TSV, hashed into the id), each module and data
file of each output's code closure, each file of a local backbone folder. The outputs: every run,
the masked triplets of each backbone, every evaluation of every run and baseline, and the
figures and report jobs (their orchestrator fingerprints). Ids only: an output whose inputs all
enter its id, by value or by content, cannot be served for other inputs.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel

from stages.core.errors import ParamsError, StageError
from stages.core.identity import code
from stages.core.identity.experiments import (
    FIGURES_CODE,
    REPORT_CODE,
    STSB_DEV,
    TRIPLETS_CODE,
    Plan,
    plan_experiments,
    triplets_id,
)
from stages.core.planning.jobs import build_jobs, job_fingerprint
from stages.core.schema.data_check import verify_workspace_data
from stages.core.schema.data_manifest import is_under, load_manifest
from stages.core.schema.evaluation_settings import EVALUATIONS
from stages.core.schema.id_markers import ExecutionOnly, marker
from stages.core.schema.objective_settings import SETTINGS_BY_NAME
from stages.core.schema.params import (
    BackboneParams,
    BaselineParams,
    DataParams,
    FiguresParams,
    IdentityParams,
    Params,
    ReportParams,
    TrainParams,
    TripletsParams,
    parse_params,
)
from stages.core.schema.temperature_settings import TemperatureSchedule
from stages.core.storage import hashing, layout

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
METHODS = ("simcse", "arccse", "cooldown")
BACKBONES = ("local", "hub")


def workspace_params(folder: Path, tsv: Path) -> dict[str, Any]:
    return {
        "data": {"corpus": "wiki1m_head_11913"},
        "backbones": {
            "local": {"model": str(folder)},
            "hub": {"model": "org/tiny-bert", "revision": COMMIT},
        },
        "methods": {
            "simcse": {"objective": {"name": "infonce"}},
            "arccse": {"objective": {"name": "arccse"}},
            "cooldown": {
                "objective": {"name": "simace"},
                "temperature": {"schedule": "tcc", "initial_tau": 0.1, "step_ratio": 0.5},
            },
        },
        "experiments": [{"methods": list(METHODS), "backbones": list(BACKBONES)}],
        "baselines": {"local-mean": {"backbone": "local", "pooler": "mean"}},
        "evaluations": {"mteb": {"enabled": True}, "sts_tsv": {"files": {"own": str(tsv)}}},
    }


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A workspace: data/ (each shared file linked, so that one can be replaced), a local model
    folder, an own TSV file, a copy of the source tree the code ids read."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hashing, "HASH_CACHE", tmp_path / "cache" / "sha256.json")
    for file in SHARED.rglob("*"):
        if file.is_file():
            link = tmp_path / "data" / file.relative_to(SHARED)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(file)
    folder = tmp_path / "model"
    folder.mkdir()
    for name, text in {
        "config.json": '{"model_type": "bert", "hidden_size": 32}',
        "vocab.txt": "[PAD]\n[UNK]\nhello\n",
        "tokenizer_config.json": '{"do_lower_case": true}',
        "model.safetensors": "weights",
    }.items():
        (folder / name).write_text(text)
    tsv = tmp_path / "own.tsv"
    tsv.write_text("sentence1\tsentence2\tscore\na\tb\t1.0\n")
    source = tmp_path / "src"
    shutil.copytree(
        REPO / "stages", source / "stages", ignore=shutil.ignore_patterns("__pycache__")
    )
    monkeypatch.setattr(code, "SOURCE_ROOT", source)
    return {"raw": workspace_params(folder, tsv), "model": folder, "tsv": tsv, "src": source}


# -- the outputs, their ids and what each reads ---------------------------------------------------


def outputs(params: Params) -> dict[str, str]:
    """Every output's id: runs and evaluations by content id, the masked triplets of each
    backbone, the figures and report by their job's fingerprint."""
    plan = plan_experiments(params)
    found = {f"run:{name}": run.run_id for name, run in plan.runs.items()}
    for backbone in BACKBONES:
        found[f"triplets:{backbone}"] = triplets_id(params, backbone, "arccse")
    for name, experiment in plan.experiments.items():
        for evaluation in EVALUATIONS:
            found[f"{evaluation}:{name}"] = plan.evaluation_id(evaluation, experiment)
    for job in build_jobs(plan):
        if job.stage in ("figures", "report"):
            found[job.stage] = job_fingerprint(params, job)
    return found


def inputs(params: Params) -> dict[str, Any]:
    """What each output reads of params, fully resolved (execution-only settings included)."""
    plan = plan_experiments(params)
    read: dict[str, Any] = {}
    common = {"data": params.data.model_dump(), "identity": params.identity.model_dump()}
    for name, run in plan.runs.items():
        read[f"run:{name}"] = {
            **common,
            "method": params.resolve(run.method, run.backbone).model_dump(),
            "backbone": run.backbone_spec.model_dump(),
            "triplets": params.triplets_for(run.method).model_dump() if run.needs_triplets else 0,
        }
    for backbone in BACKBONES:
        read[f"triplets:{backbone}"] = {  # the whole corpus: no max_sentences
            "corpus": params.data.corpus,
            "identity": common["identity"],
            "tokenizer": params.backbones[backbone].model_dump(include={"model", "revision"}),
            "triplets": params.triplets_for("arccse").model_dump(),
        }
    for name, experiment in plan.experiments.items():
        evaluated = read.get(f"run:{name}") or {
            "baseline": experiment.spec.model_dump(),
            "backbone": experiment.backbone_spec.model_dump(),
        }
        for evaluation in EVALUATIONS:
            settings = params.evaluation_settings(evaluation, experiment.method)
            read[f"{evaluation}:{name}"] = {
                "evaluated": evaluated,
                "settings": settings.model_dump(),
                "identity": common["identity"],
            }
    read["figures"] = params.figures.model_dump()
    # the report also counts SentEval's test sets and names the matrix's rows
    read["report"] = {
        "report": params.report.model_dump(),
        "senteval": params.evaluations.senteval.data_dir,
        "matrix": [params.experiments, params.backbones, params.baselines],
    }
    return read


def code_of(plan: Plan) -> dict[str, set[str]]:
    """Each output's code: the source and data files of its closure, and of the outputs it
    reads (an evaluation its run's, ArcCSE's run its triplets')."""
    triplets = set(code.code_files(TRIPLETS_CODE))
    found: dict[str, set[str]] = {}
    for backbone in BACKBONES:
        found[f"triplets:{backbone}"] = triplets
    for name, run in plan.runs.items():
        found[f"run:{name}"] = set(run.code_files) | (triplets if run.needs_triplets else set())
    for name in plan.experiments:
        upstream = found.get(f"run:{name}", set())
        for evaluation, registered in EVALUATIONS.items():
            own = set(code.code_files(registered.code_modules))
            found[f"{evaluation}:{name}"] = own | upstream
    found["figures"] = set(code.code_files(FIGURES_CODE))
    found["report"] = set(code.code_files(REPORT_CODE))
    return found


def changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {name for name in before if before[name] != after[name]}


# -- params ---------------------------------------------------------------------------------------


def settings_of(raw: dict[str, Any]) -> Iterator[tuple[tuple[str, ...], type[BaseModel], str]]:
    """Every setting an output reads, where it is written: (path of its section, section, key)."""
    sections: list[tuple[tuple[str, ...], type[BaseModel]]] = [
        (("train",), TrainParams),
        (("triplets",), TripletsParams),
        (("data",), DataParams),
        (("identity",), IdentityParams),
        (("figures",), FiguresParams),
        (("report",), ReportParams),
        (("methods", "cooldown", "temperature"), TemperatureSchedule),
        (("backbones", "hub"), BackboneParams),
        (("baselines", "local-mean"), BaselineParams),
    ]
    sections += [(("evaluations", name), e.settings) for name, e in EVALUATIONS.items()]
    for method in METHODS:
        name = raw["methods"][method]["objective"]["name"]
        sections.append((("methods", method, "objective"), SETTINGS_BY_NAME[name]))
    from test_settings_walk import leaves

    for path, model in sections:
        for key, _ in leaves(model):
            if key != "name":
                yield path, model, key


def section_model(model: type[BaseModel], key: str) -> tuple[type[BaseModel], str]:
    """The model holding dotted ``key`` (train's sam.rho: SamParams, rho)."""
    *parents, leaf = key.split(".")
    for part in parents:
        model = model.model_fields[part].annotation
    return model, leaf


def edited(raw: dict[str, Any], path: tuple[str, ...], key: str, value: Any) -> dict[str, Any]:
    tree = copy.deepcopy(raw)
    node = tree
    for part in (*path, *key.split(".")[:-1]):
        node = node.setdefault(part, {})
    node[key.split(".")[-1]] = value
    return tree


def test_each_params_setting_reaches_the_ids_of_the_outputs_that_read_it(workspace) -> None:
    from test_settings_walk import other_value

    raw = workspace["raw"]
    base = parse_params(raw)
    before, read_before = outputs(base), inputs(base)
    checked, problems = 0, []
    for path, section, key in settings_of(raw):
        holder, leaf = section_model(section, key)
        field = holder.model_fields[leaf]
        current = base
        for part in (*path, *key.split(".")):
            current = current[part] if isinstance(current, dict) else getattr(current, part)
        scope = "evaluations." + path[1] + "." if path[0] == "evaluations" else ""
        sections = [
            a
            for a in get_args(field.annotation)
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if current is None and sections:
            value: Any = {}  # a section left out (random_init): its defaults
        else:
            value = other_value(f"{scope}{key}", field, current)
        try:
            params = parse_params(edited(raw, path, key, value))
        except ParamsError:
            continue  # refused, naming it (tests/test_settings_walk.py checks the naming)
        checked += 1
        after, read_after = outputs(params), inputs(params)
        neutral = isinstance(marker(field), ExecutionOnly)
        label = f"{'.'.join(path)}.{key}: {current!r} -> {value!r}"
        for output in before:
            reads = read_after[output] != read_before[output]
            if reads and not neutral and before[output] == after[output]:
                problems.append(f"{label}: {output} reads it and keeps its id")
            if not reads and before[output] != after[output]:
                problems.append(f"{label}: {output} does not read it and gets a new id")
    assert not problems, "\n".join(problems)
    assert checked > 90


# -- data -----------------------------------------------------------------------------------------


def reads(params: Params) -> dict[str, tuple[Path, ...]]:
    """The workspace data each output reads (verified against the manifest at every use)."""
    plan = plan_experiments(params)
    found: dict[str, tuple[Path, ...]] = {}
    corpus = layout.corpus_file(params.data.corpus)
    for name in plan.runs:
        found[f"run:{name}"] = (corpus, layout.DATA / STSB_DEV)
    for backbone in BACKBONES:
        found[f"triplets:{backbone}"] = (corpus,)
    for name, experiment in plan.experiments.items():
        for evaluation in EVALUATIONS:
            settings = params.evaluation_settings(evaluation, experiment.method)
            found[f"{evaluation}:{name}"] = settings.reads()
    return found


def test_each_data_file_changed_is_refused_or_changes_the_ids(workspace) -> None:
    params = parse_params(workspace["raw"])
    before = outputs(params)
    read = reads(params)
    manifest = [f.path for d in load_manifest().datasets.values() for f in d.files]
    tested = 0
    for relative in manifest:
        file = layout.DATA / relative
        readers = [
            output
            for output, paths in read.items()
            if any(
                is_under(relative, p.relative_to(layout.DATA).as_posix())
                for p in paths
                if p.is_relative_to(layout.DATA)
            )
        ]
        if not readers:
            continue
        tested += 1
        original = file.resolve()
        file.unlink()
        file.write_bytes(original.read_bytes() + b"\n")
        try:
            for output in readers:
                with pytest.raises(StageError, match=rf"{file} changed after download"):
                    verify_workspace_data(*read[output])
        finally:
            file.unlink()
            file.symlink_to(original)
    assert tested > 50
    # the user's own file is read by content into its evaluation's id
    workspace["tsv"].write_text("sentence1\tsentence2\tscore\na\tb\t2.0\n")
    after = outputs(parse_params(workspace["raw"]))
    assert changed(before, after) == {o for o in before if o.startswith("sts_tsv:")}


# -- code -----------------------------------------------------------------------------------------


def test_each_code_file_changed_changes_exactly_the_outputs_that_run_it(workspace) -> None:
    params = parse_params(workspace["raw"])
    before = outputs(params)
    closure = code_of(plan_experiments(params))
    files = sorted(set().union(*closure.values()))
    assert len(files) > 50
    problems = []
    for relative in files:
        path = workspace["src"] / relative
        text = path.read_bytes()
        probe = b"\n_honesty_probe = 1\n" if path.suffix == ".py" else b"\n"
        path.write_bytes(text + probe)
        try:
            after = outputs(params)
        finally:
            path.write_bytes(text)
        expected = {output for output, covered in closure.items() if relative in covered}
        if changed(before, after) != expected:
            problems.append(f"{relative}: changed {sorted(changed(before, after) ^ expected)}")
    assert not problems, "\n".join(problems)


# -- a local backbone -----------------------------------------------------------------------------


def test_each_file_of_a_local_backbone_changed_changes_the_ids_of_its_outputs(workspace) -> None:
    params = parse_params(workspace["raw"])
    before = outputs(params)
    local = {
        output
        for output in before
        if ".local." in output or output.endswith(":local") or "baseline.local" in output
    }
    for file in sorted(workspace["model"].iterdir()):
        text = file.read_bytes()
        file.write_bytes(text + b" ")
        after = outputs(params)
        assert changed(before, after) == local, file.name
        file.write_bytes(text)
        assert outputs(params) == before
    # a file added to the folder too (a tokenizer file a later load would read)
    (workspace["model"] / "special_tokens_map.json").write_text("{}")
    assert changed(before, outputs(params)) == local


def test_the_mini_workspace_plans_offline(workspace) -> None:
    """What the tests above walk: every output kind, both backbones."""
    params = parse_params(workspace["raw"])
    found = outputs(params)
    kinds = {name.split(":")[0] for name in found}
    assert kinds == {"run", "triplets", *EVALUATIONS, "figures", "report"}
    assert yaml.safe_dump(workspace["raw"])  # a params file a user could write
