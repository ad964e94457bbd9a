"""The results layout, in one place: its version, file names, CSV columns and typed records.

A results directory ``results/<name>/`` holds:

=============================  =====================================================
``summary.json``               :class:`RunRecord`: the run, and one
                               :class:`StrategyRecord` per strategy
``plan.json``                  the resolved plan every strategy ran (:mod:`harness.plan`)
``strategy-<strategy>.json``   what that strategy's process wrote (:func:`strategy_file`)
``samples-<strategy>.csv``     its samples, :data:`SAMPLE_COLUMNS`
``events-<strategy>.csv``      its load, partition and engine events, :data:`EVENT_COLUMNS`
=============================  =====================================================

Every record has ``to_json`` and ``from_json``. ``from_json`` rejects a missing key, an
unknown key and a value of the wrong type with a :class:`RecordError` naming the file
and the key's path (``summary.json: strategies.map.engines[3]: missing key 'end_s'``),
so a misspelt key cannot quietly read as ``None``.

Versions (:data:`LAYOUT_VERSION` is what this code writes; ``summary.json`` says which
it is in ``layout``):

1. No ``layout`` key. The results committed before the layout had a version.
2. Adds ``layout``; per strategy ``load_hwm_bytes`` (the kernel's high-water mark read
   at partitioning, which covers the load), ``gpu_baseline_bytes`` (NVML ``used`` taken
   as GPU zero) and ``build_peak_bytes`` (the build-phase host peak); per engine
   ``tensors``. ``phases`` always holds its four keys (``null`` for a phase not reached).
   Reading version 1 fills ``load_hwm_bytes``, ``gpu_baseline_bytes`` and ``tensors`` with
   ``None``, and ``build_peak_bytes`` with version 1's own build-phase peak: on a CPU
   device that is ``host_gpu_peak_bytes`` (no GPU memory adds to it), on a GPU the
   largest engine high-water mark.

3. Adds, for compiler backends (``inductor``): per engine ``compile_s``, ``artifact_bytes``,
   ``rss_before_bytes`` (RSS when its build began), ``children_peak_bytes`` (the compiler's
   subprocesses, sampled) and ``cache_bytes`` (growth of the compiler's cache); per strategy
   ``compiler`` and ``compiler_weights`` (the backend's weight setting), ``export`` (an
   :class:`ExportRecord`: the export phase), ``max_abs_diff`` and ``check`` (the built model
   against eager); ``phases`` gains ``export_start_s`` and ``export_end_s``. All ``None`` for
   the ``copy`` backend and when reading version 1 or 2.
4. Adds, per run, ``repeats`` (cold runs per strategy), ``prefetch`` (the scenario's
   prefetch setting) and ``disk_reads`` (:class:`DiskRead`: cold sequential reads of the
   checkpoint made in the same run, the reference for read-bound time); per strategy
   ``cache`` (:class:`CacheRecord`: how the page cache was prepared and the checkpoint's
   residency at load start), ``prefetch`` and ``drop_cache`` (what its release plan was
   asked to do), ``prefetch_warmed_bytes``, ``repeat`` (which repeat the record is) and
   ``repeats`` (:class:`RepeatRecord`, one per cold run); per engine ``pages_s``,
   ``copy_s`` and ``major_faults``.

A later version adds keys (each field records the version that added it in
:data:`_SINCE`) and bumps :data:`LAYOUT_VERSION`; records of earlier versions read with
those fields ``None``.

What is *measured* lives here. What is *derived* from it (floors, excess, which peak is
compared with the floor) is computed by :mod:`harness.metrics` only; ``floor_bytes`` and
``excess_over_floor`` are written into the summary from there for readers outside the
harness and are never read back by it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.atomic import write_json
from harness.errors import HarnessError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "EVENT_COLUMNS",
    "LAYOUT_VERSION",
    "PLAN",
    "SAMPLE_COLUMNS",
    "SUMMARY",
    "CacheRecord",
    "CheckpointInfo",
    "DiskRead",
    "EngineRecord",
    "ExportRecord",
    "MachineInfo",
    "ModelInfo",
    "Phases",
    "Reference",
    "RecordError",
    "RepeatRecord",
    "RunRecord",
    "StrategyRecord",
    "empty_events",
    "empty_samples",
    "events_file",
    "read_events",
    "read_json_file",
    "read_samples",
    "read_strategy_file",
    "samples_file",
    "strategy_file",
    "write_strategy_file",
    "write_summary",
]

LAYOUT_VERSION = 4
"""The layout this code writes; it reads every version from 1 to this one."""

SUMMARY = "summary.json"
PLAN = "plan.json"

SAMPLE_COLUMNS: tuple[str, ...] = (
    "t_s",
    "rss_bytes",
    "anon_bytes",
    "file_bytes",
    "resident_bytes",
    "gpu_used_bytes",
    "gpu_reserved_bytes",
    "engine",
    "phase",
)
"""``samples-<strategy>.csv``: one row per sample of :class:`harness.sampler.Sampler` (all versions)."""

EVENT_COLUMNS: tuple[str, ...] = (
    "t_s",
    "event",
    "engine",
    "weight_bytes",
    "host_hwm_bytes",
    "released_bytes",
    "rss_bytes",
    "gpu_used_bytes",
)
"""``events-<strategy>.csv``: load, partition and engine events of :mod:`harness.worker` (all versions)."""


def samples_file(strategy: str) -> str:
    """File name of a strategy's samples."""
    return f"samples-{strategy}.csv"


