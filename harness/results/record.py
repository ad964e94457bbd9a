"""The results layout, in one place: its version, file names, CSV columns and typed records.

A results directory ``results/<name>/`` holds:

=============================  =====================================================
``summary.json``               :class:`RunRecord`: the run, and one
                               :class:`StrategyRecord` per strategy
``plan.json``                  the resolved plan every strategy ran (:mod:`harness.plan`)
``strategy-<strategy>.json``   what that strategy's process wrote (:func:`strategy_file`)
``samples-<strategy>.csv``     its samples, :data:`harness.results.samples.SAMPLE_COLUMNS`
``events-<strategy>.csv``      its events, :data:`harness.results.samples.EVENT_COLUMNS`
=============================  =====================================================

Every record is a frozen dataclass written and read by :mod:`harness.fileio.codec` from its
fields alone (``to_json`` and ``from_json``); reading rejects a missing key, an unknown key
and a value of the wrong type with a :class:`RecordError` naming the file and the key's path
(``summary.json: strategies.map.engines[3]: missing key 'end_s'``), so a misspelt key cannot
quietly read as ``None``.

Versions: :data:`LAYOUT_VERSION` is what this code writes (``summary.json`` says which it is in
``layout``); what each version's keys mean is :mod:`harness.results.layouts`.

Values are read for what they mean, not only for their JSON type (:mod:`harness.fileio.codec`),
so that no hostile or corrupt file reaches the reporters: an integer is a whole number below
:data:`MAX_INTEGER` in size and a byte count below :data:`MAX_BYTES`; neither is
negative, nor is a number (bytes, counts, indices and times never are), unless its field is
declared ``signed`` (growths, an exit status, an excess below the floor); a number is finite;
the top-level ``name`` (of ``summary.json`` and ``budget.json``) and every strategy's name obey
:data:`NAME`, since they name files; a run has 1 to :data:`MAX_ENGINES` engines and a model at
least one byte. Files are read by
:func:`harness.fileio.files.read_file`, which refuses anything but a regular file without blocking on it (a
FIFO, a device); JSON nested deeper than :data:`~harness.fileio.files.MAX_JSON_DEPTH` is refused before it is
parsed. A CSV row must hold every column, the file must end with a whole row and hold as
many rows as its strategy's record states (from layout 11), and a number in it must be finite
and in range.

What is *measured* lives here. What is *derived* from it (floors, excess, which peak is
compared with the floor) is computed by :mod:`harness.results.metrics` only; ``floor_bytes`` and
``excess_over_floor`` are written into the summary from there for readers outside the
harness and are never read back by it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from harness.backends.columns import EngineColumns
from harness.catalog import is_gpu
from harness.fileio.atomic import write_json
from harness.fileio.codec import (
    MAX_BYTES,
    MAX_INTEGER,
    NAME,
    Limit,
    Record,
    RecordError,
    check_name,
    decode,
    name_problem,
)
from harness.fileio.files import read_json_file
from harness.results.checkpoint_reading import ReadingChoice
from harness.results.disk import CeilingPoint, DiskRead, SharedDisk
from harness.units import GIB, PIB

__all__ = [
    "LAYOUT_VERSION",
    "MAX_BYTES",
    "MAX_ENGINES",
    "MAX_INTEGER",
    "NAME",
    "PLAN",
    "SUMMARY",
    "CacheRecord",
    "CheckpointInfo",
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
    "read_strategy_file",
    "results_name_problem",
    "strategy_file",
    "write_strategy_file",
    "write_summary",
]

LAYOUT_VERSION = 22
"""The results layout this code writes; it reads every version from 1 to this one. It versions the results records'
keys (the ``since`` and ``absent_until`` of their fields, :mod:`harness.results.layouts`) wherever they are held:
``summary.json`` and ``strategy-<strategy>.json`` state it in their ``layout`` key, and ``plan.json`` and
``budget.json``, whose own keys have counters of their own (:data:`harness.plan.PLAN_VERSION`,
:data:`harness.budget.record.BUDGET_VERSION`), state the layout of the records they hold in theirs."""

SAMPLE_INTERVAL = "sample_interval_ms"
"""The key of a scenario's ``[run]`` table (:class:`harness.scenario.RunConfig`) that holds the sampler's interval,
which a run record reads from its ``scenario_config``."""

SUMMARY = "summary.json"
PLAN = "plan.json"

MAX_ENGINES = 100_000
"""The most engines a run may have: every engine holds at least one weight tensor, and no model
a scenario names comes near this many (pi0.5 has 813 tensors)."""

def strategy_file(strategy: str) -> str:
    """File name of the record a strategy's process writes."""
    return f"strategy-{strategy}.json"


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class EngineRecord(Record):
    """One engine build: its weights, time span, host high-water mark and what followed it.

    Times are seconds from the strategy process's start. ``host_hwm_bytes`` is the
    kernel's exact RSS peak while the engine was built (``VmHWM`` reset at its start);
    ``rss_after_bytes`` and ``gpu_used_bytes`` are read right after its weights were
    released. ``tensors`` counts the names it reads (version 2).

    On a GPU (version 16; ``None`` on the CPU): ``gpu_start_bytes`` is NVML ``used`` above the strategy's
    ``gpu_baseline_bytes`` when the build began (what earlier engines left), ``gpu_peak_bytes`` the largest
    such value sampled while it was built (the samples labelled with this engine, and the start: device-wide,
    so a child process's CUDA context counts; a spike between samples is missed), ``gpu_weights_bytes``
    the bytes of the device copies of the partition's weights the build made (a compiler backend's;
    0 where every weight was already on the device), ``gpu_reserved_peak_bytes`` and
    ``gpu_allocated_peak_bytes`` the high-water marks of torch's caching allocator in this process over
    the build (``torch.cuda.max_memory_reserved`` and ``max_memory_allocated``, reset as it began; exact,
    but blind to memory allocated outside the allocator: CUDA modules loaded, other processes).
    """

    index: int
    weight_bytes: int
    start_s: float | None
    end_s: float | None
    host_hwm_bytes: int | None
    released_bytes: int | None
    rss_after_bytes: int | None
    gpu_used_bytes: int | None
    tensors: int | None = field(default=None, metadata={"since": 2})
    compile_s: float | None = field(default=None, metadata={"since": 3})
    artifact_bytes: int | None = field(default=None, metadata={"since": 3})
    rss_before_bytes: int | None = field(default=None, metadata={"since": 3})
    children_peak_bytes: int | None = field(default=None, metadata={"since": 3})
    cache_bytes: int | None = field(default=None, metadata={"since": 3, "signed": True})
    pages_s: float | None = field(default=None, metadata={"since": 4})
    copy_s: float | None = field(default=None, metadata={"since": 4})
    major_faults: int | None = field(default=None, metadata={"since": 4})
    compile_hwm_bytes: int | None = field(default=None, metadata={"since": 7})
    write_rss_bytes: int | None = field(default=None, metadata={"since": 7})
    write_peak_bytes: int | None = field(default=None, metadata={"since": 7})
    write_read_bytes: int | None = field(default=None, metadata={"since": 7})
    children_pss_bytes: int | None = field(default=None, metadata={"since": 13})
    convert_s: float | None = field(default=None, metadata={"since": 14})
    convert_hwm_bytes: int | None = field(default=None, metadata={"since": 14})
    compiler_read_bytes: int | None = field(default=None, metadata={"since": 14, "signed": True})
    compiler_held_bytes: int | None = field(default=None, metadata={"since": 14, "signed": True})
    gpu_start_bytes: int | None = field(default=None, metadata={"since": 16, "signed": True})
    gpu_peak_bytes: int | None = field(default=None, metadata={"since": 16, "signed": True})
    gpu_weights_bytes: int | None = field(default=None, metadata={"since": 16})
    gpu_reserved_peak_bytes: int | None = field(default=None, metadata={"since": 16})
    gpu_allocated_peak_bytes: int | None = field(default=None, metadata={"since": 16})

    def with_columns(self, *groups: EngineColumns) -> EngineRecord:
        """A copy with the fields of each group a builder measured (:mod:`harness.backends.columns`) set; a
        ``TypeError`` naming the group and the field where a group holds a field this record does not declare."""
        declared = _ENGINE_FIELDS
        changes = {}
        for group in groups:
            for f in fields(group):
                if f.name not in declared:
                    raise TypeError(f"{type(group).__name__}.{f.name}: not a field of EngineRecord; declare it there "
                                    "(with the layout version that adds it) before a builder records it")
                changes[f.name] = getattr(group, f.name)
        return replace(self, **changes)

    @property
    def compiler_over_floor_bytes(self) -> int | None:
        """What a compiler added on top of this engine's copy floor: high-water mark - (RSS at its start + its weights).

        ``None`` for engines not built by a compiler (or without a high-water mark).
        """
        if self.compile_s is None or self.host_hwm_bytes is None or self.rss_before_bytes is None:
            return None
        return self.host_hwm_bytes - (self.rss_before_bytes + self.weight_bytes)

    @property
    def compiler_own_bytes(self) -> int | None:
        """The compiler's own rise in this process over RSS at the engine's start: its high-water mark when it
        was done, or, where the weights were then written into the artifact, the RSS when that write began if
        higher (what the compiler and torch's packaging left resident). Where the write sets the engine's peak,
        this + :attr:`write_read_bytes` + :attr:`write_buffers_bytes` is the engine's host rise."""
        if self.compile_hwm_bytes is None or self.rss_before_bytes is None:
            return None
        return max(self.compile_hwm_bytes, self.write_rss_bytes or 0) - self.rss_before_bytes

    @property
    def write_buffers_bytes(self) -> int | None:
        """The artifact write's own rise: its largest RSS - RSS at its start - the weights read meanwhile."""
        if self.write_peak_bytes is None or self.write_rss_bytes is None or self.write_read_bytes is None:
            return None
        return self.write_peak_bytes - self.write_rss_bytes - self.write_read_bytes


