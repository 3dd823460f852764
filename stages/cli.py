"""Command-line plumbing shared by the stage modules: the common flags and clean failures.

Each stage module ends with ``if __name__ == "__main__": run(main)``. Expected failures (bad
params, missing or corrupt data, a diverged run) are ``StageError``s and end the process with
one readable message and exit status 2 instead of a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from stages.params import DEFAULT_PARAMS, ParamsError


class StageError(RuntimeError):
    """An expected failure with a message that says what is wrong and where."""


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--params", default=str(DEFAULT_PARAMS), help="params file (default: params.yaml)"
    )
    return p


def run(main: Callable[[Sequence[str] | None], object]) -> None:
    try:
        main(None)
    except (ParamsError, StageError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(
            "interrupted: finished outputs are intact, partial ones were discarded", file=sys.stderr
        )
        sys.exit(130)
