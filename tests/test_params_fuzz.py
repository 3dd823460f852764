"""Fuzzed params: every preset (presets/*.yaml and params.yaml) with one generated mutation (a wrong
type, an out-of-range or non-finite number, a missing, unknown or repeated key) is either refused
with one message naming the key path (exit 2 from a CLI, nothing written), or accepted with every
resolved setting valid; never a traceback. Deterministic (derandomized, no example database)."""

from __future__ import annotations

import copy
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from stages.core.schema.bounds import _bound_of
from stages.core.schema.params import Params, ParamsError, load_params, parse_params

REPO = Path(__file__).resolve().parents[1]
FILES = [
    "params.yaml",
    *sorted(p.relative_to(REPO).as_posix() for p in REPO.glob("presets/*.yaml")),
]


def unshared(node: Any) -> Any:
    """A parsed file without YAML's aliases (one object under several keys): a mutation of one
    place is then that place's, as an edit of the text would be."""
    if isinstance(node, dict):
        return {key: unshared(value) for key, value in node.items()}
    if isinstance(node, list):
        return [unshared(value) for value in node]
    return node


RAW = {name: unshared(yaml.safe_load((REPO / name).read_text("utf-8"))) for name in FILES}
FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=50,  # the quick tier: a few seconds for the whole file
    suppress_health_check=[HealthCheck.too_slow],
)

Path_ = tuple[Any, ...]


def leaves(node: Any, path: Path_ = ()) -> list[tuple[Path_, Any]]:
    """Every scalar of a parsed file, with its path of keys and list indices."""
    if isinstance(node, dict):
        return [leaf for key, value in node.items() for leaf in leaves(value, (*path, key))]
    if isinstance(node, list):
        return [leaf for i, value in enumerate(node) for leaf in leaves(value, (*path, i))]
    return [(path, node)]


def mappings(node: Any, path: Path_ = ()) -> list[Path_]:
    """The path of every mapping of a parsed file (the root included)."""
    if isinstance(node, dict):
        return [path, *(m for key, value in node.items() for m in mappings(value, (*path, key)))]
    if isinstance(node, list):
        return [m for i, value in enumerate(node) for m in mappings(value, (*path, i))]
    return []


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def gridded(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with a one-point grid over a number of a method's objective (not the report's
    baseline), so that every preset is also fuzzed with a sweep."""
    mutated = copy.deepcopy(raw)
    baseline = (raw.get("report") or {}).get("baseline_method", "simcse")
    for name, method in mutated["methods"].items():
        numbers = [k for k, v in method["objective"].items() if is_number(v)]
        if name != baseline and "grid" not in method and numbers:
            method["grid"] = {f"objective.{numbers[0]}": [method["objective"][numbers[0]]]}
            return mutated
    return mutated


RAW |= {f"{name} (gridded)": gridded(RAW[name]) for name in FILES}
VARIANTS = list(RAW)
NUMBERS = {name: [leaf for leaf in leaves(raw) if is_number(leaf[1])] for name, raw in RAW.items()}
KEYS = {name: [p for p, _ in leaves(raw) if isinstance(p[-1], str)] for name, raw in RAW.items()}
# Names that refer to another entry: where a value of another type meets the matrix's expansion
REFERENCES = {
    name: [path for path, _ in leaves(raw) if path[0] in ("experiments", "report", "baselines")]
    for name, raw in RAW.items()
}
MAPPINGS = {name: mappings(raw) for name, raw in RAW.items()}


def replaced(raw: dict[str, Any], path: Path_, value: Any) -> dict[str, Any]:
    mutated = copy.deepcopy(raw)
    node = mutated
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return mutated


def dotted(path: Path_) -> str:
    return ".".join(map(str, path))


def named_key(path: Path_) -> str:
    """What a refusal of a value at ``path`` must name: its key path; in a method's grid, the
    swept key (its points are validated as the methods they expand into: arccse[margin_deg=5])."""
    if "grid" in path:
        return str(path[path.index("grid") + 1])
    return dotted(path)


POINT = re.compile(r"\[[^\[\]\s]+\](?=[.:])")


def names(message: str, path: Path_) -> bool:
    """Whether a refusal names the value at ``path``: its key path, or (a check across keys:
    masking rates, seeds listed twice) an enclosing section and the key's name."""
    message = POINT.sub("", message)  # methods.arccse[margin_deg=5].x: a point of methods.arccse
    if named_key(path) in message:
        return True
    key = next(str(part) for part in reversed(path) if isinstance(part, str))
    return any(f"{dotted(path[:k])}: " in message for k in range(1, len(path))) and key in message