def events_file(strategy: str) -> str:
    """File name of a strategy's events."""
    return f"events-{strategy}.csv"


def strategy_file(strategy: str) -> str:
    """File name of the record a strategy's process writes."""
    return f"strategy-{strategy}.json"


class RecordError(HarnessError, ValueError):
    """A results file is not in a layout this harness reads; the message names the file and the key."""


# --------------------------------------------------------------------------- reading helpers


def _describe(value: Any) -> str:
    text = json.dumps(value, default=str)
    return (text[:57] + "...") if len(text) > 60 else text


class _Obj:
    """One JSON object being read: its keys are checked on construction, values by the getters."""

    def __init__(self, data: Any, source: str, where: str, required: AbstractSet[str],
                 optional: AbstractSet[str] = frozenset()) -> None:
        self.source, self.where = source, where
        if not isinstance(data, dict):
            raise self.error(None, f"expected an object, got {_describe(data)}")
        self.data: dict[str, Any] = data
        for problem, keys in (("unknown", set(data) - set(required) - set(optional)),
                              ("missing", set(required) - set(data))):
            if keys:
                first, more = sorted(keys)[0], len(keys) - 1
                raise self.error(None, f"{problem} key {first!r}" + (f" (and {more} more)" if more else ""))

    def path(self, key: str | None) -> str:
        if key is None:
            return self.where or "<top level>"
        return f"{self.where}.{key}" if self.where else key

    def error(self, key: str | None, problem: str) -> RecordError:
        return RecordError(f"{self.source}: {self.path(key)}: {problem}")

    def raw(self, key: str) -> Any:
        return self.data.get(key)

    def _typed(self, key: str, ok: Callable[[Any], bool], what: str, null: bool) -> Any:
        value = self.data.get(key)
        if value is None and null:
            return None
        if not ok(value):
            raise self.error(key, f"expected {what}{' or null' if null else ''}, got {_describe(value)}")
        return value

    def integer(self, key: str, *, null: bool = True) -> Any:
        return self._typed(key, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer", null)

    def number(self, key: str, *, null: bool = True) -> Any:
        def ok(v: Any) -> bool:
            return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)

        value = self._typed(key, ok, "a number", null)
        return None if value is None else float(value)

    def text(self, key: str, *, null: bool = True) -> Any:
        return self._typed(key, lambda v: isinstance(v, str), "a string", null)

    def flag(self, key: str, *, null: bool = True) -> Any:
        return self._typed(key, lambda v: isinstance(v, bool), "true or false", null)

    def items(self, key: str) -> list[Any]:
        return self._typed(key, lambda v: isinstance(v, list), "a list", False)  # type: ignore[no-any-return]


_SINCE: dict[str, dict[str, int]] = {}
"""Per record class, the layout version that added each key (absent: version 1)."""


def _keys(cls: type, version: int) -> set[str]:
    """The keys a record of ``cls`` holds in ``version``."""
    since = _SINCE.get(cls.__name__, {})
    return {f.name for f in fields(cls) if since.get(f.name, 1) <= version and not f.name.startswith("_")}


