"""The pipeline's expected failures: each carries one readable message naming what is wrong and
where. Stage CLIs print it and exit with status 2 instead of a traceback (``stages.cli``)."""


class StageError(RuntimeError):
    """An expected failure: bad or missing data, an unfinished upstream stage, a diverged run."""


class ParamsError(ValueError):
    """A params file is invalid; the message lists every problem with its key path."""
