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

Values are read for what they mean, not only for their JSON type (:class:`_Obj`), so that
no hostile or corrupt file reaches the reporters: an integer is a whole number below
:data:`MAX_INTEGER` in size and a byte count below :data:`MAX_BYTES`; neither is
negative, nor is a number (bytes, counts, indices and times never are), unless its key is
one of :data:`SIGNED`; a number is finite; the top-level ``name`` (of ``summary.json`` and
``budget.json``) and every strategy's name obey :data:`NAME`, since they name files; a run
has 1 to :data:`MAX_ENGINES` engines and a model at least one byte. Files are read by
:func:`read_file`, which refuses anything but a regular file without blocking on it (a
FIFO, a device); JSON nested deeper than :data:`MAX_JSON_DEPTH` is refused before it is
parsed. A CSV row must hold every column, the file must end with a whole row, and a
number in it must be finite and in range.

What is *measured* lives here. What is *derived* from it (floors, excess, which peak is
compared with the floor) is computed by :mod:`harness.results.metrics` only; ``floor_bytes`` and
``excess_over_floor`` are written into the summary from there for readers outside the
harness and are never read back by it.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import re
import stat
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError
from harness.results.atomic import write_json

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "EVENT_COLUMNS",
    "LAYOUT_VERSION",
    "MAX_BYTES",
    "MAX_ENGINES",
    "MAX_INTEGER",
    "MAX_JSON_DEPTH",
    "NAME",
    "PLAN",
    "SAMPLE_COLUMNS",
    "SIGNED",
    "SUMMARY",
    "CacheRecord",
    "CheckpointInfo",
    "DiskRead",
    "EngineRecord",
    "ExportRecord",
    "MachineInfo",
    "ModelInfo",
    "Phases",
    "RecordError",
    "Reference",
    "RepeatRecord",
    "RunRecord",
    "StrategyRecord",
    "check_name",
    "empty_events",
    "empty_samples",
    "events_file",
    "parse_json",
    "read_events",
    "read_file",
    "read_json_file",
    "read_samples",
    "read_strategy_file",
    "read_text_file",
    "samples_file",
    "strategy_file",
    "write_strategy_file",
    "write_summary",
]

LAYOUT_VERSION = 4
"""The layout this code writes; it reads every version from 1 to this one."""

SUMMARY = "summary.json"
PLAN = "plan.json"

NAME = re.compile(r"[a-z0-9_-]+")
"""What a results name and a strategy name may be: they name ``results/<name>/``, the report
and figures beside it, and the files of each strategy, so no path separator, dot or ``..``."""

MAX_INTEGER = 2**63
"""Every integer read is smaller than this in size: what a 64-bit count (the kernel's, numpy's) holds."""

MAX_BYTES = 2**53
"""Every byte count read is smaller than this (8 PiB, far above any machine's memory): the figures and
the samples compute in float64, which holds every whole number up to it exactly."""

SIGNED = frozenset({"anon_delta_bytes", "residency_read_bytes", "cache_bytes", "returncode", "excess_over_floor"})
"""The keys whose values may be negative: growths (deltas), an exit status, an excess below the floor.
Every other integer and number (bytes, counts, indices, times) is read as not negative."""

MAX_ENGINES = 100_000
"""The most engines a run may have: every engine holds at least one weight tensor, and no model
a scenario names comes near this many (pi0.5 has 813 tensors)."""

MAX_JSON_DEPTH = 64
"""The deepest nesting of objects and lists a results file may have (the records need 6)."""

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
"""``samples-<strategy>.csv``: one row per sample of :class:`harness.measure.sampler.Sampler` (all versions)."""

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
    try:
        text = json.dumps(value, default=str)
    except (ValueError, RecursionError):  # a value nested past what json.dumps walks
        text = type(value).__name__
    return (text[:57] + "...") if len(text) > 60 else text