_ENGINE_FIELDS = frozenset(f.name for f in fields(EngineRecord))


@dataclass(frozen=True)
class ExportRecord(Record):
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
    residency_read_bytes: int | None = field(metadata={"signed": True})
    rss_before_bytes: int
    rss_after_bytes: int
    hwm_bytes: int | None
    anon_delta_bytes: int = field(metadata={"signed": True})
    not_shared: int

    @property
    def host_cost_bytes(self) -> int | None:
        """How far host memory rose above its value at the start of export, at its highest."""
        return None if self.hwm_bytes is None else self.hwm_bytes - self.rss_before_bytes


@dataclass(frozen=True)
class CacheRecord(Record):
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


@dataclass(frozen=True)
class RepeatRecord(Record):
    """One cold run of a strategy, when the scenario asks for repeats (version 4).

    ``repeat`` counts from 0; the times are the run's own (:class:`StrategyRecord`'s
    ``wall_s``, load and build phases); ``resident_at_load_bytes`` is the checkpoint's
    page-cache residency at its load's start. ``job_ids`` and ``node`` (version 22): the Slurm jobs the run was
    (``run --executor slurm``; comma-separated, the last one the one that counts) and the node it ran on; ``None``
    for a run on the harness's own machine.
    """

    repeat: int
    status: str
    error: str | None
    wall_s: float | None
    load_s: float | None
    build_s: float | None
    build_peak_bytes: int | None
    resident_at_load_bytes: int | None
    job_ids: str | None = field(default=None, metadata={"since": 22})
    node: str | None = field(default=None, metadata={"since": 22})


