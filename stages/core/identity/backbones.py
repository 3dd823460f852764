"""A backbone by content: what ids hold of it beyond its settings, so that other weights or
another tokenizer under the same name never reuse a stored output.

- A local folder: the digest of its files (a path can be overwritten in place).
- ``package:<module>``: the installed distribution's version and the digest of the package's
  files (a release that changes the vocabulary or ``do_lower_case`` under the same module name).
- A hub id: its commit. A ``revision`` that is a commit (40 hex digits) names it; a branch or a
  tag (``main``) names nothing fixed, so it is resolved once, online, by ``cse pin``
  (``stages.commands.pin``) and recorded in ``backbones.lock``, which the user commits beside
  params.yaml as dvc.lock. The plan reads the lock: a backbone's revision becomes its locked
  commit, so ``revision: main`` pinned to C is the backbone ``revision: C`` and the loaders load
  C. Without an entry the backbone is *unpinned*: its id holds the branch name, ``cse status``
  and the dry run say so, and loading it stops naming ``cse pin``.

A ``random_init`` backbone reads its config and tokenizer from its model, so the same holds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from stages.core.errors import ParamsError, StageError
from stages.core.schema.params import PACKAGE_PREFIX, BackboneParams
from stages.core.storage.hashing import cached_sha256, folder_digest

LOCK_FILE = Path("backbones.lock")
LOCK_HEADER = (
    "# Hub revisions (branches, tags) resolved to commits by `cse pin`: the run ids read them.\n"
    "# Commit this file with params.yaml; `cse pin --update` resolves them again.\n"
)
PIN_COMMAND = "cse pin"
COMMIT = re.compile(r"[0-9a-f]{40}")
# What a package ships that is not its content: Python's bytecode caches.
NOT_CONTENT = ("__pycache__",)

# model -> revision -> commit
Lock = dict[str, dict[str, str]]


def is_commit(revision: str) -> bool:
    return COMMIT.fullmatch(revision) is not None


def local_folder(spec: BackboneParams) -> Path | None:
    """The backbone's folder when it is a local one (a job dependency), else None."""
    is_folder = not spec.model.startswith(PACKAGE_PREFIX) and Path(spec.model).is_dir()
    return Path(spec.model) if is_folder else None


def looks_like_path(location: str) -> bool:
    """Not a hub id ('name' or 'owner/name'): a folder, there or missing (from_pretrained would
    call a missing folder an invalid repo id instead of saying that it does not exist)."""
    return location.startswith(("/", ".", "~")) or location.count("/") > 1


def is_hub(spec: BackboneParams) -> bool:
    """A hub id: not a package, not a folder (there or missing)."""
    return not spec.model.startswith(PACKAGE_PREFIX) and not (
        local_folder(spec) or looks_like_path(spec.model)
    )


def read_lock(path: Path = LOCK_FILE) -> Lock:
    """``backbones.lock``: {model: {revision: commit}}; empty when there is none. A damaged one
    is refused naming the entry."""
    if not path.is_file():
        return {}
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ParamsError(
            f"{path}: not valid YAML ({err}); delete it and run `{PIN_COMMAND}`"
        ) from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ParamsError(
            f"{path}: expected a mapping of model -> revision -> commit; run "
            f"`{PIN_COMMAND} --update`"
        )
    problems: list[str] = []
    lock: Lock = {}
    for model, revisions in raw.items():
        if not isinstance(revisions, dict):
            problems.append(f"{model}: expected a mapping of revision -> commit")
            continue
        for revision, commit in revisions.items():
            if not isinstance(commit, str) or not is_commit(commit):
                problems.append(f"{model}.{revision}: not a 40-hex commit ({commit!r})")
            else:
                lock.setdefault(str(model), {})[str(revision)] = commit
    if problems:
        listed = "; ".join(problems)
        raise ParamsError(f"{path} is invalid: {listed}; run `{PIN_COMMAND} --update`")
    return lock


def locked_commit(spec: BackboneParams, lock: Lock) -> str | None:
    """The commit a hub backbone's branch or tag is locked to, if it is."""
    return lock.get(spec.model, {}).get(spec.revision)


def unpinned(spec: BackboneParams, lock: Lock) -> bool:
    """A hub backbone on a branch or tag without a commit in the lock."""
    return is_hub(spec) and not is_commit(spec.revision) and locked_commit(spec, lock) is None


def pinned_spec(spec: BackboneParams, lock: Lock) -> BackboneParams:
    """``spec`` with its revision the commit the lock gives its branch or tag (unchanged when
    it has none, or needs none)."""
    commit = locked_commit(spec, lock) if is_hub(spec) else None
    return spec.model_copy(update={"revision": commit}) if commit else spec


def unpinned_message(key: str, spec: BackboneParams) -> str:
    return (
        f"backbones.{key}: {spec.model} at revision '{spec.revision}' is unpinned (a branch "
        f"or tag names no fixed weights, and {LOCK_FILE} has no commit for it): run "
        f"`{PIN_COMMAND}` (online) to record its commit, then commit {LOCK_FILE}"
    )


def require_pinned(spec: BackboneParams, key: str | None, lock: Lock) -> BackboneParams:
    """The pinned spec to load; a StageError naming ``cse pin`` for an unpinned one."""
    if unpinned(spec, lock):
        raise StageError(unpinned_message(key or spec.model, spec))
    return pinned_spec(spec, lock)


@cache
def _distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def package_folder(module: str) -> Path:
    """The folder of installed package ``module`` (found, not imported)."""
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        raise ParamsError(
            f"package:{module}: no installed package '{module}' (its files are part of the ids: "
            "install it where the pipeline plans and trains)"
        )
    return Path(next(iter(found.submodule_search_locations)))


def package_content(module: str) -> dict[str, Any]:
    """The distribution and version of installed package ``module``, and the digest of every
    file of its folder (its bytecode caches aside); file hashes are cached by stat."""
    folder = package_folder(module)
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part in NOT_CONTENT for part in p.relative_to(folder).parts)
    )
    hashes = cached_sha256(files)
    listing = "".join(f"{p.relative_to(folder).as_posix()}\0{hashes[p]}\n" for p in files)
    distributions = _distributions().get(module.split(".")[0], [])
    return {
        "distribution": {d: metadata.version(d) for d in sorted(distributions)},
        "files": hashlib.sha256(listing.encode()).hexdigest(),
    }


def backbone_content(spec: BackboneParams) -> dict[str, Any]:
    """What of a backbone's content its settings do not name: a local folder's ``files``, a
    package's ``package``; nothing for a hub id (its revision, pinned, is the commit)."""
    folder = local_folder(spec)
    if folder is not None:
        return {"files": folder_digest(folder)}
    if spec.model.startswith(PACKAGE_PREFIX):
        return {"package": package_content(spec.model.removeprefix(PACKAGE_PREFIX))}
    return {}
