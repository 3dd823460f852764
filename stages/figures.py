"""Stage `figures`: the papers' analyses that need no training (paper 002's Section 3.1
simulations, paper 003's gradient norms against the angles), from the objectives module: the
figures of ``stages.reporting.registry`` whose stage is ``figures``.

    python -m stages.figures [--params params.yaml] [--out reports/analyses]

Reads the ``figures`` section of params; writes <out>/<figure>.png, <figure>.csv for every figure
and index.json (title, paper, the paper's figure number, caption, files, the params used). The
folder is replaced as a whole, atomically. Seeded and float64: the CSVs are identical run to run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stages.core.cli import parser, run
from stages.core.planning.jobs import stage_fingerprint
from stages.core.schema.params import FiguresParams, load_params
from stages.core.storage import layout
from stages.core.storage.atomic import atomic_path, write_json
from stages.core.storage.input_guard import watch
from stages.reporting.plots import save
from stages.reporting.registry import drawn_by

DEFAULT_OUT = layout.analyses_dir()


def write_figures(params: FiguresParams, out: Path, job_fingerprint: str) -> list[str]:
    """Compute and render every figure into ``out``; returns the figure names. ``index.json``
    records ``job_fingerprint`` (``stages.core.planning.jobs.stage_fingerprint``)."""
    entries = []
    with atomic_path(out) as tmp:
        tmp.mkdir()
        for figure in drawn_by("figures"):
            for plot in figure.plots(params):
                save(plot, tmp)
                entries.append(
                    {
                        "name": plot.name,
                        "title": figure.title,
                        "paper": figure.paper,
                        "paper_figure": figure.paper_figure,
                        "caption": plot.caption,
                        "png": f"{plot.name}.png",
                        "csv": f"{plot.name}.csv",
                    }
                )
        index = {
            "figures": entries,
            "params": params.model_dump(),
            "job_fingerprint": job_fingerprint,
        }
        write_json(tmp / "index.json", index)
    return [entry["name"] for entry in entries]


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    args = p.parse_args(argv)
    inputs = watch(Path(args.params))
    params = load_params(args.params)
    with inputs.guarding():
        names = write_figures(params.figures, args.out, stage_fingerprint(params, "figures"))
    print(f"wrote {len(names)} figures to {args.out}: {', '.join(names)}")


if __name__ == "__main__":
    run(main)
