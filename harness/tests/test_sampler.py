"""Tests of the sampler thread, the /proc/self readers, the kernel high-water mark and GPU columns."""

from __future__ import annotations

import mmap
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from harness.measure.gpu import GpuMonitor, torch_reserved_bytes
from harness.measure.procfs import PeakTracker, mapping_rss, read_peak, read_status, reset_peak
from harness.measure.sampler import Sampler
from harness.units import MIB, TIB

COL = {name: i for i, name in enumerate(Sampler.COLUMNS)}


def _touched(nbytes: int) -> np.ndarray:
    """An anonymous block of ``nbytes`` whose every page has been written."""
    return np.ones(nbytes, dtype=np.uint8)


def _wait_for_samples(sampler: Sampler, extra: int, timeout_s: float = 5.0) -> None:
    """Wait until the sampler has taken ``extra`` more rows (bounded by ``timeout_s``)."""
    target = sampler.stats.samples + extra
    deadline = time.monotonic() + timeout_s
    while sampler.stats.samples < target:
        assert time.monotonic() < deadline, "the sampler thread stopped sampling"
        time.sleep(sampler.interval_s / 2)


def _column(rows: Sequence[tuple[Any, ...]], name: str) -> list[Any]:
    return [row[COL[name]] for row in rows]


# -- /proc/self readers -----------------------------------------------------------------------


def test_status_reading_is_consistent() -> None:
    status = read_status()
    assert status.rss_bytes > 0
    assert status.rss_bytes == status.anon_bytes + status.file_bytes + status.shmem_bytes
    assert status.hwm_bytes >= status.rss_bytes
    assert read_peak() >= status.rss_bytes


def test_mapping_rss_counts_touched_pages_of_a_file(tmp_path: Path) -> None:
    path = tmp_path / "mapped.bin"
    path.write_bytes(b"\1" * (8 * MIB))
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert mapping_rss(path) == 0
        total = sum(mm[i] for i in range(0, len(mm), mmap.PAGESIZE))  # one read per page
        assert total == len(mm) // mmap.PAGESIZE
        assert mapping_rss(path) == 8 * MIB
    assert mapping_rss(path) == 0
    assert mapping_rss(tmp_path / "never-mapped") == 0


# -- the sampler ----------------------------------------------------------------------------


def test_sampler_sees_anonymous_allocation_and_its_release() -> None:
    sampler = Sampler(interval_s=0.01)
    sampler.start()
    try:
        block = _touched(512 * MIB)
        _wait_for_samples(sampler, 3)
        del block
        _wait_for_samples(sampler, 3)
    finally:
        sampler.stop()
    rows = sampler.rows()
    anon, file_, rss = _column(rows, "anon_bytes"), _column(rows, "file_bytes"), _column(rows, "rss_bytes")
    # The first row (start) precedes the allocation and the last (stop) follows its release,
    # so only the background thread's rows can show the block.
    assert max(anon) - anon[0] >= 480 * MIB
    assert max(rss) - rss[0] >= 480 * MIB
    assert max(file_) - file_[0] < 64 * MIB, "an anonymous block was counted as file-backed"
    assert anon[-1] - anon[0] < 64 * MIB, "the release was not seen"


def test_peak_tracker_catches_a_spike_the_samples_miss() -> None:
    tracker = PeakTracker()
    sampler = Sampler(interval_s=1.0)
    sampler.start()
    try:
        base = read_status().rss_bytes
        began = time.monotonic()
        if not tracker.begin():
            pytest.skip("the kernel refuses '5' on /proc/self/clear_refs: per-engine peaks use samples")
        spike = _touched(256 * MIB)
        del spike
        peak = tracker.end()
        elapsed = time.monotonic() - began
    finally:
        sampler.stop()
    assert peak is not None
    assert peak >= base + 240 * MIB
    assert tracker.overall_bytes is not None and tracker.overall_bytes >= peak
    if elapsed < 0.9 * sampler.interval_s:  # else the thread may legitimately have sampled the spike
        rss = _column(sampler.rows(), "rss_bytes")
        assert max(rss) < base + 128 * MIB, "the spike was meant to fall between samples"
    # After a reset the mark restarts from the current RSS, far below the spike.
    assert reset_peak()
    assert read_peak() < peak - 128 * MIB


def test_peak_tracker_remembers_a_refused_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.measure.procfs as procfs

    monkeypatch.setattr(procfs, "CLEAR_REFS_PATH", "/nonexistent/clear_refs")
    assert procfs.reset_peak() is False
    tracker = PeakTracker()
    assert tracker.supported
    assert tracker.begin() is False
    assert tracker.supported is False
    assert tracker.end() is None
    assert tracker.begin() is False


