"""Fabricate a small results directory for the reporting tests, through :mod:`harness.results.record`.

Test data only: it is written under a test's temporary directory and never into ``results/``.
The figures follow the shape real runs have (a mapped loader whose file-backed pages come and go
per engine, an eager loader holding the model in anonymous memory, a failed strategy with partial
samples) so that the figures and the report can be looked at as well as asserted on. The records
are the real ones (:class:`~harness.results.record.RunRecord`, :class:`~harness.results.record.StrategyRecord`),
and the peaks are derived by :func:`harness.results.metrics.sampled_peaks`, as a run derives them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.backends.columns import EngineColumns
from harness.catalog import is_gpu
from harness.results.metrics import SampleColumns, StrategyMetrics, sampled_peaks
from harness.results.record import (
    CheckpointInfo,
    EngineRecord,
    MachineInfo,
    ModelInfo,
    Phases,
    Reference,
    RunRecord,
    StrategyRecord,
    write_summary,
)
from harness.results.samples import EVENT_COLUMNS, SAMPLE_COLUMNS, events_file, samples_file
from harness.units import GIB, MIB

ENGINE_GIB = (1.5, 0.5, 1.0, 1.0)
"""Engine sizes of the fabricated model, in build order (model: 4 GiB)."""
BASE_ANON = 350 * MIB
BASE_FILE = 50 * MIB
INTERVAL_S = 0.01
FAILED_REASON = "MemoryError: engine 2 ran out of host memory while copying weights"


@dataclass
class _Trace:
    """Samples and events of one fabricated strategy."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


def _ramp(x: float, start: float, end: float) -> float:
    """0 before ``start``, 1 after ``end``, linear between."""
    return float(np.clip((x - start) / (end - start), 0.0, 1.0))


def _simulate(strategy: str, cuda: bool, fail_at: int | None) -> tuple[_Trace, StrategyRecord]:
    """Sample one strategy's memory over a fabricated run; return its trace and summary entry."""
    engines = [int(g * GIB) for g in ENGINE_GIB]
    model = sum(engines)
    load_s = {"map": 0.05, "load": 2.0, "load_file": 0.1}.get(strategy, 0.5)
    load_start = 0.3
    load_end = load_start + load_s
    partition = load_end + 0.2
    starts, ends = [], []
    t = partition + 0.3
    for size in engines:
        starts.append(t)
        t += 0.4 + size / GIB
        ends.append(t)
        t += 0.05
    build_end = ends[-1]
    stop = build_end + 0.3
    failed_at_s = None
    if fail_at is not None:
        failed_at_s = starts[fail_at] + 0.6 * (ends[fail_at] - starts[fail_at])
        stop = failed_at_s

    trace = _Trace()
    for t_s in np.arange(0.0, stop, INTERVAL_S):
        t_s = float(t_s)
        engine = next((k for k, (s, e) in enumerate(zip(starts, ends, strict=True)) if s <= t_s < e), -1)
        built = [k for k, e in enumerate(ends) if e <= t_s]
        done_bytes = sum(engines[k] for k in built)
        read_frac = copy_frac = 0.0
        current = 0
        if engine >= 0:
            frac = _ramp(t_s, starts[engine], ends[engine])
            read_frac, copy_frac = _ramp(frac, 0.0, 0.4), _ramp(frac, 0.4, 0.9)
            current = engines[engine]
        loaded = _ramp(t_s, load_start, load_end)
        anon, file_ = float(BASE_ANON), float(BASE_FILE)
        copy_host = 0.0 if cuda else current * copy_frac
        if strategy == "load":
            anon += model * loaded - done_bytes + copy_host
            resident = model * loaded
        elif strategy == "map":
            file_ += current * read_frac
            anon += copy_host
            resident = done_bytes + current * read_frac
        else:
            file_ += done_bytes + current * read_frac
            anon += copy_host
            resident = done_bytes + current * read_frac
        gpu = done_bytes + current * copy_frac if cuda else float("nan")
        if t_s < load_start:
            phase = "baseline"
        elif t_s < partition:
            phase = "load"
        elif t_s < starts[0]:
            phase = "partition"
        elif t_s < build_end:
            phase = "build"
        else:
            phase = "done"
        trace.rows.append(
            {
                "t_s": round(t_s, 4),
                "rss_bytes": int(anon + file_),
                "anon_bytes": int(anon),
                "file_bytes": int(file_),
                "resident_bytes": int(resident),
                "gpu_used_bytes": gpu if np.isnan(gpu) else int(gpu),
                "gpu_reserved_bytes": gpu if np.isnan(gpu) else int(gpu * 1.05),
                "engine": engine,
                "phase": phase,
            }
        )

    frame = pd.DataFrame(trace.rows)

    def event(t_s: float, name: str, **values: Any) -> None:
        trace.events.append({"t_s": round(t_s, 4), "event": name, **values})

    event(load_start, "load_start")
    if failed_at_s is None or failed_at_s > load_end:
        event(load_end, "load_end")
        event(partition, "partition")
    engine_records = []
    for k, size in enumerate(engines):
        if failed_at_s is not None and starts[k] > failed_at_s:
            break
        event(starts[k], "engine_start", engine=k, weight_bytes=size)
        if failed_at_s is not None and ends[k] > failed_at_s:
            break
        during = frame[(frame["t_s"] >= starts[k]) & (frame["t_s"] < ends[k])]
        hwm = int(during["rss_bytes"].max()) + MIB
        released = 0 if strategy == "load_file" else size
        event(ends[k], "engine_end", engine=k, weight_bytes=size, host_hwm_bytes=hwm, released_bytes=released)
        after = frame[frame["t_s"] >= ends[k]]
        engine_records.append(
            EngineRecord(
                index=k,
                weight_bytes=size,
                start_s=starts[k],
                end_s=ends[k],
                host_hwm_bytes=hwm,
                released_bytes=released,
                rss_after_bytes=int(after["rss_bytes"].iloc[0]) if len(after) else None,
                gpu_used_bytes=int(after["gpu_used_bytes"].iloc[0]) if cuda and len(after) else None,
                tensors=10 + k,
            )
        )
    if failed_at_s is None:
        event(build_end, "build_end")

    at_partition = frame.loc[frame["t_s"] <= partition, "rss_bytes"]
    released_total = sum(e.released_bytes or 0 for e in engine_records)
    failed = fail_at is not None
    load_frame = frame[frame["t_s"] <= partition]
    record = StrategyRecord(
        status="failed" if failed else "ok",
        error=FAILED_REASON if failed else None,
        baseline_rss_bytes=BASE_ANON + BASE_FILE,
        host_at_partitioning_bytes=int(at_partition.iloc[-1]) if len(at_partition) else None,
        load_hwm_bytes=int(load_frame["rss_bytes"].max()) + MIB if len(load_frame) else None,
        gpu_baseline_bytes=0 if cuda else None,
        process_wall_s=round(stop, 3),
        phases=Phases(load_start_s=load_start, load_end_s=load_end, partition_s=partition,
                      build_end_s=None if failed else build_end),
        samples=len(frame),
        mean_interval_ms=10.2,
        max_gap_ms=14.5,
        peak_source="kernel high-water mark",
        engine_cap_bytes=int(1.5 * GIB),
        released_bytes=released_total,
        unreleased_bytes=model - released_total,
        release_note=(
            "resize_(0) fails on safetensors' mapped storages: nothing released"
            if strategy == "load_file"
            else "each weight released after the last engine that reads it"
        ),
        engines=tuple(engine_records),
    )
    record = record.replace(**sampled_peaks(record, SampleColumns.of(frame)))
    return trace, record


