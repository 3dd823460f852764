"""The dry run's seeds table: each method's seeds against the baseline method's, the spread the
papers print (or SimCSE's, named), and what the paired seeds can detect."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from stages.core.identity.experiments import plan_experiments
from stages.core.schema.params import load_params
from stages.reference import published
from stages.reporting.power import detectable_difference, seeds_needed
from stages.reporting.seed_power import format_seed_power, seed_power

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def simace_rows() -> dict[tuple[str, str], object]:
    plan = plan_experiments(load_params(REPO / "presets" / "simace.yaml"))
    return {(r.method, r.backbone): r for r in seed_power(plan)}


def test_a_method_with_a_printed_spread_is_judged_by_it(simace_rows: dict) -> None:
    """SimACE on BERT-base, five seeds against SimCSE's five: SimACE Table 2's 0.47, SimCSE's
    largest printed spread on BERT-base (the cool-down paper's Table 8, 0.71)."""
    row = simace_rows["simace", "bert-base"]
    assert (row.seeds, row.baseline_seeds) == (5, 5)
    assert (row.spread.sd, row.spread.source) == (0.47, "simace Table 2, 5 seeds")
    assert (row.baseline_spread.sd, row.baseline_spread.source) == (
        0.71, "cooldown Table 8, 3 seeds"
    )  # fmt: skip
    sd = math.hypot(0.47, 0.71)
    assert row.detectable == pytest.approx(detectable_difference(sd, 5))
    assert row.seeds_needed == seeds_needed(0.5, sd)
    assert 1.0 < row.detectable < 2.0  # 5 pairs detect about 1.7 standard deviations (0.85)


def test_a_method_without_one_borrows_simcses_and_says_so(simace_rows: dict) -> None:
    row = simace_rows["simace_no_margin", "roberta-base"]
    assert row.spread.source == "simcse's on roberta-base: simace Table 2, 5 seeds"
    assert row.seeds == 1 and row.detectable is None  # one seed: no test at all


def test_the_baseline_method_is_not_compared_with_itself(simace_rows: dict) -> None:
    assert not any(method == "simcse" for method, _ in simace_rows)


def test_a_tiny_backbone_falls_back_to_simcse_on_bert_base() -> None:
    plan = plan_experiments(load_params(REPO / "presets" / "smoke.yaml"))
    rows = {(r.method, r.backbone): r for r in seed_power(plan)}
    arccon = rows["arccon", "tiny-bert"]
    assert arccon.spread.source.startswith("simcse's on bert-base: ")
    assert (arccon.seeds, arccon.baseline_seeds) == (2, 2)
    # two pairs: the t-test's one degree of freedom needs a difference of many spreads
    assert arccon.detectable == pytest.approx(
        detectable_difference(math.hypot(arccon.spread.sd, arccon.baseline_spread.sd), 2)
    )


def test_every_printed_spread_is_a_positive_number_of_points() -> None:
    spreads = published().filter(published()["aggregation"] == "std")["value"].drop_nulls()
    assert spreads.min() > 0 and spreads.max() < 5


def test_the_dry_run_prints_the_seeds_table() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "stages.commands", "estimates", "--params", "presets/simace.yaml",
         "--gpu", "h100"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    plan = plan_experiments(load_params(REPO / "presets" / "simace.yaml"))
    table = format_seed_power(plan, seed_power(plan))
    assert table in out
    assert "seeds against simcse (paired_t" in out
    assert "simace             bert-base       5/5" in out
