"""presets/smoke_arccse_margin.yaml: ArcCSE's margin swept by a grid on the smoke backbone.
After presets/smoke.yaml's own ArcCSE run, the sweep trains only the new margins and the report
draws the margin figure from the three points."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import yaml
from project_copy import project_copy
from test_end_to_end import run, snakemake

PRESETS = ("presets/smoke.yaml", "presets/smoke_arccse_margin.yaml")

pytestmark = pytest.mark.e2e  # orchestrator runs: the e2e tier


def shortened(root: Path) -> None:
    """Both presets on fewer sentences (the same in both: the shared run keeps its id)."""
    for preset in PRESETS:
        raw = yaml.safe_load((root / preset).read_text())
        raw["data"]["max_sentences"] = 640
        raw["evaluations"]["mteb"]["enabled"] = False
        raw["evaluations"]["senteval"]["tasks"] = ["STSBenchmark"]
        raw["figures"]["batches"] = 20
        (root / preset).write_text(yaml.safe_dump(raw, sort_keys=False))


def runs(root: Path) -> set[str]:
    """The trained runs (the stored evaluations live beside them, in runs/evaluations/)."""
    return {p.name for p in (root / "runs").iterdir() if p.is_dir() and p.name != "evaluations"}


def test_the_margin_sweep_reuses_the_smoke_run_and_draws_the_margin_figure(tmp_path: Path):
    root = project_copy(tmp_path, None)
    shortened(root)
    target = "experiments/arccse.tiny-bert.s42/train.json"  # before the options taking lists
    run(["snakemake", target, "--cores", "1", "--resources", "gpu=1", "--config",
         f"params={PRESETS[0]}"], root)  # fmt: skip
    before = runs(root)
    assert len(before) == 1

    snakemake(root, "--config", f"params={PRESETS[1]}")
    assert before < runs(root) and len(runs(root) - before) == 2  # margins 5 and 15 only
    figure = root / "reports" / "results" / "figures" / "margin_ablation.png"
    assert figure.stat().st_size > 0
    tidy = pl.read_parquet(root / "reports" / "results" / "results.parquet")
    swept = tidy.filter(pl.col("task") == "STS_avg")["method"].unique().sort().to_list()
    assert swept == [f"arccse[margin_deg={m}]" for m in (10, 15, 5)]
