"""What a process that imports ``stages`` sets up before anything heavy loads: the threads of a
job's share of the cores, a short OpenMP spin, and one line for a Ctrl-C during start-up.

It changes no number a stage computes (the thread count a run trained with is recorded in its
``execution``), so it sits in the core, outside every output's code identity
(``stages.core.identity.code``): tuning it retrains nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from types import TracebackType

# Each variable that follows OMP_NUM_THREADS unless set itself: polars' and the tokenizers'
# thread pools, read when they load.
THREAD_VARIABLES = ("POLARS_MAX_THREADS", "RAYON_NUM_THREADS")
# torch's OpenMP threads (GNU libgomp, read when torch loads) spin about 300k times at every
# barrier before they sleep; on a core another process also wants, each of a job's threads then
# waits for a descheduled sibling while burning the time it needs (a train job beside two busy
# processes: 117 s spinning, 38 s with a short spin; the same on a quiet machine).
OPENMP_SPIN = ("GOMP_SPINCOUNT", "10000")


def set_thread_variables(environ: MutableMapping[str, str]) -> None:
    """A job's share of the cores arrives as OMP_NUM_THREADS (Snakemake sets it, and the
    MKL/BLAS variables, to the rule's ``threads``; torch reads it): polars and the tokenizers
    follow it. A stage run by hand with none set uses every core. A user's own settings win."""
    if "OMP_NUM_THREADS" in environ:
        for variable in THREAD_VARIABLES:
            environ.setdefault(variable, environ["OMP_NUM_THREADS"])
    environ.setdefault(*OPENMP_SPIN)


def _interrupted_while_starting(
    kind: type[BaseException], value: BaseException, traceback: TracebackType | None
) -> None:
    """A stage's Ctrl-C before its ``cli.run`` handles it (while it imports, before anything
    is written): one line instead of the traceback of whatever import it cut short; under
    ``python -X dev`` (or anything else) Python's own hook."""
    if issubclass(kind, KeyboardInterrupt) and not sys.flags.dev_mode:
        print("interrupted while starting: nothing was written", file=sys.stderr)
    else:
        sys.__excepthook__(kind, value, traceback)


def prepare() -> None:
    set_thread_variables(os.environ)
    # ``python -m stages.<name>`` imports the package while sys.argv[0] is still "-m" (runpy sets
    # the module's path only afterwards): stage processes only, not a library user's.
    if sys.argv[:1] == ["-m"]:
        sys.excepthook = _interrupted_while_starting