def test_mark_records_every_transition_as_a_row() -> None:
    sampler = Sampler(interval_s=30.0)  # no background sample during the test
    sampler.mark(engine=7)  # before start: labels only, no row
    sampler.start()
    sampler.mark(engine=0, phase="build")
    sampler.mark(phase="release")
    sampler.mark(engine=1, phase="build")
    sampler.mark(engine=None, phase=None)
    sampler.stop()
    sampler.mark(phase="after")  # after stop: labels only, no row
    labels = [(row[COL["engine"]], row[COL["phase"]]) for row in sampler.rows()]
    assert labels == [
        (7, None),  # start
        (0, "build"),
        (0, "release"),
        (1, "build"),
        (-1, None),
        (-1, None),  # stop
    ]
    times = _column(sampler.rows(), "t_s")
    assert times == sorted(times)


def test_stats_measure_the_background_intervals() -> None:
    sampler = Sampler(interval_s=0.01)
    assert sampler.stats.samples == 0
    sampler.start()
    _wait_for_samples(sampler, 10)
    stats = sampler.stop()
    assert stats.samples >= 12
    assert stats.samples == len(sampler.rows())
    # the figures are the gaps between the thread's own rows (every row but stop's): what it achieved, however
    # loaded the machine was (a fresh clone measured 30 ms against 10 while other work shared its two cores)
    gaps_ms = np.diff(_column(sampler.rows(), "t_s")[:-1]) * 1e3
    assert stats.mean_interval_ms == pytest.approx(float(gaps_ms.mean()), rel=1e-6, abs=1e-6)
    assert stats.max_gap_ms == pytest.approx(float(gaps_ms.max()), rel=1e-6, abs=1e-6)
    # the thread keeps a fixed cadence from start and never samples ahead of it: never faster than asked
    assert stats.mean_interval_ms >= 0.99 * 10
    assert stats.max_gap_ms >= stats.mean_interval_ms
    assert sampler.stats == stats


def test_t0_sets_the_time_origin() -> None:
    t0 = time.monotonic() - 100.0
    sampler = Sampler(interval_s=30.0, t0=t0)
    sampler.start()
    sampler.stop()
    first = _column(sampler.rows(), "t_s")[0]
    assert 100.0 <= first < 110.0


def test_lifecycle_errors() -> None:
    sampler = Sampler(interval_s=30.0)
    with pytest.raises(RuntimeError):
        sampler.stop()
    with pytest.raises(RuntimeError):
        sampler.sample_now()
    sampler.start()
    with pytest.raises(RuntimeError):
        sampler.start()
    sampler.sample_now()
    sampler.stop()
    assert len(sampler.rows()) == 3
    with pytest.raises(ValueError):
        Sampler(interval_s=0)
    with pytest.raises(ValueError):
        Sampler(residency_every=0)


def test_a_failing_reader_surfaces_at_stop() -> None:
    class BrokenGpu(_FakeGpu):
        def used_bytes(self) -> int:
            if self.calls >= 3:  # baseline, start's row, one background row
                raise OSError("device lost")
            self.calls += 1
            return 0

    sampler = Sampler(interval_s=0.005, gpu=BrokenGpu())
    sampler.start()
    deadline = time.monotonic() + 5.0
    while sampler._thread is not None and sampler._thread.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    with pytest.raises(RuntimeError, match="device lost"):
        sampler.stop()
    assert len(sampler.rows()) == 2  # start and one background row are kept


# -- GPU columns ----------------------------------------------------------------------------


class _FakeGpu(GpuMonitor):
    """A GPU monitor whose ``used`` is set by the test."""

    def __init__(self) -> None:
        super().__init__(None, device_index=0, name="fake", total_bytes=TIB)
        self.used = 0
        self.calls = 0

    def used_bytes(self) -> int:
        return self.used


def test_gpu_columns_are_empty_without_a_monitor(tmp_path: Path) -> None:
    sampler = Sampler(interval_s=0.01)
    sampler.start()
    _wait_for_samples(sampler, 2)
    sampler.mark(engine=3, phase="build")
    sampler.stop()
    rows = sampler.rows()
    for name in ("gpu_used_bytes", "gpu_reserved_bytes", "resident_bytes"):
        assert all(value is None for value in _column(rows, name)), name
    assert sampler.gpu_baseline_bytes is None

    path = tmp_path / "samples.csv"
    sampler.write_csv(path)
    assert path.read_text().splitlines()[0] == ",".join(Sampler.COLUMNS)
    frame = pd.read_csv(path)
    assert tuple(frame.columns) == Sampler.COLUMNS
    assert len(frame) == len(rows)
    for name in ("gpu_used_bytes", "gpu_reserved_bytes", "resident_bytes"):
        assert frame[name].isna().all(), name
    assert (frame["rss_bytes"] > 0).all()
    assert frame["rss_bytes"].tolist() == _column(rows, "rss_bytes")
    assert frame["engine"].tolist() == _column(rows, "engine")
    assert frame["engine"].iloc[-1] == 3
    assert frame["phase"].iloc[-1] == "build"
    assert frame["phase"].iloc[0] != frame["phase"].iloc[0]  # NaN: an empty phase
    assert np.allclose(frame["t_s"], _column(rows, "t_s"))


