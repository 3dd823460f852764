"""``cse pin [--update]``: resolve each hub backbone's branch or tag to its commit, online, and
record it in backbones.lock (``stages.core.identity.backbones``), which the run ids read and the
loaders load by. Commit the lock with params.yaml.

It asks the hub's API (``HfApi().model_info(model, revision=...).sha``; ``HF_ENDPOINT`` and
``HF_TOKEN`` apply) for the backbones of the params file that are on a branch or tag: those the
lock has no commit for, or, with ``--update``, all of them again (their runs get new ids where
the commit moved). A revision that is a commit, a local folder and a package need no entry.
Entries of other params files' backbones are kept.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import yaml

from stages.core.errors import StageError
from stages.core.identity.backbones import (
    LOCK_FILE,
    LOCK_HEADER,
    Lock,
    is_commit,
    is_hub,
    locked_commit,
    read_lock,
)
from stages.core.schema.params import DEFAULT_PARAMS, BackboneParams, Params, load_params
from stages.core.storage.atomic import write_text


def to_pin(params: Params, lock: Lock, update: bool) -> dict[str, BackboneParams]:
    """The params file's hub backbones on a branch or tag that need resolving, by key."""
    return {
        key: spec
        for key, spec in params.backbones.items()
        if is_hub(spec)
        and not is_commit(spec.revision)
        and (update or locked_commit(spec, lock) is None)
    }


def resolve_commit(key: str, spec: BackboneParams) -> str:
    """The commit ``spec``'s branch or tag points to on the hub now."""
    from huggingface_hub import HfApi, constants

    where = f"backbones.{key}: {spec.model}@{spec.revision}"
    if constants.HF_HUB_OFFLINE:
        raise StageError(
            f"{where}: HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set, and pinning asks the "
            "hub; unset it"
        )
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
    try:
        commit = api.model_info(spec.model, revision=spec.revision).sha
    # whatever the hub client raises: its HTTP library (requests, httpx, httpx2) and so its
    # exception classes change between huggingface_hub releases
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise StageError(f"{where}: cannot resolve it on {api.endpoint}: {first}") from None
    if not isinstance(commit, str) or not is_commit(commit):
        raise StageError(f"{where}: {api.endpoint} answered no commit ({commit!r})")
    return commit


def lock_text(lock: Lock) -> str:
    return LOCK_HEADER + yaml.safe_dump(lock, sort_keys=True, default_flow_style=False)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cse pin", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    parser.add_argument(
        "--update", action="store_true", help="resolve every branch or tag again, pinned or not"
    )
    args = parser.parse_args(argv)
    params = load_params(args.params)
    lock = read_lock()
    pending = to_pin(params, lock, args.update)
    if not pending:
        print(f"every hub backbone of {args.params} is pinned (a commit, or in {LOCK_FILE})")
        return
    for key, spec in pending.items():
        commit = resolve_commit(key, spec)
        before = locked_commit(spec, lock)
        lock.setdefault(spec.model, {})[spec.revision] = commit
        change = "" if before in (None, commit) else f" (was {before})"
        print(f"backbones.{key}: {spec.model}@{spec.revision} -> {commit}{change}")
    write_text(LOCK_FILE, lock_text(lock))
    print(f"wrote {LOCK_FILE}: commit it with {args.params}")