def _serialise(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_serialise(v) for v in value]
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, Path):
        return str(value)
    return value


def _to_json(record: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {f.name: _serialise(getattr(record, f.name)) for f in fields(record) if f.name not in skip}


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class EngineRecord:
    """One engine build: its weights, time span, host high-water mark and what followed it.

    Times are seconds from the strategy process's start. ``host_hwm_bytes`` is the
    kernel's exact RSS peak while the engine was built (``VmHWM`` reset at its start);
    ``rss_after_bytes`` and ``gpu_used_bytes`` are read right after its weights were
    released. ``tensors`` counts the names it reads (version 2).
    """

    index: int
    weight_bytes: int
    start_s: float | None
    end_s: float | None
    host_hwm_bytes: int | None
    released_bytes: int | None
    rss_after_bytes: int | None
    gpu_used_bytes: int | None
    tensors: int | None = None
    compile_s: float | None = None
    artifact_bytes: int | None = None
    rss_before_bytes: int | None = None
    children_peak_bytes: int | None = None
    cache_bytes: int | None = None

    @property
    def compiler_over_floor_bytes(self) -> int | None:
        """What a compiler added on top of this engine's copy floor: high-water mark - (RSS at its start + its weights).

        ``None`` for engines not built by a compiler (or without a high-water mark).
        """
        if self.compile_s is None or self.host_hwm_bytes is None or self.rss_before_bytes is None:
            return None
        return self.host_hwm_bytes - (self.rss_before_bytes + self.weight_bytes)
    pages_s: float | None = None
    copy_s: float | None = None
    major_faults: int | None = None

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any, source: str, where: str, version: int) -> EngineRecord:
        o = _Obj(data, source, where, _keys(cls, version))
        return cls(
            index=o.integer("index", null=False),
            weight_bytes=o.integer("weight_bytes", null=False),
            start_s=o.number("start_s"),
            end_s=o.number("end_s"),
            host_hwm_bytes=o.integer("host_hwm_bytes"),
            released_bytes=o.integer("released_bytes"),
            rss_after_bytes=o.integer("rss_after_bytes"),
            gpu_used_bytes=o.integer("gpu_used_bytes"),
            tensors=o.integer("tensors"),
            compile_s=o.number("compile_s"),
            artifact_bytes=o.integer("artifact_bytes"),
            rss_before_bytes=o.integer("rss_before_bytes"),
            children_peak_bytes=o.integer("children_peak_bytes"),
            cache_bytes=o.integer("cache_bytes"),
            pages_s=o.number("pages_s"),
            copy_s=o.number("copy_s"),
            major_faults=o.integer("major_faults"),
        )


_SINCE["EngineRecord"] = {"tensors": 2, "compile_s": 3, "artifact_bytes": 3, "rss_before_bytes": 3,
                          "children_peak_bytes": 3, "cache_bytes": 3, "pages_s": 4, "copy_s": 4, "major_faults": 4}


@dataclass(frozen=True)
class ExportRecord:
    """The export phase of a compiler backend (``torch.export.export`` of the loaded model), version 3.

    ``pages_read_bytes``: growth of this process's resident pages of the checkpoint files
    over the phase (what export read through mapped views); ``residency_read_bytes``: growth
    of the files' page-cache residency (anyone's reads). ``rss_before_bytes`` and
    ``hwm_bytes``: RSS at the start and the kernel's high-water mark over the phase;
    ``anon_delta_bytes``: growth of anonymous memory. ``not_shared``: program tensors whose
    memory is not the model's (copies, or constants export made).
    """

    seconds: float
    nodes: int
    pages_read_bytes: int | None
    residency_read_bytes: int | None
    rss_before_bytes: int
    rss_after_bytes: int
    hwm_bytes: int | None
    anon_delta_bytes: int
    not_shared: int

    @property
    def host_cost_bytes(self) -> int | None:
        """How far host memory rose above its value at the start of export, at its highest."""
        return None if self.hwm_bytes is None else self.hwm_bytes - self.rss_before_bytes

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any, source: str, where: str, version: int) -> ExportRecord:
        o = _Obj(data, source, where, _keys(cls, version))
        return cls(
            seconds=o.number("seconds", null=False),
            nodes=o.integer("nodes", null=False),
            pages_read_bytes=o.integer("pages_read_bytes"),
            residency_read_bytes=o.integer("residency_read_bytes"),
            rss_before_bytes=o.integer("rss_before_bytes", null=False),
            rss_after_bytes=o.integer("rss_after_bytes", null=False),
            hwm_bytes=o.integer("hwm_bytes"),
            anon_delta_bytes=o.integer("anon_delta_bytes", null=False),
            not_shared=o.integer("not_shared", null=False),
        )


