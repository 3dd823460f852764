"""The dry run: every experiment of the matrix with its run id and the estimated GPU minutes of its
train, senteval and mteb jobs, and the totals (the arithmetic: ``stages.core.planning.estimates``).

    python -m stages.commands.estimates [--params FILE]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from stages.core.planning.estimates import dry_run, format_dry_run
from stages.core.schema.params import DEFAULT_PARAMS, load_params


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    args = parser.parse_args(argv)
    params = load_params(args.params)
    print(f"dry run of {args.params}")
    print(format_dry_run(params, dry_run(params, args.params)))


if __name__ == "__main__":
    from stages.core.cli import run

    run(main)
