"""Read a results directory (``summary.json``, ``samples-*.csv``, ``events-*.csv``) into plain objects.

The runner writes one directory per scenario run. This module is its only reader: the reporters
(figures, markdown) take a :class:`RunResults` and never open the files themselves. Missing values
(a failed strategy's partial figures, the GPU columns of a host-only run) become ``None`` or ``NaN``,
never zero, so that "not measured" cannot be mistaken for "nothing used".
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.schema import EVENT_COLUMNS, SAMPLE_COLUMNS

GIB = 1 << 30
"""Bytes in a GiB; every figure and table reports GiB."""

_NUMERIC_SAMPLE_COLUMNS = SAMPLE_COLUMNS[:-1]
_NUMERIC_EVENT_COLUMNS = ("t_s", "engine", "weight_bytes", "host_hwm_bytes", "released_bytes")


@dataclass(frozen=True)
class Machine:
    """The machine a run was made on."""

    cpus: int | None
    mem_total_bytes: int | None
    gpu: str | None
    kernel: str | None
    hostname: str | None


@dataclass(frozen=True)
class ModelInfo:
    """The model that was loaded: where it came from and how large its checkpoint is."""

    name: str
    source: str | None
    source_note: str | None
    tensors: int | None
    bytes: int


@dataclass(frozen=True)
class Reference:
    """A figure measured elsewhere (another setup), shown next to the run's own for scale."""

    label: str
    host_at_partitioning_gib: float | None
    host_gpu_peak_gib: float | None
    host_peak_gib: float | None
    note: str | None


@dataclass(frozen=True)
class EngineRecord:
    """One engine build: its weights, its time span and the host high-water mark while it ran."""

    index: int
    weight_bytes: int
    start_s: float | None
    end_s: float | None
    host_hwm_bytes: int | None
    released_bytes: int | None


@dataclass(frozen=True)
class Phases:
    """Phase boundaries in seconds from the strategy process start."""

    load_start_s: float | None
    partition_s: float | None
    build_end_s: float | None


@dataclass
class StrategyResult:
    """One loading strategy's figures, engines, samples and events."""

    name: str
    status: str
    error: str | None
    baseline_rss_bytes: int | None
    host_at_partitioning_bytes: int | None
    host_peak_bytes: int | None
    anon_peak_bytes: int | None
    gpu_peak_bytes: int | None
    host_gpu_peak_bytes: int | None
    wall_s: float | None
    phases: Phases
    sample_count: int | None
    max_gap_ms: float | None
    peak_source: str | None
    released_bytes: int | None
    unreleased_bytes: int | None
    release_note: str | None
    engines: tuple[EngineRecord, ...]
    samples: pd.DataFrame = field(repr=False)
    events: pd.DataFrame = field(repr=False)
    note: str | None = None
    mean_interval_ms: float | None = None

    @property
    def ok(self) -> bool:
        """Whether the strategy ran to the end."""
        return self.status == "ok"

    @property
    def gpu_measured(self) -> bool:
        """Whether any GPU figure exists for this strategy (summary or samples)."""
        if self.gpu_peak_bytes is not None:
            return True
        return bool("gpu_used_bytes" in self.samples and self.samples["gpu_used_bytes"].notna().any())


@dataclass
class RunResults:
    """Everything one results directory holds, strategies in the order the summary lists them."""

    directory: Path
    name: str
    scenario: str
    created: str | None
    commit: str | None
    machine: Machine
    versions: dict[str, str | None]
    model: ModelInfo
    backend: str | None
    device: str
    cache: str | None
    engine_count: int | None
    engine_cap_bytes: int | None
    release: bool | None
    sample_interval_ms: float | None
    references: tuple[Reference, ...]
    strategies: dict[str, StrategyResult]
    raw: dict[str, Any] = field(repr=False)
    description: str | None = None

    @property
    def on_gpu(self) -> bool:
        """Whether engines were built on a GPU (the device decides which floor applies)."""
        return self.device.startswith("cuda")

    @property
    def gpu_measured(self) -> bool:
        """Whether any strategy has GPU figures; without them figures say "no GPU"."""
        return any(s.gpu_measured for s in self.strategies.values())


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _read_csv(path: Path, columns: tuple[str, ...], numeric: tuple[str, ...]) -> pd.DataFrame:
    """Read one CSV; a missing or empty file gives an empty frame with the expected columns."""
    if not path.is_file() or path.stat().st_size == 0:
        frame = pd.DataFrame({c: pd.Series(dtype="float64") for c in columns})
    else:
        frame = pd.read_csv(path)
        for column in columns:
            if column not in frame:
                frame[column] = pd.NA
    for column in numeric:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    return frame


def read_samples(path: Path) -> pd.DataFrame:
    """Read a ``samples-<strategy>.csv``: numeric columns as float (empty GPU cells become NaN)."""
    frame = _read_csv(path, SAMPLE_COLUMNS, _NUMERIC_SAMPLE_COLUMNS)
    frame["phase"] = frame["phase"].astype("string")
    return frame.sort_values("t_s", kind="stable").reset_index(drop=True)


def read_events(path: Path) -> pd.DataFrame:
    """Read an ``events-<strategy>.csv``: numeric columns as float, empty cells NaN."""
    frame = _read_csv(path, EVENT_COLUMNS, _NUMERIC_EVENT_COLUMNS)
    frame["event"] = frame["event"].astype("string")
    return frame.sort_values("t_s", kind="stable").reset_index(drop=True)