def check_name(name: str, where: str, what: str) -> str:
    """``name`` when it obeys :data:`NAME`; else a :class:`RecordError` ``<where>: expected ...``."""
    if not NAME.fullmatch(name):
        raise RecordError(f"{where}: expected letters a-z, digits, '_' or '-' only ({what}), got {_describe(name)}")
    return name


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

    def _in_range(self, key: str, value: Any) -> None:
        """Refuse a value the key cannot mean (negative where only :data:`SIGNED` keys may be, a byte count
        of :data:`MAX_BYTES` or more) or the machine cannot hold (:data:`MAX_INTEGER`); ``value`` is
        already an int or a finite float."""
        if "bytes" in key.split("_") and abs(value) >= MAX_BYTES:
            raise self.error(key, f"{_describe(value)} bytes is out of range (less than 2**53, 8 PiB, expected)")
        if abs(value) >= MAX_INTEGER:
            raise self.error(key, f"{_describe(value)} is out of range (at most 2**63 - 1 in size)")
        if value < 0 and key not in SIGNED:
            raise self.error(key, f"expected a value of at least 0, got {_describe(value)}")

    def integer(self, key: str, *, null: bool = True) -> Any:
        value = self.data.get(key)
        if isinstance(value, _LongInteger):
            raise self.error(key, f"an integer of {value.digits} digits is out of range (at most 2**63 - 1 in size)")
        value = self._typed(key, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer", null)
        if value is not None:
            self._in_range(key, value)
        return value

    def number(self, key: str, *, null: bool = True) -> Any:
        def ok(v: Any) -> bool:
            return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)

        value = self.data.get(key)
        if isinstance(value, _LongInteger):
            raise self.error(key, f"a number of {value.digits} digits is out of range (at most 2**63 - 1 in size)")
        value = self._typed(key, ok, "a number", null)
        if value is None:
            return None
        self._in_range(key, value)
        return float(value)

    def text(self, key: str, *, null: bool = True) -> Any:
        value = self._typed(key, lambda v: isinstance(v, str), "a string", null)
        if key == "name" and not self.where and value is not None:  # the results' name, at the top of a record
            check_name(value, f"{self.source}: {self.path(key)}", "it names the report and figures beside the results")
        return value

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
    (:class:`harness.measure.coldcache.CacheReport`); ``flushed``: the files were fsynced until
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
    (:func:`harness.measure.diskread.cold_read_bandwidth`); ``resident_at_start_bytes``: the
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
    what the kernel's high-water marks say (see :func:`harness.results.metrics.sampled_peaks`):
    ``host_peak_bytes`` over the whole run, ``build_peak_bytes`` from partitioning to the
    end of the last engine, ``host_gpu_peak_bytes`` host + GPU over that build phase,
    ``anon_peak_bytes`` and ``gpu_peak_bytes`` sampled over the whole run.
    ``floor_bytes`` and ``excess_over_floor`` are a copy of :mod:`harness.results.metrics`'
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
    """The machine a run was made on (:func:`harness.measure.machine.machine`)."""

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
        info = cls(o.text("name", null=False), o.text("source", null=False), o.text("source_note", null=False),
                   o.integer("tensors", null=False), o.integer("bytes", null=False),
                   o.integer("bytes_with_non_persistent_buffers", null=False))
        if info.bytes == 0:  # every share "of the model" divides by it
            raise o.error("bytes", "a model of 0 bytes; expected its checkpoint's size")
        return info


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
        engines = o.integer("engines", null=False)
        if not 1 <= engines <= MAX_ENGINES:
            raise o.error("engines", f"expected 1 to {MAX_ENGINES} engines, got {engines}")
        strategies = {}
        for name, item in raw_strategies.items():
            check_name(name, f"{source}: strategies.{name}", "it names the strategy's files")
            record = StrategyRecord.from_json(item, source, f"strategies.{name}", version)
            for i, engine in enumerate(record.engines):
                if engine.index >= engines:
                    raise RecordError(f"{source}: strategies.{name}.engines[{i}].index: engine {engine.index} "
                                      f"of a run of {engines} engines")
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
            engines=engines,
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


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def read_file(path: Path) -> bytes:
    """The bytes of ``path``, which must be a regular file (a link to one is followed).

    The file is opened without blocking (``O_NONBLOCK``: a FIFO without a writer, or a
    device, cannot hang the reader) and checked on the open descriptor (``fstat``), so
    nothing can swap it in between. Raises :class:`FileNotFoundError` when there is no
    such file, and a :class:`RecordError` naming the path for anything that is not a
    regular file or cannot be read. Every reader of results and notes opens files through it.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise RecordError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise RecordError(f"{path}: {kind}, not a regular file; expected a file the harness wrote")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise RecordError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)


def read_text_file(path: Path) -> str | None:
    """The UTF-8 text of the regular file ``path`` (:func:`read_file`); ``None`` when there is no such file."""
    try:
        data = read_file(path)
    except FileNotFoundError:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"{path}: not UTF-8 text (byte {exc.start})") from exc


class _LongInteger:
    """A JSON integer too long to be any value of a record; kept as its digit count (never converted)."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __str__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _parse_int(text: str) -> int | _LongInteger:
    digits = len(text.lstrip("-"))
    return _LongInteger(digits) if digits > 19 else int(text)  # 19 digits hold every value below 2**63


