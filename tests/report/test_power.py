"""The summary's power numbers and verdicts: the paired t-test's power against textbook values
and simulation, the Wilcoxon approximation against simulation of the exact test, and the
verdict of every comparison of random frames against its definition."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from stages.reporting.collect import RESULT_SCHEMA
from stages.reporting.comparison import (
    BETTER,
    COLLAPSED,
    COLLAPSED_UNIFORMITY,
    FLOOR,
    NO_DIFFERENCE,
    TOO_FEW,
    WORSE,
    compare,
    comparison_table,
    verdict,
)
from stages.reporting.power import (
    ALPHA,
    POWER,
    detectable_difference,
    detectable_effect,
    exact_wilcoxon_floor,
    seeds_needed,
    t_power,
    wilcoxon_level,
)

VERDICTS = {BETTER, WORSE, NO_DIFFERENCE, TOO_FEW}


def test_paired_t_power_reproduces_the_textbook_values() -> None:
    """G*Power and statsmodels' TTestPower (one-sample / paired t, two-sided, alpha 0.05):
    d = 0.5 needs 34 pairs for power 0.8 (statsmodels: 33.37), d = 0.8 needs 15 (14.30);
    10 pairs detect d = 1 with power 0.8031; at power 0.8, 5 pairs detect d = 1.6820,
    3 pairs d = 3.2640, 2 pairs d = 11.550 (statsmodels' solve_power)."""
    assert seeds_needed(0.5, 1.0) == 34
    assert seeds_needed(0.8, 1.0) == 15
    assert t_power(1.0, 10) == pytest.approx(0.80310, abs=5e-5)
    assert detectable_effect(5) == pytest.approx(1.68200, abs=5e-5)
    assert detectable_effect(3) == pytest.approx(3.26404, abs=5e-5)
    assert detectable_effect(2) == pytest.approx(11.5499, abs=5e-4)
    # in the measure's points: the standardised effect times the observed std of the differences
    assert detectable_difference(0.4, 5) == pytest.approx(0.4 * 1.68200, abs=5e-5)
    assert detectable_difference(None, 1) is None and seeds_needed(0.5, None) is None
    assert detectable_effect(1) == math.inf


@pytest.mark.parametrize("n", [3, 5, 10])
def test_the_detectable_difference_is_detected_four_times_in_five(n: int) -> None:
    """Simulated paired t-tests: normal differences with the detectable mean are significant
    in 80% of 20,000 samples, with no difference in 5%."""
    rng = np.random.default_rng(n)
    shifted = rng.normal(detectable_effect(n), 1.0, size=(20_000, n))
    null = rng.normal(0.0, 1.0, size=(20_000, n))
    power = (stats.ttest_1samp(shifted, 0.0, axis=1).pvalue < ALPHA).mean()
    size = (stats.ttest_1samp(null, 0.0, axis=1).pvalue < ALPHA).mean()
    assert power == pytest.approx(POWER, abs=0.015)
    assert size == pytest.approx(ALPHA, abs=0.006)


def test_the_wilcoxon_levels_are_the_exact_tests() -> None:
    """Below 6 pairs the exact two-sided signed-rank p cannot reach 0.05 (2 / 2^n: 0.0625 at
    5); from 6 the attainable levels are scipy's own exact p-values (0.03125 at 6, 0.0469 at
    7, the textbook critical value T = 2)."""
    assert exact_wilcoxon_floor() == 6
    assert stats.wilcoxon(np.arange(1.0, 6.0)).pvalue == pytest.approx(0.0625)
    assert [wilcoxon_level(n) for n in range(1, 6)] == [0.0] * 5
    assert wilcoxon_level(6) == pytest.approx(stats.wilcoxon(np.arange(1.0, 7.0)).pvalue)
    seven = [1.0, -2.0, 3.0, 4.0, 5.0, 6.0, 7.0]  # negative-rank sum T = 2
    assert wilcoxon_level(7) == pytest.approx(stats.wilcoxon(seven).pvalue)
    assert wilcoxon_level(7) == pytest.approx(6 / 128)
    assert detectable_effect(5, "wilcoxon") == math.inf
    assert detectable_difference(0.3, 5, "wilcoxon") == math.inf
    assert seeds_needed(0.5, 1.0, "wilcoxon") > seeds_needed(0.5, 1.0)


@pytest.mark.parametrize("n", [6, 8, 12, 20])
def test_the_wilcoxon_approximation_holds_for_the_exact_test(n: int) -> None:
    """scipy's exact signed-rank test on normal differences with the mean the approximation
    calls detectable: power within 0.06 of 0.8 (4,000 samples; 0.75 at 6 pairs, 0.80-0.81 from
    7 on, in 40,000). The efficiency alone, at level 0.05, would promise 0.8 where the exact
    test at 6 pairs gives 0.65."""
    rng = np.random.default_rng(n)
    shifted = rng.normal(detectable_effect(n, "wilcoxon"), 1.0, size=(4_000, n))
    power = (stats.wilcoxon(shifted, axis=1).pvalue < ALPHA).mean()
    assert power == pytest.approx(POWER, abs=0.06)


@settings(max_examples=40, deadline=None)
@given(
    min_effect=st.floats(0.05, 5.0),
    sd=st.floats(0.01, 5.0),
    test=st.sampled_from(["paired_t", "wilcoxon"]),
)
def test_seeds_needed_is_the_first_count_whose_detectable_difference_is_small_enough(
    min_effect: float, sd: float, test: str
) -> None:
    needed = seeds_needed(min_effect, sd, test)
    if needed is None:  # beyond any run: even 10,000 seeds miss it
        assert detectable_difference(sd, 10_000, test) > min_effect
        return
    assert detectable_difference(sd, needed, test) <= min_effect * (1 + 1e-9)
    floor = exact_wilcoxon_floor() if test == "wilcoxon" else 2
    for fewer in range(max(floor, needed - 3), needed):
        assert detectable_difference(sd, fewer, test) > min_effect


def test_verdicts_follow_their_definitions() -> None:
    assert verdict(1.0, 0.01, 0.8, 0.5) == BETTER  # significant: whatever the power
    assert verdict(-1.0, 0.01, 0.3, 0.5) == WORSE
    assert verdict(0.1, 0.6, 0.3, 0.5) == NO_DIFFERENCE  # would have seen 0.5
    assert verdict(0.1, 0.6, 0.9, 0.5) == TOO_FEW  # underpowered: not significant means little
    assert verdict(0.1, 0.6, 0.9, 1.0) == NO_DIFFERENCE  # a user who cares about 1 point only
    assert verdict(0.7, None, None, 0.5) == TOO_FEW  # one paired seed
    assert verdict(0.0, None, 0.0, 0.5) == NO_DIFFERENCE  # identical on every seed


def rows(method: str, values: dict[int, float], task: str = "STS_avg", metric: str = "spearman"):
    return [
        {"experiment": f"{method}.bert.s{seed}", "kind": "run", "run_id": "x", "method": method,
         "backbone": "bert", "seed": seed, "source": "senteval", "task": task, "metric": metric,
         "value": value}
        for seed, value in values.items()
    ]  # fmt: skip


def frame(*parts: list[dict]) -> pl.DataFrame:
    return pl.DataFrame([r for part in parts for r in part], schema=RESULT_SCHEMA)


def test_clear_cases_get_the_verdict_a_reader_expects() -> None:
    rng = np.random.default_rng(0)
    seeds = range(1, 11)
    base = {s: 76.0 + rng.normal(0, 0.5) for s in seeds}
    shift = {s: rng.normal(0, 0.2) for s in seeds}  # paired noise, sd about 0.2
    results = frame(
        rows("simcse", base),
        rows("better", {s: base[s] + 2 + shift[s] for s in seeds}),
        rows("worse", {s: base[s] - 2 + shift[s] for s in seeds}),
        rows("same", {s: base[s] + shift[s] for s in seeds}),
        rows("few", {s: base[s] + 0.3 + 3 * shift[s] for s in (1, 2, 3)}),
        rows("one", {1: base[1] + 5}),
    )
    comparison = compare(results, "simcse", min_effect=0.5)
    got = dict(comparison.select("method", "verdict").rows())
    assert got == {"better": BETTER, "worse": WORSE, "same": NO_DIFFERENCE, "few": TOO_FEW,
                   "one": TOO_FEW}  # fmt: skip
    few = comparison.filter(method="few").row(0, named=True)
    assert few["p_value"] > ALPHA and few["detectable"] > 0.5  # underpowered, not "no effect"
    assert few["seeds_needed"] > 3
    same = comparison.filter(method="same").row(0, named=True)
    assert same["detectable"] <= 0.5 and same["seeds_needed"] <= 10
    table = comparison_table(comparison, "simcse")
    detectable = {row[1]: row[table.header.index("detectable difference")] for row in table.rows}
    assert detectable["few"].endswith("(underpowered)") and detectable["one"] == "–"
    assert table.header[table.header.index("seeds paired") + 2] == "seeds to detect 0.50"
    # the same seeds under a user's larger min_effect: no longer underpowered
    relaxed = compare(results, "simcse", min_effect=few["detectable"] + 0.1)
    assert relaxed.filter(method="few")["verdict"].item() == NO_DIFFERENCE
    # Wilcoxon with 3 seeds cannot reject: every comparison with fewer than 6 is too few
    wilcoxon = compare(results, "simcse", "wilcoxon", min_effect=0.5)
    assert wilcoxon.filter(method="few")["detectable"].item() == math.inf
    assert wilcoxon.filter(method="better")["verdict"].item() == BETTER
    assert "asymptotic relative efficiency" in comparison_table(wilcoxon, "simcse").note


@pytest.mark.filterwarnings("ignore:Precision loss occurred:RuntimeWarning")  # noise 0
@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 8),
    shift=st.floats(-3, 3),
    noise=st.floats(0.0, 2.0),
    min_effect=st.sampled_from([0.25, 0.5, 1.0]),
    seed=st.integers(0, 2**16),
    test=st.sampled_from(["paired_t", "wilcoxon"]),
)
def test_every_verdict_of_a_random_frame_matches_its_test_and_power(
    n: int, shift: float, noise: float, min_effect: float, seed: int, test: str
) -> None:
    rng = np.random.default_rng(seed)
    base = {s: 75 + rng.normal(0, 1) for s in range(n)}
    ours = {s: base[s] + shift + rng.normal(0, noise) for s in range(n)}
    (row,) = compare(
        frame(rows("simcse", base), rows("m", ours)), "simcse", test, min_effect=min_effect
    ).iter_rows(named=True)
    diffs = np.array([ours[s] - base[s] for s in range(n)])
    assert row["verdict"] in VERDICTS and row["n_pairs"] == n
    if n < 2:
        assert row["verdict"] == TOO_FEW and row["detectable"] is None
        return
    sd = float(np.std(diffs, ddof=1))
    assert row["sd_diff"] == pytest.approx(sd)
    assert row["detectable"] == pytest.approx(detectable_difference(sd, n, test))
    significant = row["p_value"] is not None and row["p_value"] < ALPHA
    if test == "paired_t" and sd > 1e-9:
        expected = stats.ttest_rel(list(ours.values()), list(base.values())).pvalue
        assert row["p_value"] == pytest.approx(expected)
    if significant:
        assert row["verdict"] == (BETTER if diffs.mean() > 0 else WORSE)
    elif row["detectable"] > min_effect:
        assert row["verdict"] == TOO_FEW
    else:
        assert row["verdict"] == NO_DIFFERENCE


