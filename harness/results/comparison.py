"""Two runs side by side, BASE and NEW: what moved in memory and in time, and whether it moved beyond the noise.

:func:`compare_results` pairs the strategies present in both runs and gives, for each,

* every memory figure's delta NEW − BASE (:class:`MemoryDelta`), in bytes and as a share of BASE's
  model: the build-phase host peak, on a GPU the build-phase host + GPU peak, the floor, the excess
  over the floor (the peak compared with the floor, minus the floor), the whole-run host peak, the
  anonymous peak above the baseline and the whole-run GPU peak, each under the name the results table
  gives it (:mod:`harness.results.labels`); each read from :mod:`harness.results.metrics` and the
  measured record;
* every time's ratio NEW / BASE, wall, load and build, with an interval over the rounds
  (:func:`harness.results.spread.ratio_of_medians`).

A memory delta is *flagged* when it is larger than the strategy's noise (:func:`memory_noise`); a time
when :func:`harness.results.spread.time_moved` says it moved (its interval excludes 1 and its median moved
by at least :data:`TIME_RESOLUTION_S`: the rule the report's notes check uses too). A
*regression* is a flagged rise of memory beyond the noise once the floor's rise is taken off (the floor is
the plan's, baseline + engines, not the strategy's doing: a rise of it is never a regression, nor is the part
of a peak's rise that it explains, such as the harness's own imports growing the baseline) or a flagged
slow-down; and, at any threshold, a strategy of BASE that NEW
failed or did not run: NEW has no figure to show that it did not regress.

A time of a strategy with one round on either side has no interval, so it is never flagged however it
moved: :meth:`Comparison.untimed` names those strategies, and the report says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from harness.errors import HarnessError
from harness.results import spread
from harness.results.labels import (
    ANON_ABOVE_BASELINE,
    BUILD_HOST_GPU_PEAK,
    BUILD_HOST_PEAK,
    EXCESS,
    FLOOR,
    WHOLE_RUN_GPU_PEAK,
    WHOLE_RUN_HOST_PEAK,
)
from harness.results.metrics import StrategyMetrics
from harness.results.reading import Results
from harness.results.record import SUMMARY
from harness.results.spread import TIME_RESOLUTION_S, Ratio, ratio_of_medians, strategy_rounds
from harness.units import MIB

__all__ = [
    "MEMORY_TOLERANCE",
    "SAMPLED",
    "TIME_RESOLUTION_S",
    "TIMES",
    "Comparison",
    "ComparisonError",
    "MemoryDelta",
    "Regression",
    "StrategyComparison",
    "TimeRatio",
    "compare_results",
    "figure_noise",
    "memory_noise",
    "sampled_noise",
]

MEMORY_TOLERANCE = 0.005
"""The smallest memory change, as a share of the model, that counts as beyond the noise; where either run's
build-phase peaks spread wider over its rounds, that spread is the noise (:func:`memory_noise`).

