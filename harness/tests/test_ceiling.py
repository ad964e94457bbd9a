"""Tests of the disk's read-ceiling sweep (harness.measure.ceiling)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.measure.ceiling import read_ceiling
from harness.measure.residency import FileResidency
from harness.results.metrics import best_ceiling
from harness.results.record import CeilingPoint
from harness.tests.test_coldcache import synced_files

MiB = 1 << 20
SIZE = 24 * MiB + 12345  # not a multiple of any request or of a page


def _resident(*paths: Path) -> int:
    with FileResidency(list(paths)) as r:
        return r.resident_bytes()


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    return synced_files(tmp_path, ["a.bin", "b.bin"], SIZE)


def test_each_point_reads_a_part_of_its_own_and_leaves_the_files_cold(shards: list[Path]) -> None:
    points = read_ceiling(shards, threads=(1, 3), requests=(MiB, 4 * MiB), point_s=30.0)
    assert [(p.threads, p.request_bytes) for p in points] == [(1, MiB), (1, 4 * MiB), (3, MiB), (3, 4 * MiB)]
    # four equal parts of the two files taken end to end, each read whole well before 30 s: nothing twice
    share = -(-2 * SIZE // 4)
    assert [p.bytes for p in points] == [share, share, share, 2 * SIZE - 3 * share]
    assert all(p.seconds > 0 for p in points)
    # every range dropped once read, and the files dropped at the end: nothing of them left cached
    assert _resident(*shards) <= 2 * MiB
    best = best_ceiling(points)
    assert best is not None and best.bytes_per_s == max(p.bytes_per_s for p in points)


def test_a_point_stops_at_its_time(shards: list[Path]) -> None:
    (point,) = read_ceiling(shards, threads=(1,), requests=(4096,), point_s=0.005)
    assert 0 < point.bytes < 2 * SIZE  # 4 KiB reads of 48 MiB take far longer than 5 ms
    assert point.seconds < 5.0


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
    assert best_ceiling([CeilingPoint(1, MiB, 0, 0.5)]) is None
    assert best_ceiling([CeilingPoint(1, MiB, 100, 1.0), CeilingPoint(2, MiB, 300, 1.0)]) == CeilingPoint(
        2, MiB, 300, 1.0)