@dataclass(frozen=True)
class CacheRecord:
    """How a strategy's run found the checkpoint in the page cache (version 4).

    ``state`` is ``"cold"`` or ``"warm"``, ``method`` what was done in words
    (:class:`harness.coldcache.CacheReport`); ``flushed``: the files were fsynced until
    no page was dirty or under writeback; ``settled``: the machine's dirty and writeback
    pages fell under the threshold before the drop (None: not asked, or unknown);
    ``dropped``: the files' pages were dropped; ``resident_before_bytes`` and
    ``resident_after_bytes``: the checkpoint's residency before and after the
    preparation; ``resident_at_load_bytes``: its residency right before the load began
    (about 0 for a cold run); ``seconds``: what the preparation took; ``notes``: what
    kept the state from being the one asked for.
    """

    state: str
    method: str
    flushed: bool
    settled: bool | None
    dropped: bool
    resident_before_bytes: int
    resident_after_bytes: int
    resident_at_load_bytes: int | None
    total_bytes: int
    seconds: float
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any, source: str, where: str, version: int) -> CacheRecord:
        o = _Obj(data, source, where, _keys(cls, version))
        notes = o.items("notes")
        if not all(isinstance(n, str) for n in notes):
            raise o.error("notes", "expected a list of strings")
        return cls(
            state=o.text("state", null=False), method=o.text("method", null=False),
            flushed=o.flag("flushed", null=False), settled=o.flag("settled"), dropped=o.flag("dropped", null=False),
            resident_before_bytes=o.integer("resident_before_bytes", null=False),
            resident_after_bytes=o.integer("resident_after_bytes", null=False),
            resident_at_load_bytes=o.integer("resident_at_load_bytes"),
            total_bytes=o.integer("total_bytes", null=False), seconds=o.number("seconds", null=False),
            notes=tuple(notes),
        )


@dataclass(frozen=True)
class RepeatRecord:
    """One cold run of a strategy, when the scenario asks for repeats (version 4).

    ``repeat`` counts from 0; the times are the run's own (:class:`StrategyRecord`'s
    ``wall_s``, load and build phases); ``resident_at_load_bytes`` is the checkpoint's
    page-cache residency at its load's start.
    """

    repeat: int
    status: str
    error: str | None
    wall_s: float | None
    load_s: float | None
    build_s: float | None
    build_peak_bytes: int | None
    resident_at_load_bytes: int | None

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any, source: str, where: str, version: int) -> RepeatRecord:
        o = _Obj(data, source, where, _keys(cls, version))
        return cls(o.integer("repeat", null=False), o.text("status", null=False), o.text("error"),
                   o.number("wall_s"), o.number("load_s"), o.number("build_s"), o.integer("build_peak_bytes"),
                   o.integer("resident_at_load_bytes"))


@dataclass(frozen=True)
class DiskRead:
    """A cold sequential ``read()`` of the checkpoint, made in the run (version 4).

    ``bytes`` read in ``seconds``: ``bytes_per_s``; ``cpu_seconds`` of the reading
    process meanwhile (close to ``seconds``: the copy on the CPU bound it, not the disk);
    ``before``: which repeat's strategies it preceded; ``method``: how it was read
    (:func:`harness.diskread.cold_read_bandwidth`); ``resident_at_start_bytes``: the
    checkpoint's residency once prepared cold.
    """

    before: int
    bytes: int
    seconds: float
    bytes_per_s: float
    cpu_seconds: float
    method: str
    resident_at_start_bytes: int

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any, source: str, where: str, version: int) -> DiskRead:
        o = _Obj(data, source, where, _keys(cls, version))
        return cls(o.integer("before", null=False), o.integer("bytes", null=False),
                   o.number("seconds", null=False), o.number("bytes_per_s", null=False),
                   o.number("cpu_seconds", null=False), o.text("method", null=False),
                   o.integer("resident_at_start_bytes", null=False))