It lies far below what a loader changes when it copies (one copy of pi0.5's largest engine is 11% of the
model), and above how far the build-phase peaks of the strategies that hold one engine's weights at a time
move from round to round. Measured on smoke (252 MiB model), the committed run and two reruns of one commit
compared pairwise: every figure the kernel's high-water mark gives (build-phase and whole-run host peaks),
the floor and the excess moved at most 0.70 MiB (0.28% of the model), over every round at most 0.96 MiB
(0.38%). A maximum of samples moves further; it is held to :func:`sampled_noise`.
"""

TIMES: tuple[str, ...] = ("wall", "load", "build")
"""The times compared, in the order they are shown."""


class ComparisonError(HarnessError, ValueError):
    """Two results directories that cannot be compared as asked (different scenarios without leave)."""


@dataclass(frozen=True)
class MemoryDelta:
    """One memory figure of one strategy in BASE and NEW (bytes; ``None`` where not measured).

    ``model_bytes`` is BASE's model, which the shares divide by; ``noise_bytes`` the change that
    counts as beyond the noise (:func:`memory_noise`); ``counts`` whether a rise is a regression;
    ``explained_bytes`` the part of a rise that the floor's rise explains (for a peak that holds the floor:
    the floor's rise where it rose, else 0), which is not the strategy's doing.
    """

    label: str
    base_bytes: int | None
    new_bytes: int | None
    model_bytes: int
    noise_bytes: float
    counts: bool = True
    explained_bytes: int = 0

    @property
    def delta_bytes(self) -> int | None:
        """NEW − BASE; ``None`` where either is missing."""
        return None if self.base_bytes is None or self.new_bytes is None else self.new_bytes - self.base_bytes

    @property
    def delta_fraction(self) -> float | None:
        """NEW − BASE as a share of BASE's model."""
        delta = self.delta_bytes
        return None if delta is None else delta / self.model_bytes

    @property
    def flagged(self) -> bool:
        """Whether the change is larger than the noise: the rule ``compare`` marks a memory figure with and the
        notes check of a re-rendered report lists one by (:mod:`harness.report.notes`)."""
        delta = self.delta_bytes
        return delta is not None and abs(delta) > self.noise_bytes

    @property
    def unexplained_bytes(self) -> int | None:
        """NEW − BASE less what the floor's rise explains (``explained_bytes``); ``None`` where either is missing."""
        delta = self.delta_bytes
        return None if delta is None else delta - self.explained_bytes

    @property
    def regression(self) -> bool:
        """A rise of a figure that counts, beyond the noise once the floor's rise is taken off."""
        rise = self.unexplained_bytes
        return self.counts and self.flagged and rise is not None and rise > self.noise_bytes


@dataclass(frozen=True)
class TimeRatio:
    """One time (``wall``, ``load`` or ``build``) of one strategy: NEW / BASE, ``None`` where either side has
    no finished round or BASE's median is 0."""

    time: str
    ratio: Ratio | None

    @property
    def flagged(self) -> bool:
        """Whether the time moved beyond the noise (:func:`harness.results.spread.time_moved`: the ratio's
        interval excludes 1 and the medians differ by at least :data:`TIME_RESOLUTION_S`); never without an
        interval."""
        return self.ratio is not None and spread.time_moved(self.ratio.base, self.ratio.new) is True

    @property
    def regression(self) -> bool:
        """A flagged slow-down."""
        return self.ratio is not None and self.flagged and self.ratio.value > 1.0


@dataclass(frozen=True)
class Regression:
    """A flagged regression: where, and how large (a share of BASE's model or of BASE's time; ``inf`` for a
    strategy that failed in NEW or is missing from it: larger than any threshold).

    A memory figure's also carries its bytes in BASE and NEW and the noise it was held to (``None`` otherwise).
    """

    strategy: str
    figure: str
    size: float
    base_bytes: int | None = None
    new_bytes: int | None = None
    noise_bytes: float | None = None
    explained_bytes: int = 0

    @property
    def time(self) -> bool:
        """Whether it is a time's slow-down (not a memory figure's rise, nor a strategy's failure or absence)."""
        return self.figure in TIMES

    def exceeds(self, percent: float) -> bool:
        """Whether it is larger than ``percent`` percent."""
        return self.size * 100 > percent

    def amounts(self) -> str:
        """A memory figure's bytes, ``342.0 MiB in BASE, 594.1 MiB in NEW, noise 1.3 MiB``; empty for the rest."""
        if self.base_bytes is None or self.new_bytes is None or self.noise_bytes is None:
            return ""
        floor = f", {self.explained_bytes / MIB:.1f} MiB of it the floor's rise" if self.explained_bytes else ""
        return (f"{self.base_bytes / MIB:.1f} MiB in BASE, {self.new_bytes / MIB:.1f} MiB in NEW{floor}, "
                f"noise {self.noise_bytes / MIB:.1f} MiB")

    def describe(self) -> str:
        """``map: wall +27.3% of BASE`` in words; a memory figure's size is its rise beyond the floor's."""
        if self.figure in _OUTCOMES:
            return f"{self.strategy}: {_OUTCOMES[self.figure]}"
        unit = "of the model" if self.figure not in TIMES else "of BASE"
        beyond = " beyond the floor's rise" if self.explained_bytes else ""
        return f"{self.strategy}: {self.figure} {self.size:+.1%} {unit}{beyond}"