def test_a_collapsed_seed_is_named_in_the_summary() -> None:
    """A seed whose transfer task sits at its majority-class rate learned nothing: the
    summary names it on its side of every comparison, both measures."""
    base, ours = {1: 76.0, 2: 77.0}, {1: 78.0, 2: 76.5}
    results = frame(
        rows("simcse", base), rows("m", ours),
        rows("simcse", {1: 80.0, 2: 81.0}, "TR_avg", "accuracy"),
        rows("m", {1: 57.0, 2: 82.0}, "TR_avg", "accuracy"),
        rows("simcse", {1: 80.0, 2: 81.0}, "MR", "accuracy"),
        rows("m", {1: 50.0, 2: 82.0}, "MR", "accuracy"),  # seed 1: always one class
    )  # fmt: skip
    comparison = compare(results, "simcse", min_effect=0.5, majority={"MR": 50.0})
    assert comparison["collapsed_seeds"].to_list() == ["1", "1"]
    assert comparison["baseline_collapsed_seeds"].to_list() == [None, None]
    table = comparison_table(comparison, "simcse")
    assert all(row[-2].endswith("‡ seed 1") for row in table.rows)
    assert "majority-class rate" in table.note
    plain = compare(results, "simcse", min_effect=0.5)
    assert plain["collapsed_seeds"].to_list() == [None, None]