@dataclass(frozen=True)
class Phases:
    """Phase boundaries in seconds from the strategy process's start; ``None`` for a phase not reached."""

    load_start_s: float | None = None
    load_end_s: float | None = None
    partition_s: float | None = None
    build_end_s: float | None = None
    export_start_s: float | None = None
    export_end_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any, source: str, where: str, version: int) -> Phases:
        keys = _keys(cls, version)
        # version 1 wrote only the phases a strategy reached
        o = _Obj(data, source, where, set() if version == 1 else keys, keys)
        return cls(**{k: o.number(k) for k in keys})


_SINCE["Phases"] = {"export_start_s": 3, "export_end_s": 3}


@dataclass(frozen=True)
class StrategyRecord:
    """One strategy's measured figures (``summary.json``'s ``strategies.<name>``).

    ``status`` is ``"ok"`` when every engine was built, ``"failed"`` otherwise, with the
    reason in ``error``. Peaks are bytes and the larger of what the sampler saw and
    what the kernel's high-water marks say (see :func:`harness.metrics.sampled_peaks`):
    ``host_peak_bytes`` over the whole run, ``build_peak_bytes`` from partitioning to the
    end of the last engine, ``host_gpu_peak_bytes`` host + GPU over that build phase,
    ``anon_peak_bytes`` and ``gpu_peak_bytes`` sampled over the whole run.
    ``floor_bytes`` and ``excess_over_floor`` are a copy of :mod:`harness.metrics`'
    figures for readers outside the harness.
    """

    status: str
    error: str | None = None
    note: str = ""
    baseline_rss_bytes: int | None = None
    host_at_partitioning_bytes: int | None = None
    load_hwm_bytes: int | None = None
    gpu_baseline_bytes: int | None = None
    host_peak_bytes: int | None = None
    anon_peak_bytes: int | None = None
    gpu_peak_bytes: int | None = None
    host_gpu_peak_bytes: int | None = None
    build_peak_bytes: int | None = None
    wall_s: float | None = None
    process_wall_s: float | None = None
    phases: Phases = field(default_factory=Phases)
    samples: int = 0
    mean_interval_ms: float | None = None
    max_gap_ms: float | None = None
    peak_source: str | None = None
    engine_cap_bytes: int | None = None
    released_bytes: int | None = None
    unreleased_bytes: int | None = None
    release_note: str = ""
    engines: tuple[EngineRecord, ...] = ()
    floor_bytes: int | None = None
    excess_over_floor: float | None = None
    watched_peak_rss_bytes: int | None = None
    compiler: str | None = None
    compiler_weights: str | None = None
    export: ExportRecord | None = None
    max_abs_diff: float | None = None
    check: str | None = None
    cache: CacheRecord | None = None
    prefetch: str | None = None
    drop_cache: bool | None = None
    prefetch_warmed_bytes: int | None = None
    repeat: int | None = None
    repeats: tuple[RepeatRecord, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the strategy ran to the end."""
        return self.status == "ok"

    def replace(self, **changes: Any) -> StrategyRecord:
        """A copy with ``changes``."""
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any, source: str, where: str, version: int) -> StrategyRecord:
        o = _Obj(data, source, where, _keys(cls, version))
        status = o.text("status", null=False)
        engines = tuple(
            EngineRecord.from_json(item, source, f"{o.path('engines')}[{i}]", version)
            for i, item in enumerate(o.items("engines"))
        )
        build_peak = o.integer("build_peak_bytes")
        return cls(
            status=status,
            error=o.text("error"),
            note=o.text("note") or "",
            baseline_rss_bytes=o.integer("baseline_rss_bytes"),
            host_at_partitioning_bytes=o.integer("host_at_partitioning_bytes"),
            load_hwm_bytes=o.integer("load_hwm_bytes"),
            gpu_baseline_bytes=o.integer("gpu_baseline_bytes"),
            host_peak_bytes=o.integer("host_peak_bytes"),
            anon_peak_bytes=o.integer("anon_peak_bytes"),
            gpu_peak_bytes=o.integer("gpu_peak_bytes"),
            host_gpu_peak_bytes=o.integer("host_gpu_peak_bytes"),
            build_peak_bytes=build_peak,
            wall_s=o.number("wall_s"),
            process_wall_s=o.number("process_wall_s"),
            phases=Phases.from_json(o.raw("phases"), source, o.path("phases"), version),
            samples=o.integer("samples", null=False),
            mean_interval_ms=o.number("mean_interval_ms"),
            max_gap_ms=o.number("max_gap_ms"),
            peak_source=o.text("peak_source"),
            engine_cap_bytes=o.integer("engine_cap_bytes"),
            released_bytes=o.integer("released_bytes"),
            unreleased_bytes=o.integer("unreleased_bytes"),
            release_note=o.text("release_note") or "",
            engines=engines,
            floor_bytes=o.integer("floor_bytes"),
            excess_over_floor=o.number("excess_over_floor"),
            watched_peak_rss_bytes=o.integer("watched_peak_rss_bytes"),
            compiler=o.text("compiler"),
            compiler_weights=o.text("compiler_weights"),
            export=None if o.raw("export") is None else ExportRecord.from_json(
                o.raw("export"), source, o.path("export"), version),
            max_abs_diff=o.number("max_abs_diff"),
            check=o.text("check"),
            cache=None if o.raw("cache") is None else CacheRecord.from_json(o.raw("cache"), source, o.path("cache"),
                                                                             version),
            prefetch=o.text("prefetch"),
            drop_cache=o.flag("drop_cache"),
            prefetch_warmed_bytes=o.integer("prefetch_warmed_bytes"),
            repeat=o.integer("repeat"),
            repeats=tuple(
                RepeatRecord.from_json(item, source, f"{o.path('repeats')}[{i}]", version)
                for i, item in enumerate(o.items("repeats") if "repeats" in o.data else [])
            ),
        )


_SINCE["StrategyRecord"] = {"load_hwm_bytes": 2, "gpu_baseline_bytes": 2, "build_peak_bytes": 2,
                            "compiler": 3, "compiler_weights": 3, "export": 3, "max_abs_diff": 3, "check": 3,
                            **dict.fromkeys(("cache", "prefetch", "drop_cache", "prefetch_warmed_bytes", "repeat",
                                             "repeats"), 4)}


def _upgrade_v1_strategy(record: StrategyRecord, device: str) -> StrategyRecord:
    """Version 1 had no build-phase host peak of its own; take the one it compared with the floor."""
    if device.startswith("cuda"):
        hwms = [e.host_hwm_bytes for e in record.engines if e.host_hwm_bytes is not None]
        return record.replace(build_peak_bytes=max(hwms) if hwms else None)
    return record.replace(build_peak_bytes=record.host_gpu_peak_bytes)


@dataclass(frozen=True)
class MachineInfo:
    """The machine a run was made on (:func:`harness.machine.machine`)."""

    cpus: int | None
    mem_total_bytes: int | None
    gpu: str | None
    kernel: str | None
    hostname: str | None
    platform: str | None

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any, source: str, where: str, version: int) -> MachineInfo:
        o = _Obj(data, source, where, _keys(cls, version))
        return cls(o.integer("cpus"), o.integer("mem_total_bytes"), o.text("gpu"), o.text("kernel"),
                   o.text("hostname"), o.text("platform"))


@dataclass(frozen=True)
class ModelInfo:
    """The model that was measured; ``bytes`` are its checkpoint's (a tied tensor once)."""

    name: str
    source: str
    source_note: str
    tensors: int
    bytes: int
    bytes_with_non_persistent_buffers: int

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any, source: str, where: str, version: int) -> ModelInfo:
        o = _Obj(data, source, where, _keys(cls, version))
        return cls(o.text("name", null=False), o.text("source", null=False), o.text("source_note", null=False),
                   o.integer("tensors", null=False), o.integer("bytes", null=False),
                   o.integer("bytes_with_non_persistent_buffers", null=False))


