"""Every figure of the report, the papers' analyses included, in the order the report shows
them: its name, title, the stage that draws it, the data it reads and the function that draws
it (which also writes its caption, true of what it draws: the caption can depend on the data).

Two stages draw them. The ``report`` stage draws its own from what the runs wrote
(``ReportData``) into reports/results/figures/. The ``figures`` stage draws the analyses that
need no training from the ``figures`` params into reports/analyses/ (PNG, CSV and index.json
with each title and caption); the report embeds those as that stage wrote them. Adding a
figure is one function that returns a ``Plot`` (or None where its data are absent) and one
entry here (docs/figures.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl

from stages import analyses
from stages.core.schema.params import Params
from stages.core.storage import layout
from stages.reporting import plots
from stages.reporting.collect import Collected, stsb_dev_angles
from stages.reporting.forest import forest_plot

Stage = Literal["report", "figures"]
Section = Literal["summary", "figures"]
PAPER_002 = "002: Towards Better Understanding of Contrastive SRL: A Unified Paradigm for Gradient"
PAPER_003 = "003: On the Inadequacy of Optimizing Alignment and Uniformity in Contrastive SRL"


@dataclass(frozen=True)
class ReportData:
    """What the report stage's figures are drawn from."""

    collected: Collected
    params: Params
    published: pl.DataFrame  # stages.reference.published()
    comparison: pl.DataFrame  # stages.reporting.comparison.compare
    root: Path  # the project folder the runs are under

    def stsb_dev_angles(self) -> dict[str, dict[str, np.ndarray]]:
        """experiment -> STS-B dev angles of its final model, for the runs whose SentEval
        embeddings are in the cache."""
        data_dir = self.root / self.params.evaluations.senteval.data_dir
        cache = self.root / layout.embedding_cache_dir()
        angles = {}
        for experiment, fingerprint in self.collected.encoders.items():
            found = stsb_dev_angles(data_dir, cache, fingerprint)
            if found is not None:
                angles[experiment] = found
        return angles


Drawn = plots.Plot | list[plots.Plot] | None


@dataclass(frozen=True)
class Figure:
    """One registered figure. ``draw`` takes ``ReportData`` (stage ``report``) or the figures
    params (stage ``figures``) and returns its plot, None where its data are absent, or, for a
    family (the sweeps: one PNG per swept setting), a list; a single figure's plot is named
    ``name``, its PNG ``<name>.png``."""

    name: str
    title: str
    stage: Stage
    reads: str  # the data it is drawn from, as a reader would look for them
    draw: Callable[[Any], Drawn]
    section: Section = "figures"  # the report's section: the summary or the figures
    paper: str = ""  # the paper whose figure it regenerates
    paper_figure: str = ""  # that figure's number in the paper

    @property
    def heading(self) -> str:
        """Its title as the report shows it: with the paper's figure it regenerates."""
        if not self.paper:
            return self.title
        return f"{self.title} (paper {self.paper.split(':')[0]}, {self.paper_figure})"

    def plots(self, source: Any) -> list[plots.Plot]:
        drawn = self.draw(source)
        if drawn is None:
            return []
        return drawn if isinstance(drawn, list) else [drawn]