@dataclass(frozen=True)
class Phases(Record):
    """Phase boundaries in seconds from the strategy process's start; ``None`` for a phase not reached.

    Version 1 wrote only the phases a strategy reached (``absent_until=1``).
    """

    load_start_s: float | None = field(default=None, metadata={"absent_until": 1})
    load_end_s: float | None = field(default=None, metadata={"absent_until": 1})
    partition_s: float | None = field(default=None, metadata={"absent_until": 1})
    build_end_s: float | None = field(default=None, metadata={"absent_until": 1})
    export_start_s: float | None = field(default=None, metadata={"since": 3})
    export_end_s: float | None = field(default=None, metadata={"since": 3})
    check_start_s: float | None = field(default=None, metadata={"since": 5})
    check_end_s: float | None = field(default=None, metadata={"since": 5})

    @property
    def load_s(self) -> float | None:
        """The load: from its start to its end (None where either was not reached)."""
        return _span(self.load_start_s, self.load_end_s)

    @property
    def export_s(self) -> float | None:
        """The export of a compiler backend: from its start to its end."""
        return _span(self.export_start_s, self.export_end_s)

    @property
    def build_s(self) -> float | None:
        """The build: from partitioning to the end of the last engine."""
        return _span(self.partition_s, self.build_end_s)

    @property
    def check_s(self) -> float | None:
        """The built model run and compared with eager, after the wall (not part of it)."""
        return _span(self.check_start_s, self.check_end_s)

    @property
    def wall_s(self) -> float | None:
        """The wall: from the load's start to the end of the last engine (``StrategyRecord.wall_s`` stores it
        rounded to the millisecond)."""
        return _span(self.load_start_s, self.build_end_s)


