"""The whole smoke preset (every objective family, two seeds for two methods, a temperature and
a margin sweep point) under both orchestrators, and the report with every table and figure: in CI
with its runs cut to 40 steps (`ci_sized`), in the release tier (`-m full`) as committed. A module
of its own, so that pytest-xdist runs it beside tests/test_end_to_end.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml
from project_copy import project_copy
from test_end_to_end import SMOKE, check_report, ci_sized, dvc_repro, run_ids, snakemake

pytestmark = pytest.mark.e2e  # orchestrator runs: pytest -m e2e


def smoke_preset(size: str) -> dict[str, Any]:
    """presets/smoke.yaml as committed, or its runs cut to CI's size (`ci_sized`)."""
    params = yaml.safe_load(SMOKE.read_text())
    return ci_sized(params) if size == "ci" else params


@pytest.mark.parametrize(
    "size",
    # as committed (200-step runs) under both orchestrators it takes about half an hour on two
    # cores: beyond the timeout every other test keeps to
    ["ci", pytest.param("preset", marks=[pytest.mark.full, pytest.mark.timeout(5400)])],
    ids=["ci-sized", "as committed"],
)
def test_smoke_preset_yields_every_table_and_figure_under_both_orchestrators(
    tmp_path: Path, size: str
) -> None:
    experiments = [f"{m}.tiny-bert.s{s}" for m in ("simcse", "arccon") for s in (42, 43)] + [
        f"{m}.tiny-bert.s42"
        for m in ("arccse", "simace", "tcc", "align_uniform", "mat", "barlow_twins_modified",
                  "simcse-tau-0_1", "simace_margin_neg")
    ]  # fmt: skip
    # One run store for both copies: the cut-down test in test_end_to_end.py trains under each tool
    # and compares the numbers; here DVC's stages for the whole preset take Snakemake's runs from
    # the store.
    store = tmp_path / "runs"
    params = smoke_preset(size)
    by_snakemake = project_copy(tmp_path / "snakemake", params)
    snakemake(by_snakemake, runs_dir=store)
    rerun = snakemake(by_snakemake, runs_dir=store)
    assert "Nothing to be done" in rerun
    tidy = check_report(by_snakemake, experiments)
    assert {"senteval", "mteb"} <= set(tidy["source"].unique())

    report = (by_snakemake / "reports" / "results" / "report.md").read_text()
    figures = sorted((by_snakemake / "reports" / "results" / "figures").glob("*.png"))
    assert {f.stem for f in figures} >= {"training_curves", "alignment_uniformity",
                                         "gradient_norms", "angle_distributions",
                                         "temperature_sweep", "margin_ablation"}  # fmt: skip
    assert all(f"figures/{f.name}" in report for f in figures)
    significance = pl.read_csv(by_snakemake / "reports" / "results" / "significance.csv")
    assert "arccon" in significance["method"].to_list()

    by_dvc = project_copy(tmp_path / "dvc", params)
    dvc_repro(by_dvc, store)
    assert "Running stage" not in dvc_repro(by_dvc, store)
    check_report(by_dvc, experiments)
    assert run_ids(by_snakemake, experiments) == run_ids(by_dvc, experiments)
