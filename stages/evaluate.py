"""Stage evaluate: score an experiment (or any model) with a registered evaluation.

    python -m stages.evaluate EVALUATION --experiment NAME [--params FILE]
    python -m stages.evaluate EVALUATION --model NAME_OR_DIR [...] --output results.json

EVALUATION is a name of the registry (``stages.core.schema.evaluation_settings.EVALUATIONS``:
senteval, mteb, sts_tsv, ...); its module in ``stages/evaluations/`` parses the rest
(``python -m stages.evaluate EVALUATION --help``). ``--experiment`` scores a run of the matrix
(its best checkpoint) or a ``baseline.<key>`` and writes ``experiments/<NAME>/<EVALUATION>.json``,
stored under the evaluation's id and reused when asked for again.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from stages.core import cli
from stages.core.errors import StageError
from stages.core.schema.evaluation_settings import EVALUATIONS
from stages.core.storage.input_guard import watch
from stages.evaluations import evaluation_module


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    registered = ", ".join(EVALUATIONS)
    if not args or args[0] in ("-h", "--help"):
        print(f"{__doc__}\nregistered evaluations: {registered}")
        return
    name, rest = args[0], args[1:]
    if name not in EVALUATIONS:
        raise StageError(f"unknown evaluation '{name}'; registered: {registered}")
    # every output of the evaluation is written from the params file it read, or none
    inputs = watch(Path(cli.params_file_of(rest)))
    with inputs.guarding():
        evaluation_module(name).main(rest)


if __name__ == "__main__":
    cli.run(main)
