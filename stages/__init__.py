"""Pipeline stages (one module each, runnable as ``python -m stages.<name>``) and their
building blocks (sub-packages named for what they are)."""

import sys

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