_OUTCOMES = {
    "status": "finished in BASE, failed in NEW",
    "failed": "failed in NEW, as in BASE",
    "missing": "ran in BASE, missing from NEW",
}
"""The :attr:`Regression.figure` of a strategy NEW has no figures for, and its words."""


@dataclass(frozen=True)
class StrategyComparison:
    """One strategy present in both runs: its memory deltas, its time ratios and the noise they were held to."""

    name: str
    base: StrategyMetrics
    new: StrategyMetrics
    memory: tuple[MemoryDelta, ...]
    times: tuple[TimeRatio, ...]
    noise_bytes: float
    noise_source: str

    @property
    def failed_in_new(self) -> bool:
        """Failed in NEW (whether or not it finished in BASE)."""
        return not self.new.record.ok

    @property
    def one_round(self) -> bool:
        """Whether a time of it has a ratio without an interval (one round on a side): never flagged."""
        return any(t.ratio is not None and t.ratio.low is None for t in self.times)

    def time(self, name: str) -> TimeRatio:
        """The ratio of time ``name`` (one of :data:`TIMES`)."""
        return next(t for t in self.times if t.time == name)

    def regressions(self) -> list[Regression]:
        """Its flagged regressions; failing in NEW is one whatever its size."""
        status = "status" if self.base.record.ok else "failed"
        found = [Regression(self.name, status, float("inf"))] if self.failed_in_new else []
        found += [Regression(self.name, d.label, d.unexplained_bytes / d.model_bytes, d.base_bytes, d.new_bytes,
                             d.noise_bytes, d.explained_bytes)
                  for d in self.memory
                  if d.regression and d.unexplained_bytes is not None]
        found += [Regression(self.name, t.time, t.ratio.value - 1.0) for t in self.times
                  if t.regression and t.ratio is not None]
        return found


@dataclass(frozen=True)
class Comparison:
    """BASE and NEW compared: the strategies in both, in BASE's order, and what only one of them has.

    ``notes`` say what differs between the two runs beyond their figures (scenario, model, device).
    """

    base: Results
    new: Results
    strategies: tuple[StrategyComparison, ...]
    only_base: tuple[str, ...]
    only_new: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def gpu_measured(self) -> bool:
        """Whether either run has GPU figures."""
        return self.base.gpu_measured or self.new.gpu_measured

    def regressions(self) -> list[Regression]:
        """Every flagged regression, strategy by strategy, then each strategy of BASE missing from NEW."""
        return ([r for s in self.strategies for r in s.regressions()]
                + [Regression(name, "missing", float("inf")) for name in self.only_base])

    def flagged(self) -> int:
        """How many figures moved beyond the noise, either way (a strategy that finished in BASE and failed in
        NEW included)."""
        return sum((s.failed_in_new and s.base.record.ok) + sum(d.flagged for d in s.memory)
                   + sum(t.flagged for t in s.times) for s in self.strategies)

    def untimed(self) -> list[str]:
        """The strategies whose times cannot be flagged, having one round in BASE or in NEW
        (:attr:`StrategyComparison.one_round`)."""
        return [s.name for s in self.strategies if s.one_round]


