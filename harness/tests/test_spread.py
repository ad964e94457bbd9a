"""The timing statistics: medians with distribution-free intervals, ratios of medians, a strategy's rounds."""

from __future__ import annotations

import math
from itertools import combinations
from pathlib import Path

import pytest

from harness.results.reading import load_results
from harness.results.spread import (
    chance_flag,
    median_coverage,
    median_spread,
    ratio_of_medians,
    strategy_rounds,
)
from harness.tests.fixtures import make_results

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_coverage_of_the_range_and_of_inner_order_statistics() -> None:
    assert median_coverage(3, 1) == pytest.approx(0.75)
    assert median_coverage(5, 1) == pytest.approx(0.9375)
    assert median_coverage(9, 2) == pytest.approx(1 - 2 * 10 / 512)
    with pytest.raises(ValueError):
        median_coverage(3, 3)


def test_median_spread_is_the_range_up_to_eight_rounds_then_order_statistics() -> None:
    one = median_spread([4.0])
    assert (one.median, one.low, one.high, one.method) == (4.0, None, None, "one run: no interval")
    three = median_spread([3.0, 1.0, 2.0])
    assert (three.median, three.low, three.high, three.k) == (2.0, 1.0, 3.0, 1)
    assert "range" in three.method and "75.0%" in three.method
    nine = median_spread([float(v) for v in range(9)])
    assert (nine.low, nine.high, nine.k) == (1.0, 7.0, 2)
    assert nine.coverage is not None and nine.coverage >= 0.95
    # the short words for where the ends come from, as reports print them
    assert three.span() == "over 3 rounds" and three.span("times") == "over 3 times"
    assert nine.span() == "the 2nd to 8th smallest of 9 rounds"
    assert median_spread([float(v) for v in range(13)]).span() == "the 3rd to 11th smallest of 13 rounds"
    with pytest.raises(ValueError):
        median_spread([])
    with pytest.raises(ValueError):
        median_spread([1.0, math.nan])


def test_ratio_is_outside_the_noise_only_when_the_rounds_separate() -> None:
    slower = ratio_of_medians([10.0, 11.0, 12.0], [13.0, 14.0, 15.0])
    assert slower is not None
    assert slower.value == pytest.approx(14 / 11)
    assert (slower.low, slower.high) == pytest.approx((13 / 12, 15 / 10))
    assert slower.outside_noise
    assert "10.0%" in slower.method
    overlapping = ratio_of_medians([10.0, 11.0, 12.0], [11.5, 14.0, 15.0])
    assert overlapping is not None and not overlapping.outside_noise
    same = ratio_of_medians([10.0, 11.0, 12.0], [10.0, 11.0, 12.0])
    assert same is not None and same.value == 1.0 and not same.outside_noise
    single = ratio_of_medians([10.0], [20.0])
    assert single is not None and single.low is None and not single.outside_noise
    assert ratio_of_medians([0.0], [1.0]) is None
    reaching_zero = ratio_of_medians([0.0, 1.0, 2.0], [1.0, 2.0, 3.0])
    assert reaching_zero is not None and reaching_zero.high == math.inf


def test_a_time_moved_when_the_intervals_separate_by_the_resolution_or_more() -> None:
    from harness.results.spread import TIME_RESOLUTION_S, time_moved

    def moved(base: list[float], new: list[float]) -> bool | None:
        return time_moved(median_spread(base), median_spread(new))

    assert moved([10.0, 11.0, 12.0], [13.0, 14.0, 15.0]) is True
    assert moved([10.0, 11.0, 12.0], [7.0, 8.0, 9.0]) is True  # faster moves too
    assert moved([10.0, 11.0, 12.0], [11.5, 14.0, 15.0]) is False  # the intervals overlap
    assert moved([0.020, 0.021, 0.022], [0.040, 0.041, 0.042]) is False  # clear, but 20 ms is no change to wait for
    assert moved([10.0], [20.0]) is None  # one round: no interval, unknown
    # a step of exactly the resolution counts, though 0.7 - 0.6 is 0.0999... in floating point
    assert TIME_RESOLUTION_S > 0.7 - 0.6 and moved([0.6, 0.6, 0.6], [0.7, 0.7, 0.7]) is True


def test_chance_flag_is_the_share_of_rank_orders_that_separate() -> None:
    base, new = median_spread([1.0, 2.0, 3.0]), median_spread([1.0, 2.0, 3.0, 4.0])
    orders = list(combinations(range(7), 3))  # which of the 7 ranks BASE's rounds take
    separated = [c for c in orders if c == (0, 1, 2) or c == (4, 5, 6)]
    assert chance_flag(base, new) == pytest.approx(len(separated) / len(orders))
    assert chance_flag(median_spread([1.0]), new) is None


def test_rounds_of_a_strategy_with_repeats_and_without(tmp_path: Path) -> None:
    pi05 = load_results(RESULTS / "pi05")
    rounds = strategy_rounds(pi05.metrics["map"])
    repeats = pi05.strategies["map"].repeats
    assert rounds.wall_s == tuple(r.wall_s for r in repeats)
    assert rounds.build_peak_bytes == tuple(r.build_peak_bytes for r in repeats)
    tiny = load_results(make_results(tmp_path / "results", name="tiny"))
    for name, metrics in tiny.metrics.items():
        one = strategy_rounds(metrics)
        if metrics.record.ok:
            assert one.wall_s == (metrics.record.wall_s,)
            assert one.load_s == (metrics.load_s,)
        else:
            assert one.wall_s == (), name
