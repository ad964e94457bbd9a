"""Tests of the cold sequential read reference (harness.measure.diskread)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import harness.measure.diskread as diskread
from harness.measure.coldcache import COLD_TOLERANCE_BYTES
from harness.measure.diskread import cold_read_bandwidth, cpu_times
from harness.measure.procfs import read_status
from harness.measure.residency import FileResidency
from harness.tests.pages import skip_if_in_memory
from harness.tests.test_coldcache import _write
from harness.units import MIB

SIZE = 24 * MIB + 12345  # not a multiple of the chunk or of a page


@pytest.fixture
def cold_file(tmp_path: Path) -> Path:
    skip_if_in_memory(tmp_path)
    path = tmp_path / "weights.bin"
    _write(path, SIZE, sync=False)  # dirty: the reference must flush it before it drops it
    return path


def _resident(path: Path) -> int:
    with FileResidency([path]) as r:
        return r.resident_bytes()


def test_reads_every_byte_cold_and_leaves_the_file_cold(cold_file: Path) -> None:
    result = cold_read_bandwidth(cold_file, chunk=4 * MIB, settle=False)
    assert result.bytes == SIZE
    assert result.seconds > 0
    assert result.bytes_per_s == pytest.approx(SIZE / result.seconds)
    assert result.cache.record.state == "cold"
    assert result.cache.cold_ok  # it started cold
    assert result.resident_bytes_after <= COLD_TOLERANCE_BYTES  # and the next reader starts cold too
    assert _resident(cold_file) <= COLD_TOLERANCE_BYTES
    assert result.per_file == [(str(cold_file), SIZE, result.per_file[0][2])]
    assert result.chunk_bytes == 4 * MIB


def test_the_read_starts_from_a_cold_cache(cold_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = os.readv

    def spy(fd: int, buffers: list[memoryview]) -> int:
        if not seen:  # residency at the first read: nothing of the file may be cached yet
            seen.append(_resident(cold_file))
        return real(fd, buffers)

    with open(cold_file, "rb") as fh:  # warm it first
        while fh.read(MIB):
            pass
    monkeypatch.setattr(diskread.os, "readv", spy)
    cold_read_bandwidth(cold_file, chunk=4 * MIB, settle=False)
    assert seen and seen[0] <= COLD_TOLERANCE_BYTES


def test_limit_bytes_stops_early(cold_file: Path) -> None:
    result = cold_read_bandwidth(cold_file, chunk=4 * MIB, limit_bytes=5 * MIB + 7, settle=False)
    assert result.bytes == 5 * MIB + 7


def test_several_files_are_read_in_order_and_limited_together(tmp_path: Path, cold_file: Path) -> None:
    second = tmp_path / "second.bin"
    _write(second, 3 * MIB, sync=True)
    both = cold_read_bandwidth([cold_file, second], chunk=2 * MIB, settle=False)
    assert both.bytes == SIZE + 3 * MIB
    assert [row[:2] for row in both.per_file] == [(str(cold_file), SIZE), (str(second), 3 * MIB)]
    limited = cold_read_bandwidth([cold_file, second], chunk=2 * MIB, limit_bytes=SIZE + MIB, settle=False)
    assert limited.bytes == SIZE + MIB
    assert [row[:2] for row in limited.per_file] == [(str(cold_file), SIZE), (str(second), MIB)]


def test_memory_does_not_grow_with_the_file(cold_file: Path) -> None:
    # One reused buffer: the process's anonymous memory grows by the buffer at most, and the
    # file's pages never enter the process (read() copies them; nothing is mapped).
    before = read_status()
    cold_read_bandwidth(cold_file, chunk=MIB, settle=False)
    after = read_status()
    assert after.anon_bytes - before.anon_bytes < 4 * MIB
    assert after.file_bytes - before.file_bytes < 4 * MIB


def test_result_is_json(cold_file: Path) -> None:
    data = json.loads(json.dumps(cold_read_bandwidth(cold_file, chunk=4 * MIB, settle=False).to_json()))
    assert data["bytes"] == SIZE
    assert data["cache"]["state"] == "cold"
    assert data["cache"]["cold_ok"] is True
    assert data["per_file"][0][:2] == [str(cold_file), SIZE]
    assert {"bytes_per_s", "seconds", "cpu_seconds", "method", "machine_cpu", "resident_bytes_after"} <= data.keys()


def test_bad_arguments_are_refused(cold_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="chunk"):
        cold_read_bandwidth(cold_file, chunk=0)
    with pytest.raises(ValueError, match="limit_bytes"):
        cold_read_bandwidth(cold_file, limit_bytes=0)
    with pytest.raises(FileNotFoundError, match="nothing.bin"):
        cold_read_bandwidth(tmp_path / "nothing.bin")


def test_cpu_times_parses_proc_stat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "stat"
    fake.write_text("cpu  10 1 5 100 2 0 1 7 0 0\ncpu0 5 0 2 50 1 0 0 3 0 0\n")
    monkeypatch.setattr(diskread, "STAT", str(fake))
    assert cpu_times() == {"user": 10, "nice": 1, "system": 5, "idle": 100, "iowait": 2, "irq": 0,
                           "softirq": 1, "steal": 7}
    fake.write_text("intr 1 2 3\n")
    assert cpu_times() is None


def test_settle_is_passed_on_to_the_preparation(cold_file: Path) -> None:
    assert cold_read_bandwidth(cold_file, chunk=4 * MIB, settle=False).cache.record.settled is None
    settled = cold_read_bandwidth(cold_file, chunk=4 * MIB, settle=True)
    assert settled.cache.record.settled is not None
    assert "sync" in settled.cache.record.method


@pytest.mark.parametrize("drop_behind", [True, False])
def test_drop_behind_keeps_the_page_cache_from_growing(
    cold_file: Path, monkeypatch: pytest.MonkeyPatch, drop_behind: bool
) -> None:
    seen: list[tuple[int, int]] = []  # (bytes read so far, bytes of the file in the page cache)
    real = os.readv

    def spy(fd: int, buffers: list[memoryview]) -> int:
        done = seen[-1][0] if seen else 0
        seen.append((done, _resident(cold_file)))
        got = real(fd, buffers)
        seen[-1] = (done + got, seen[-1][1])
        return got

    monkeypatch.setattr(diskread.os, "readv", spy)
    result = cold_read_bandwidth(cold_file, chunk=4 * MIB, settle=False, drop_behind=drop_behind)
    assert result.drop_behind is drop_behind
    assert len(seen) >= 6
    # Residency before each read: readahead may have cached what is not read yet; whatever
    # exceeds that is bytes already read and still cached.
    read_before = [0] + [done for done, _ in seen[:-1]]
    kept = [max(0, resident - (SIZE - before)) for before, (_, resident) in zip(read_before, seen, strict=True)]
    if drop_behind:
        assert max(kept) <= COLD_TOLERANCE_BYTES
        assert "dropped from the page cache once read" in result.method
    else:
        assert kept[-1] >= read_before[-1] - COLD_TOLERANCE_BYTES  # everything read so far is still cached
        assert read_before[-1] >= SIZE - 4 * MIB
        assert "kept cached" in result.method
    assert result.resident_bytes_after <= COLD_TOLERANCE_BYTES