@dataclass(frozen=True)
class CheckpointInfo:
    """The checkpoint every strategy read: its path, whether this run generated it, its seed and size."""

    path: str
    generated: bool
    seed: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any, source: str, where: str, version: int) -> CheckpointInfo:
        o = _Obj(data, source, where, _keys(cls, version))
        return cls(o.text("path", null=False), o.flag("generated", null=False), o.integer("seed", null=False),
                   o.integer("bytes", null=False))


@dataclass(frozen=True)
class Reference:
    """A figure measured on another setup, shown beside the run's own and marked as such."""

    label: str
    host_at_partitioning_gib: float | None = None
    host_gpu_peak_gib: float | None = None
    host_peak_gib: float | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any, source: str, where: str, version: int) -> Reference:
        o = _Obj(data, source, where, _keys(cls, version))
        return cls(o.text("label", null=False), o.number("host_at_partitioning_gib"), o.number("host_gpu_peak_gib"),
                   o.number("host_peak_gib"), o.text("note") or "")


@dataclass(frozen=True)
class RunRecord:
    """``summary.json``: one scenario run and its strategies, in the order they ran."""

    scenario: str
    name: str
    description: str
    created: str
    commit: str | None
    machine: MachineInfo
    versions: dict[str, str | None]
    model: ModelInfo
    checkpoint: CheckpointInfo
    engines: int
    engine_cap_bytes: int
    largest_engine_bytes: int
    backend: str
    device: str
    cache: str
    release: bool
    sample_interval_ms: float
    memory_limit_bytes: int | None
    references: tuple[Reference, ...]
    scenario_config: dict[str, Any]
    strategies: dict[str, StrategyRecord]
    layout: int = LAYOUT_VERSION
    repeats: int | None = None
    prefetch: str | None = None
    disk_reads: tuple[DiskRead, ...] = ()

    @property
    def on_gpu(self) -> bool:
        """Whether engines were built on a GPU (the device decides which floor applies)."""
        return self.device.startswith("cuda")

    def replace(self, **changes: Any) -> RunRecord:
        """A copy with ``changes``."""
        return replace(self, **changes)

    def with_strategy(self, name: str, record: StrategyRecord) -> RunRecord:
        """A copy with strategy ``name`` set to ``record`` (appended when new)."""
        return replace(self, strategies={**self.strategies, name: record})

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"layout": LAYOUT_VERSION}
        data.update(_to_json(self, skip=("layout", "strategies")))
        data["versions"] = dict(self.versions)
        data["scenario_config"] = self.scenario_config
        data["strategies"] = {name: s.to_json() for name, s in self.strategies.items()}
        return data

    @classmethod
    def from_json(cls, data: Any, source: str) -> RunRecord:
        if not isinstance(data, dict):
            raise RecordError(f"{source}: expected a JSON object, got {_describe(data)}")
        version = data.get("layout", 1)
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= LAYOUT_VERSION:
            raise RecordError(f"{source}: layout: this harness reads layout versions 1 to {LAYOUT_VERSION}, "
                              f"got {_describe(version)}")
        o = _Obj(data, source, "", _keys(cls, version))
        versions = o.raw("versions")
        if not isinstance(versions, dict) or not all(isinstance(v, str | None) for v in versions.values()):
            raise o.error("versions", "expected an object of strings or nulls")
        config = o.raw("scenario_config")
        if not isinstance(config, dict):
            raise o.error("scenario_config", "expected an object")
        device = o.text("device", null=False)
        raw_strategies = o.raw("strategies")
        if not isinstance(raw_strategies, dict):
            raise o.error("strategies", "expected an object of strategies")
        strategies = {}
        for name, item in raw_strategies.items():
            record = StrategyRecord.from_json(item, source, f"strategies.{name}", version)
            strategies[str(name)] = _upgrade_v1_strategy(record, device) if version == 1 else record
        return cls(
            layout=version,
            scenario=o.text("scenario", null=False),
            name=o.text("name", null=False),
            description=o.text("description") or "",
            created=o.text("created", null=False),
            commit=o.text("commit"),
            machine=MachineInfo.from_json(o.raw("machine"), source, "machine", version),
            versions={str(k): v for k, v in versions.items()},
            model=ModelInfo.from_json(o.raw("model"), source, "model", version),
            checkpoint=CheckpointInfo.from_json(o.raw("checkpoint"), source, "checkpoint", version),
            engines=o.integer("engines", null=False),
            engine_cap_bytes=o.integer("engine_cap_bytes", null=False),
            largest_engine_bytes=o.integer("largest_engine_bytes", null=False),
            backend=o.text("backend", null=False),
            device=device,
            cache=o.text("cache", null=False),
            release=o.flag("release", null=False),
            sample_interval_ms=o.number("sample_interval_ms", null=False),
            memory_limit_bytes=o.integer("memory_limit_bytes"),
            references=tuple(
                Reference.from_json(item, source, f"references[{i}]", version)
                for i, item in enumerate(o.items("references"))
            ),
            scenario_config=config,
            strategies=strategies,
            repeats=o.integer("repeats"),
            prefetch=o.text("prefetch"),
            disk_reads=tuple(
                DiskRead.from_json(item, source, f"disk_reads[{i}]", version)
                for i, item in enumerate(o.items("disk_reads") if "disk_reads" in o.data else [])
            ),
        )