LINE = re.compile(r"^  - \S+: \S")  # a problem: its key path, then what is wrong


def check_refusal(err: ParamsError, source: str = "params.yaml") -> str:
    """One message, 'SOURCE is invalid:', then one line per problem led by its key path."""
    first, *problems = str(err).splitlines()
    assert first == f"{source} is invalid:", str(err)
    assert problems and all(LINE.match(line) for line in problems), str(err)
    return str(err)


def bounded_values(model: BaseModel, path: str = "") -> list[tuple[str, Any, Any]]:
    found = []
    for name, info in type(model).model_fields.items():
        value, where = getattr(model, name), f"{path}.{name}"
        if isinstance(value, BaseModel):
            found += bounded_values(value, where)
            continue
        own = [m for m in info.metadata if hasattr(m, "allowed")]
        bound, each = (own[0], False) if own else _bound_of(info.annotation)
        if bound is not None and value is not None:
            found += [(where, v, bound) for v in (value if each else (value,))]
    return found


def check_valid(params: Params) -> None:
    """Every setting as resolved for each run is valid: revalidated from its dump, each bounded
    number finite and within its allowed range; the warnings are lines."""
    resolved: list[BaseModel] = [params]
    for method, spec in params.methods.items():
        resolved.append(params.triplets_for(method))
        resolved += [params.resolve(method, b) for b in [None, *spec.per_backbone]]
        resolved += [
            params.evaluation_settings(name, method) for name in params.planned_evaluations()
        ]
    for model in resolved:
        type(model).model_validate(model.model_dump(exclude_unset=True))
        for where, value, bound in bounded_values(model):
            assert not isinstance(value, bool) and math.isfinite(value), (where, value)
            assert bound.allowed.problem(value) is None, (where, value)
    assert all("\n" not in line for line in params.unusual_settings())


def refused_or_valid(raw: dict[str, Any]) -> str | None:
    """The refusal's message (checked), or None where accepted (then checked valid)."""
    try:
        params = parse_params(raw)
    except ParamsError as err:
        return check_refusal(err)
    check_valid(params)
    return None


WORDS = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
NOT_A_NUMBER = st.one_of(
    st.booleans(),
    WORDS.filter(lambda w: w not in ("inf", "nan", "infinity")),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(WORDS, st.integers(0, 3), max_size=2),
)
NUMBER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 1e20, -1e-9, 1e-300, 2**32, 0.5, 11.0, 1000.5]),
)


@FUZZ
@given(st.sampled_from(VARIANTS), st.data())
def test_a_number_replaced_by_a_boolean_string_list_or_mapping_is_refused_naming_it(
    name: str, data: st.DataObject
) -> None:
    path, _ = data.draw(st.sampled_from(NUMBERS[name]), label="number")
    value = data.draw(NOT_A_NUMBER, label="value")
    message = refused_or_valid(replaced(RAW[name], path, value))
    assert message is not None, f"{dotted(path)}: {value!r} accepted where a number is"
    assert named_key(path) in message


@FUZZ
@given(st.sampled_from(VARIANTS), st.data())
def test_any_number_is_refused_naming_its_key_or_accepted_valid(
    name: str, data: st.DataObject
) -> None:
    path, _ = data.draw(st.sampled_from(NUMBERS[name]), label="number")
    value = data.draw(NUMBER, label="value")
    message = refused_or_valid(replaced(RAW[name], path, value))
    if isinstance(value, float) and not math.isfinite(value):
        assert message is not None, f"{dotted(path)}: {value!r} accepted"
    if message is not None:
        assert names(message, path), message


@FUZZ
@given(st.sampled_from(VARIANTS), st.data())
def test_a_missing_or_unknown_key_is_refused_naming_it_or_accepted_valid(
    name: str, data: st.DataObject
) -> None:
    if data.draw(st.booleans(), label="remove"):
        path = data.draw(st.sampled_from(KEYS[name]), label="removed key")
        mutated = copy.deepcopy(RAW[name])
        node = mutated
        for part in path[:-1]:
            node = node[part]
        del node[path[-1]]
        refused_or_valid(mutated)
        return
    where = data.draw(st.sampled_from(MAPPINGS[name]), label="mapping")
    key = data.draw(WORDS.map(lambda w: f"zz{w}"), label="unknown key")
    value = data.draw(st.one_of(st.integers(), WORDS, st.none()), label="value")
    message = refused_or_valid(replaced(RAW[name], (*where, key), value))
    # a new name of the user's: an STS file, a backbone override, method, backbone or baseline
    named = where[-1:] in [("files",), ("per_backbone",), ("methods",), ("backbones",)]
    if not named and where[-1:] != ("baselines",) and where[::2] != ("methods", "evaluations"):
        assert message is not None and dotted((*where, key)) in message, message