_JSON_TOKENS = re.compile(r'\\.|["\[\]{}]')


def _json_depth_error(text: str) -> str | None:
    """Where ``text`` nests objects and lists deeper than :data:`MAX_JSON_DEPTH`, in words; else None.

    One pass over the quotes, escapes and brackets, skipping strings, before the parser
    (which recurses once per level) sees the text.
    """
    depth, in_string = 0, False
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if in_string:
            in_string = token != '"'
        elif token == '"':
            in_string = True
        elif token in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                line = text.count("\n", 0, match.start()) + 1
                return f"nested deeper than {MAX_JSON_DEPTH} levels (line {line})"
        elif token in "]}":
            depth -= 1
    return None


def read_json_file(path: Path) -> Any:
    """The JSON in ``path``; a missing, unreadable or malformed file is a :class:`RecordError` naming it.

    Integers too long to be any record's value read as a placeholder that every getter of
    :class:`_Obj` refuses, naming the key; ``NaN`` and ``Infinity`` are refused there too.
    """
    text = read_text_file(path)
    if text is None:
        raise RecordError(f"{path}: not found; is {path.parent} a results directory?")
    return parse_json(text, str(path))


def parse_json(text: str, source: str) -> Any:
    """The JSON ``text`` read from ``source``, as :func:`read_json_file` reads a file's."""
    deep = _json_depth_error(text)
    if deep is not None:
        raise RecordError(f"{source}: not a record: {deep}")
    try:
        return json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{source}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"{source}: not a record ({' '.join(str(exc).split())})") from exc


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


_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
"""A number in a results CSV, as Python and pandas write them (``nan``, ``inf`` and the like are not numbers)."""


def _csv_rows(path: Path, columns: tuple[str, ...]) -> list[list[str]]:
    """The data rows of a results CSV, each with every column; the header must be ``columns``."""
    text = read_text_file(path)
    if text is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    if not text.strip():
        raise RecordError(f"{path}: empty; expected a header of {', '.join(columns)}")
    if not text.endswith("\n"):
        line = text.count("\n") + 1
        raise RecordError(f"{path}: row {line}: the file ends inside a row (it was cut short)")
    try:
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        header = next(reader)
        rows = list(reader)
    except csv.Error as exc:
        raise RecordError(f"{path}: not a readable CSV ({exc})") from exc
    if tuple(header) != columns:
        raise RecordError(f"{path}: expected the columns {', '.join(columns)}; got {', '.join(header)}")
    for i, row in enumerate(rows):
        if len(row) != len(columns):
            raise RecordError(f"{path}: row {i + 2}: expected {len(columns)} fields, got {len(row)}"
                              + (" (a short or cut row)" if len(row) < len(columns) else ""))
    return rows


def _read_csv(path: Path, columns: tuple[str, ...], text_column: str) -> pd.DataFrame:
    """A results CSV: numbers as float64 (an empty cell NaN), ``text_column`` as text (an empty cell NA).

    A number must be finite and below :data:`MAX_BYTES` in a byte column, :data:`MAX_INTEGER`
    elsewhere; ``t_s`` must be present and not negative, byte columns not negative, ``engine``
    at least -1 (no engine).
    """
    import pandas as pd

    rows = _csv_rows(path, columns)
    frame = pd.DataFrame(rows, columns=list(columns), dtype=object)
    for column in columns:
        cells = frame[column].astype(str)
        empty = cells == ""
        if column == text_column:
            frame[column] = cells.where(~empty, None).astype("string")
            continue
        lowest = -1.0 if column == "engine" else 0.0

        def fail(mask: pd.Series, problem: str, column: str = column, cells: pd.Series = cells) -> RecordError:
            row = int(mask.to_numpy().nonzero()[0][0])
            return RecordError(f"{path}: row {row + 2}, column {column}: {problem} ({cells.iloc[row]!r})")

        if column == "t_s" and empty.any():
            raise fail(empty, "missing")
        bad = ~empty & ~cells.str.fullmatch(_NUMBER)
        if bad.any():
            raise fail(bad, "not a finite number")
        values = pd.to_numeric(cells.where(~empty, None), errors="coerce").astype("float64")
        bound, words = (MAX_BYTES, "less than 2**53 expected") if column.endswith("bytes") else (
            MAX_INTEGER, "at most 2**63 - 1 in size")
        in_range = values.abs() < bound
        if (~empty & ~in_range).any():
            raise fail(~empty & ~in_range, f"out of range ({words})")
        if (values < lowest).any():
            raise fail(values < lowest, f"expected at least {lowest:g}")
        frame[column] = values
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