def memory_noise(base: StrategyMetrics, new: StrategyMetrics, model_bytes: int) -> tuple[float, str]:
    """The memory change of one strategy that counts as beyond the noise, and where it comes from.

    :data:`MEMORY_TOLERANCE` of the model, or the widest spread (max − min) of the build-phase peaks over
    either run's rounds where that is wider.
    """
    fixed = MEMORY_TOLERANCE * model_bytes
    spreads = [max(p) - min(p) for p in (strategy_rounds(base).build_peak_bytes,
                                         strategy_rounds(new).build_peak_bytes) if len(p) > 1]
    if spreads and max(spreads) > fixed:
        return float(max(spreads)), "the spread of the build-phase peaks over the rounds"
    return fixed, f"{MEMORY_TOLERANCE:.1%} of the model"


SAMPLED: dict[str, str] = {ANON_ABOVE_BASELINE: "anon_bytes", WHOLE_RUN_GPU_PEAK: "gpu_used_bytes"}
"""The memory figures that are a maximum of samples (no kernel high-water mark checks them), each with the
samples' column it is read from: their noise is :func:`sampled_noise` where that is wider than the strategy's."""


def sampled_noise(results: Results, strategy: str, column: str) -> float:
    """The largest rise of ``column`` between two consecutive samples of ``strategy`` in ``results`` (0 without
    samples): how far a maximum of those samples can fall short of the true peak.

    A peak that the series climbs to over more than one sampling interval is missed by at most what it rises
    within one, so two runs' sampled peaks of one true peak differ by at most the larger of their largest rises
    (a spike shorter than an interval can be missed whole: no samples can tell). Measured on smoke (252 MiB
    model, samples every 10 ms), the committed run and two reruns of one commit, five rounds each: ``load``'s
    anonymous peak (two copies of the model at its top, held for less than an interval) took values from
    696.6 to 723.3 MiB, 26.7 MiB or 10.6% of the model, and its representative rounds 5.2 MiB apart (2.0%),
    far beyond :data:`MEMORY_TOLERANCE`; its largest rise between samples was 43.4 MiB in the run with the
    low values (a quiet machine: the copy ran fastest) and 15.8 and 13.8 MiB in the two whose rounds all lay
    within 1.6 MiB of the top. Every other strategy's anonymous samples rose at most 0.2 MiB at a step, but
    ``read_file``'s, 36.0 MiB, one engine's copy made at once.
    """
    frame = results.samples.get(strategy)
    if frame is None or column not in frame or len(frame) < 2:
        return 0.0
    rises = frame[column].astype("float64").diff().to_numpy()
    rises = rises[np.isfinite(rises)]
    return float(max(rises.max(initial=0.0), 0.0))


def figure_noise(label: str, strategy: str, runs: Sequence[Results], model_bytes: int) -> float:
    """The change of memory figure ``label`` of ``strategy`` that counts as beyond the noise, from the runs at hand:
    ``compare`` holds BASE and NEW to it, the notes check of a re-rendered report the run it renders (its stamp
    keeps printed figures only).

    The strategy's noise (:func:`memory_noise` over those runs' rounds); for a maximum of samples
    (:data:`SAMPLED`), the largest rise between samples (:func:`sampled_noise`) where that is wider.
    """
    metrics = [run.metrics[strategy] for run in runs]
    noise, _ = memory_noise(metrics[0], metrics[-1], model_bytes)
    column = SAMPLED.get(label)
    if column is not None:
        noise = max(noise, *(sampled_noise(run, strategy, column) for run in runs))
    return noise


def _excess_bytes(metrics: StrategyMetrics) -> int | None:
    if metrics.compared_peak_bytes is None or metrics.floor_bytes is None:
        return None
    return metrics.compared_peak_bytes - metrics.floor_bytes


def _rise(base: int | None, new: int | None) -> int:
    """How far a floor rose from BASE to NEW; 0 where it fell or either is missing."""
    return 0 if base is None or new is None else max(0, new - base)


