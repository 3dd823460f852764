"""``cse``: the pipeline's commands (also ``python -m stages.commands COMMAND``).

Each command is a module of ``stages.commands``, imported only when it runs, so the torch-free
ones answer in well under a second.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# command -> (module, how it is called, what it does)
COMMANDS = {
    "status": ("pipeline", "status", "experiments, run ids, what is finished, and where from"),
    "estimates": (
        "pipeline",
        "estimates [--gpu h100|h200]",
        "the dry run: every job's estimated time, device and measured rates",
    ),
    "dvc": ("pipeline", "dvc", "regenerate dvc.yaml after changing the experiment matrix"),
    "check-dvc": ("pipeline", "check-dvc", "fail if dvc.yaml is out of date with the params"),
    "check": (
        "pipeline",
        "check",
        "validate the params; refuse a GPU matrix without a GPU (DVC's first stage)",
    ),
    "code-manifests": ("pipeline", "code-manifests", "write the stages' code manifests (DVC)"),
    "carry-over": (
        "carry_over",
        "carry-over [EXPERIMENT ...]",
        "verified reuse across a code change",
    ),
    "adopt": ("pipeline", "adopt EXPERIMENT", "reuse a run trained before code identity"),
    "pin": (
        "pin",
        "pin [--update]",
        "resolve the hub backbones' branches to commits in backbones.lock (online)",
    ),
    "docs": (
        "pipeline",
        "docs",
        "regenerate README.md's table of the evaluations and docs/identity.md's of id markers",
    ),
    "store": ("store", "store list|pull|push|verify|gc", "the shared runs store"),
    "export": ("export", "export EXPERIMENT DIR", "a run's checkpoint as a model folder (Hub)"),
    "gpu-slot": ("gpu_slot", "gpu-slot [--gpus K|--share N] -- CMD", "run CMD on GPUs of its own"),
}
# commands whose module reads the command's name as its own first argument
SUBCOMMANDS_OF_MODULE = {"pipeline"}


def usage() -> str:
    width = max(len(call) for _, call, _ in COMMANDS.values())
    lines = [f"  cse {call:{width}}  {what}" for _, call, what in COMMANDS.values()]
    return "usage: cse COMMAND [ARGS] [--params FILE]\n\n" + "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), end="")
        return
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"cse: unknown command '{name}'\n\n{usage()}", end="", file=sys.stderr)
        sys.exit(2)
    module_name = COMMANDS[name][0]
    module = importlib.import_module(f"stages.commands.{module_name}")
    forwarded = [name, *rest] if module_name in SUBCOMMANDS_OF_MODULE else rest
    if module_name == "gpu_slot":  # it replaces itself with the command: no error handling
        module.main(forwarded)
        return
    from stages.core.cli import run

    run(lambda _: module.main(forwarded))


if __name__ == "__main__":
    main()
