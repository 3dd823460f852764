"""Which source files determine an output, and their fingerprints.

An output's code identity is the set of ``stages`` modules its stage runs, found statically: the
transitive closure of the imports (module-level and inside functions) of the stage's entry
modules, each module's package ``__init__`` included, read with ``ast`` without importing
anything. Two kinds of module are left out, because they compute nothing in any output:
``stages.core`` (the description of a run: params schema, ids, paths; its effect on an output is
the settings' values, which are hashed themselves) and ``stages.cli`` (argument parsing and error
printing). An objective's loss is imported lazily by name, so a run covers only the loss module
it uses (``stages.core.objective_settings.OBJECTIVES``) and what that imports.

A file's fingerprint is the sha256 of its syntax tree with docstrings removed (``ast.dump``
without positions): comments, docstrings, blank lines and formatting change nothing, while any
change to what the code does (a sign, a constant, an argument) changes the fingerprint.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable
from functools import cache
from pathlib import Path

PACKAGE = "stages"
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding stages/
# Describe runs or print errors; computing nothing in an output, they are no part of its code.
OUTSIDE_CODE_IDENTITY = ("stages.core", "stages.cli")


def module_file(module: str) -> Path:
    """The source file of ``stages`` module ``module`` (a package's ``__init__.py``)."""
    base = SOURCE_ROOT.joinpath(*module.split("."))
    package_init = base / "__init__.py"
    return package_init if package_init.is_file() else base.with_suffix(".py")


def _is_excluded(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in OUTSIDE_CODE_IDENTITY)


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_bytes(), filename=str(path))


@cache
def _fingerprint(path: Path, mtime_ns: int, size: int) -> str:
    tree = _parse(path)
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


def source_fingerprint(path: Path) -> str:
    """The fingerprint of one source file (cached per process by path, mtime and size)."""
    stat = path.stat()
    return _fingerprint(path, stat.st_mtime_ns, stat.st_size)


def _resolve_from(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _module_exists(module: str) -> bool:
    return module_file(module).is_file()


@cache
def _direct_imports(module: str, mtime_ns: int) -> tuple[str, ...]:
    path = module_file(module)
    is_package = path.name == "__init__.py"
    found: list[str] = []
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            origin = _resolve_from(module, node, is_package)
            found.append(origin)
            # `from stages.x import y` may import the submodule stages.x.y
            found += [f"{origin}.{alias.name}" for alias in node.names]
    inside = [m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")]
    return tuple(sorted({m for m in inside if _module_exists(m)}))


def _with_parents(module: str) -> list[str]:
    """The module and every package it sits in (importing it runs their ``__init__``)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def import_closure(entry_modules: Iterable[str]) -> tuple[str, ...]:
    """Every ``stages`` module that importing ``entry_modules`` can run, core and CLI left out."""
    seen: set[str] = set()
    todo = [m for entry in entry_modules for m in _with_parents(entry)]
    while todo:
        module = todo.pop()
        if module in seen or _is_excluded(module):
            continue
        seen.add(module)
        imports = _direct_imports(module, module_file(module).stat().st_mtime_ns)
        todo += [m for imported in imports for m in _with_parents(imported)]
    return tuple(sorted(seen))


def code_files(entry_modules: Iterable[str]) -> tuple[str, ...]:
    """The source files of ``import_closure``, as paths relative to the repository root."""
    return tuple(
        sorted(
            module_file(m).relative_to(SOURCE_ROOT).as_posix()
            for m in import_closure(entry_modules)
        )
    )


def code_identity(entry_modules: Iterable[str]) -> dict[str, str]:
    """{source file: fingerprint} of everything ``entry_modules`` run: part of an output's id."""
    return {f: source_fingerprint(SOURCE_ROOT / f) for f in code_files(entry_modules)}