def test_gpu_used_is_relative_to_the_baseline() -> None:
    gpu = _FakeGpu()
    gpu.used = 1000
    sampler = Sampler(interval_s=30.0, gpu=gpu)
    sampler.start()  # baseline 1000
    gpu.used = 1500
    sampler.mark(phase="model on device")
    gpu.used = 5000
    sampler.rebase_gpu()  # baseline 5000
    gpu.used = 5200
    sampler.mark(phase="engine")
    sampler.stop()
    used = _column(sampler.rows(), "gpu_used_bytes")
    assert used == [0, 500, 200, 200]
    assert sampler.gpu_baseline_bytes == 5000
    # Until this process initialises CUDA (an earlier test on a GPU machine may have),
    # torch has reserved nothing it can report.
    reserved = _column(sampler.rows(), "gpu_reserved_bytes")
    if "torch" not in sys.modules or not sys.modules["torch"].cuda.is_initialized():
        assert reserved == [None] * 4


def test_gpu_monitor_open_never_raises() -> None:
    monitor = GpuMonitor.open()
    if monitor is None:
        return  # no driver or no device: the harness records no GPU figures
    with monitor:
        assert monitor.total_bytes > 0
        assert 0 < monitor.used_bytes() <= monitor.total_bytes
        assert monitor.name


def test_torch_reserved_does_not_initialise_cuda() -> None:
    torch = pytest.importorskip("torch")
    was_initialised = torch.cuda.is_initialized()
    value = torch_reserved_bytes()
    assert torch.cuda.is_initialized() == was_initialised
    if not was_initialised:
        assert value is None


def test_visible_devices_select_the_nvml_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.measure.gpu import _visible_entry

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _visible_entry(1) == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert [_visible_entry(i) for i in range(3)] == ["3", "1", None]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ab12, 2,-1,0")
    assert [_visible_entry(i) for i in range(3)] == ["GPU-ab12", "2", None]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert _visible_entry(0) is None
    assert GpuMonitor.open(0) is None


# -- what reading residency may cost ---------------------------------------------------------


class _Clock:
    """``time`` for the sampler: a monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _CostlyResidency:
    """A residency reader each of whose reads takes ``cost_s`` of ``clock``, as cachestat takes time
    on a large cached file; ``reads`` holds the clock at the start of each."""

    cost_s = 0.02
    clock = _Clock()
    made: list[_CostlyResidency] = []

    def __init__(self, files: Sequence[Path]) -> None:
        self.reads: list[float] = []
        self.made.append(self)

    def resident_bytes(self) -> int:
        self.reads.append(self.clock.now)
        self.clock.now += self.cost_s
        return 4096 * len(self.reads)

    def close(self) -> None:
        pass


def test_reading_residency_stays_within_its_budget(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clock = _Clock()
    monkeypatch.setattr(_CostlyResidency, "clock", clock)
    monkeypatch.setattr(_CostlyResidency, "made", [])
    monkeypatch.setattr("harness.measure.sampler.time", clock)
    monkeypatch.setattr("harness.measure.sampler.FileResidency", _CostlyResidency)
    budget = 0.1
    sampler = Sampler(interval_s=0.005, files=[tmp_path / "ckpt"], residency_every=1, residency_budget=budget)
    sampler.start()
    for _ in range(20):  # 50 ms of the sampler's clock each, with a mark: marks are throttled too
        clock.now += 0.05
        time.sleep(0.01)  # the thread, polling every 5 ms, samples at the new time
        sampler.mark(engine=1)
    sampler.stop()
    (residency,) = _CostlyResidency.made
    reads = residency.reads
    assert sampler.residency_reads == len(reads)
    assert sampler.residency_s >= len(reads) * _CostlyResidency.cost_s - 1e-9
    # start reads first and stop last, whatever the budget; every read in between came at least
    # cost / budget after the one before (unthrottled: at every sample and every mark).
    gaps = [later - earlier for earlier, later in zip(reads[:-2], reads[1:-1], strict=True)]
    assert all(gap >= _CostlyResidency.cost_s / budget - 1e-9 for gap in gaps), gaps
    assert len(reads) >= 3  # it still reads, less often: start's, at least one in between, stop's
    resident = [row[4] for row in sampler.rows()]  # the resident_bytes column
    assert resident[-1] == 4096 * len(reads)  # stop reads it


def test_residency_budget_must_be_a_fraction() -> None:
    with pytest.raises(ValueError, match="residency_budget"):
        Sampler(residency_budget=0)
    with pytest.raises(ValueError, match="residency_budget"):
        Sampler(residency_budget=1.5)
