"""How much a time moves from round to round: the median of a strategy's rounds with an interval, and the
ratio of two runs' medians with one.

A strategy run with ``repeats`` has one :class:`~harness.results.record.RepeatRecord` per cold round; one
without has a single run, its record's own figures. :func:`strategy_rounds` gathers either into
:class:`Rounds`: the wall, load and build times and the build-phase peak of every finished round.

The intervals are distribution-free, so that 3 to 5 rounds are enough to state one honestly:

* :func:`median_spread`: the interval of order statistics ``[x_(k), x_(n+1-k)]`` that covers the median of
  the rounds' distribution with probability ``1 - 2 P(B <= k-1)``, ``B ~ Binomial(n, 1/2)``; ``k`` is the
  largest that keeps that probability at :data:`CONFIDENCE` or more, and 1 (the range, min to max) when
  even the range keeps less: up to 5 rounds it is the range, which covers the median with probability
  75% at 3 rounds, 87.5% at 4 and 93.75% at 5. One round has no interval.
* :func:`ratio_of_medians`: NEW / BASE of the two medians, with the interval
  ``[low(NEW) / high(BASE), high(NEW) / low(BASE)]`` of the two median intervals: a ratio is outside the
  noise only when every value NEW's interval allows is on one side of every value BASE's allows. When
  both intervals are the range, that is when every NEW round is slower (or faster) than every BASE
  round; with no change (rounds exchangeable) it happens by chance with probability
  ``2 / C(n + m, n)``: 1 in 10 at 3 rounds a side, 1 in 35 at 4, 1 in 126 at 5.

:func:`time_moved` is the one rule that says whether a time moved beyond the noise between two runs:
``harness compare`` marks a time with it (:class:`harness.results.comparison.TimeRatio`) and the report's
list of figures that changed since its notes were checked leaves out the times it calls noise
(:mod:`harness.report.notes`). Neither keeps a rule of its own.

Everything here is deterministic: the same rounds give the same figures and the same words.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.results.metrics import StrategyMetrics

__all__ = [
    "CONFIDENCE",
    "TIME_RESOLUTION_S",
    "MedianSpread",
    "Ratio",
    "Rounds",
    "chance_flag",
    "median_coverage",
    "median_spread",
    "ratio_of_medians",
    "strategy_rounds",
    "time_moved",
]

CONFIDENCE = 0.95
"""The coverage :func:`median_spread` aims at; with 5 rounds or fewer only the range is left, which covers less."""

TIME_RESOLUTION_S = 0.1
"""The smallest change of a median time that :func:`time_moved` calls a move, in seconds: below it a ratio
outside the noise (a load phase of 0.02 s against 0.03 s) is not a change a user waits for."""


def median_coverage(rounds: int, k: int) -> float:
    """Probability that ``[x_(k), x_(n+1-k)]`` of ``rounds`` independent values covers their distribution's median.

    ``1 - 2 P(B <= k-1)`` with ``B ~ Binomial(rounds, 1/2)``; ``k`` counts from 1 (1: the range).
    """
    if rounds < 1 or not 1 <= k <= (rounds + 1) // 2:
        raise ValueError(f"order statistic {k} of {rounds} rounds: expected 1 <= k <= (rounds + 1) // 2")
    below = sum(math.comb(rounds, i) for i in range(k)) / 2**rounds
    return max(0.0, 1.0 - 2.0 * below)


def _ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


@dataclass(frozen=True)
class MedianSpread:
    """The median of some rounds and the interval :func:`median_spread` gives it.

    ``low`` and ``high`` are ``None`` for one round (no interval); ``k`` is the order statistic the
    interval starts at (1: the range); ``coverage`` is the probability that it covers the median.
    """

    median: float
    low: float | None
    high: float | None
    rounds: int
    k: int | None
    coverage: float | None

    def span(self, over: str = "rounds") -> str:
        """Where the interval's ends come from, short: ``over 5 rounds`` for the range, ``the 2nd to 8th smallest of
        9 rounds`` for order statistics inside it (``over`` names what the values are one each of)."""
        if self.k is None or self.k == 1:
            return f"over {self.rounds} {over}"
        return f"the {_ordinal(self.k)} to {_ordinal(self.rounds + 1 - self.k)} smallest of {self.rounds} {over}"

    @property
    def method(self) -> str:
        """How the interval was taken, in words a report can print."""
        if self.k is None or self.coverage is None:
            return "one run: no interval"
        if self.k == 1:
            return f"range (min to max) of {self.rounds} rounds, which covers the median with probability " \
                   f"{self.coverage:.1%}"
        return (f"{_ordinal(self.k)} to {_ordinal(self.rounds + 1 - self.k)} smallest of {self.rounds} rounds "
                f"(order statistics), which cover the median with probability {self.coverage:.1%}")


def median_spread(values: Sequence[float], confidence: float = CONFIDENCE) -> MedianSpread:
    """The median of ``values`` (one per round) with its order-statistic interval (see the module doc).

    Raises :class:`ValueError` for no values or a value that is not finite.
    """
    data = np.sort(np.asarray(values, dtype="float64"))
    if data.size == 0:
        raise ValueError("no rounds: a median needs at least one value")
    if not np.isfinite(data).all():
        raise ValueError(f"rounds must be finite numbers, got {list(values)}")
    n = int(data.size)
    median = float(np.median(data))
    if n == 1:
        return MedianSpread(median, None, None, 1, None, None)
    k = 1
    while k + 1 <= (n + 1) // 2 and median_coverage(n, k + 1) >= confidence:
        k += 1
    return MedianSpread(median, float(data[k - 1]), float(data[n - k]), n, k, median_coverage(n, k))


def chance_flag(base: MedianSpread, new: MedianSpread) -> float | None:
    """With no change, the probability that :func:`ratio_of_medians`' interval excludes 1 by chance.

    Known exactly when both intervals are the range: ``2 / C(n + m, n)``; ``None`` otherwise (one run
    on either side: never flagged; order statistics inside the range: not derived here).
    """
    if base.k != 1 or new.k != 1:
        return None
    return 2.0 / math.comb(base.rounds + new.rounds, base.rounds)


@dataclass(frozen=True)
class Ratio:
    """NEW / BASE of two medians, with the interval :func:`ratio_of_medians` gives it.

    ``low`` and ``high`` are ``None`` where either side had one round; ``high`` is ``inf`` where BASE's
    interval reaches 0. ``base`` and ``new`` are the two sides' spreads.
    """

    value: float
    low: float | None
    high: float | None
    base: MedianSpread
    new: MedianSpread

    @property
    def outside_noise(self) -> bool:
        """Whether the interval excludes 1 (no interval: never): the two medians' intervals are disjoint."""
        return _disjoint(self.base, self.new) is True

    @property
    def method(self) -> str:
        """How the interval was taken, in words a report can print."""
        if self.low is None:
            return "ratio of the medians; no interval: one run on a side"
        chance = chance_flag(self.base, self.new)
        if chance is not None:
            return (f"ratio of the medians; interval [min NEW / max BASE, max NEW / min BASE] over "
                    f"{self.base.rounds} BASE and {self.new.rounds} NEW rounds; with no change it excludes 1 by "
                    f"chance with probability {chance:.1%}")
        return (f"ratio of the medians; interval [low NEW / high BASE, high NEW / low BASE] of the medians' "
                f"intervals (BASE: {self.base.method}; NEW: {self.new.method})")