def _span(start: float | None, end: float | None) -> float | None:
    """``end - start`` in seconds; None where either is."""
    return None if start is None or end is None else end - start


@dataclass(frozen=True)
class StrategyRecord(Record):
    """One strategy's measured figures (``summary.json``'s ``strategies.<name>``).

    ``status`` is ``"ok"`` when every engine was built, ``"failed"`` otherwise, with the
    reason in ``error``. Peaks are bytes and the larger of what the sampler saw and
    what the kernel's high-water marks say (see :func:`harness.results.metrics.sampled_peaks`):
    ``host_peak_bytes`` over the whole run, ``build_peak_bytes`` from partitioning to the
    end of the last engine, ``host_gpu_peak_bytes`` host + GPU over that build phase,
    ``anon_peak_bytes`` and ``gpu_peak_bytes`` sampled over the whole run.
    ``floor_bytes`` and ``excess_over_floor`` are a copy of :mod:`harness.results.metrics`'
    figures for readers outside the harness. ``sample_rows`` and ``event_rows``: the data rows written
    into its samples and events CSVs (``None`` where not written), which their readers check.
    ``job_ids``, ``node`` and ``limit_enforcer`` (version 22): the Slurm jobs its worker ran as (``run --executor
    slurm``; comma-separated, the last one the one that counts: earlier ones were lost by the cluster), the node it
    ran on and which limit bounded it where the scenario sets ``run.memory_limit_gib``; ``None`` for a worker run on
    the harness's own machine.

    On a GPU, ``gpu_baseline_bytes`` is NVML ``used`` for the device when sampling began, after the CUDA
    context exists: every GPU figure is above it, so the context is in none of them. ``gpu_context_bytes``
    (version 16) is the context alone, as the first CUDA allocation created it: NVML ``used`` right after
    that allocation minus ``used`` before it, less the caching allocator's reservation for it. NVML's
    ``used`` is device-wide, so another process's change in between counts too; what the context grows
    by later (CUDA modules loaded lazily at a kernel's first launch, library handles) is above the baseline,
    in the engines' GPU figures.
    """

    status: str
    error: str | None = None
    note: str = field(default="", metadata={"null_as": ""})
    baseline_rss_bytes: int | None = None
    host_at_partitioning_bytes: int | None = None
    load_hwm_bytes: int | None = field(default=None, metadata={"since": 2})
    gpu_baseline_bytes: int | None = field(default=None, metadata={"since": 2})
    gpu_context_bytes: int | None = field(default=None, metadata={"since": 16})
    host_peak_bytes: int | None = None
    anon_peak_bytes: int | None = None
    gpu_peak_bytes: int | None = None
    host_gpu_peak_bytes: int | None = None
    build_peak_bytes: int | None = field(default=None, metadata={"since": 2})
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
    release_note: str = field(default="", metadata={"null_as": ""})
    engines: tuple[EngineRecord, ...] = ()
    floor_bytes: int | None = None
    excess_over_floor: float | None = field(default=None, metadata={"signed": True})
    watched_peak_rss_bytes: int | None = None
    compiler: str | None = field(default=None, metadata={"since": 3})
    compiler_weights: str | None = field(default=None, metadata={"since": 3})
    export: ExportRecord | None = field(default=None, metadata={"since": 3})
    max_abs_diff: float | None = field(default=None, metadata={"since": 3})
    check: str | None = field(default=None, metadata={"since": 3})
    check_peak_bytes: int | None = field(default=None, metadata={"since": 7})
    cache: CacheRecord | None = field(default=None, metadata={"since": 4})
    prefetch: str | None = field(default=None, metadata={"since": 4})
    drop_cache: bool | None = field(default=None, metadata={"since": 4})
    prefetch_warmed_bytes: int | None = field(default=None, metadata={"since": 4})
    repeat: int | None = field(default=None, metadata={"since": 4})
    repeats: tuple[RepeatRecord, ...] = field(default=(), metadata={"since": 4})
    prefetch_busy_s: float | None = field(default=None, metadata={"since": 8})
    prefetch_evict_s: float | None = field(default=None, metadata={"since": 8})
    sample_rows: int | None = field(default=None, metadata={"since": 11})
    event_rows: int | None = field(default=None, metadata={"since": 11})
    job_ids: str | None = field(default=None, metadata={"since": 22})
    node: str | None = field(default=None, metadata={"since": 22})
    limit_enforcer: str | None = field(default=None, metadata={"since": 22})

    @property
    def ok(self) -> bool:
        """Whether the strategy ran to the end."""
        return self.status == "ok"

    def replace(self, **changes: Any) -> StrategyRecord:
        """A copy with ``changes``."""
        return replace(self, **changes)

    def upgraded_from_v1(self, device: str) -> StrategyRecord:
        """Version 1 had no build-phase host peak of its own; take the one it compared with the floor: on a
        GPU the largest engine high-water mark, else ``host_gpu_peak_bytes`` (no GPU memory adds to it)."""
        if is_gpu(device):
            hwms = [e.host_hwm_bytes for e in self.engines if e.host_hwm_bytes is not None]
            return self.replace(build_peak_bytes=max(hwms) if hwms else None)
        return self.replace(build_peak_bytes=self.host_gpu_peak_bytes)