def _memory(base: StrategyMetrics, new: StrategyMetrics, model_bytes: int, noise: Callable[[str], float],
            gpu: bool) -> tuple[MemoryDelta, ...]:
    def delta(label: str, b: int | None, n: int | None, counts: bool = True,
              floor: tuple[int | None, int | None] = (None, None)) -> MemoryDelta:
        return MemoryDelta(label, b, n, model_bytes, noise(label), counts, _rise(*floor))

    host_floor = (base.build_host_floor_bytes, new.build_host_floor_bytes)
    rows = [delta(BUILD_HOST_PEAK, base.record.build_peak_bytes, new.record.build_peak_bytes, floor=host_floor)]
    if base.on_gpu or new.on_gpu:
        rows.append(delta(BUILD_HOST_GPU_PEAK, base.record.host_gpu_peak_bytes, new.record.host_gpu_peak_bytes,
                          floor=(base.floor_bytes, new.floor_bytes)))
    rows += [
        delta(FLOOR, base.floor_bytes, new.floor_bytes, counts=False),
        delta(EXCESS, _excess_bytes(base), _excess_bytes(new)),
        delta(WHOLE_RUN_HOST_PEAK, base.record.host_peak_bytes, new.record.host_peak_bytes, floor=host_floor),
        delta(ANON_ABOVE_BASELINE, base.anon_above_baseline_bytes, new.anon_above_baseline_bytes),
    ]
    if gpu:
        rows.append(delta(WHOLE_RUN_GPU_PEAK, base.record.gpu_peak_bytes, new.record.gpu_peak_bytes))
    return tuple(rows)


def _times(base: StrategyMetrics, new: StrategyMetrics) -> tuple[TimeRatio, ...]:
    before, after = strategy_rounds(base).times(), strategy_rounds(new).times()
    return tuple(TimeRatio(name, ratio_of_medians(before[name], after[name])
                           if before[name] and after[name] else None) for name in TIMES)


def _differences(base: Results, new: Results) -> list[str]:
    b, n = base.record, new.record
    notes = []
    if b.scenario != n.scenario:
        notes.append(f"different scenarios: BASE ran {b.scenario!r}, NEW ran {n.scenario!r}")
    if b.model.bytes != n.model.bytes or b.model.name != n.model.name:
        notes.append(f"different models: BASE {b.model.name} ({b.model.bytes:,} bytes), NEW {n.model.name} "
                     f"({n.model.bytes:,} bytes); shares are of BASE's model")
    for what, before, after in (("device", b.device, n.device), ("backend", b.backend, n.backend),
                                ("cache", b.cache, n.cache), ("engines", b.engines, n.engines)):
        if before != after:
            notes.append(f"different {what}: BASE {before}, NEW {after}")
    return notes


def compare_results(base: Results, new: Results, *, across_scenarios: bool = False) -> Comparison:
    """Compare NEW with BASE (see the module doc).

    Raises :class:`ComparisonError` when the two ran different scenarios and ``across_scenarios`` is
    false.
    """
    if base.record.scenario != new.record.scenario and not across_scenarios:
        raise ComparisonError(
            f"{new.directory / SUMMARY}: scenario: {new.record.scenario!r}, but {base.directory / SUMMARY} ran "
            f"{base.record.scenario!r}; compare runs of different scenarios with --scenario")
    model = base.record.model.bytes
    gpu = base.gpu_measured or new.gpu_measured
    strategies = []
    for name, before in base.metrics.items():
        after = new.metrics.get(name)
        if after is None:
            continue
        noise, source = memory_noise(before, after, model)
        memory = _memory(before, after, model, partial(figure_noise, strategy=name, runs=(base, new),
                                                       model_bytes=model), gpu)
        strategies.append(StrategyComparison(name, before, after, memory, _times(before, after), noise, source))
    return Comparison(
        base, new, tuple(strategies),
        only_base=tuple(n for n in base.metrics if n not in new.metrics),
        only_new=tuple(n for n in new.metrics if n not in base.metrics),
        notes=tuple(_differences(base, new)),
    )
