"""Command-line plumbing shared by the stage modules: the common flags and clean failures.

Each stage module ends with ``if __name__ == "__main__": run(main)``. Expected failures (bad
params, missing or corrupt data, a diverged run) are ``StageError``s and end the process with
one readable message and exit status 2 instead of a traceback; so does a full disk or quota, or
a location the stage may not write (read-only filesystem, permissions), wherever it strikes
(every output is written to a temporary and renamed, so nothing it cut short looks finished).
Ctrl-C and SIGTERM (what SLURM's scancel, Snakemake and torchrun send to stop a job) unwind the
stage the same way (locks given back, temporaries removed) and end it with one line.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from stages.core.errors import ParamsError, StageError
from stages.core.schema.params import DEFAULT_PARAMS, POOLERS
from stages.core.storage.atomic import destination_of

# The OSErrors that are the machine's state, not a bug: how to name the path, what to do.
FULL = ("writing", "free some space")
DENIED = ("at", "check that location's permissions (a read-only filesystem, or not yours)")
REMEDIES = {
    errno.ENOSPC: FULL,
    errno.EDQUOT: FULL,
    errno.EROFS: DENIED,
    errno.EACCES: DENIED,
    errno.EPERM: DENIED,
}


def parser(description: str, prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument(
        "--params", default=str(DEFAULT_PARAMS), help="params file (default: params.yaml)"
    )
    return p


def positive_int(text: str) -> int:
    """argparse ``type`` of a count or a length: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def add_target_arguments(
    p: argparse.ArgumentParser,
    max_length_help: str = "truncation in tokens (default: the longest the model takes, <= 512)",
) -> None:
    """--experiment | --model, and how to load --model."""
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--experiment", help="a run of the matrix or baseline.<key>")
    target.add_argument("--model", help="HF id, model dir, checkpoint dir, package:<module>")
    p.add_argument("--pooler", choices=POOLERS, help="required unless the dir has encoder.json")
    p.add_argument("--revision", default="main", help="hub revision of --model")
    p.add_argument("--output", help="results JSON (default with --experiment: experiments/...)")
    p.add_argument("--max-length", type=positive_int, help=max_length_help)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")


# How --model is loaded, which an experiment's run and params decide: (flag, attribute, default).
MODEL_OPTIONS = (
    ("--pooler", "pooler", None),
    ("--revision", "revision", "main"),
    ("--max-length", "max_length", None),
    ("--precision", "precision", "fp32"),
)


def parse_target_arguments(
    p: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """``p.parse_args(argv)``, refusing with --experiment the flags that say how to load --model
    (ignored, they would have the experiment's result written as if they applied)."""
    args = p.parse_args(argv)
    given = [flag for flag, name, default in MODEL_OPTIONS if getattr(args, name) != default]
    if args.experiment and given:
        p.error(
            f"{', '.join(given)} apply to --model only: experiment {args.experiment} is "
            "evaluated as its run and params give it (for other settings pass its checkpoint: "
            "--model runs/<run_id>/best --output FILE)"
        )
    return args


def params_file_of(argv: Sequence[str]) -> str:
    """The ``--params`` of a stage's arguments (``--params F`` or ``--params=F``), else the
    default, for code that runs before (or around) the stage's own parser."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--params" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--params="):
            return arg.removeprefix("--params=")
    return str(DEFAULT_PARAMS)


def ensure_dvc_yaml_is_current(argv: Sequence[str]) -> None:
    """Under `dvc repro` (DVC sets DVC_STAGE), refuse to run from a stale dvc.yaml.

    dvc.yaml is generated from params.yaml's experiment matrix; if the matrix changed and the
    file was not regenerated, DVC would silently skip new experiments.
    """
    if "DVC_STAGE" not in os.environ:
        return
    from stages.core.planning.jobs import check_dvc_yaml

    problem = check_dvc_yaml(params_file_of(argv))
    if problem:
        raise StageError(problem)


class Terminated(BaseException):
    """SIGTERM, raised where the stage is, so that it unwinds as on Ctrl-C. A BaseException,
    as KeyboardInterrupt: code that catches Exception (a failing logger, a retrying upload) must
    not swallow it and train on."""


def _terminate(signum: int, frame: object) -> None:
    # A second SIGTERM (srun and torchrun each send one) must not cut the unwinding short: the
    # lock and the store's lease are given back in finally blocks.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


def run(main: Callable[[Sequence[str] | None], object]) -> None:
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        ensure_dvc_yaml_is_current(sys.argv[1:])
        main(None)
        # what is still buffered, written here: a reader gone shows below, not at interpreter exit
        sys.stdout.flush()
    except (ParamsError, StageError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:
        # the reader went away (`cse estimates | head`): what it read was all it wanted; the
        # rest is dropped quietly, as by `ls | head` (Python docs, "Note on SIGPIPE")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    except OSError as err:
        if err.errno not in REMEDIES:
            raise
        preposition, remedy = REMEDIES[err.errno]
        where = f" {preposition} {destination_of(Path(err.filename))}" if err.filename else ""
        print(
            f"error: {err.strerror}{where}. Nothing this stage cut short is left looking "
            f"finished; {remedy} and rerun (finished outputs are reused).",
            file=sys.stderr,
        )
        sys.exit(2)
    except (KeyboardInterrupt, Terminated) as stop:
        terminated = isinstance(stop, Terminated)
        # what the stage cut short says itself, as a note on the exception (the train stage:
        # which run folder is kept and the checkpoint a rerun resumes from)
        kept = "; ".join(getattr(stop, "__notes__", ())) or "a rerun redoes what was cut short"
        print(
            f"{'terminated (SIGTERM)' if terminated else 'interrupted'}: finished outputs are "
            f"intact and nothing cut short looks finished; {kept}",
            file=sys.stderr,
        )
        sys.exit(128 + signal.SIGTERM if terminated else 130)
    finally:
        signal.signal(signal.SIGTERM, previous)