@dataclass(frozen=True)
class MachineInfo(Record):
    """The machine a run was made on (:func:`harness.measure.machine.machine`)."""

    cpus: int | None
    mem_total_bytes: int | None
    gpu: str | None
    kernel: str | None
    hostname: str | None
    platform: str | None


def _some_bytes(value: int) -> str | None:
    return "a model of 0 bytes; expected its checkpoint's size" if value == 0 else None


@dataclass(frozen=True)
class ModelInfo(Record):
    """The model that was measured; ``bytes`` are its checkpoint's (a tied tensor once), at least one:
    every share "of the model" divides by it."""

    name: str
    source: str
    source_note: str
    tensors: int
    bytes: int = field(metadata={"check": _some_bytes})
    bytes_with_non_persistent_buffers: int


@dataclass(frozen=True)
class CheckpointInfo(Record):
    """The checkpoint every strategy read: its path (relative to the repository root where inside it, as the
    scenario gives it: :mod:`harness.fileio.paths`; a file, a sharded folder or its index), whether this run
    generated it, its seed, and the total ``bytes`` of its files (headers included).

    Since layout 19: ``files``, how many files hold its tensors (several for a sharded checkpoint), and
    ``dtype_bytes``, the bytes of its tensors per dtype (``{"bfloat16": ...}``), largest first. ``None`` when
    reading layouts 1 to 18, whose checkpoints were one file generated by the harness.
    """

    path: str = field(metadata={"path": True})
    generated: bool
    seed: int
    bytes: int
    files: int | None = field(default=None, metadata={"since": 19})
    dtype_bytes: dict[str, int] | None = field(default=None, metadata={"since": 19})

    @property
    def sharded(self) -> bool:
        """Whether several files hold the checkpoint's tensors."""
        return (self.files or 1) > 1