FIGURES: tuple[Figure, ...] = (
    Figure(
        name="summary_forest",
        title="Each method against the baseline method",
        stage="report",
        reads="the comparison of each method with report.baseline_method (comparison.csv)",
        draw=lambda d: forest_plot(
            d.comparison, d.params.report.baseline_method, d.params.report.min_effect
        ),
        section="summary",
    ),
    Figure(
        name="training_curves",
        title="Training curves",
        stage="report",
        reads="experiments/<name>/train_steps.csv, dev_evals.csv",
        draw=lambda d: plots.training_curves(d.collected.curves),
    ),
    Figure(
        name="alignment_uniformity",
        title="Alignment and uniformity on STS-B dev over training",
        stage="report",
        reads="experiments/<name>/dev_evals.csv",
        draw=lambda d: plots.alignment_uniformity(d.collected.curves),
    ),
    Figure(
        name="gradient_norms",
        title="Gradient norms in training",
        stage="report",
        reads="experiments/<name>/train_steps.csv (batch_infonce_grad_pos/neg, grad_norm)",
        draw=lambda d: plots.gradient_norms(d.collected.curves),
    ),
    Figure(
        name="batch_angles",
        title="Angles in training batches",
        stage="report",
        reads="experiments/<name>/train_steps.csv (batch_pos/neg_angle_deg)",
        draw=lambda d: plots.batch_angles(d.collected.curves),
    ),
    Figure(
        name="angle_distributions",
        title="Angles between the final models' embeddings of STS-B dev pairs",
        stage="report",
        reads="the SentEval stage's embedding cache, cache/embeddings/<encoder>/STSBenchmark.npz",
        draw=lambda d: plots.angle_distributions(d.stsb_dev_angles()),
    ),
    Figure(
        name="sweeps",
        title="STS avg. against a swept setting",
        stage="report",
        reads="the STS avg. of methods whose resolved settings differ only in one setting; "
        "stages/reference/published.csv",
        draw=lambda d: plots.sweep_plots(d.collected.planned, d.collected.results, d.published),
    ),
    Figure(
        name="final_gap_sweep",
        title="STS avg. and transfer avg. against the final d_ij",
        stage="report",
        reads="methods whose settings differ only in objective.margin: their STS avg., "
        "transfer avg. and the logged batch_euclidean_gap",
        draw=lambda d: plots.final_gap_plots(d.collected.planned, d.collected.results),
        paper=PAPER_003,
        paper_figure="Fig. 3a",
    ),
    Figure(
        name="gradient_dissipation",
        title="Mean gradient dissipation GD over simulated batches",
        stage="figures",
        reads="the figures params: paper 002's simulated angles",
        draw=analyses.gradient_dissipation_figure,
        paper=PAPER_002,
        paper_figure="Fig. 2 (ArcCon, MET) and Fig. 10 (InfoNCE, MPT), Section 3.1.1",
    ),
    Figure(
        name="hardest_negative_share",
        title="Share of the hardest negative in the exponential weight",
        stage="figures",
        reads="the figures params: paper 002's simulated angles",
        draw=analyses.hardest_negative_share_figure,
        paper=PAPER_002,
        paper_figure="Fig. 3, Section 3.1.2",
    ),
    Figure(
        name="dynamic_ratio",
        title="Dynamic ratios R of ArcCon and MET",
        stage="figures",
        reads="the figures params: the angle grid",
        draw=analyses.dynamic_ratio_figure,
        paper=PAPER_002,
        paper_figure="Fig. 4, Section 3.1.3",
    ),
    Figure(
        name="alignment_gradient_norms",
        title="Gradient norms of the alignment part",
        stage="figures",
        reads="the figures params: the angle grid, the negative counts",
        draw=analyses.alignment_gradient_norms_figure,
        paper=PAPER_003,
        paper_figure="Fig. 2a and 2b, Section 4",
    ),
    Figure(
        name="uniformity_gradient_norms",
        title="Gradient norms of the uniformity part (one negative)",
        stage="figures",
        reads="the figures params: the angle grid, the negative counts",
        draw=analyses.uniformity_gradient_norms_figure,
        paper=PAPER_003,
        paper_figure="Fig. 4, Appendix B",
    ),
    Figure(
        name="gradient_norm_curves",
        title="Gradient norms against the angle, closed form vs autograd",
        stage="figures",
        reads="the figures params: the curves' fixed angles, the negative counts",
        draw=analyses.gradient_norm_curves_figure,
        paper=PAPER_003,
        paper_figure="slices of Fig. 2a and Fig. 4 (eqs. 7, 9, 11, 16, 18, 19)",
    ),
)


def drawn_by(stage: Stage) -> list[Figure]:
    """The registered figures ``stage`` draws, in the report's order."""
    return [figure for figure in FIGURES if figure.stage == stage]