def make_results(
    root: Path,
    *,
    device: str = "cpu",
    name: str = "smoke",
    failed: str | None = "load_file",
    strategies: tuple[str, ...] = ("map", "load", "load_file"),
    references: bool = True,
) -> Path:
    """Write a fabricated results directory ``root/name`` and return its path.

    ``device="cuda"`` fabricates GPU columns and host + GPU figures; ``failed`` names the strategy
    that stops part-way through engine 2 with partial samples.
    """
    cuda = is_gpu(device)
    directory = Path(root) / name
    directory.mkdir(parents=True, exist_ok=True)
    model = sum(int(g * GIB) for g in ENGINE_GIB)
    run = RunRecord(
        scenario=name,
        name=name,
        description="three loading strategies, engines built one by one",
        created="2025-01-02T03:04:05+00:00",
        commit="0123456789abcdef0123456789abcdef01234567",
        machine=MachineInfo(cpus=16, mem_total_bytes=128 * GIB, gpu="NVIDIA H200" if cuda else None,
                            kernel="6.8.0", hostname="bench-1", platform="Linux-6.8.0-x86_64"),
        versions={"python": "3.11.7", "torch": "2.13.0", "safetensors": "0.8.0", "torch_tensorrt": None,
                  "weightmap": "0.1.0"},
        model=ModelInfo(name="fixture-model", source="spec:harness/specs/fixture.json",
                        source_note="random weights in the model's shapes", tensors=812, bytes=model,
                        bytes_with_non_persistent_buffers=model + 4096),
        checkpoint=CheckpointInfo(path=str(Path(root) / "fixture.safetensors"), generated=False, seed=0,
                                  bytes=model + 65536),
        engines=len(ENGINE_GIB),
        engine_cap_bytes=int(1.5 * GIB),
        largest_engine_bytes=max(int(g * GIB) for g in ENGINE_GIB),
        backend="copy",
        device=device,
        cache="cold",
        release=True,
        memory_limit_bytes=None,
        references=(
            (Reference(label="seed run", host_at_partitioning_gib=2.23, host_gpu_peak_gib=7.07,
                       note="TensorRT build of the full model, 16 engines, measured before this harness"),)
            if references else ()
        ),
        scenario_config={"name": name, "run": {"sample_interval_ms": INTERVAL_S * 1000}},
        strategies={},
        round_orders=(strategies,),
    )
    for strategy in strategies:
        trace, record = _simulate(strategy, cuda, 2 if strategy == failed else None)
        pd.DataFrame(trace.rows, columns=list(SAMPLE_COLUMNS)).to_csv(directory / samples_file(strategy),
                                                                      index=False)
        events = pd.DataFrame(trace.events, columns=list(EVENT_COLUMNS))
        integers = {c: "Int64" for c in EVENT_COLUMNS if c not in ("t_s", "event")}
        events.astype(integers).to_csv(directory / events_file(strategy), index=False)
        record = record.replace(sample_rows=len(trace.rows), event_rows=len(trace.events))
        metrics = StrategyMetrics.of(strategy, record, run)
        record = record.replace(floor_bytes=metrics.floor_bytes, excess_over_floor=metrics.excess)
        run = run.with_strategy(strategy, record)
    write_summary(directory, run)
    return directory


def measured(groups: EngineColumns | Iterable[EngineColumns] | None) -> dict[str, Any]:
    """The engine-record fields a builder's column groups set (those not None), by name: what its engine's record
    takes from them."""
    if groups is None:
        return {}
    listed = [groups] if isinstance(groups, EngineColumns) else list(groups)
    return {k: v for group in listed for k, v in asdict(group).items() if v is not None}
