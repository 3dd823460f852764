"""The shared runs store from the command line (``store.url`` in params, or $CSE_STORE_URL).

cse store list                   every complete run in the store
cse store pull EXPERIMENT        fetch one run of the matrix (checked)
cse store push                   publish every complete local run it lacks, and upload again
                                 the files a stored run lost (the store's copy of each looked at)
cse store verify                 rehash every stored run; report damage, and list the leftovers
                                 (leases, temporaries, uploads never committed) with their age
cse store gc [--keep P [P ...]]  delete leftovers older than --older-than (default 1d; never
                                 what a live lease covers: a lease not lapsed, an upload under
                                 way) and, with --keep, stored runs no listed params file uses
                                 (asks first, --yes to skip the question; each one checked again
                                 just before it is deleted)
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence

from stages.core.errors import StageError
from stages.core.identity.experiments import plan_experiments
from stages.core.schema.params import DEFAULT_PARAMS, load_params
from stages.core.storage import layout
from stages.core.storage.run_folders import is_complete, is_stored_run, read_config
from stages.core.storage.run_lock import RunLocked
from stages.core.storage.shared_store import (
    LEFTOVER_AGE_S,
    Leftover,
    SharedStore,
    store_url,
)

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def open_store(params_file: str) -> SharedStore:
    params = load_params(params_file)
    url = store_url(params.store.url)
    if not url:
        raise StageError(f"no runs store: set store.url in {params_file} or $CSE_STORE_URL")
    return SharedStore(url, params.store.settings())


def age_s(text: str) -> float:
    """'90s', '30m', '12h', '7d' or plain seconds."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r}: an age such as 3600, 90s, 30m, 12h or 7d")
    return float(found[1]) * UNITS[found[2] or "s"]


def shown_age(seconds: float | None) -> str:
    if seconds is None:
        return "age unknown"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit} old"
    return f"{seconds:.0f} s old"


def doomed_leftovers(store: SharedStore, older_than: float) -> list[Leftover]:
    """Leftovers old enough to remove, by the store's clock, that no live lease covers."""
    return [
        item
        for item in store.leftovers()
        if not item.held and item.age_s is not None and item.age_s >= older_than
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cse store", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("list", "pull", "push", "verify", "gc"))
    parser.add_argument("experiment", nargs="?", help="pull: the experiment whose run to fetch")
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    parser.add_argument("--keep", nargs="+", default=[], help="gc: params files whose runs stay")
    parser.add_argument(
        "--older-than", type=age_s, default=LEFTOVER_AGE_S, metavar="AGE",
        help="gc: leftovers (leases, temporaries, uploads never committed) at least this old "
        "by the store's clock are removed (3600, 90s, 30m, 12h, 7d; default 1d)",
    )  # fmt: skip
    parser.add_argument("--yes", action="store_true", help="gc: delete without asking")
    args = parser.parse_args(argv)
    store = open_store(args.params)

    if args.command == "list":
        for run_id in store.run_ids():
            manifest = store.manifest(run_id) or {}
            when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(manifest.get("published", 0)))
            local = "local" if is_complete(layout.run_dir(run_id)) else "-"
            print(f"{run_id}  {manifest.get('experiment', '?'):40s}  {when}  {local}")
    elif args.command == "pull":
        target = plan_experiments(load_params(args.params)).run(args.experiment)
        if is_complete(target.run_dir):
            print(f"{args.experiment}: run {target.run_id} is already here")
            return
        store.fetch(target.run_id, target.run_dir)
        print(f"{args.experiment}: fetched {target.run_id} from {store.url}")
    elif args.command == "push":
        push(store)
    elif args.command == "verify":
        run_ids = store.run_ids()
        problems = [p for run_id in run_ids for p in store.verify(run_id)]
        for problem in problems:
            print(problem)
        leftovers = store.leftovers()
        for item in leftovers:
            state = ", held" if item.held else ""
            print(f"leftover: {item.path}: {item.what} ({shown_age(item.age_s)}{state})")
        print(
            f"{len(run_ids)} runs checked, {len(problems)} problem(s), {len(leftovers)} "
            "leftover(s) (`cse store gc` removes those older than --older-than)"
        )
        if problems:
            sys.exit(1)
    else:
        gc(store, args)


def push(store: SharedStore) -> None:
    """Publish the complete local runs the store lacks; upload again the files a listed run
    lost. A run whose lease another workspace holds (training or publishing it) is left to it."""
    stored = set(store.run_ids())
    # a folder named as the run its config.json records: a staged or hand-renamed copy is no run
    local = sorted(p for p in layout.RUNS.glob("*") if p.is_dir() and is_stored_run(p))
    left: list[str] = []
    for folder in local:
        experiment = (read_config(folder) or {}).get("experiment", "?")
        if folder.name in stored:
            missing = store.missing_files(
                folder.name, (store.manifest(folder.name) or {}).get("files", {})
            )
            if not missing:
                continue
        try:
            store.publish(folder.name, folder, experiment)
        except RunLocked as held:
            print(f"not pushed: {held}")
            left.append(folder.name)
            continue
        if folder.name in stored:
            print(f"repaired {folder.name} ({experiment}): uploaded again {', '.join(missing)}")
        else:
            print(f"published {folder.name} ({experiment})")
    if left:
        raise StageError(
            f"{len(left)} run(s) not pushed, their lease held by another workspace: "
            f"{', '.join(left)}; rerun `cse store push` after it"
        )


def gc(store: SharedStore, args: argparse.Namespace) -> None:
    doomed: list[str] = []
    if args.keep:
        kept = {
            run.run_id
            for file in args.keep
            for run in plan_experiments(load_params(file)).runs.values()
        }
        doomed = [run_id for run_id in store.run_ids() if run_id not in kept]
    leftovers = doomed_leftovers(store, args.older_than)
    if not doomed and not leftovers:
        print("nothing to delete" + ("" if args.keep else " (runs: give --keep PARAMS ...)"))
        return
    if doomed:
        print(f"{len(doomed)} run(s) in {store.url} are used by none of {', '.join(args.keep)}:")
        print("\n".join(f"  {run_id}" for run_id in doomed))
    if leftovers:
        print(f"{len(leftovers)} leftover(s) in {store.url} at least "
              f"{shown_age(args.older_than).removesuffix(' old')} old:")  # fmt: skip
        print("\n".join(f"  {i.path}: {i.what} ({shown_age(i.age_s)})" for i in leftovers))
    if not args.yes and input("delete them? [y/N] ").strip().lower() != "y":
        print("kept")
        return
    deleted = removed = 0
    for run_id in doomed:
        reason = store.delete(run_id)
        deleted += reason is None
        if reason:
            print(f"kept run {run_id}: {reason}")
    for item in leftovers:
        reason = store.remove(item, args.older_than)
        removed += reason is None
        if reason:
            print(f"kept {item.path}: {reason}")
    print(f"deleted {deleted} run(s) and {removed} leftover(s)")
