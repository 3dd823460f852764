"""Which source files determine an output, and their fingerprints.

An output's code identity is the set of ``stages`` modules its stage runs, found statically: the
transitive closure of the imports (module-level and inside functions) of the stage's entry
modules, each module's package ``__init__`` included, read with ``ast`` without importing
anything. Two kinds of module are left out, because they compute nothing in any output:
``stages.core`` (the description of a run: params schema, ids, paths; its effect on an output is
the settings' values, which are hashed themselves, with what the core derives from them; MTEB's
task sets excepted) and ``stages.core.cli`` (argument parsing and error
printing). An objective's loss is imported lazily by name, so a run covers only the loss module
it uses (``stages.core.schema.objective_settings.OBJECTIVES``) and what that imports.

A file's fingerprint is the sha256 of its syntax tree with docstrings removed (``ast.dump``
without positions): comments, docstrings, blank lines and formatting change nothing, while any
change to what the code does (a sign, a constant, an argument) changes the fingerprint.

A package's data files (the files of its folder with a data suffix, ``DATA_SUFFIXES``, such as
the report's ``stages/reference/published.csv``; not its documentation) are code of every
module of the package: their fingerprint is the sha256 of their bytes.
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from stages.core.storage.atomic import read_json_cache, write_text
from stages.core.storage.hashing import stat_key
from stages.core.storage.layout import CACHE

PACKAGE = "stages"
SOURCE_ROOT = Path(__file__).resolve().parents[3]  # the folder holding stages/
# Describe runs or print errors; computing nothing in an output, they are no part of its code.
OUTSIDE_CODE_IDENTITY = ("stages.core", "stages.core.cli")
# The core module that is data of a stage, not a description of a run: which tasks MTEB's named
# sets run (an edit must re-evaluate). Objectives' derived switches are hashed as values instead
# (``ObjectiveSettings.derived``), so adding an objective retrains nothing.
CORE_MODULES_IN_CODE_IDENTITY = ("stages.core.schema.mteb_task_sets",)
# What a file in a package folder must end with to be read as data by the package's code.
DATA_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".yaml", ".yml", ".txt", ".parquet", ".npy",
                 ".npz", ".safetensors")  # fmt: skip


def module_file(module: str) -> Path:
    """The source file of ``stages`` module ``module`` (a package's ``__init__.py``)."""
    base = SOURCE_ROOT.joinpath(*module.split("."))
    package_init = base / "__init__.py"
    return package_init if package_init.is_file() else base.with_suffix(".py")


def _is_excluded(module: str) -> bool:
    if module in CORE_MODULES_IN_CODE_IDENTITY:
        return False
    return any(module == m or module.startswith(m + ".") for m in OUTSIDE_CODE_IDENTITY)


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_bytes(), filename=str(path))


def _fingerprint_of(tree: ast.Module) -> str:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    canonical = ast.dump(tree, annotate_fields=False, include_attributes=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _resolve_from(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imported_names(module: str, tree: ast.Module, is_package: bool) -> list[str]:
    """Every ``stages`` name the module imports (some may be attributes, not modules)."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            origin = _resolve_from(module, node, is_package)
            found.append(origin)
            # `from stages.x import y` may import the submodule stages.x.y
            found += [f"{origin}.{alias.name}" for alias in node.names]
    return sorted({m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")})


class _SourceFacts:
    """Each source file's fingerprint and imported names, parsed once per change of the file.

    Parsing and dumping the syntax trees of the training closure costs about a second, which
    every DAG parse and stage start would pay; so the facts are kept in ``cache/code_identity.json``
    keyed by the file's ``stat_key``, like the data hashes (storage/hashing.py): any write to a file
    changes its key, and it is parsed again.
    """

    def __init__(self, store: Path) -> None:
        self.store = store
        self.entries: dict[str, list[Any]] | None = None
        self.changed = False

    def _load(self) -> dict[str, list[Any]]:
        if self.entries is None:
            self.entries = read_json_cache(self.store)
        return self.entries

    def get(self, path: Path, module: str) -> tuple[str, tuple[str, ...]]:
        """(fingerprint, imported names) of the source file ``path`` of ``module``; a data
        file's fingerprint is its bytes' and it imports nothing."""
        key, entries = stat_key(path), self._load()
        entry = entries.get(str(path))
        if entry is None or entry[0] != key:
            if path.suffix == ".py":
                tree = _parse(path)
                names = _imported_names(module, tree, path.name == "__init__.py")
                fingerprint = _fingerprint_of(tree)
            else:
                names, fingerprint = [], hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            entry = entries[str(path)] = [key, fingerprint, names]
            self.changed = True
        return entry[1], tuple(entry[2])

    def save(self) -> None:
        if self.changed and self.entries is not None:
            try:
                write_text(self.store, json.dumps(self.entries, sort_keys=True))
            except OSError:
                return  # a read-only workspace parses again next time
            self.changed = False


_FACTS = _SourceFacts(CACHE / "code_identity.json")


def source_fingerprint(path: Path) -> str:
    """The fingerprint of one source file."""
    return _FACTS.get(path.resolve(), path.stem)[0]


def _module_exists(module: str) -> bool:
    return module_file(module).is_file()


def _direct_imports(module: str) -> tuple[str, ...]:
    imported = _FACTS.get(module_file(module), module)[1]
    return tuple(m for m in imported if _module_exists(m))


def _with_parents(module: str) -> list[str]:
    """The module and every package it sits in (importing it runs their ``__init__``)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def import_closure(entry_modules: Iterable[str]) -> tuple[str, ...]:
    """Every ``stages`` module that importing ``entry_modules`` can run, core and CLI left out.
    Walked once per process for each set of entry modules: a DAG asks for the same few closures
    hundreds of times (every job's fingerprint and id); the files' fingerprints are still read
    per call, so an edit of what a file does shows, only an added import waits for a new
    process."""
    return _import_closure(tuple(entry_modules))


@cache
def _import_closure(entry_modules: tuple[str, ...]) -> tuple[str, ...]:
    seen: set[str] = set()
    todo = [m for entry in entry_modules for m in _with_parents(entry)]
    while todo:
        module = todo.pop()
        if module in seen or _is_excluded(module):
            continue
        seen.add(module)
        imports = _direct_imports(module)
        todo += [m for imported in imports for m in _with_parents(imported)]
    return tuple(sorted(seen))


def package_data_files(module: str) -> list[Path]:
    """The data files of package ``module`` (none for a plain module)."""
    init = module_file(module)
    if init.name != "__init__.py":
        return []
    return [
        path
        for path in init.parent.iterdir()
        if path.suffix in DATA_SUFFIXES and not path.name.startswith(".") and path.is_file()
    ]


def code_files(entry_modules: Iterable[str]) -> tuple[str, ...]:
    """The source and package data files of ``import_closure``, as paths relative to the
    repository root."""
    closure = import_closure(entry_modules)
    files = [module_file(m) for m in closure] + [
        data for m in closure for data in package_data_files(m)
    ]
    return tuple(sorted(path.relative_to(SOURCE_ROOT).as_posix() for path in files))


def code_identity(entry_modules: Iterable[str]) -> dict[str, str]:
    """{source file: fingerprint} of everything ``entry_modules`` run: part of an output's id."""
    identity = {f: source_fingerprint(SOURCE_ROOT / f) for f in code_files(entry_modules)}
    _FACTS.save()
    return identity