_REFERENCE_GIB = {"limit": Limit(0, PIB // GIB, unit="GiB")}


@dataclass(frozen=True)
class Reference(Record):
    """A figure measured on another setup, shown beside the run's own and marked as such: a
    scenario's ``[[reference]]`` table, copied into its results."""

    label: str
    host_at_partitioning_gib: float | None = field(default=None, metadata=_REFERENCE_GIB)
    host_gpu_peak_gib: float | None = field(default=None, metadata=_REFERENCE_GIB)
    host_peak_gib: float | None = field(default=None, metadata=_REFERENCE_GIB)
    note: str = field(default="", metadata={"null_as": ""})


def _engine_count(engines: int) -> str | None:
    return None if 1 <= engines <= MAX_ENGINES else f"expected 1 to {MAX_ENGINES} engines, got {engines}"


def results_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as the name of a results directory (:data:`NAME`), or None."""
    return name_problem(name, "it names the report and figures beside the results")


def _strategy_name(name: str) -> str | None:
    return name_problem(name, "it names the strategy's files")


@dataclass(frozen=True)
class RunRecord(Record):
    """``summary.json``: one scenario run and its strategies, in the order they ran.

    ``layout`` is the layout version the record was read at (:data:`LAYOUT_VERSION` for one
    made here); ``summary.json`` is always written at :data:`LAYOUT_VERSION`. Each setting is held once:
    :attr:`prefetch` reads ``reading.prefetch`` and :attr:`sample_interval_ms` the scenario's (``scenario_config``);
    versions 1 to 17 also wrote them as keys of their own (``earlier_prefetch``, ``earlier_sample_interval_ms``),
    which are read only where the record holds nothing else to read them from, must agree with it where it does,
    and are never written (``until``, ``moved_to``: :mod:`harness.fileio.codec`).
    """

    scenario: str
    name: str = field(metadata={"check": results_name_problem})
    description: str = field(metadata={"null_as": ""})
    created: str
    commit: str | None
    machine: MachineInfo
    versions: dict[str, str | None]
    model: ModelInfo
    checkpoint: CheckpointInfo
    engines: int = field(metadata={"check": _engine_count})
    engine_cap_bytes: int
    largest_engine_bytes: int
    backend: str
    device: str
    cache: str
    release: bool
    memory_limit_bytes: int | None
    references: tuple[Reference, ...]
    scenario_config: dict[str, Any]
    strategies: dict[str, StrategyRecord] = field(metadata={"check_keys": _strategy_name})
    layout: int = field(default=LAYOUT_VERSION, metadata={"since": 2, "version": True})
    repeats: int | None = field(default=None, metadata={"since": 4})
    disk_reads: tuple[DiskRead, ...] = field(default=(), metadata={"since": 4})
    read_ceiling: tuple[CeilingPoint, ...] = field(default=(), metadata={"since": 7})
    reading: ReadingChoice | None = field(default=None, metadata={"since": 21})
    round_orders: tuple[tuple[str, ...], ...] = field(default=(), metadata={"since": 9})
    shared_disk: tuple[SharedDisk, ...] = field(default=(), metadata={"since": 10})
    read_ceiling_error: str | None = field(default=None, metadata={"since": 12})
    shared_disk_error: str | None = field(default=None, metadata={"since": 12})
    disk_read_error: str | None = field(default=None, metadata={"since": 15})
    # dropped in version 18: each is held once, where the moved_to path says
    earlier_sample_interval_ms: float | None = field(default=None, metadata={
        "key": "sample_interval_ms", "until": 17, "moved_to": f"scenario_config.run.{SAMPLE_INTERVAL}"})
    earlier_prefetch: str | None = field(default=None, metadata={
        "since": 4, "key": "prefetch", "until": 17, "moved_to": "speed.prefetch"})
    # versions 7 to 20: the settings of the strategies that map under their earlier name, read as ``reading``
    earlier_speed: ReadingChoice | None = field(default=None, metadata={
        "since": 7, "key": "speed", "until": 20, "moved_to": "reading"})

    @property
    def prefetch(self) -> str | None:
        """The prefetch method of the strategies that map (``None``: off): ``reading.prefetch``; for a record of
        versions 4 to 6, which holds no settings, the ``prefetch`` it wrote."""
        return self.reading.prefetch if self.reading is not None else self.earlier_prefetch

    @property
    def sample_interval_ms(self) -> float | None:
        """The sampler's interval: the scenario's ``run.sample_interval_ms`` as ``scenario_config`` keeps it; for a
        record of versions 1 to 17 whose ``scenario_config`` holds none, the ``sample_interval_ms`` it wrote."""
        run = self.scenario_config.get("run")
        value = run.get(SAMPLE_INTERVAL) if isinstance(run, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        return self.earlier_sample_interval_ms

    @property
    def on_gpu(self) -> bool:
        """Whether engines were built on a GPU (the device decides which floor applies)."""
        return is_gpu(self.device)

    @property
    def order_changed(self) -> bool:
        """Whether the strategies ran in more than one order over the rounds."""
        return len(set(self.round_orders)) > 1

    def replace(self, **changes: Any) -> RunRecord:
        """A copy with ``changes``."""
        return replace(self, **changes)

    def with_strategy(self, name: str, record: StrategyRecord) -> RunRecord:
        """A copy with strategy ``name`` set to ``record`` (appended when new)."""
        return replace(self, strategies={**self.strategies, name: record})

    @property
    def rounds(self) -> int:
        """How many measured rounds the run has: ``repeats``, at least one."""
        return max(1, self.repeats or 1)

    @property
    def warmup_rounds(self) -> int:
        """How many warm-up rounds ran before the measured ones, discarded: the scenario's ``run.warmup`` as
        ``scenario_config`` keeps it; 0 where it holds none (runs made before warm-up rounds existed) or holds
        anything but a whole number of at least 1."""
        run = self.scenario_config.get("run")
        rounds = run.get("warmup") if isinstance(run, dict) else None
        return rounds if isinstance(rounds, int) and not isinstance(rounds, bool) and rounds >= 1 else 0

    def after_decode(self, version: int, fail: Callable[[str, str], RecordError]) -> RunRecord:
        """Every engine index below the run's engines; from version 9, one order per round (:attr:`rounds`), none
        left out where a strategy ran; every round's order the same strategies, each once; a version-1
        strategy's build-phase peak filled in; a version 3 to 5 ``"packaged"`` read as the compiler's packaging
        it was; before version 9, the scenario's order in every round; from version 18, the sampler's interval in
        ``scenario_config``; before version 21, the settings held as ``speed`` read as ``reading``."""
        if version > 17 and self.sample_interval_ms is None:
            raise fail(f"scenario_config.run.{SAMPLE_INTERVAL}", "missing: the sampler's interval is held there")
        for name, record in self.strategies.items():
            for i, engine in enumerate(record.engines):
                if engine.index >= self.engines:
                    raise fail(f"strategies.{name}.engines[{i}].index",
                               f"engine {engine.index} of a run of {self.engines} engines")
        if version >= 9 and (self.round_orders or self.strategies) and len(self.round_orders) != self.rounds:
            raise fail("round_orders", f"expected one order per measured round, {self.rounds} (repeats = "
                                       f"{self.repeats}), got {len(self.round_orders)}")
        for i, order in enumerate(self.round_orders):  # a run being written holds the strategies done so far
            if len(set(order)) != len(order) or not set(self.strategies) <= set(order) or (
                    set(order) != set(self.round_orders[0])):
                raise fail(f"round_orders[{i}]", f"expected every strategy of the run once, as in every round, "
                                                 f"got {list(order)}")
        run = self
        if self.earlier_speed is not None:  # versions 7 to 20 held the settings as ``speed``
            run = run.replace(reading=self.earlier_speed, earlier_speed=None)
        if version < 9:
            run = run.replace(round_orders=(tuple(self.strategies),) * self.rounds)
        if version == 1:
            return run.replace(strategies={n: s.upgraded_from_v1(self.device) for n, s in self.strategies.items()})
        if version < 6:
            return run.replace(strategies={
                n: s.replace(compiler_weights="packaged_compiler") if s.compiler_weights == "packaged" else s
                for n, s in self.strategies.items()
            })
        return run


# --------------------------------------------------------------------------- files


def write_summary(directory: Path, run: RunRecord) -> Path:
    """Write ``summary.json`` into ``directory`` (atomically)."""
    return write_json(Path(directory) / SUMMARY, run.to_json())


@dataclass(frozen=True)
class _StrategyFile(Record):
    """``strategy-<name>.json``: the layout it was written at, the strategy's name and its record (read once
    the layout is known to be :data:`LAYOUT_VERSION`)."""

    layout: int
    strategy: str
    record: dict[str, Any]


def write_strategy_file(directory: Path, name: str, record: StrategyRecord) -> Path:
    """Write what a strategy's process measured, ``strategy-<name>.json`` (atomically)."""
    data = _StrategyFile(LAYOUT_VERSION, name, record.to_json()).to_json()
    return write_json(Path(directory) / strategy_file(name), data)


def read_strategy_file(directory: Path, name: str) -> StrategyRecord | None:
    """The record a strategy's process wrote; ``None`` when it wrote none."""
    path = Path(directory) / strategy_file(name)
    if not path.exists():
        return None
    written = decode(_StrategyFile, read_json_file(path), source=str(path), version=LAYOUT_VERSION)
    if written.layout != LAYOUT_VERSION or written.strategy != name:
        raise RecordError(f"{path}: layout: expected layout {LAYOUT_VERSION} for strategy {name!r}")
    return decode(StrategyRecord, written.record, source=str(path), where="record", version=LAYOUT_VERSION)

