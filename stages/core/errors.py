"""The pipeline's expected failures: each carries one readable message naming what is wrong and
where. Stage CLIs print it and exit with status 2 instead of a traceback (``stages.core.cli``)."""

import zipfile

# What reading a damaged cache .npz raises: a truncated archive (BadZipFile), a member missing or
# cut short (KeyError, ValueError, EOFError), a file that cannot be read (OSError). A cache entry
# that raises one is a miss, computed again and rewritten.
UNREADABLE_NPZ = (zipfile.BadZipFile, KeyError, ValueError, EOFError, OSError)


class StageError(RuntimeError):
    """An expected failure: bad or missing data, an unfinished upstream stage, a diverged run."""


class ParamsError(ValueError):
    """A params file is invalid; the message lists every problem with its key path."""