_SINCE["RunRecord"] = {"layout": 2, "repeats": 4, "prefetch": 4, "disk_reads": 4}


# --------------------------------------------------------------------------- files


def read_json_file(path: Path) -> Any:
    """The JSON in ``path``; a missing, unreadable or malformed file is a :class:`RecordError` naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise RecordError(f"{path}: not found; is {path.parent} a results directory?") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path}: cannot read ({exc})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc


def write_summary(directory: Path, run: RunRecord) -> Path:
    """Write ``summary.json`` into ``directory`` (atomically)."""
    return write_json(Path(directory) / SUMMARY, run.to_json())


def write_strategy_file(directory: Path, name: str, record: StrategyRecord) -> Path:
    """Write what a strategy's process measured, ``strategy-<name>.json`` (atomically)."""
    data = {"layout": LAYOUT_VERSION, "strategy": name, "record": record.to_json()}
    return write_json(Path(directory) / strategy_file(name), data)


def read_strategy_file(directory: Path, name: str) -> StrategyRecord | None:
    """The record a strategy's process wrote; ``None`` when it wrote none."""
    path = Path(directory) / strategy_file(name)
    if not path.exists():
        return None
    o = _Obj(read_json_file(path), str(path), "", {"layout", "strategy", "record"})
    if o.integer("layout", null=False) != LAYOUT_VERSION or o.text("strategy", null=False) != name:
        raise o.error("layout", f"expected layout {LAYOUT_VERSION} for strategy {name!r}")
    return StrategyRecord.from_json(o.raw("record"), str(path), "record", LAYOUT_VERSION)


