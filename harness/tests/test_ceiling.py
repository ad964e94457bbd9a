"""Tests of the disk's read-ceiling sweep (harness.measure.ceiling)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from harness.measure.ceiling import read_ceiling
from harness.measure.residency import FileResidency
from harness.results.disk import CeilingPoint
from harness.results.metrics import best_ceiling
from harness.tests.test_coldcache import synced_files
from harness.units import MIB

SIZE = 24 * MIB + 12345  # not a multiple of any request or of a page


def _resident(*paths: Path) -> int:
    with FileResidency(list(paths)) as r:
        return r.resident_bytes()


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    return synced_files(tmp_path, ["a.bin", "b.bin"], SIZE)


def test_each_point_reads_a_part_of_its_own_and_leaves_the_files_cold(shards: list[Path]) -> None:
    points = read_ceiling(shards, threads=(1, 3), requests=(MIB, 4 * MIB), point_s=30.0)
    assert [(p.threads, p.request_bytes) for p in points] == [(1, MIB), (1, 4 * MIB), (3, MIB), (3, 4 * MIB)]
    # four equal parts of the two files taken end to end, each read whole well before 30 s: nothing twice
    share = -(-2 * SIZE // 4)
    assert [p.bytes for p in points] == [share, share, share, 2 * SIZE - 3 * share]
    assert all(p.seconds > 0 for p in points)
    # every range dropped once read, and the files dropped at the end: nothing of them left cached
    assert _resident(*shards) <= 2 * MIB
    best = best_ceiling(points)
    assert best is not None and best.bytes_per_s == max(p.bytes_per_s for p in points)


class _TimedReads:
    """``os`` and ``time`` for the sweep: each ``preadv`` takes ``read_s`` of a clock that moves only then."""

    def __init__(self, read_s: float) -> None:
        self.read_s = read_s
        self.now = 0.0
        self.reads = 0
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        return self.now

    def preadv(self, fd: int, buffers: list[memoryview], offset: int) -> int:
        with self._lock:
            self.reads += 1
            self.now += self.read_s
        return os.preadv(fd, buffers, offset)

    def __getattr__(self, name: str) -> Any:  # the rest of ``os``
        return getattr(os, name)


@pytest.fixture
def timed_reads(monkeypatch: pytest.MonkeyPatch) -> _TimedReads:
    clock = _TimedReads(read_s=0.001)
    monkeypatch.setattr("harness.measure.ceiling.os", clock)
    monkeypatch.setattr("harness.measure.ceiling.time", clock)
    return clock


def test_a_point_stops_at_its_time(shards: list[Path], timed_reads: _TimedReads) -> None:
    (point,) = read_ceiling(shards, threads=(1,), requests=(4096,), point_s=0.005)
    # 1 ms a read: the fifth reaches 5 ms and is the last, of the more than 12,000 the point's part holds
    assert timed_reads.reads == 5
    assert point.bytes == 5 * 4096 and point.seconds == 0.005


def test_each_reader_makes_one_request_however_late_it_starts(shards: list[Path], timed_reads: _TimedReads) -> None:
    (point,) = read_ceiling(shards, threads=(3,), requests=(4096,), point_s=1e-6)
    assert timed_reads.reads == 3  # the first read passes the time: each reader stops after its one
    assert point.bytes == 3 * 4096


def test_bad_settings_and_missing_files_are_refused(tmp_path: Path, shards: list[Path]) -> None:
    open_fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ValueError, match="thread counts and request sizes must be at least 1"):
        read_ceiling(shards, threads=(0,))
    with pytest.raises(ValueError, match="point_s positive"):
        read_ceiling(shards, point_s=float("nan"))
    with pytest.raises(ValueError, match="needs files"):
        read_ceiling([])
    with pytest.raises(FileNotFoundError):
        read_ceiling([*shards, tmp_path / "missing.bin"])
    assert len(os.listdir("/proc/self/fd")) == open_fds  # nothing left open


def test_the_best_point_is_none_where_nothing_was_read() -> None:
    assert best_ceiling([CeilingPoint(1, MIB, 0, 0.5)]) is None
    assert best_ceiling([CeilingPoint(1, MIB, 100, 1.0), CeilingPoint(2, MIB, 300, 1.0)]) == CeilingPoint(
        2, MIB, 300, 1.0)


def test_the_fastest_settings_are_read_again_each_from_a_part_of_its_own(shards: list[Path]) -> None:
    points = read_ceiling(shards, threads=(1, 3), requests=(MIB, 4 * MIB), point_s=30.0, best_settings=2, repeats=2)
    sweep, again = points[:4], points[4:]
    fastest = [(p.threads, p.request_bytes) for p in sorted(sweep, key=lambda p: -p.bytes_per_s)[:2]]
    assert [(p.threads, p.request_bytes) for p in again] == fastest * 2
    # eight equal parts now, each read whole: every byte read once, by one read only
    share = -(-2 * SIZE // 8)
    assert [p.bytes for p in points] == [share] * 7 + [2 * SIZE - 7 * share]
    assert _resident(*shards) <= 2 * MIB


def test_the_best_setting_is_the_median_of_its_reads_not_its_luckiest() -> None:
    lucky = [CeilingPoint(2, MIB, 900, 1.0), CeilingPoint(2, MIB, 300, 1.0), CeilingPoint(2, MIB, 310, 1.0)]
    steady = [CeilingPoint(1, MIB, 500, 1.0), CeilingPoint(1, MIB, 520, 1.0), CeilingPoint(1, MIB, 480, 1.0)]
    assert best_ceiling([lucky[0], steady[0], *lucky[1:], *steady[1:]]) == CeilingPoint(1, MIB, 500, 1.0)
    assert best_ceiling(lucky[:2]) == CeilingPoint(2, MIB, 300, 1.0)  # two reads: the lower middle one
