"""The job graph's command line (the graph itself is ``stages.core.planning.jobs``).

  python -m stages.commands.pipeline status       experiment names -> run ids, what is finished, and
  the environment each result was computed in python -m stages.commands.pipeline dvc
  regenerate dvc.yaml after changing the matrix python -m stages.commands.pipeline check-dvc    fail
  if dvc.yaml is out of date with params.yaml python -m stages.commands.pipeline code-manifests
  write the stages' code manifests (dvc.yaml's `code` stage runs it) python -m
  stages.commands.pipeline adopt NAME   reuse a run trained before code identity existed python -m
  stages.commands.pipeline docs         regenerate README.md's table of the registered evaluations
  (stages/core/schema/evaluation_settings.py)

Torch-free: answers in well under a second on a finished workspace.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from stages.core.planning.jobs import DVC_YAML, build_jobs, check_dvc_yaml, code_manifests, dvc_yaml
from stages.core.planning.status import adopt_legacy_run, status_rows
from stages.core.schema.evaluation_settings import with_evaluations_table
from stages.core.schema.params import DEFAULT_PARAMS, load_params
from stages.core.storage.atomic import write_json, write_text

README = Path("README.md")


def print_table(rows: list[dict[str, str]]) -> None:
    headers = list(rows[0]) if rows else ["experiment"]
    widths = {h: max(len(h), *(len(r[h]) for r in rows)) for h in headers}
    print("  ".join(h.ljust(widths[h]) for h in headers).rstrip())
    for r in rows:
        print("  ".join(r[h].ljust(widths[h]) for h in headers).rstrip())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command", choices=("status", "dvc", "check-dvc", "code-manifests", "adopt", "docs")
    )
    parser.add_argument("experiment", nargs="?", help="adopt: the experiment to adopt a run for")
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    args = parser.parse_args(argv)
    if args.command == "docs":
        write_text(README, with_evaluations_table(README.read_text(encoding="utf-8")))
        print(f"wrote the evaluations table of {README}")
        return
    params = load_params(args.params)
    if args.command == "dvc":
        jobs = build_jobs(params, args.params)
        write_text(DVC_YAML, dvc_yaml(jobs, args.params))
        print(f"wrote {DVC_YAML} ({len(jobs)} stages)")
    elif args.command == "code-manifests":
        manifests = code_manifests(build_jobs(params, args.params))
        for path, manifest in manifests.items():
            write_json(Path(path), manifest)
        print(f"wrote {len(manifests)} code manifests")
    elif args.command == "check-dvc":
        problem = check_dvc_yaml(args.params)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            sys.exit(1)
        print(f"{DVC_YAML} is up to date")
    elif args.command == "adopt":
        if not args.experiment:
            parser.error("adopt needs an experiment name")
        print(adopt_legacy_run(params, args.experiment))
    else:
        print_table(status_rows(params))


if __name__ == "__main__":
    from stages.core.cli import run

    run(main)
