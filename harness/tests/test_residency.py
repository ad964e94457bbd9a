"""Tests of page-cache residency (mincore and cachestat) and of its column in the sampler."""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path
from typing import Any

import pytest

import harness.measure.residency as residency
from harness.measure.procfs import mapping_rss
from harness.measure.residency import FileResidency, Method
from harness.measure.sampler import Sampler
from harness.tests.pages import skip_if_in_memory
from harness.units import MIB

SIZE = 64 * MIB


def _methods() -> list[Method]:
    """The residency methods this machine supports."""
    methods: list[Method] = ["mincore"]
    probe = Path(__file__)
    try:
        with FileResidency([probe], method="cachestat"):
            methods.append("cachestat")
    except OSError:
        pass
    return methods


METHODS = _methods()


@pytest.fixture
def cold_file(tmp_path: Path) -> Path:
    """A 64 MiB file written to disk and dropped from the page cache."""
    skip_if_in_memory(tmp_path)
    path = tmp_path / "weights.bin"
    chunk = bytes(range(256)) * (MIB // 256)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(SIZE // MIB):
            os.write(fd, chunk)
        os.fsync(fd)  # only clean pages can be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return path


def _read(path: Path, nbytes: int) -> None:
    """Read the first ``nbytes`` of ``path`` with readahead off, so exactly they get cached."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        done = 0
        while done < nbytes:
            got = len(os.pread(fd, min(8 * MIB, nbytes - done), done))
            assert got > 0
            done += got
    finally:
        os.close(fd)


@pytest.mark.parametrize("method", METHODS)
def test_cold_file_reads_zero_and_half_read_file_reads_half(cold_file: Path, method: Method) -> None:
    with FileResidency([cold_file], method=method) as res:
        assert res.methods == {cold_file: method}
        assert res.total_bytes == SIZE
        assert res.resident_bytes() <= MIB, "the file should be out of the page cache"
        _read(cold_file, SIZE // 2)
        resident = res.resident_bytes()
        assert abs(resident - SIZE // 2) <= 0.1 * SIZE
        assert res.per_file() == {cold_file: resident}
    # The residency reader itself never maps a page into the process.
    assert mapping_rss(cold_file) == 0


@pytest.mark.parametrize("method", METHODS)
def test_fully_read_file_counts_its_exact_size(tmp_path: Path, method: Method) -> None:
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"x" * (3 * mmap.PAGESIZE + 123))  # a partial last page
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    odd.read_bytes()
    with FileResidency([odd, empty], method=method) as res:
        assert res.per_file() == {odd: 3 * mmap.PAGESIZE + 123, empty: 0}
        assert res.resident_bytes() == 3 * mmap.PAGESIZE + 123
        assert res.page_cache_visible
    with pytest.raises(ValueError):
        res.resident_bytes()


def test_no_files_and_missing_files(tmp_path: Path) -> None:
    with FileResidency([]) as res:
        assert res.resident_bytes() == 0
        assert res.per_file() == {}
    with pytest.raises(FileNotFoundError):
        FileResidency([tmp_path / "missing.bin"])
    with pytest.raises(ValueError):
        FileResidency([], method="guess")  # type: ignore[arg-type]


def test_a_platform_without_mincore_is_refused_at_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class LibcWithoutMincore:
        pass

    path = tmp_path / "f.bin"
    path.write_bytes(b"x")
    residency._mincore.cache_clear()
    monkeypatch.setattr(residency, "_libc", LibcWithoutMincore)
    try:
        with pytest.raises(OSError, match="no mincore"):
            FileResidency([path], method="mincore")
    finally:
        residency._mincore.cache_clear()


def test_an_unknown_platform_falls_back_to_mincore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 10)
    monkeypatch.setattr(residency, "_cachestat_nr", lambda: None)
    with FileResidency([path]) as res:
        assert res.methods == {path: "mincore"}
    with pytest.raises(OSError):
        FileResidency([path], method="cachestat")


def test_sampler_reads_residency_every_nth_sample_and_at_marks(cold_file: Path) -> None:
    sampler = Sampler(interval_s=0.005, files=[cold_file], residency_every=10_000)
    sampler.start()
    try:
        _read(cold_file, SIZE // 2)
        target = sampler.stats.samples + 3
        deadline = time.monotonic() + 5.0
        while sampler.stats.samples < target:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        sampler.mark(phase="after read")
    finally:
        sampler.stop()
    rows = sampler.rows()
    resident: list[Any] = [row[Sampler.COLUMNS.index("resident_bytes")] for row in rows]
    phases: list[Any] = [row[Sampler.COLUMNS.index("phase")] for row in rows]
    at_mark = phases.index("after read")
    assert resident[0] is not None and resident[0] <= MIB
    # Background rows carry the start value forward; the mark reads afresh.
    assert resident[1:at_mark] == [resident[0]] * (at_mark - 1)
    assert abs(resident[at_mark] - SIZE // 2) <= 0.1 * SIZE
    assert abs(resident[-1] - SIZE // 2) <= 0.1 * SIZE  # stop reads afresh too