def _disjoint(base: MedianSpread, new: MedianSpread) -> bool | None:
    """Whether the two medians' intervals do not overlap; ``None`` where either side has no interval."""
    if base.low is None or base.high is None or new.low is None or new.high is None:
        return None
    return new.low > base.high or new.high < base.low


def time_moved(base: MedianSpread, new: MedianSpread) -> bool | None:
    """Whether one time moved beyond the noise from BASE to NEW: the rule every comparison of two runs' times uses.

    True when the intervals of the two medians (:func:`median_spread`) do not overlap and the medians differ by
    :data:`TIME_RESOLUTION_S` or more; False when they overlap or the medians are closer; ``None`` when either
    side has one round, so no interval: how far such a time moves by chance is unknown, and each caller says
    what it does then (``compare`` marks nothing and says so; the notes check lists the change).

    Non-overlapping intervals are exactly a ratio NEW / BASE whose interval (:func:`ratio_of_medians`) excludes
    1. This is noise from round to round within each run; a machine shared with other work moves every time of
    a run together (1.3-2.2x here), beyond any such interval, so times of runs made at different moments are
    compared here, never gated.
    """
    disjoint = _disjoint(base, new)
    if disjoint is None:
        return None
    step = abs(new.median - base.median)
    return disjoint and (step >= TIME_RESOLUTION_S or math.isclose(step, TIME_RESOLUTION_S))


def ratio_of_medians(base: Sequence[float], new: Sequence[float], confidence: float = CONFIDENCE) -> Ratio | None:
    """NEW / BASE of the two samples' medians, with its interval (see the module doc).

    ``None`` when BASE's median is not positive (no ratio). Raises :class:`ValueError` as
    :func:`median_spread` does, and for a negative value (times are not negative).
    """
    if any(v < 0 for v in (*base, *new)):
        raise ValueError("times are not negative")
    b, n = median_spread(base, confidence), median_spread(new, confidence)
    if b.median <= 0:
        return None
    if b.low is None or b.high is None or n.low is None or n.high is None:
        return Ratio(n.median / b.median, None, None, b, n)
    high = n.high / b.low if b.low > 0 else math.inf
    return Ratio(n.median / b.median, n.low / b.high, high, b, n)


@dataclass(frozen=True)
class Rounds:
    """A strategy's finished rounds: wall, load and build seconds and build-phase peaks, one per round.

    A round that did not reach a figure leaves it out, so the tuples can differ in length; a strategy
    without ``repeats`` has one round, its record's own figures.
    """

    wall_s: tuple[float, ...]
    load_s: tuple[float, ...]
    build_s: tuple[float, ...]
    build_peak_bytes: tuple[int, ...]

    def times(self) -> dict[str, tuple[float, ...]]:
        """``{"wall": ..., "load": ..., "build": ...}``: the three times, by name."""
        return {"wall": self.wall_s, "load": self.load_s, "build": self.build_s}


def _present(values: Sequence[float | int | None]) -> tuple[float, ...]:
    return tuple(float(v) for v in values if v is not None)


def strategy_rounds(metrics: StrategyMetrics) -> Rounds:
    """The rounds of one strategy: its repeats that finished (status ``ok``), or its one run."""
    record = metrics.record
    if not record.repeats:
        if not record.ok:
            return Rounds((), (), (), ())
        peak = () if record.build_peak_bytes is None else (record.build_peak_bytes,)
        return Rounds(_present([record.wall_s]), _present([metrics.load_s]), _present([metrics.build_s]), peak)
    done = [r for r in record.repeats if r.status == "ok"]
    return Rounds(
        _present([r.wall_s for r in done]),
        _present([r.load_s for r in done]),
        _present([r.build_s for r in done]),
        tuple(r.build_peak_bytes for r in done if r.build_peak_bytes is not None),
    )
