"""The shared runs store from the command line (``store.url`` in params, or $CSE_STORE_URL).

cse store list                   every complete run in the store
cse store pull EXPERIMENT        fetch one run of the matrix (checked)
cse store push                   publish every complete local run it lacks
cse store verify                 rehash every stored run; report damage
cse store gc --keep P [P ...]    delete stored runs no listed params file uses (asks first;
                                 --yes to skip the question)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from stages.core.errors import StageError
from stages.core.identity.experiments import plan_experiments
from stages.core.schema.params import DEFAULT_PARAMS, load_params
from stages.core.storage import layout
from stages.core.storage.run_folders import is_complete, read_config
from stages.core.storage.shared_store import SharedStore, store_url


def open_store(params_file: str) -> SharedStore:
    url = store_url(load_params(params_file).store.url)
    if not url:
        raise StageError(f"no runs store: set store.url in {params_file} or $CSE_STORE_URL")
    return SharedStore(url)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cse store", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("list", "pull", "push", "verify", "gc"))
    parser.add_argument("experiment", nargs="?", help="pull: the experiment whose run to fetch")
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    parser.add_argument("--keep", nargs="+", default=[], help="gc: params files whose runs stay")
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
        stored = set(store.run_ids())
        local = sorted(p for p in layout.RUNS.glob("*") if p.is_dir() and is_complete(p))
        for folder in local:
            if folder.name not in stored:
                experiment = (read_config(folder) or {}).get("experiment", "?")
                store.publish(folder.name, folder, experiment)
                print(f"published {folder.name} ({experiment})")
    elif args.command == "verify":
        problems = [p for run_id in store.run_ids() for p in store.verify(run_id)]
        for problem in problems:
            print(problem)
        print(f"{len(store.run_ids())} runs checked, {len(problems)} problem(s)")
        if problems:
            sys.exit(1)
    else:
        if not args.keep:
            raise StageError("gc needs --keep PARAMS [PARAMS ...]: the runs they use stay")
        kept = {
            run.run_id
            for file in args.keep
            for run in plan_experiments(load_params(file)).runs.values()
        }
        doomed = [run_id for run_id in store.run_ids() if run_id not in kept]
        if not doomed:
            print("nothing to delete")
            return
        print(f"{len(doomed)} run(s) in {store.url} are used by none of {', '.join(args.keep)}:")
        print("\n".join(f"  {run_id}" for run_id in doomed))
        if not args.yes and input("delete them? [y/N] ").strip().lower() != "y":
            print("kept")
            return
        for run_id in doomed:
            store.delete(run_id)
        print(f"deleted {len(doomed)} run(s)")