MAJORITY = {"MR": 50.0, "CR": 63.76}


def transfer(method: str, mr: dict[int, float], cr: dict[int, float]) -> list[dict]:
    """A side's MR and CR accuracies per seed and their average, as SentEval reports them."""
    average = {seed: (mr[seed] + cr[seed]) / 2 for seed in mr}
    return [
        *rows(method, mr, "MR", "accuracy"),
        *rows(method, cr, "CR", "accuracy"),
        *rows(method, average, "TR_avg", "accuracy"),
    ]


def test_two_sides_at_the_majority_class_read_as_floor_not_as_a_powered_null() -> None:
    """Both sides at every transfer task's majority-class rate on every seed: their difference
    is 0.00 [0.00, 0.00] with a detectable difference of 0.00, which the paired test calls
    "no detectable difference"; the verdict says neither learned anything. One side above it
    on one seed is a comparison again."""
    seeds = (1, 2, 3)
    chance = {s: 50.0 for s in seeds}, {s: 63.76 for s in seeds}
    sts = rows("simcse", {1: 30.0, 2: 31.0, 3: 29.0}), rows("m", {1: 31.0, 2: 32.1, 3: 29.9})
    floor = compare(
        frame(*sts, transfer("simcse", *chance), transfer("m", *chance)),
        "simcse",
        min_effect=0.5,
        majority=MAJORITY,
    )
    verdicts = dict(floor.select("measure", "verdict").rows())
    assert verdicts == {"STS avg": BETTER, "transfer avg": FLOOR}
    row = floor.filter(measure="transfer avg").row(0, named=True)
    assert (row["diff"], row["detectable"]) == (0.0, 0.0)  # what read as a powered null
    assert verdict(row["diff"], row["p_value"], row["detectable"], 0.5) == NO_DIFFERENCE
    table = comparison_table(floor, "simcse")
    assert table.rows[1][3] == "floor: neither side above the majority class"
    assert "floor (transfer)" in table.note and "majority-class rate" in table.note

    learned = {1: 75.0, 2: 63.76, 3: 63.76}  # seed 1 above chance on CR: it learned something
    one_side = compare(
        frame(*sts, transfer("simcse", *chance), transfer("m", chance[0], learned)),
        "simcse",
        min_effect=0.5,
        majority=MAJORITY,
    )
    assert one_side.filter(measure="transfer avg")["verdict"].item() == TOO_FEW
    # without the rates (no SentEval data and none recorded) nothing is known to be at chance
    unknown = compare(
        frame(*sts, transfer("simcse", *chance), transfer("m", *chance)), "simcse", min_effect=0.5
    )
    assert unknown.filter(measure="transfer avg")["verdict"].item() == NO_DIFFERENCE


