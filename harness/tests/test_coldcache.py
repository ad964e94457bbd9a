"""Tests of cold and warm page-cache preparation (harness.measure.coldcache)."""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

import harness.measure.coldcache as coldcache
from harness.measure.coldcache import (
    COLD_TOLERANCE_BYTES,
    file_page_counts,
    prepare_cold,
    prepare_warm,
    write_back_and_drop,
)
from harness.measure.residency import FileResidency
from harness.tests.pages import skip_if_in_memory
from harness.units import GIB, KIB, MIB

SIZE = 16 * MIB


@pytest.fixture
def disk_dir(tmp_path: Path) -> Path:
    skip_if_in_memory(tmp_path)
    return tmp_path


def _write(path: Path, nbytes: int = SIZE, *, sync: bool) -> None:
    """Write ``nbytes`` of non-zero data; ``sync=False`` leaves the pages dirty (no fsync)."""
    block = bytes(range(1, 256)) * (MIB // 255 + 1)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        while done < nbytes:
            done += os.write(fd, block[: min(MIB, nbytes - done)])
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def synced_files(directory: Path, names: Sequence[str], nbytes: int) -> list[Path]:
    """Files ``names`` of ``nbytes`` each under ``directory``, written and synced; skips the calling test where
    ``directory`` is in memory (tmpfs, ramfs), whose page cache cannot be dropped."""
    skip_if_in_memory(directory)
    paths = [directory / name for name in names]
    for path in paths:
        _write(path, nbytes, sync=True)
    return paths


def _resident(path: Path) -> int:
    with FileResidency([path]) as r:
        return r.resident_bytes()


def _dirty(path: Path) -> int | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        counts = file_page_counts(fd)
    finally:
        os.close(fd)
    return None if counts is None else counts.dirty + counts.writeback


def test_cold_leaves_a_cached_file_out_of_the_page_cache(disk_dir: Path) -> None:
    path = disk_dir / "weights.bin"
    _write(path, sync=True)
    with open(path, "rb") as fh:  # make every page resident
        while fh.read(MIB):
            pass
    assert _resident(path) == SIZE
    report = prepare_cold([path], settle=False)
    assert report.record.state == "cold"
    assert report.files[0].resident_bytes_before == SIZE
    assert report.files[0].resident_bytes_after <= COLD_TOLERANCE_BYTES
    assert report.record.resident_after_bytes == report.files[0].resident_bytes_after
    assert _resident(path) <= COLD_TOLERANCE_BYTES
    assert report.cold_ok


def test_cold_flushes_dirty_pages_before_dropping_them(disk_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # posix_fadvise(DONTNEED) skips pages that are dirty or under writeback when it runs; the
    # file must be clean by then. Record the file's dirty state at the moment of the drop.
    path = disk_dir / "fresh.bin"
    _write(path, sync=False)
    if not _dirty(path):
        pytest.skip("cachestat(2) is not available here, or the kernel wrote the file back already")
    at_drop: list[int | None] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_DONTNEED:
            counts = file_page_counts(fd)
            at_drop.append(None if counts is None else counts.dirty + counts.writeback)
        real(fd, offset, length, advice)

    monkeypatch.setattr(coldcache.os, "posix_fadvise", spy)
    # Short enough that waiting for the kernel's own writeback (30 s by default) cannot stand in for the flush.
    report = prepare_cold([path], settle=False, timeout_s=5)
    assert at_drop == [0]
    assert report.files[0].resident_bytes_after <= COLD_TOLERANCE_BYTES, report.to_json()
    assert report.files[0].dirty_bytes_after == 0
    assert report.files[0].writeback_bytes_after == 0
    assert report.files[0].flushes >= 1


def test_cold_works_on_a_read_only_file(disk_dir: Path) -> None:
    path = disk_dir / "ro.bin"
    _write(path, sync=False)
    path.chmod(0o444)
    report = prepare_cold([path], settle=False)
    assert report.files[0].resident_bytes_after <= COLD_TOLERANCE_BYTES
    assert report.cold_ok


def test_cold_records_dirty_bytes_found_before_the_flush(disk_dir: Path) -> None:
    path = disk_dir / "fresh.bin"
    _write(path, sync=False)
    dirty = _dirty(path)
    if dirty is None:
        pytest.skip("cachestat(2) is not available here: per-file dirty state is not visible")
    report = prepare_cold([path], settle=False)
    before = (report.files[0].dirty_bytes_before or 0) + (report.files[0].writeback_bytes_before or 0)
    assert before > 0
    assert report.dirty_source == "cachestat"
    assert report.files[0].dirty_bytes_after == 0


def test_settle_waits_for_the_machine_and_reports_it(disk_dir: Path) -> None:
    path = disk_dir / "weights.bin"
    _write(path, sync=True)
    report = prepare_cold([path], settle=True, settle_bytes=1 << 62, timeout_s=30)
    assert report.record.settled is True
    assert "sync" in report.record.method
    assert report.system_dirty_bytes_before is not None


def test_settle_gives_up_at_the_timeout_and_says_so(disk_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = disk_dir / "weights.bin"
    _write(path, sync=True)
    monkeypatch.setattr(coldcache, "system_dirty_bytes", lambda: 10 * GIB)  # a machine that never settles
    report = prepare_cold([path], settle=True, timeout_s=0.3)
    assert report.record.settled is False
    assert any("dirty or under writeback" in note for note in report.record.notes)
    assert report.files[0].resident_bytes_after <= COLD_TOLERANCE_BYTES  # dropped all the same


def test_cold_reports_pages_a_process_still_maps(disk_dir: Path) -> None:
    path = disk_dir / "mapped.bin"
    _write(path, sync=True)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        mm.madvise(mmap.MADV_WILLNEED)
        for offset in range(0, SIZE, mmap.PAGESIZE):  # fault every page in: mapped pages cannot be dropped
            mm[offset]
        report = prepare_cold([path], settle=False)
    assert report.files[0].resident_bytes_after > COLD_TOLERANCE_BYTES
    assert not report.cold_ok
    assert any("still in the page cache" in note for note in report.record.notes)


def test_warm_reads_every_page_in(disk_dir: Path) -> None:
    path = disk_dir / "weights.bin"
    _write(path, sync=True)
    prepare_cold([path], settle=False)
    report = prepare_warm([path], chunk=3 * MIB)  # not a divisor of the size: the tail is read too
    assert report.record.state == "warm"
    assert report.files[0].resident_bytes_before <= COLD_TOLERANCE_BYTES
    assert report.files[0].resident_bytes_after == SIZE
    assert report.record.resident_after_bytes == SIZE


def test_report_is_json(disk_dir: Path) -> None:
    path = disk_dir / "weights.bin"
    _write(path, sync=True)
    data = json.loads(json.dumps(prepare_cold([path], settle=False).to_json()))
    assert data["state"] == "cold"
    assert data["total_bytes"] == SIZE
    assert data["files"][0]["path"] == str(path)
    assert data["cold_ok"] is True
    assert {"method", "seconds", "flush_seconds", "settle_seconds", "resident_after_bytes", "notes"} <= data.keys()


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no files"):
        prepare_cold([])
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        prepare_cold([tmp_path / "missing.bin"])
    with pytest.raises(FileNotFoundError, match="not a regular file"):
        prepare_warm([tmp_path])


@pytest.mark.parametrize("by", ["path", "descriptor"])
def test_a_file_just_written_is_written_back_and_leaves_the_page_cache(disk_dir: Path, by: str) -> None:
    path = disk_dir / "engine.bin"
    _write(path, sync=False)  # dirty: dropping alone would leave its pages
    assert _resident(path) == SIZE
    if by == "path":
        write_back_and_drop(path)
    else:
        fd = os.open(path, os.O_RDONLY)
        try:
            write_back_and_drop(fd)
            os.fstat(fd)  # still open: the caller's to close
        finally:
            os.close(fd)
    assert _resident(path) <= COLD_TOLERANCE_BYTES
    assert _dirty(path) in (0, None)
    assert path.read_bytes()[:255] == bytes(range(1, 256))  # the data, written back intact


def test_system_dirty_bytes_reads_meminfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "meminfo"
    fake.write_text("MemTotal: 100 kB\nDirty:        12 kB\nWriteback:     3 kB\nWritebackTmp: 7 kB\n")
    monkeypatch.setattr(coldcache, "MEMINFO", str(fake))
    assert coldcache.system_dirty_bytes() == 15 * KIB
    fake.write_text("MemTotal: 100 kB\n")
    assert coldcache.system_dirty_bytes() is None