def _read_csv(path: Path, columns: tuple[str, ...], text_column: str) -> pd.DataFrame:
    import pandas as pd

    try:
        frame = pd.read_csv(path, dtype={text_column: "string"})
    except FileNotFoundError:
        raise
    except pd.errors.EmptyDataError as exc:
        raise RecordError(f"{path}: empty; expected a header of {', '.join(columns)}") from exc
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise RecordError(f"{path}: not a readable CSV ({' '.join(str(exc).split())})") from exc
    if tuple(frame.columns) != columns:
        got = ", ".join(map(str, frame.columns))
        raise RecordError(f"{path}: expected the columns {', '.join(columns)}; got {got}")
    for column in columns:
        if column == text_column:
            continue
        numeric = pd.to_numeric(frame[column], errors="coerce")
        if (numeric.isna() & frame[column].notna()).any():
            row = int((numeric.isna() & frame[column].notna()).to_numpy().nonzero()[0][0])
            raise RecordError(f"{path}: row {row + 2}, column {column}: not a number ({frame[column].iloc[row]!r})")
        frame[column] = numeric.astype("float64")
    return frame.sort_values("t_s", kind="stable").reset_index(drop=True)


def _empty(columns: tuple[str, ...], text_column: str) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({c: pd.Series(dtype="string" if c == text_column else "float64") for c in columns})


def empty_samples() -> pd.DataFrame:
    """Samples of a strategy that wrote none: the columns of :func:`read_samples`, no rows."""
    return _empty(SAMPLE_COLUMNS, "phase")


def empty_events() -> pd.DataFrame:
    """Events of a strategy that wrote none: the columns of :func:`read_events`, no rows."""
    return _empty(EVENT_COLUMNS, "event")


def read_samples(path: Path) -> pd.DataFrame:
    """A ``samples-<strategy>.csv``: numbers as float64 (empty cells NaN), ``phase`` as text."""
    return _read_csv(Path(path), SAMPLE_COLUMNS, "phase")


def read_events(path: Path) -> pd.DataFrame:
    """An ``events-<strategy>.csv``: numbers as float64 (empty cells NaN), ``event`` as text."""
    return _read_csv(Path(path), EVENT_COLUMNS, "event")