def test_two_collapsed_encoders_read_as_collapsed_on_both_measures() -> None:
    """Both sides' STS-B dev uniformity near 0 (every sentence embedded alike) on every paired
    seed: "collapsed", even where the test finds a difference; a spread side, or a seed of
    either side that spread, is a comparison again."""
    seeds = (1, 2, 3)
    base_sts = {1: 20.0, 2: 21.0, 3: 20.5}
    sts = rows("simcse", base_sts), rows("m", {s: v + 3 + s / 10 for s, v in base_sts.items()})
    tr = (
        transfer("simcse", {s: 55.0 for s in seeds}, {s: 70.0 for s in seeds}),
        transfer("m", {s: 56.0 + s / 10 for s in seeds}, {s: 71.0 for s in seeds}),
    )

    def uniformity(method: str, values: dict[int, float]) -> list[dict]:
        return rows(method, values, "STSBenchmark_dev", "uniformity")

    both = frame(
        *sts,
        *tr,
        uniformity("simcse", {1: -0.01, 2: -0.0, 3: -0.04}),
        uniformity("m", {1: -0.02, 2: -0.03, 3: -0.001}),
    )
    verdicts = compare(both, "simcse", min_effect=0.5, majority=MAJORITY)["verdict"].to_list()
    assert verdicts == [COLLAPSED, COLLAPSED]
    assert COLLAPSED == "collapsed: neither side's embeddings spread apart"
    spread_seed = frame(
        *sts,
        *tr,
        uniformity("simcse", {1: -0.01, 2: -0.0, 3: -0.04}),
        uniformity("m", {1: -0.02, 2: -2.5, 3: -0.001}),  # seed 2 spread
    )
    verdicts = compare(spread_seed, "simcse", min_effect=0.5, majority=MAJORITY)["verdict"]
    assert verdicts.to_list() == [BETTER, BETTER]
    assert pytest.approx(math.log(0.95)) == COLLAPSED_UNIFORMITY
    just_below = frame(
        *sts,
        *tr,
        uniformity("simcse", {s: COLLAPSED_UNIFORMITY for s in seeds}),
        uniformity("m", {s: COLLAPSED_UNIFORMITY - 1e-6 for s in seeds}),
    )
    verdicts = compare(just_below, "simcse", min_effect=0.5)["verdict"].to_list()
    assert verdicts == [BETTER, BETTER]