ANYTHING = st.one_of(NOT_A_NUMBER, NUMBER, st.none())


@FUZZ
@given(st.sampled_from(VARIANTS), st.data())
def test_any_value_or_section_of_another_type_is_refused_naming_it_or_accepted_valid(
    name: str, data: st.DataObject
) -> None:
    paths = [leaf[0] for leaf in leaves(RAW[name])] + [m for m in MAPPINGS[name] if m]
    path = data.draw(
        st.one_of(st.sampled_from(REFERENCES[name]), st.sampled_from(paths)), label="replaced"
    )
    value = data.draw(ANYTHING, label="value")
    message = refused_or_valid(replaced(RAW[name], path, value))
    if message is not None and "grid" not in path:
        assert names(message, path) or any(f"{dotted(path[:k])}" in message for k in (1, 2))


KEY_LINE = re.compile(r"^(\s*)([A-Za-z0-9_.\-\[\]=,]+):( |$)")


def balanced(line: str) -> bool:
    """A line that is a whole entry: no flow mapping or list running on, no anchor (YAML itself
    refuses an anchor given twice: not valid YAML)."""
    return (
        line.count("{") == line.count("}")
        and line.count("[") == line.count("]")
        and ("&" not in line)
    )


@settings(FUZZ, max_examples=15)
@given(st.sampled_from(FILES), st.data())
def test_a_key_given_twice_is_refused_naming_it(name: str, data: st.DataObject) -> None:
    lines = (REPO / name).read_text(encoding="utf-8").splitlines()
    # not an anchor or a merge: YAML itself refuses an anchor given twice (not valid YAML)
    keys = [i for i, line in enumerate(lines) if KEY_LINE.match(line) and balanced(line)]
    i = data.draw(st.sampled_from(keys), label="line")
    key = KEY_LINE.match(lines[i]).group(2)
    text = "\n".join([*lines[: i + 1], lines[i], *lines[i + 1 :]]) + "\n"
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "params.yaml"
        file.write_text(text, encoding="utf-8")
        with pytest.raises(ParamsError) as err:
            load_params(file)
    message = check_refusal(err.value, str(file))
    assert f"{key}: given twice, at lines {i + 1} and {i + 2}" in message


# The values of the issue, each through a real entry point: (file, key path, value, message)
CLI_CASES = [
    ("params.yaml", ("methods", "simcse", "objective", "tau"), True, "valid number (got True)"),
    ("params.yaml", ("train", "learning_rate"), "1e20", "less than or equal to 1, in (0, 1]"),
    ("presets/cooldown.yaml", ("train", "warmup_ratio"), math.nan, "finite number"),
]


@pytest.mark.parametrize(("name", "path", "value", "why"), CLI_CASES, ids=lambda c: str(c))
def test_the_cli_refuses_with_one_error_line_exit_2_and_nothing_written(
    tmp_path: Path, name: str, path: Path_, value: Any, why: str
) -> None:
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(replaced(RAW[name], path, value)), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "stages.commands", "status", "--params", str(bad)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [
        f"error: {bad} is invalid:"
    ]
    assert f"  - {dotted(path)}: " in done.stderr and why in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["params.yaml"]


def test_a_value_beyond_the_papers_range_is_accepted_with_one_warning_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "params.yaml"
    file.write_text(
        yaml.safe_dump(replaced(RAW["params.yaml"], ("train", "learning_rate"), 0.05)), "utf-8"
    )
    params = load_params(file)
    load_params(file)  # once a process
    assert params.train.learning_rate == 0.05
    warned = capsys.readouterr().err.splitlines()
    assert len(warned) == 1 and warned[0].startswith(f"warning: {file}: train.learning_rate: 0.05")
    assert "[1e-7, 1e-2]" in warned[0] and "(0, 1]" in warned[0]
