"""The bisection for the smallest completing limit, with fake runs (no processes, no cgroups)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from harness.budget.cgroup import Attempt
from harness.budget.sweep import SweepError, default_precision, search_runs, smallest_limit
from harness.units import GIB, MIB


def _attempt(limit: int, ok: bool) -> Attempt:
    # Wall time grows as the limit tightens towards the threshold, as reclaim makes a run slower.
    return Attempt(limit_bytes=limit, completed=ok, returncode=0 if ok else -9, wall_s=10 + GIB / limit,
                   group_peak_bytes=limit if not ok else limit // 2, oom_kills=0 if ok else 1,
                   reason=None if ok else "OOM-killed")


class Fake:
    """A run that completes at and above ``threshold``; ``override`` may change single outcomes."""

    def __init__(self, threshold: int, override: Callable[[int, int, bool], bool] | None = None) -> None:
        self.threshold, self.override = threshold, override
        self.calls: list[int] = []

    def __call__(self, limit: int) -> Attempt:
        ok = limit >= self.threshold
        if self.override is not None:
            ok = self.override(limit, self.calls.count(limit), ok)
        self.calls.append(limit)
        return _attempt(limit, ok)


def test_monotone_runs_find_the_threshold_within_the_precision_and_keep_every_run() -> None:
    threshold, precision = int(3.3 * GIB), 64 * MIB
    fake = Fake(threshold)
    sweep = smallest_limit(fake, GIB // 2, 16 * GIB, precision)
    assert sweep.largest_failing_bytes is not None
    assert sweep.largest_failing_bytes < threshold <= sweep.minimum_bytes
    assert sweep.minimum_bytes - sweep.largest_failing_bytes <= precision
    assert fake.calls[:2] == [16 * GIB, GIB // 2]  # the upper bound is checked first
    assert [a.limit_bytes for a in sweep.attempts] == fake.calls  # every run is kept, in order
    assert sweep.unstable_limits == () and not sweep.at_lower_bound
    assert sweep.minimum_attempt.completed and sweep.minimum_attempt.limit_bytes == sweep.minimum_bytes
    bisection_steps = math.ceil(math.log2((16 * GIB - GIB // 2) / precision))
    assert len([p for p in sweep.points if p.phase == "bisect"]) <= bisection_steps
    assert [p.phase for p in sweep.points].count("confirm") == 2
    assert all(limit % MIB == 0 for limit in fake.calls[2:])


def test_extra_points_are_run_at_multiples_of_the_minimum_below_the_upper_bound() -> None:
    fake = Fake(int(3.3 * GIB))
    sweep = smallest_limit(fake, GIB // 2, 6 * GIB, 64 * MIB, extra_factors=(1.25, 1.5, 2.0))
    extra = [p.attempt.limit_bytes for p in sweep.points if p.phase == "extra"]
    expected = [math.ceil(sweep.minimum_bytes * f / MIB) * MIB for f in (1.25, 1.5)]  # 2x is above 6 GiB
    assert extra == expected
    assert all(p.attempt.completed for p in sweep.points if p.phase == "extra")
    rows = sweep.rows()
    assert len(rows) == len(fake.calls) and rows[-1]["phase"] == "extra"
    assert {"limit_bytes", "completed", "wall_s", "group_peak_bytes", "reason", "phase"} <= set(rows[0])


def test_a_run_that_fails_at_the_upper_bound_is_an_error() -> None:
    with pytest.raises(SweepError, match="does not complete at the upper bound 2.00 GiB: OOM-killed"):
        smallest_limit(Fake(3 * GIB), GIB // 2, 2 * GIB, 64 * MIB)


def test_a_run_that_completes_at_the_lower_bound_ends_the_sweep() -> None:
    fake = Fake(GIB // 4)
    sweep = smallest_limit(fake, GIB // 2, 4 * GIB, 64 * MIB, extra_factors=())
    assert sweep.at_lower_bound and sweep.minimum_bytes == GIB // 2 and sweep.largest_failing_bytes is None
    assert fake.calls == [4 * GIB, GIB // 2]
    assert "at or below" in sweep.describe()


def test_one_spurious_failure_above_the_threshold_does_not_move_the_answer() -> None:
    threshold, precision, upper = int(3.3 * GIB), 64 * MIB, 16 * GIB

    def fails_once_above(limit: int, earlier_runs: int, ok: bool) -> bool:
        # The first run above the threshold (after the upper bound's) fails once: 8.25 GiB here.
        first_above = not any(threshold <= c < upper for c in fake.calls)
        return False if ok and limit < upper and first_above else ok

    fake = Fake(threshold, fails_once_above)
    sweep = smallest_limit(fake, GIB // 2, upper, precision, extra_factors=())
    assert sweep.largest_failing_bytes is not None
    assert sweep.largest_failing_bytes < threshold <= sweep.minimum_bytes
    assert sweep.minimum_bytes - sweep.largest_failing_bytes <= precision
    spurious = next(p.attempt.limit_bytes for p in sweep.points if p.attempt.limit_bytes >= threshold
                    and not p.attempt.completed)
    assert sweep.unstable_limits == (spurious,)
    assert sweep.verdicts()[spurious] is True  # two of three runs completed there
    assert "disagreed" in sweep.describe()


def test_a_limit_that_completes_once_then_fails_is_not_the_minimum() -> None:
    threshold, marginal, precision = 3 * GIB, 192 * MIB, 64 * MIB

    def marginal_band(limit: int, earlier_runs: int, ok: bool) -> bool:
        # In [threshold, threshold + marginal) only the first run at a limit completes.
        if threshold <= limit < threshold + marginal:
            return earlier_runs == 0
        return ok

    sweep = smallest_limit(Fake(threshold, marginal_band), GIB, 8 * GIB, precision, extra_factors=())
    assert threshold + marginal <= sweep.minimum_bytes <= threshold + marginal + precision
    assert sweep.unstable_limits and all(threshold <= n < threshold + marginal for n in sweep.unstable_limits)
    assert all(not sweep.verdicts()[n] for n in sweep.unstable_limits)


def test_a_lucky_completion_below_the_threshold_is_outvoted() -> None:
    threshold, precision = 3 * GIB, 64 * MIB
    lucky: list[int] = []

    def completes_once_below(limit: int, earlier_runs: int, ok: bool) -> bool:
        # The first bisection run that lands within 256 MiB below the threshold completes, once.
        if not ok and threshold - 256 * MIB <= limit < threshold and not lucky:
            lucky.append(limit)
            return True
        return ok

    sweep = smallest_limit(Fake(threshold, completes_once_below), GIB, 8 * GIB, precision, extra_factors=())
    assert lucky
    assert sweep.largest_failing_bytes is not None
    assert sweep.largest_failing_bytes < threshold <= sweep.minimum_bytes <= threshold + precision
    assert lucky[0] in sweep.unstable_limits


def test_runs_that_never_settle_stop_at_the_attempt_budget() -> None:
    def first_run_only(limit: int, earlier_runs: int, ok: bool) -> bool:
        # Every limit between the bounds completes on its first run and fails on every later one.
        return ok if limit in (GIB, 8 * GIB) else earlier_runs == 0

    flip = Fake(8 * GIB, first_run_only)
    with pytest.raises(SweepError, match="no answer after 12 runs"):
        smallest_limit(flip, GIB, 8 * GIB, 64 * MIB, max_attempts=12)


@pytest.mark.parametrize(("lower", "upper", "precision"), [(0, GIB, 64 * MIB), (GIB, GIB, 64 * MIB),
                                                           (2 * GIB, GIB, 64 * MIB), (GIB // 2, GIB, 1)])
def test_bad_bounds_are_refused(lower: int, upper: int, precision: int) -> None:
    with pytest.raises(ValueError):
        smallest_limit(Fake(GIB), lower, upper, precision)


def test_default_precision_is_two_percent_of_the_model_but_at_least_64_mib() -> None:
    assert default_precision(9_353_911_360) == math.ceil(0.02 * 9_353_911_360)
    assert default_precision(252 * MIB) == 64 * MIB


def test_an_extra_point_that_fails_above_the_minimum_is_flagged() -> None:
    threshold = 3 * GIB

    def fails_far_above(limit: int, earlier_runs: int, ok: bool) -> bool:
        return ok and not 5 * GIB <= limit < 7 * GIB  # a failure nothing in the bisection runs into

    sweep = smallest_limit(Fake(threshold, fails_far_above), GIB, 8 * GIB, 64 * MIB, extra_factors=(2.0,))
    extra = next(p.attempt for p in sweep.points if p.phase == "extra")
    assert not extra.completed
    assert threshold <= sweep.minimum_bytes <= threshold + 64 * MIB
    assert sweep.unstable_limits == (extra.limit_bytes,)


def test_extra_limits_are_run_once_each_below_the_upper_bound() -> None:
    fake = Fake(GIB + 100 * MIB)
    sweep = smallest_limit(fake, GIB // 2, 4 * GIB, 64 * MIB, extra_factors=(), extra_limits=(3 * GIB, 5 * GIB))
    extra = [p.attempt.limit_bytes for p in sweep.points if p.phase == "extra"]
    assert extra == [3 * GIB], "5 GiB is above the upper bound"
    assert sweep.verdicts()[3 * GIB] is True


# --------------------------------------------------------------------------- starting from the predicted minimum


@pytest.mark.parametrize("error_mib", [-40, 0, 30])
def test_a_prediction_within_a_step_is_the_bracket_and_the_same_minimum_is_found(error_mib: int) -> None:
    """The first run after the upper bound is at the prediction, the second one step beside it; where the
    prediction is within a step of the threshold, those two are the bracket, found in fewer runs than from the
    baseline, with the minimum the sweep without a prediction finds within the precision."""
    threshold, precision = int(3.3 * GIB), 64 * MIB
    predicted = threshold + error_mib * MIB
    fake = Fake(threshold)
    sweep = smallest_limit(fake, GIB // 2, 16 * GIB, precision, extra_factors=(), start=predicted)
    start = math.ceil(predicted / MIB) * MIB
    assert fake.calls[:2] == [16 * GIB, start]
    assert [p.phase for p in sweep.points][:3] == ["upper", "predicted", "bracket"]
    assert fake.calls[2] == start + (-precision if start >= threshold else precision)
    assert "lower" not in [p.phase for p in sweep.points] and "bisect" not in [p.phase for p in sweep.points]
    without = smallest_limit(Fake(threshold), GIB // 2, 16 * GIB, precision, extra_factors=())
    assert abs(sweep.minimum_bytes - without.minimum_bytes) <= precision
    assert sweep.largest_failing_bytes is not None and sweep.largest_failing_bytes < threshold <= sweep.minimum_bytes
    assert len(sweep.points) < len(without.points)
    assert search_runs(lambda limit: limit >= threshold, GIB // 2, 16 * GIB, precision) == len(without.points)
    assert search_runs(lambda limit: limit >= threshold, GIB // 2, 16 * GIB, precision,
                       start=predicted) == len(sweep.points)


@pytest.mark.parametrize("predicted", [int(0.8 * GIB), int(12 * GIB)])
def test_a_prediction_far_off_still_finds_the_threshold(predicted: int) -> None:
    threshold, precision = int(3.3 * GIB), 64 * MIB
    sweep = smallest_limit(Fake(threshold), GIB // 2, 16 * GIB, precision, extra_factors=(), start=predicted)
    assert sweep.points[1].phase == "predicted"
    assert sweep.points[1].attempt.limit_bytes == math.ceil(predicted / MIB) * MIB
    assert sweep.largest_failing_bytes is not None
    assert sweep.largest_failing_bytes < threshold <= sweep.minimum_bytes
    assert sweep.minimum_bytes - sweep.largest_failing_bytes <= precision


def test_a_prediction_above_a_minimum_at_the_baseline_ends_at_the_lower_bound() -> None:
    fake = Fake(GIB // 4)
    sweep = smallest_limit(fake, GIB // 2, 4 * GIB, 64 * MIB, extra_factors=(), start=GIB)
    assert sweep.at_lower_bound and sweep.minimum_bytes == GIB // 2
    assert fake.calls == [4 * GIB, GIB, GIB - 64 * MIB, GIB // 2]


def test_a_prediction_outside_the_bounds_is_not_run() -> None:
    fake = Fake(int(3.3 * GIB))
    smallest_limit(fake, GIB // 2, 16 * GIB, 64 * MIB, extra_factors=(), start=32 * GIB)
    assert fake.calls[:2] == [16 * GIB, GIB // 2]
