"""The pipeline's commands on the job graph (``stages.core.planning``): ``cse status``,
``estimates``, ``dvc``, ``check-dvc``, ``check``, ``code-manifests``, ``adopt`` and ``docs``
(``stages/commands/__main__.py`` lists them). Torch-free: each answers in well under a second on a
finished workspace.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from stages.core.errors import StageError
from stages.core.identity.backbones import unpinned_message
from stages.core.identity.experiments import Plan, plan_experiments
from stages.core.planning.cpu_guard import cpu_guard, visible_gpus
from stages.core.planning.estimates import (
    DEFAULT_GPU,
    GPU_KINDS,
    Machine,
    dry_run,
    format_dry_run,
)
from stages.core.planning.jobs import (
    DVC_YAML,
    PARAMS_CHECKED,
    build_jobs,
    check_dvc_yaml,
    code_manifests,
    dvc_yaml,
)
from stages.core.planning.status import adopt_legacy_run, status_rows, unpinned_lines
from stages.core.schema.evaluation_settings import with_evaluations_table
from stages.core.schema.id_markers import with_markers_table
from stages.core.schema.params import DEFAULT_PARAMS, Params, load_params
from stages.core.storage.atomic import write_json, write_text

README = Path("README.md")
IDENTITY_DOC = Path("docs/identity.md")


def print_table(rows: list[dict[str, str]]) -> None:
    headers = list(rows[0]) if rows else ["experiment"]
    widths = {h: max(len(h), *(len(r[h]) for r in rows)) for h in headers}
    print("  ".join(h.ljust(widths[h]) for h in headers).rstrip())
    for r in rows:
        print("  ".join(r[h].ljust(widths[h]) for h in headers).rstrip())


def unread_params_change(params_file: str) -> str | None:
    """Why this experiment does nothing it was asked to: under ``dvc exp run`` (DVC sets
    ``DVC_EXP_BASELINE_REV``) with stages that read another params file, params.yaml differs
    from the experiment's baseline commit, as ``-S KEY=VALUE`` without a file name leaves it."""
    baseline = os.environ.get("DVC_EXP_BASELINE_REV")
    if not baseline or params_file == str(DEFAULT_PARAMS) or not DEFAULT_PARAMS.is_file():
        return None
    committed = subprocess.run(
        ["git", "show", f"{baseline}:{DEFAULT_PARAMS}"], capture_output=True, check=False
    )
    if committed.returncode != 0 or committed.stdout == DEFAULT_PARAMS.read_bytes():
        return None
    return (
        f"this experiment changed {DEFAULT_PARAMS}, which no stage reads: dvc.yaml's stages "
        f"read {params_file} (`cse dvc --params {params_file}`). Set a value there with "
        f"`dvc exp run -S {params_file}:KEY=VALUE` (-S without a file name writes "
        f"{DEFAULT_PARAMS}), and revert {DEFAULT_PARAMS}"
    )


def check(plan: Plan, params_file: str) -> None:
    """DVC's first stage (``stages.core.planning.jobs.check_stage``), given the valid params'
    plan: the experiment changes the file the stages read, the matrix may start here (the GPU
    check of Snakemake's onstart), and every hub backbone on a branch is pinned
    (backbones.lock, which the jobs that read it depend on); then the file every stage runs
    after."""
    unpinned = "\n".join(unpinned_message(k, s) for k, s in plan.unpinned_backbones().items())
    stop = unread_params_change(params_file) or cpu_guard(plan, params_file) or unpinned
    if stop:
        raise StageError(stop)
    write_text(PARAMS_CHECKED, f"{params_file}\n")
    print(f"{params_file} is valid, and this machine may run its matrix")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cse", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command",
        choices=(
            "status",
            "estimates",
            "dvc",
            "check-dvc",
            "check",
            "code-manifests",
            "adopt",
            "docs",
        ),
    )
    parser.add_argument("experiment", nargs="?", help="adopt: the experiment to adopt a run for")
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    parser.add_argument(
        "--gpu",
        choices=GPU_KINDS,
        help=f"estimates: the GPU kind of train.device cuda (default {DEFAULT_GPU}), and of auto "
        "even where no GPU is visible (without it, auto is this machine's GPU or its CPU)",
    )
    args = parser.parse_args(argv)
    if args.command == "docs":
        write_text(README, with_evaluations_table(README.read_text(encoding="utf-8")))
        print(f"wrote the evaluations table of {README}")
        write_text(IDENTITY_DOC, with_markers_table(IDENTITY_DOC.read_text("utf-8"), Params))
        print(f"wrote the id markers table of {IDENTITY_DOC}")
        return
    if args.command == "check-dvc":
        problem = check_dvc_yaml(args.params)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            sys.exit(1)
        print(f"{DVC_YAML} is up to date")
        return
    plan = plan_experiments(load_params(args.params))
    if args.command == "estimates":
        machine = Machine(args.gpu or DEFAULT_GPU, args.gpu is not None or visible_gpus() > 0)
        print(f"dry run of {args.params}")
        print(format_dry_run(plan, dry_run(plan, args.params, machine), machine))
        for line in unpinned_lines(plan):
            print(line)
        # scipy and the published numbers: loaded for this command only
        from stages.reporting.seed_power import format_seed_power, seed_power

        print(format_seed_power(plan, seed_power(plan)))
    elif args.command == "dvc":
        jobs = build_jobs(plan, args.params)
        write_text(DVC_YAML, dvc_yaml(jobs, args.params))
        print(f"wrote {DVC_YAML} ({len(jobs)} stages)")
    elif args.command == "check":
        check(plan, args.params)
    elif args.command == "code-manifests":
        manifests = code_manifests(build_jobs(plan, args.params))
        for path, manifest in manifests.items():
            write_json(Path(path), manifest)
        print(f"wrote {len(manifests)} code manifests")
    elif args.command == "adopt":
        if not args.experiment:
            parser.error("adopt needs an experiment name")
        print(adopt_legacy_run(plan, args.experiment))
    else:
        print(f"status of {args.params}")
        print_table(status_rows(plan))
        for line in unpinned_lines(plan):
            print(line)
