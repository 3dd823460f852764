"""Pipeline stages (one module each, runnable as ``python -m stages.<name>``) and their
building blocks (sub-packages named for what they are)."""

import os
import sys

# Threads: a job's share of the cores arrives as OMP_NUM_THREADS (Snakemake sets it, and the
# MKL/BLAS variables, to the rule's `threads`; torch reads it); polars and the tokenizers have
# variables of their own, read when they load: they follow it unless set themselves. A stage run
# by hand with none set uses every core.
if "OMP_NUM_THREADS" in os.environ:
    for _variable in ("POLARS_MAX_THREADS", "RAYON_NUM_THREADS"):
        os.environ.setdefault(_variable, os.environ["OMP_NUM_THREADS"])

_previous_excepthook = sys.excepthook


def _interrupted_while_starting(kind, value, traceback) -> None:
    """A stage's Ctrl-C before its ``cli.run`` handles it (while it imports, before anything
    is written): one line instead of the traceback of whatever import it cut short; under
    ``python -X dev`` (or anything else) the excepthook that was there before."""
    if issubclass(kind, KeyboardInterrupt) and not sys.flags.dev_mode:
        print("interrupted while starting: nothing was written", file=sys.stderr)
    else:
        _previous_excepthook(kind, value, traceback)


# ``python -m stages.<name>`` imports this package while sys.argv[0] is still "-m" (runpy sets
# the module's path only afterwards): stage processes only, not a library user's.
if sys.argv[:1] == ["-m"]:
    sys.excepthook = _interrupted_while_starting
