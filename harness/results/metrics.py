"""Every figure the harness derives, defined once.

Two steps, like ``torch.utils.benchmark.Measurement`` deriving its statistics from the
times it holds:

* :func:`sampled_peaks`, run once when a strategy's record is made (in its own
  process, from its samples and the kernel's marks), gives the peaks stored in
  ``summary.json``:

  - ``host_peak_bytes``: the whole run: samples of RSS, the high-water mark of the
    load phase (read at partitioning) and each engine's high-water mark;
  - ``build_peak_bytes``: the build phase, from partitioning to the end of the last
    engine (to the last sample when a strategy failed): RSS samples in that window
    and each engine's high-water mark;
  - ``host_gpu_peak_bytes``: over the same window, samples of RSS + GPU and each
    engine's high-water mark plus the GPU memory in use at its end (GPU use only
    grows while an engine is built); without a GPU it equals ``build_peak_bytes``;
  - ``anon_peak_bytes``, ``gpu_peak_bytes``: the samples' maxima over the whole run;
  - ``wall_s``: from the load's start to the end of the last engine.

* :class:`StrategyMetrics` (one per strategy, :func:`run_metrics` for a run) derives
  from a record what the table, the figures and the summary all show: the floor, the
  peak compared with it, the excess, phase and per-engine times.

The **floor** is what no loader can go under while an engine's weights and its copy
coexist. Engines written to files (no GPU) are held one at a time: the build-phase host
peak is at least ``baseline + largest engine``. Engines built on a GPU accumulate: while
engine ``k`` is built, engines ``0..k-1`` are in GPU memory, engine ``k``'s copy is being
made and its weights are in host memory, so host + GPU is at least
``baseline + (e_0 + ... + e_k) + e_k``; the floor is the largest of these over ``k``
(never above ``baseline + model + largest engine``). Engines that hold their own weights
(``packaged`` and ``packaged_compiler``, like a serialised TensorRT engine) need no device copy once
written, so on a GPU they need not accumulate: the floor is ``baseline + 2 * e_k`` (engine
``k``'s weights on the host and their device copy), the largest over ``k``. Engines built on the host that
need no weight resident (:data:`~harness.catalog.BUILT_WITHOUT_RESIDENT_WEIGHTS`: ``mapped`` ones run on the
mapped weights where they lie, ``packaged`` ones have theirs streamed into the artifact a chunk at a time)
have the baseline as their floor; AOTInductor's own packaging (``packaged_compiler``) keeps the copy floor.
A compiler that reads every weight of an engine within calls a caller cannot split and holds memory of its own
beside them until the engine is written (OpenVINO: its converted and compiled models, the compiled one holding
weights repacked for its kernels) records that memory per engine (``compiler_held_bytes``,
:func:`engines_hold_compiler_memory`): its floor is ``baseline + max over k of (e_k + h_k)``, ``h_k`` what it
held beside engine ``k``'s weights.
The figure compared with the floor
is the build-phase host peak without a GPU and the build-phase host + GPU peak with one;
**excess** is ``(compared − floor) / model bytes``. A strategy that failed built part of
the model only: it has no floor and no excess.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from itertools import accumulate
from typing import Any

import numpy as np

from harness.catalog import BUILT_WITHOUT_RESIDENT_WEIGHTS, HOLDS_WEIGHTS, builds_read_weights
from harness.results.disk import CeilingPoint, DiskRead
from harness.results.labels import BUILD_HOST_GPU_PEAK, BUILD_HOST_PEAK
from harness.results.record import EngineRecord, Phases, RunRecord, StrategyRecord

__all__ = [
    "BuildLimit",
    "DiskMetrics",
    "best_ceiling",
    "ceiling_points_read",
    "ceiling_settings",
    "build_limit",
    "SampleColumns",
    "StrategyMetrics",
    "compared_label",
    "compiler_gpu_own_bytes",
    "disk_metrics",
    "excess_fraction",
    "floor_bytes",
    "engine_gpu_peaks",
    "engines_accumulate",
    "engines_hold_compiler_memory",
    "engines_built_without_resident_weights",
    "baseline_anon_bytes",
    "floor_formula",
    "gpu_floor_bytes",
    "host_floor_bytes",
    "phase_spans",
    "resident_at_load",
    "run_metrics",
    "sampled_peaks",
]


@dataclass(frozen=True)
class SampleColumns:
    """The sample columns the peaks are taken from, as float64 arrays (NaN for an empty cell)."""

    t_s: np.ndarray
    rss_bytes: np.ndarray
    anon_bytes: np.ndarray
    gpu_used_bytes: np.ndarray

    @classmethod
    def of(cls, columns: Mapping[str, Any]) -> SampleColumns:
        """From any mapping of column name to values: a ``pandas.DataFrame`` or a dict of arrays."""
        return cls(*(np.asarray(columns[name], dtype="float64") for name in
                     ("t_s", "rss_bytes", "anon_bytes", "gpu_used_bytes")))


def _max(values: Iterable[Any]) -> int | None:
    present = [float(v) for v in values if v is not None and not np.isnan(float(v))]
    return int(max(present)) if present else None


def _window(t_s: np.ndarray, phases: Phases) -> np.ndarray:
    """The samples of the build phase: from partitioning to the end of the last engine."""
    if phases.partition_s is None:
        return np.zeros(t_s.shape, dtype=bool)
    inside = t_s >= phases.partition_s
    if phases.build_end_s is not None:
        inside &= t_s <= phases.build_end_s
    return inside


def _column_max(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else None


def sampled_peaks(record: StrategyRecord, samples: SampleColumns) -> dict[str, Any]:
    """The peaks and wall time of a strategy, from its samples and its kernel marks (see the module doc).

    Returns the :class:`~harness.results.record.StrategyRecord` fields ``host_peak_bytes``,
    ``build_peak_bytes``, ``host_gpu_peak_bytes``, ``anon_peak_bytes``, ``gpu_peak_bytes``
    and ``wall_s``, to be set on the record with ``record.replace(**peaks)``.
    """
    hwms = [e.host_hwm_bytes for e in record.engines]
    has_gpu = bool(np.isfinite(samples.gpu_used_bytes).any())
    window = _window(samples.t_s, record.phases)
    build_rss = samples.rss_bytes[window]
    gpu = np.nan_to_num(samples.gpu_used_bytes[window], nan=0.0) if has_gpu else 0.0
    at_end = [
        e.host_hwm_bytes + (e.gpu_used_bytes or 0) for e in record.engines if e.host_hwm_bytes is not None
    ]
    wall = record.phases.wall_s
    return {
        "host_peak_bytes": _max([record.load_hwm_bytes, *hwms, _column_max(samples.rss_bytes)]),
        "build_peak_bytes": _max([*hwms, _column_max(build_rss)]),
        "host_gpu_peak_bytes": _max([_column_max(build_rss + gpu), *at_end]),
        "anon_peak_bytes": _max([_column_max(samples.anon_bytes)]),
        "gpu_peak_bytes": _max([_column_max(samples.gpu_used_bytes)]) if has_gpu else None,
        "wall_s": None if wall is None else round(wall, 3),
    }


def engine_gpu_peaks(engines: Sequence[EngineRecord], engine_column: np.ndarray,
                     gpu_used: np.ndarray) -> tuple[EngineRecord, ...]:
    """``engines`` with ``gpu_peak_bytes`` set where the samples hold GPU figures: the largest ``gpu_used_bytes``
    of the samples labelled with the engine (``engine_column``, the samples' engine index), and its
    ``gpu_start_bytes``. Engines without such figures (no GPU, no sample) are returned as they are."""
    labels = np.asarray(engine_column, dtype="float64")
    used = np.asarray(gpu_used, dtype="float64")
    out = []
    for e in engines:
        peak = _max([_column_max(used[labels == e.index]), e.gpu_start_bytes])
        out.append(e if peak is None else replace(e, gpu_peak_bytes=peak))
    return tuple(out)


def compiler_gpu_own_bytes(engine: EngineRecord) -> int | None:
    """The device memory a compiler held of its own while it built ``engine``: its GPU peak − the device copies of
    its weights the build made − what was in use when it began (``gpu_peak_bytes − gpu_weights_bytes −
    gpu_start_bytes``, NVML ``used`` above the baseline: the compiler's workspace, autotuning buffers, CUDA
    modules it loaded, and any CUDA context of a process it started). None where any of them was not measured
    (the CPU, records before layout 16)."""
    if engine.gpu_peak_bytes is None or engine.gpu_weights_bytes is None or engine.gpu_start_bytes is None:
        return None
    return engine.gpu_peak_bytes - engine.gpu_weights_bytes - engine.gpu_start_bytes


def host_floor_bytes(baseline_bytes: int, engine_bytes: Sequence[int]) -> int:
    """Lowest possible build-phase host peak when engines leave the process: baseline + largest engine."""
    if not engine_bytes:
        raise ValueError("no engines: the floor is undefined")
    return int(baseline_bytes) + max(int(e) for e in engine_bytes)


def gpu_floor_bytes(baseline_bytes: int, engine_bytes: Sequence[int], accumulate_engines: bool = True) -> int:
    """Lowest possible build-phase host + GPU peak for engines built on a GPU.

    ``baseline + max over k of (e_0 + ... + e_k + e_k)``, engines in build order, where
    engines stay in GPU memory (``accumulate_engines``); ``baseline + max over k of 2 * e_k``
    where each leaves it once built (engines that hold their weights).
    """
    if not engine_bytes:
        raise ValueError("no engines: the floor is undefined")
    sizes = [int(e) for e in engine_bytes]
    if not accumulate_engines:
        return int(baseline_bytes) + 2 * max(sizes)
    return int(baseline_bytes) + max(total + size for total, size in zip(accumulate(sizes), sizes, strict=True))


def engines_built_without_resident_weights(on_gpu: bool, compiler_weights: str | None) -> bool:
    """Whether engines are built on the host with no weight resident
    (:data:`~harness.catalog.BUILT_WITHOUT_RESIDENT_WEIGHTS`): compiled to run on the mapped weights
    where they lie (``mapped``), or with their weights streamed into the artifact a chunk at a time
    (``packaged``)."""
    return not on_gpu and compiler_weights in BUILT_WITHOUT_RESIDENT_WEIGHTS


def engines_accumulate(on_gpu: bool, compiler_weights: str | None) -> bool:
    """Whether built engines must stay in GPU memory: on a GPU, unless they hold their own weights
    (:data:`~harness.catalog.HOLDS_WEIGHTS`)."""
    return on_gpu and compiler_weights not in HOLDS_WEIGHTS


def engines_hold_compiler_memory(on_gpu: bool, engines: Sequence[EngineRecord]) -> bool:
    """Whether engines built on the host each record what their compiler held of its own beside their weights
    (``compiler_held_bytes``: OpenVINO's), which sets their floor (:func:`floor_bytes`)."""
    return not on_gpu and bool(engines) and all(e.compiler_held_bytes is not None for e in engines)


def floor_formula(on_gpu: bool, accumulate_engines: bool = True, without_resident_weights: bool = False,
                  compiler_held: bool = False) -> str:
    """The floor's formula in words, as the figures and tables name it."""
    if without_resident_weights:
        return "baseline"
    if compiler_held and not on_gpu:
        return "baseline + max over k of (engine k + what the compiler held beside it)"
    if not on_gpu:
        return "baseline + largest engine"
    if accumulate_engines:
        return "baseline + max over k of (engines 0..k + engine k)"
    return "baseline + max over k of 2 x engine k"


def floor_bytes(
    baseline_bytes: int, engines: Sequence[EngineRecord], on_gpu: bool, compiler_weights: str | None = None
) -> int:
    """The floor for engines built in index order: :func:`gpu_floor_bytes` on a GPU, else :func:`host_floor_bytes`.

    Engines that hold their weights (:data:`~harness.catalog.HOLDS_WEIGHTS`) on a GPU need not accumulate.
    Engines built on the host with no weight resident (:func:`engines_built_without_resident_weights`: ``mapped`` and
    ``packaged``) have the baseline as their floor; every
    weight page a build does bring in counts in its excess. Engines whose compiler recorded what it held beside
    their weights (:func:`engines_hold_compiler_memory`) have ``baseline + max over k of (e_k + h_k)``, a
    negative ``h_k`` counting as 0.
    """
    if not engines:
        raise ValueError("no engines: the floor is undefined")
    if engines_built_without_resident_weights(on_gpu, compiler_weights):
        return int(baseline_bytes)
    if engines_hold_compiler_memory(on_gpu, engines):
        return int(baseline_bytes) + max(e.weight_bytes + max(0, e.compiler_held_bytes or 0) for e in engines)
    sizes = [e.weight_bytes for e in _in_build_order(engines)]
    if not on_gpu:
        return host_floor_bytes(baseline_bytes, sizes)
    return gpu_floor_bytes(baseline_bytes, sizes, engines_accumulate(on_gpu, compiler_weights))


def excess_fraction(value: float, floor: float, model_bytes: float) -> float:
    """``(value − floor) / model_bytes``; negative when a measurement missed memory that was there."""
    if model_bytes <= 0:
        raise ValueError(f"model size must be positive, got {model_bytes}")
    return (float(value) - float(floor)) / float(model_bytes)


def compared_label(on_gpu: bool) -> str:
    """What is compared with the floor, as tables and figures name it."""
    return BUILD_HOST_GPU_PEAK if on_gpu else BUILD_HOST_PEAK


def baseline_anon_bytes(samples: SampleColumns, phases: Phases) -> int | None:
    """The process's anonymous memory before the load began (the interpreter, torch and the harness): the last
    sample at or before the load's start, else the first sample; None without samples."""
    anon = samples.anon_bytes
    known = np.isfinite(anon)
    if not known.any():
        return None
    before = known & (samples.t_s <= phases.load_start_s) if phases.load_start_s is not None else known & False
    pick = np.flatnonzero(before)[-1] if before.any() else np.flatnonzero(known)[0]
    return int(anon[pick])


def resident_at_load(record: StrategyRecord) -> int | None:
    """The checkpoint's bytes in the page cache when ``record``'s load began, from its cache record; None where
    it has none or the residency was not measured. What the table shows and what each round's
    :class:`~harness.results.record.RepeatRecord` keeps."""
    return None if record.cache is None else record.cache.resident_at_load_bytes


def _in_build_order(engines: Iterable[EngineRecord]) -> list[EngineRecord]:
    """``engines`` in the order they were built: by index."""
    return sorted(engines, key=lambda e: e.index)


@dataclass(frozen=True)
class StrategyMetrics:
    """What every reader shows of one strategy, derived once from its record.

    Bytes are ``None`` where nothing was measured (a failed strategy's floor, the GPU
    figures of a run without one); seconds are ``None`` for a phase not reached.
    ``engine_s`` holds ``(index, seconds)`` per engine built, in build order. ``record`` is
    the measured record they were derived from: a report column of a measured value reads
    it there, with nothing to add here.

    The wall (the record's ``wall_s``, from the load's start to the end of the last engine) is the sum
    of its phases: ``load_s`` + ``export_s`` (None without an export) + ``build_s`` (from
    partitioning to the last engine's end) + ``between_s`` (what lies between them: making
    the model, the release plan). ``check_s``, the built model run against eager, comes
    after the wall and is not in it (None where not recorded). ``anon_above_baseline_bytes``
    is the whole-run anonymous peak less the anonymous memory before the load (the
    interpreter and its libraries): what the strategy itself held (None without samples).
    """

    record: StrategyRecord
    name: str
    on_gpu: bool
    model_bytes: int
    compared_label: str
    compared_peak_bytes: int | None
    floor_bytes: int | None
    excess: float | None
    load_s: float | None
    build_s: float | None
    export_s: float | None
    between_s: float | None
    check_s: float | None
    anon_above_baseline_bytes: int | None
    engine_s: tuple[tuple[int, float], ...]
    engines_built: int
    runs: int = 1
    runs_finished: int = 1
    wall_median_s: float | None = None
    wall_min_s: float | None = None
    wall_max_s: float | None = None
    load_median_s: float | None = None
    build_median_s: float | None = None

    @property
    def wall_spread(self) -> float | None:
        """The largest distance of a run's wall time from the median, as a fraction of the median."""
        if self.wall_median_s is None or self.wall_min_s is None or self.wall_max_s is None or not self.wall_median_s:
            return None
        return max(self.wall_median_s - self.wall_min_s, self.wall_max_s - self.wall_median_s) / self.wall_median_s

    @property
    def engine_pages_s(self) -> tuple[tuple[int, float], ...]:
        """``(index, seconds)`` per engine, in build order, that the build spent bringing the engine's weights'
        pages in, read from the record's engines (those that measured it)."""
        return tuple((e.index, e.pages_s) for e in _in_build_order(self.record.engines) if e.pages_s is not None)

    @property
    def engine_copy_s(self) -> tuple[tuple[int, float], ...]:
        """``(index, seconds)`` per engine, in build order, that the build spent copying its resident weights and
        flushing them, read from the record's engines (those that measured it)."""
        return tuple((e.index, e.copy_s) for e in _in_build_order(self.record.engines) if e.copy_s is not None)

    @property
    def pages_s(self) -> float | None:
        """Seconds the engine builds spent bringing their weights' pages in (None where not measured)."""
        return sum(s for _, s in self.engine_pages_s) if self.engine_pages_s else None

    @property
    def copy_s(self) -> float | None:
        """Seconds the engine builds spent copying resident weights to the engines and flushing them."""
        return sum(s for _, s in self.engine_copy_s) if self.engine_copy_s else None

    @property
    def gpu_measured(self) -> bool:
        """Whether this strategy has GPU figures."""
        return self.record.gpu_peak_bytes is not None

    @property
    def released_share(self) -> float | None:
        """The bytes released after their last engine as a fraction of the model's (each weight counted once)."""
        released = self.record.released_bytes
        return None if released is None or self.model_bytes <= 0 else released / self.model_bytes

    @property
    def build_host_floor_bytes(self) -> int | None:
        """The floor of the build-phase host peak alone, GPU or not: :func:`host_floor_bytes` (baseline + largest
        engine; ``floor_bytes`` itself without a GPU). None for a failed strategy, as ``floor_bytes``."""
        record = self.record
        if not self.on_gpu:
            return self.floor_bytes
        if not record.ok or not record.engines or record.baseline_rss_bytes is None:
            return None
        return host_floor_bytes(record.baseline_rss_bytes, [e.weight_bytes for e in record.engines])

    @property
    def build_host_excess(self) -> float | None:
        """``(build-phase host peak − build_host_floor_bytes) / model bytes``; ``excess`` itself without a GPU."""
        peak, floor = self.record.build_peak_bytes, self.build_host_floor_bytes
        if peak is None or floor is None or self.model_bytes <= 0:
            return None
        return excess_fraction(peak, floor, self.model_bytes)

    @property
    def resident_at_load_bytes(self) -> int | None:
        """The checkpoint's bytes in the page cache when the load began (None where not measured):
        :func:`resident_at_load` of its record."""
        return resident_at_load(self.record)

    @classmethod
    def of(cls, name: str, record: StrategyRecord, run: RunRecord,
           samples: SampleColumns | None = None) -> StrategyMetrics:
        """The metrics of strategy ``name`` of ``run``; ``samples``, its samples where read, give the anonymous
        memory above the baseline."""
        on_gpu = run.on_gpu
        compared = record.host_gpu_peak_bytes if on_gpu else record.build_peak_bytes
        floor = None
        if record.ok and record.engines and record.baseline_rss_bytes is not None:
            floor = floor_bytes(record.baseline_rss_bytes, record.engines, on_gpu, record.compiler_weights)
        excess = None
        if floor is not None and compared is not None and run.model.bytes > 0:
            excess = excess_fraction(compared, floor, run.model.bytes)
        phases = record.phases
        engine_s = tuple((e.index, e.end_s - e.start_s) for e in _in_build_order(record.engines)
                         if e.start_s is not None and e.end_s is not None)
        load_s, build_s, export_s = phases.load_s, phases.build_s, phases.export_s
        between_s = None
        if record.wall_s is not None and load_s is not None and build_s is not None:
            between_s = max(0.0, record.wall_s - load_s - build_s - (export_s or 0.0))
        anon_base = None if samples is None else baseline_anon_bytes(samples, phases)
        anon_above = None
        if anon_base is not None and record.anon_peak_bytes is not None:
            anon_above = max(0, record.anon_peak_bytes - anon_base)
        return cls(
            record=record,
            name=name,
            on_gpu=on_gpu,
            model_bytes=run.model.bytes,
            compared_label=compared_label(on_gpu),
            compared_peak_bytes=compared,
            floor_bytes=floor,
            excess=excess,
            load_s=load_s,
            build_s=build_s,
            export_s=export_s,
            between_s=between_s,
            check_s=phases.check_s,
            anon_above_baseline_bytes=anon_above,
            engine_s=engine_s,
            engines_built=len(engine_s),
            **_repeat_figures(record),
        )


def phase_spans(phases: Phases) -> tuple[tuple[str, float, float], ...]:
    """The phases of a strategy's wall, as ``(name, start, end)`` in seconds from its load start, in time order.

    The build runs from partitioning to the end of the last engine; every other phase is a
    ``<name>_start_s`` / ``<name>_end_s`` pair of :class:`~harness.results.record.Phases` (the load,
    the export). The check against eager comes after the wall and is not one of them
    (:attr:`StrategyMetrics.check_s`). A phase not reached is left out; without a load start there are none.
    """
    origin = phases.load_start_s
    if origin is None:
        return ()
    values = {f.name: getattr(phases, f.name) for f in fields(phases)}
    bounds = {name[: -len("_start_s")]: (start, values.get(name.replace("_start_s", "_end_s")))
              for name, start in values.items() if name.endswith("_start_s") and name != "check_start_s"}
    bounds["build"] = (phases.partition_s, phases.build_end_s)
    spans = [(name, start - origin, end - origin) for name, (start, end) in bounds.items()
             if start is not None and end is not None]
    return tuple(sorted(spans, key=lambda span: span[1]))


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if values else None


def _repeat_figures(record: StrategyRecord) -> dict[str, Any]:
    """Medians and range over a strategy's repeated runs (one run: its own figures)."""
    if not record.repeats:
        wall = record.wall_s
        return {"runs": 1, "runs_finished": int(record.ok), "wall_median_s": wall, "wall_min_s": wall,
                "wall_max_s": wall, "load_median_s": record.phases.load_s, "build_median_s": record.phases.build_s}
    done = [r for r in record.repeats if r.status == "ok" and r.wall_s is not None]
    walls = [r.wall_s for r in done if r.wall_s is not None]
    return {
        "runs": len(record.repeats),
        "runs_finished": len(done),
        "wall_median_s": _median(walls),
        "wall_min_s": min(walls, default=None),
        "wall_max_s": max(walls, default=None),
        "load_median_s": _median([r.load_s for r in done if r.load_s is not None]),
        "build_median_s": _median([r.build_s for r in done if r.build_s is not None]),
    }


@dataclass(frozen=True)
class DiskMetrics:
    """The run's cold sequential reads of the checkpoint: how many, the median rate and time, their range."""

    reads: int
    bytes: int
    median_bytes_per_s: float
    median_seconds: float
    min_bytes_per_s: float
    max_bytes_per_s: float
    median_cpu_seconds: float

    def read_s(self, nbytes: int) -> float:
        """Seconds reading ``nbytes`` costs at the median rate: the read-bound time of that many bytes."""
        return nbytes / self.median_bytes_per_s


def ceiling_points_read(points: Sequence[CeilingPoint]) -> list[CeilingPoint]:
    """The points of a read-ceiling sweep that read something, in a measurable time."""
    return [p for p in points if p.bytes > 0 and p.seconds > 0]


def ceiling_settings(points: Sequence[CeilingPoint]) -> dict[tuple[int, int], list[CeilingPoint]]:
    """The points of a read-ceiling sweep that read something, by setting (reader threads, request bytes), in the
    order the settings were first read; a setting the sweep read again holds every read of it."""
    settings: dict[tuple[int, int], list[CeilingPoint]] = {}
    for p in ceiling_points_read(points):
        settings.setdefault((p.threads, p.request_bytes), []).append(p)
    return settings


def best_ceiling(points: Sequence[CeilingPoint]) -> CeilingPoint | None:
    """The disk's ceiling: the read of the fastest setting of a read-ceiling sweep, a setting's rate being the
    median of its reads (the lower of the two middle ones where their number is even; a setting read once is its
    one read); None where it read nothing."""
    ranked = [sorted(reads, key=lambda p: p.bytes_per_s) for reads in ceiling_settings(points).values()]
    medians = [reads[(len(reads) - 1) // 2] for reads in ranked]
    return max(medians, key=lambda p: p.bytes_per_s) if medians else None


@dataclass(frozen=True)
class BuildLimit:
    """How long a build that reads the checkpoint would take with reading and building overlapped as well as the
    run's own measurements allow (:func:`build_limit`): the largest of its ``terms``, each ``(what it is,
    seconds)``. The terms are measured apart from the builds, so a build can come in under it."""

    terms: tuple[tuple[str, float], ...]

    @property
    def seconds(self) -> float:
        """The limit: the largest term."""
        return max(seconds for _, seconds in self.terms)

    @property
    def bound_by(self) -> str:
        """What the largest term is."""
        return max(self.terms, key=lambda term: term[1])[0]


def build_limit(run: RunRecord, metrics: Mapping[str, StrategyMetrics],
                engines_cost: str = "load") -> BuildLimit | None:
    """How long a build that reads the checkpoint would take with reading and building overlapped as well as the
    run's own measurements allow: the largest of

    * the model's bytes read at the disk's ceiling (:func:`best_ceiling` of the run's sweep);
    * the median build phase of ``engines_cost`` (``load``: its weights are resident when it builds, so its
      build is the engines' own cost);
    * where the engines are written as files (:class:`~harness.results.disk.SharedDisk`, each time it was
      measured), the median time of the checkpoint read while as many bytes are written, scaled to the model's
      bytes: the builds' reads and writes share that disk.

    None without a ceiling, without ``engines_cost``'s finished build, or where no engine build reads its
    weights (:func:`~harness.catalog.builds_read_weights`: then reading is no part of a build).
    """
    if not any(builds_read_weights(run.on_gpu, r.compiler_weights) for r in run.strategies.values()):
        return None
    best = best_ceiling(run.read_ceiling)
    reference = metrics.get(engines_cost)
    if best is None or reference is None or not reference.record.ok or reference.build_median_s is None:
        return None
    terms = [("the model's read time at the disk's ceiling", run.model.bytes / best.bytes_per_s),
             (f"{engines_cost}'s build phase, its weights resident, median over the rounds", reference.build_median_s)]
    shared = [s.both_s * run.model.bytes / s.bytes for s in run.shared_disk if s.bytes > 0]
    if shared:
        terms.append(("the model read while as many bytes are written as engine files, median",
                      float(np.median(shared))))
    return BuildLimit(tuple(terms))


def disk_metrics(reads: Sequence[DiskRead]) -> DiskMetrics | None:
    """:class:`DiskMetrics` of a run's disk reads; None where it made none."""
    done = [r for r in reads if r.bytes > 0 and r.bytes_per_s > 0]
    if not done:
        return None
    rates = [r.bytes_per_s for r in done]
    return DiskMetrics(
        reads=len(done), bytes=done[0].bytes, median_bytes_per_s=float(np.median(rates)),
        median_seconds=float(np.median([r.seconds for r in done])), min_bytes_per_s=min(rates),
        max_bytes_per_s=max(rates), median_cpu_seconds=float(np.median([r.cpu_seconds for r in done])),
    )


def run_metrics(run: RunRecord, samples: Mapping[str, SampleColumns] | None = None) -> dict[str, StrategyMetrics]:
    """:class:`StrategyMetrics` of every strategy of ``run``, in the order they ran (``samples``: each one's,
    where read)."""
    return {name: StrategyMetrics.of(name, record, run, None if samples is None else samples.get(name))
            for name, record in run.strategies.items()}
