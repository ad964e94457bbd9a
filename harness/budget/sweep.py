"""The smallest memory limit at which a run completes, found by bisection.

``smallest_limit(attempt, lower, upper, precision_bytes)`` calls ``attempt(limit)``
(one fresh run under that limit, e.g. :func:`harness.budget.cgroup.run_in_group`)
as few times as it can and keeps every :class:`~harness.budget.cgroup.Attempt`,
so that wall time against the limit can be plotted from the same runs.

The search
    1. ``upper`` first: the run must complete there (an unconstrained limit), or
       :class:`SweepError` is raised with the attempt's reason; nothing below it
       would mean anything.
    2. With a ``start`` (the predicted minimum, :mod:`harness.predict`) inside the bounds: a run
       there (phase ``predicted``), then one ``precision_bytes`` step below it where it completed, or
       above it where it failed (phase ``bracket``): where the prediction is right, these two runs are
       the bracket, and bisection has nothing left to do. Where the step below completes too, the
       search goes on from ``lower`` as without a start. Without a start, ``lower`` next (the baseline,
       where nothing should fit): a run that completes there ends the sweep with ``at_lower_bound``
       set; the minimum is at or below it.
    3. Bisection between the largest limit that failed and the smallest that
       completed, until they are at most ``precision_bytes`` apart. Limits are
       multiples of ``granularity`` (1 MiB).
    4. Extra points: one run at each ``extra_factors`` multiple of the minimum
       (1.25x, 1.5x, 2x by default) and at each of ``extra_limits``, below
       ``upper`` and not already run, for the wall-time curve.

Results that do not line up (a run is not a pure function of its limit: reclaim
timing, the other tenants of a shared host)
    Each bisection step trusts one run. When the bracket has closed, both of its
    ends are run once more; where the second run disagrees with the first, a
    third decides (majority of three). If an end flips, the bracket is rebuilt
    from every limit's verdict (the largest failing limit, and the smallest
    completing limit above it) and bisection resumes there. So a single spurious
    failure above the true minimum, or a single lucky completion below it, does
    not move the answer by more than the precision, at the price of two or
    three extra runs per sweep. A limit's verdict is the majority of its runs;
    limits whose runs disagreed, and failures above the reported minimum (an
    extra point that failed), are listed in ``unstable_limits`` for the results
    to show. The minimum reported is the smallest completing limit above the
    largest failing one: a completion below a failure is not believed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.budget.cgroup import Attempt
from harness.units import MIB, gib_or_mib

__all__ = ["SEARCH_PHASES", "Sweep", "SweepError", "SweepPoint", "default_precision", "search_runs",
           "smallest_limit"]

SEARCH_PHASES = ("upper", "predicted", "bracket", "lower", "bisect", "confirm", "tiebreak")
"""The phases of the runs that search for the minimum (every phase but ``extra``, the curve's points)."""



class SweepError(RuntimeError):
    """The sweep cannot give an answer (the run fails at its upper bound, or runs out of attempts).

    ``points`` holds every run made before it gave up, in order, with its phase.
    """

    points: tuple[SweepPoint, ...] = ()


def default_precision(model_bytes: int) -> int:
    """The precision the results use: 2% of the model, but no finer than 64 MiB."""
    return max(math.ceil(0.02 * model_bytes), 64 * MIB)


@dataclass(frozen=True)
class SweepPoint:
    """One run of the sweep and why it was made.

    ``phase``: ``upper``, ``predicted`` (the predicted minimum), ``bracket`` (a step beside it),
    ``lower``, ``bisect``, ``confirm`` (a bracket end run again), ``tiebreak`` (a third run where two
    disagreed) or ``extra`` (a point of the curve).
    """

    phase: str
    attempt: Attempt


@dataclass(frozen=True)
class Sweep:
    """Every run of one sweep, and what they say.

    ``minimum_bytes`` is the smallest limit at which the run completes (see the module's
    docstring for how disagreeing runs count) and ``largest_failing_bytes`` the largest at
    which it fails (None with ``at_lower_bound``); they are at most ``precision_bytes``
    apart unless the granularity stopped the bisection first.
    """

    lower_bytes: int
    upper_bytes: int
    precision_bytes: int
    points: tuple[SweepPoint, ...]
    minimum_bytes: int
    largest_failing_bytes: int | None
    at_lower_bound: bool
    unstable_limits: tuple[int, ...]

    @property
    def attempts(self) -> tuple[Attempt, ...]:
        """Every attempt, in the order they ran."""
        return tuple(p.attempt for p in self.points)

    def verdicts(self) -> dict[int, bool]:
        """Each limit tried -> whether the run completes there (majority of its runs)."""
        return _verdicts(self.points)

    @property
    def minimum_attempt(self) -> Attempt:
        """The first run that completed at the minimum (its wall time and peak)."""
        return next(p.attempt for p in self.points if p.attempt.limit_bytes == self.minimum_bytes
                    and p.attempt.completed)

    def rows(self) -> list[dict[str, Any]]:
        """One flat record per run, in order, with its phase: for a CSV or a data frame."""
        return [{"run": i, "phase": p.phase, **p.attempt.row()} for i, p in enumerate(self.points)]

    def describe(self) -> str:
        """One line for the results."""
        runs = len(self.points)
        wall = sum(p.attempt.wall_s for p in self.points)
        if self.at_lower_bound:
            return (f"completes at the lower bound {gib_or_mib(self.lower_bytes)} (the minimum is at or below it); "
                    f"{runs} runs, {wall:.0f} s")
        text = (f"smallest limit that completes: {gib_or_mib(self.minimum_bytes)} (fails at "
                f"{gib_or_mib(self.largest_failing_bytes or 0)}; precision {gib_or_mib(self.precision_bytes)}); "
                f"{runs} runs, {wall:.0f} s")
        if self.unstable_limits:
            text += "; runs disagreed at " + ", ".join(gib_or_mib(n) for n in self.unstable_limits)
        return text


def _verdicts(points: Sequence[SweepPoint]) -> dict[int, bool]:
    runs: dict[int, list[bool]] = {}
    for p in points:
        runs.setdefault(p.attempt.limit_bytes, []).append(p.attempt.completed)
    # A tie (two runs that disagree, before their tiebreak) counts as a failure.
    return {limit: 2 * sum(outcomes) > len(outcomes) for limit, outcomes in runs.items()}


def _disagreeing(points: Sequence[SweepPoint]) -> set[int]:
    runs: dict[int, set[bool]] = {}
    for p in points:
        runs.setdefault(p.attempt.limit_bytes, set()).add(p.attempt.completed)
    return {limit for limit, outcomes in runs.items() if len(outcomes) > 1}


class _Runner:
    """Calls ``attempt`` and records every run, refusing to go past ``max_attempts``."""

    def __init__(self, attempt: Callable[[int], Attempt], max_attempts: int) -> None:
        self.attempt, self.max_attempts = attempt, max_attempts
        self.points: list[SweepPoint] = []

    def run(self, limit: int, phase: str) -> Attempt:
        if len(self.points) >= self.max_attempts:
            raise SweepError(f"no answer after {self.max_attempts} runs; the results do not settle "
                             f"(limits with disagreeing runs: {sorted(_disagreeing(self.points))})")
        result = self.attempt(limit)
        if result.limit_bytes != limit:
            raise SweepError(f"asked for a run under {limit} bytes, got one under {result.limit_bytes}")
        self.points.append(SweepPoint(phase, result))
        return result

    def runs_at(self, limit: int) -> int:
        return sum(1 for p in self.points if p.attempt.limit_bytes == limit)


def smallest_limit(attempt: Callable[[int], Attempt], lower: int, upper: int, precision_bytes: int, *,
                   extra_factors: Sequence[float] = (1.25, 1.5, 2.0), extra_limits: Sequence[int] = (),
                   granularity: int = MIB, max_attempts: int = 60, start: int | None = None) -> Sweep:
    """Bisect for the smallest limit in ``[lower, upper]`` at which ``attempt(limit)`` completes.

    See the module's docstring for the search (``start``: the predicted minimum it brackets first, ignored
    outside ``(lower, upper)``) and for how runs that disagree are handled. Raises :class:`SweepError` when the
    run fails at ``upper``, and
    ``ValueError`` for bounds that are not ``0 < lower < upper`` or a precision below
    the granularity.
    """
    if not 0 < lower < upper:
        raise ValueError(f"the bounds must satisfy 0 < lower < upper, got lower={lower}, upper={upper}")
    if granularity < 1 or precision_bytes < granularity:
        raise ValueError(f"the precision ({precision_bytes} bytes) must be at least the granularity "
                         f"({granularity} bytes), which must be positive")
    runner = _Runner(attempt, max_attempts)
    try:
        return _search(runner, lower, upper, precision_bytes, extra_factors, extra_limits, granularity, start)
    except SweepError as exc:
        exc.points = tuple(runner.points)
        raise


def _bracket(runner: _Runner, lower: int, upper: int, start: int, precision_bytes: int, granularity: int) -> None:
    """The run at the predicted minimum ``start`` and the step beside it (see the module's docstring)."""
    if runner.run(start, "predicted").completed:
        below = (start - precision_bytes) // granularity * granularity
        if below > lower:
            runner.run(below, "bracket")
    else:
        above = -(-(start + precision_bytes) // granularity) * granularity
        if above < upper:
            runner.run(above, "bracket")


def _search(runner: _Runner, lower: int, upper: int, precision_bytes: int, extra_factors: Sequence[float],
            extra_limits: Sequence[int], granularity: int, start: int | None = None) -> Sweep:
    top = runner.run(upper, "upper")
    if not top.completed:
        raise SweepError(f"the run does not complete at the upper bound {gib_or_mib(upper)}: {top.reason}; "
                         "raise the upper bound (it should be a limit the run never reaches)")
    if start is not None:
        start = -(-start // granularity) * granularity
    if start is not None and lower < start < upper:
        _bracket(runner, lower, upper, start, precision_bytes, granularity)

    confirmed: set[int] = set()
    while True:
        verdicts = _verdicts(runner.points)
        if all(verdicts.values()):  # no failure yet (no start, or every run near it completed): the baseline next
            if runner.run(lower, "lower").completed:
                return _finish(runner, lower, upper, precision_bytes, lower, None, extra_factors, extra_limits,
                               granularity)
            verdicts = _verdicts(runner.points)
        lo = max(limit for limit, ok in verdicts.items() if not ok)
        above = [limit for limit, ok in verdicts.items() if ok and limit > lo]
        if not above:
            raise SweepError(f"the run no longer completes at the upper bound {gib_or_mib(upper)} when run again: "
                             f"{runner.points[-1].attempt.reason}")
        hi = min(above)
        while hi - lo > precision_bytes:
            mid = (lo + hi) // 2 // granularity * granularity
            if not lo < mid < hi:
                break
            completed = (_verdicts(runner.points)[mid] if runner.runs_at(mid)
                         else runner.run(mid, "bisect").completed)
            if completed:
                hi = mid
            else:
                lo = mid
        flipped = False
        for end, expected in ((hi, True), (lo, False)):
            if end in confirmed:
                continue
            confirmed.add(end)
            again = runner.run(end, "confirm")
            first = next(p.attempt for p in runner.points if p.attempt.limit_bytes == end)
            if again.completed != first.completed:
                runner.run(end, "tiebreak")
            flipped = flipped or _verdicts(runner.points)[end] != expected
        if not flipped:
            break
        if _verdicts(runner.points).get(lower):
            return _finish(runner, lower, upper, precision_bytes, lower, None, extra_factors, extra_limits, granularity)
    return _finish(runner, lower, upper, precision_bytes, hi, lo, extra_factors, extra_limits, granularity)


def search_runs(completes: Callable[[int], bool], lower: int, upper: int, precision_bytes: int, *,
                start: int | None = None, granularity: int = MIB) -> int:
    """How many runs :func:`smallest_limit`'s search (:data:`SEARCH_PHASES`, no extra point) makes where the run
    under each limit completes as ``completes(limit)`` says: the sweep's own arithmetic, for a count the sweep
    would have made from another ``start``."""
    def attempt(limit: int) -> Attempt:
        ok = completes(limit)
        return Attempt(limit_bytes=limit, completed=ok, returncode=0 if ok else None, wall_s=0.0,
                       group_peak_bytes=None, oom_kills=None, reason=None if ok else "does not complete")

    sweep = smallest_limit(attempt, lower, upper, precision_bytes, extra_factors=(), granularity=granularity,
                           start=start)
    return len(sweep.points)


def _finish(runner: _Runner, lower: int, upper: int, precision: int, minimum: int, failing: int | None,
            extra_factors: Sequence[float], extra_limits: Sequence[int], granularity: int) -> Sweep:
    limits = [math.ceil(minimum * factor / granularity) * granularity for factor in extra_factors]
    limits += [math.ceil(limit / granularity) * granularity for limit in extra_limits]
    for limit in sorted(set(limits)):
        if limit >= upper or limit <= 0 or runner.runs_at(limit):
            continue
        runner.run(limit, "extra")
    verdicts = _verdicts(runner.points)
    unstable = _disagreeing(runner.points) | {limit for limit, ok in verdicts.items() if limit > minimum and not ok}
    return Sweep(lower_bytes=lower, upper_bytes=upper, precision_bytes=precision, points=tuple(runner.points),
                 minimum_bytes=minimum, largest_failing_bytes=failing, at_lower_bound=failing is None,
                 unstable_limits=tuple(sorted(unstable)))