def _engines_from_summary(items: list[Mapping[str, Any]]) -> list[EngineRecord]:
    return [
        EngineRecord(
            index=int(item["index"]),
            weight_bytes=int(item.get("weight_bytes") or 0),
            start_s=_float(item.get("start_s")),
            end_s=_float(item.get("end_s")),
            host_hwm_bytes=_int(item.get("host_hwm_bytes")),
            released_bytes=_int(item.get("released_bytes")),
        )
        for item in items
    ]


def _nan_to_none(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def engines_from_events(events: pd.DataFrame) -> list[EngineRecord]:
    """Rebuild engine records from ``engine_start``/``engine_end`` events (used when the summary has none)."""
    records: dict[int, dict[str, Any]] = {}
    for row in events.itertuples(index=False):
        engine = _nan_to_none(getattr(row, "engine", None))
        if engine is None or row.event not in ("engine_start", "engine_end"):
            continue
        record = records.setdefault(int(engine), {"index": int(engine)})
        if row.event == "engine_start":
            record["start_s"] = float(row.t_s)
        else:
            record["end_s"] = float(row.t_s)
        for key in ("weight_bytes", "host_hwm_bytes", "released_bytes"):
            value = _nan_to_none(getattr(row, key, None))
            if value is not None:
                record[key] = int(value)
    return _engines_from_summary([records[k] for k in sorted(records)])


def _strategy(name: str, data: Mapping[str, Any], directory: Path) -> StrategyResult:
    samples = read_samples(directory / f"samples-{name}.csv")
    events = read_events(directory / f"events-{name}.csv")
    engines = _engines_from_summary(list(data.get("engines") or []))
    if not engines:
        engines = engines_from_events(events)
    phases = data.get("phases") or {}
    return StrategyResult(
        name=name,
        status=str(data.get("status") or "unknown"),
        error=_str(data.get("error")),
        baseline_rss_bytes=_int(data.get("baseline_rss_bytes")),
        host_at_partitioning_bytes=_int(data.get("host_at_partitioning_bytes")),
        host_peak_bytes=_int(data.get("host_peak_bytes")),
        anon_peak_bytes=_int(data.get("anon_peak_bytes")),
        gpu_peak_bytes=_int(data.get("gpu_peak_bytes")),
        host_gpu_peak_bytes=_int(data.get("host_gpu_peak_bytes")),
        wall_s=_float(data.get("wall_s")),
        phases=Phases(
            load_start_s=_float(phases.get("load_start_s")),
            partition_s=_float(phases.get("partition_s")),
            build_end_s=_float(phases.get("build_end_s")),
        ),
        sample_count=_int(data.get("samples")),
        max_gap_ms=_float(data.get("max_gap_ms")),
        peak_source=_str(data.get("peak_source")),
        released_bytes=_int(data.get("released_bytes")),
        unreleased_bytes=_int(data.get("unreleased_bytes")),
        release_note=_str(data.get("release_note")),
        engines=tuple(sorted(engines, key=lambda e: e.index)),
        samples=samples,
        events=events,
        note=_str(data.get("note")) or None,
        mean_interval_ms=_float(data.get("mean_interval_ms")),
    )


def load_results(directory: Path) -> RunResults:
    """Load ``directory`` (one scenario run) into a :class:`RunResults`.

    Raises ``FileNotFoundError`` when the directory has no ``summary.json``.
    """
    directory = Path(directory)
    summary_path = directory / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path}: no summary.json; is {directory} a results directory?")
    raw: dict[str, Any] = json.loads(summary_path.read_text(encoding="utf-8"))
    machine = raw.get("machine") or {}
    model = raw.get("model") or {}
    return RunResults(
        directory=directory,
        name=str(raw.get("name") or directory.name),
        scenario=str(raw.get("scenario") or raw.get("name") or directory.name),
        created=_str(raw.get("created")),
        commit=_str(raw.get("commit")),
        machine=Machine(
            cpus=_int(machine.get("cpus")),
            mem_total_bytes=_int(machine.get("mem_total_bytes")),
            gpu=_str(machine.get("gpu")),
            kernel=_str(machine.get("kernel")),
            hostname=_str(machine.get("hostname")),
        ),
        versions={str(k): _str(v) for k, v in (raw.get("versions") or {}).items()},
        model=ModelInfo(
            name=str(model.get("name") or "model"),
            source=_str(model.get("source")),
            source_note=_str(model.get("source_note")),
            tensors=_int(model.get("tensors")),
            bytes=int(model.get("bytes") or 0),
        ),
        backend=_str(raw.get("backend")),
        device=str(raw.get("device") or "cpu"),
        cache=_str(raw.get("cache")),
        engine_count=_int(raw.get("engines")),
        engine_cap_bytes=_int(raw.get("engine_cap_bytes")),
        release=raw.get("release"),
        sample_interval_ms=_float(raw.get("sample_interval_ms")),
        references=tuple(
            Reference(
                label=str(ref.get("label") or "reference"),
                host_at_partitioning_gib=_float(ref.get("host_at_partitioning_gib")),
                host_gpu_peak_gib=_float(ref.get("host_gpu_peak_gib")),
                host_peak_gib=_float(ref.get("host_peak_gib")),
                note=_str(ref.get("note")),
            )
            for ref in raw.get("references") or []
        ),
        strategies={
            str(name): _strategy(str(name), data or {}, directory)
            for name, data in (raw.get("strategies") or {}).items()
        },
        raw=raw,
        description=_str(raw.get("description")) or None,
    )


def write_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory, then rename.

    A reader never sees a half-written figure or report, and an interrupted write leaves the
    previous file in place.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
