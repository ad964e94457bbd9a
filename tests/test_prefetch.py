"""Prefetch warms the page cache, never the process, and never changes what a plan releases."""

from __future__ import annotations

import gc
import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from pages import cached_pages, drop_cache, tensor_present_pages
from safetensors.torch import save_file

from weightmap import PREFETCH_METHODS, ReleasePlan, ReleaseStep, map_weights
from weightmap import prefetch as prefetch_module
from weightmap.prefetch import FileRange, Prefetcher, file_ranges

PAGE = mmap.PAGESIZE
MIB = 2**20
NAMES = ("w0", "w1", "w2", "w3")


class Four(torch.nn.Module):
    def __init__(self, nbytes: int) -> None:
        super().__init__()
        for name in NAMES:
            self.register_buffer(name, torch.empty(nbytes, dtype=torch.uint8, device="meta"))
        self.register_buffer("ordinary", torch.ones(1024), persistent=False)


def write_four(path: Path, nbytes: int) -> None:
    save_file({name: torch.full((nbytes,), i + 1, dtype=torch.uint8) for i, name in enumerate(NAMES)}, str(path))


def mapped_four(path: Path, nbytes: int) -> Four:
    model = Four(nbytes)
    map_weights(model, path, strict=True)
    return model


def rss_file() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


def cached_fraction(path: Path, ranges: list[FileRange]) -> float:
    total = sum(r.length for r in ranges)
    return sum(cached_pages(path, r.offset, r.length) for r in ranges) * PAGE / total


def settled_fraction(path: Path, ranges: list[FileRange], want: float = 0.95, timeout: float = 60.0) -> float:
    """The cached fraction once reads in flight have landed (mincore counts a page once it is read)."""
    deadline = time.monotonic() + timeout
    while (fraction := cached_fraction(path, ranges)) < want and time.monotonic() < deadline:
        time.sleep(0.05)
    return fraction


@pytest.fixture
def cold_file(tmp_path: Path) -> tuple[Path, int]:
    nbytes = 16 * MIB
    path = tmp_path / "four.safetensors"
    write_four(path, nbytes)
    drop_cache(path)
    return path, nbytes


@pytest.mark.parametrize("method", PREFETCH_METHODS)
def test_prefetch_fills_the_page_cache_without_faulting_pages_into_the_process(
        cold_file: tuple[Path, int], method: str) -> None:
    path, nbytes = cold_file
    model = mapped_four(path, nbytes)
    tensors = [getattr(model, n) for n in NAMES]
    ranges = file_ranges(tensors)
    if cached_fraction(path, ranges) > 0.05:
        pytest.skip("the file did not leave the page cache (fadvise DONTNEED refused here)")
    before = rss_file()
    with Prefetcher(method) as prefetcher:  # type: ignore[arg-type]
        prefetcher.submit(ranges)
        assert prefetcher.wait(60), "prefetch did not finish in a minute"
        assert prefetcher.stats.errors == 0
        assert prefetcher.stats.warmed_bytes >= 4 * nbytes
    assert settled_fraction(path, ranges) >= 0.95, "prefetch did not warm the page cache"
    assert sum(tensor_present_pages(t) for t in tensors) == 0, "prefetch faulted mapped pages into the process"
    assert rss_file() - before < 4 * MIB, "prefetch raised the process's RssFile"


def test_file_ranges_merge_neighbours_and_skip_what_is_not_mapped(cold_file: tuple[Path, int]) -> None:
    path, nbytes = cold_file
    model = mapped_four(path, nbytes)
    ranges = file_ranges([model.w2, model.w0, model.w1, model.ordinary, torch.ones(3)])
    assert len(ranges) == 1
    (r,) = ranges
    assert r.path == path and r.length == 3 * nbytes
    assert r.address == model.w0.data_ptr()
    assert file_ranges([model.ordinary]) == []
    assert [x.length for x in file_ranges([model.w0, model.w3])] == [nbytes, nbytes]  # 32 MiB apart: not merged


def test_plan_warms_the_next_partition_when_one_is_built(cold_file: tuple[Path, int]) -> None:
    path, nbytes = cold_file
    model = mapped_four(path, nbytes)
    parts = [[n] for n in NAMES]
    with ReleasePlan.from_names(model, parts, prefetch="fadvise", prefetch_ahead=0) as plan:
        ranges = [file_ranges([getattr(model, n)]) for n in NAMES]
        if cached_fraction(path, ranges[0]) > 0.05:
            pytest.skip("the file did not leave the page cache (fadvise DONTNEED refused here)")
        assert plan.prefetch(0) == nbytes
        assert plan.prefetch(0) == 0  # asked once
        assert plan.wait_for_prefetch(60)
        assert settled_fraction(path, ranges[0]) >= 0.95
        assert cached_fraction(path, ranges[1]) < 0.5, "prefetch ran ahead of what was asked"
        model.w0.sum()
        # Reading w0 may map a few of w1's pages (the page they share, and the rest of a page-cache
        # folio that holds both: Linux maps a whole folio on a fault). Warming maps none.
        mapped_by_reading_w0 = tensor_present_pages(model.w1)
        plan.built(0)
        assert plan.wait_for_prefetch(60)
        assert settled_fraction(path, ranges[1]) >= 0.95, "built(0) did not warm partition 1"
        assert cached_fraction(path, ranges[2]) < 0.5
        assert tensor_present_pages(model.w1) == mapped_by_reading_w0, "warming faulted pages into the process"
        stats = plan.prefetch_stats
        assert stats is not None and stats.requested_bytes == 2 * nbytes


def test_by_default_the_partition_after_the_one_being_built_is_warmed(cold_file: tuple[Path, int]) -> None:
    path, nbytes = cold_file
    model = mapped_four(path, nbytes)
    ranges = [file_ranges([getattr(model, n)]) for n in NAMES]
    with ReleasePlan.from_names(model, [[n] for n in NAMES], prefetch="madvise") as plan:
        assert plan.prefetch(0) == 2 * nbytes  # partitions 0 and 1
        assert plan.wait_for_prefetch(60)
        assert settled_fraction(path, ranges[1]) >= 0.95
        assert cached_fraction(path, ranges[2]) < 0.5
        plan.built(0)
        assert plan.wait_for_prefetch(60)
        assert settled_fraction(path, ranges[2]) >= 0.95, "built(0) did not warm partition 2"
        assert cached_fraction(path, ranges[3]) < 0.5
        stats = plan.prefetch_stats
        assert stats is not None and stats.requested_bytes == 3 * nbytes
    with ReleasePlan.from_names(model, [[n] for n in NAMES], prefetch="fadvise", prefetch_ahead=2) as plan:
        assert plan.prefetch(0) == 3 * nbytes


def test_prefetch_does_not_change_what_the_plan_releases(tmp_path: Path) -> None:
    nbytes = 64 * PAGE
    path = tmp_path / "four.safetensors"
    write_four(path, nbytes)
    parts = [["w0", "ordinary"], ["w1", "w0"], ["w2"], ["w3", "w0", "ordinary"]]
    results: dict[str | None, tuple[list[ReleaseStep], list[int]]] = {}
    for method in (None, *PREFETCH_METHODS):
        model = mapped_four(path, nbytes)
        with ReleasePlan.from_names(model, parts, prefetch=method) as plan:  # type: ignore[arg-type]
            if method:
                plan.prefetch(0)
            steps = []
            for i, names in enumerate(parts):
                for name in names:
                    getattr(model, name).sum()
                steps.append(plan.built(i))
                assert plan.wait_for_prefetch(60)
            # Whatever was read last is released, whole pages and all.
            present = [tensor_present_pages(getattr(model, n)) for n in ("w0", "w3")]
        results[method] = steps, present
    assert all(max(present) <= 2 for _, present in results.values()), results
    assert all(steps == results[None][0] for steps, _ in results.values()), results


def test_a_request_for_a_built_partition_is_dropped(cold_file: tuple[Path, int]) -> None:
    path, nbytes = cold_file
    model = mapped_four(path, nbytes)
    ranges = file_ranges([model.w0])
    with Prefetcher("fadvise") as prefetcher:
        prefetcher.cancel_through(5)
        prefetcher.submit(ranges, tag=3)
        assert prefetcher.wait(60)
        assert prefetcher.stats.warmed_bytes == 0
        assert prefetcher.stats.cancelled_bytes == nbytes
    assert cached_fraction(path, ranges) < 0.05


def test_prefetch_errors_are_clear(tmp_path: Path) -> None:
    model = Four(PAGE)
    with pytest.raises(ValueError, match="not one of fadvise, madvise, read"):
        Prefetcher("willneed")  # type: ignore[arg-type]
    plan = ReleasePlan.from_names(model, [["ordinary"]])
    with pytest.raises(ValueError, match="made without prefetch"):
        plan.prefetch(0)
    with pytest.raises(ValueError, match="prefetch_ahead=-1"):
        ReleasePlan.from_names(model, [["ordinary"]], prefetch="fadvise", prefetch_ahead=-1)
    with ReleasePlan.from_names(model, [["ordinary"]], prefetch="fadvise") as plan:
        with pytest.raises(ValueError, match="cannot prefetch partition 1: the plan has 1"):
            plan.prefetch(1)
        assert plan.prefetch(0) == 0  # nothing mapped: nothing to warm
    prefetcher = Prefetcher("read")
    prefetcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        prefetcher.submit([FileRange(tmp_path / "x", 0, 1, 0)])


def test_a_vanished_file_is_counted_not_raised(tmp_path: Path) -> None:
    with Prefetcher("read") as prefetcher:
        prefetcher.submit([FileRange(tmp_path / "missing.safetensors", 0, MIB, 0)])
        assert prefetcher.wait(60)
        assert prefetcher.stats.errors == 1 and prefetcher.stats.warmed_bytes == 0


def prefetch_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "weightmap-prefetch")


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_the_prefetch_thread_stops_after_the_last_partition_or_with_the_plan(cold_file: tuple[Path, int]) -> None:
    path, nbytes = cold_file
    model = mapped_four(path, nbytes)
    before = prefetch_threads()
    plan = ReleasePlan.from_names(model, [[n] for n in NAMES[:2]], prefetch="read")
    plan.prefetch(0)
    assert prefetch_threads() == before + 1
    plan.built(0)
    plan.built(1)
    assert wait_until(lambda: prefetch_threads() == before), "the thread outlived the last partition"

    plan = ReleasePlan.from_names(model, [[n] for n in NAMES], prefetch="fadvise")
    plan.prefetch(0)
    assert prefetch_threads() == before + 1
    del plan
    gc.collect()
    assert wait_until(lambda: prefetch_threads() == before), "the thread outlived its plan"


def inner_cached(path: Path, tensor: torch.Tensor) -> int:
    """Page-cache pages of the whole pages inside a mapped tensor's file range."""
    (r,) = file_ranges([tensor])
    start = -(-r.offset // PAGE) * PAGE
    end = (r.offset + r.length) // PAGE * PAGE
    return cached_pages(path, start, end - start)


@pytest.mark.parametrize("prefetch", [None, "madvise"])
def test_drop_cache_evicts_what_no_partition_reads_again(tmp_path: Path, prefetch: str | None) -> None:
    nbytes = 256 * PAGE
    path = tmp_path / "four.safetensors"
    write_four(path, nbytes)
    drop_cache(path)  # written back: the kernel never evicts dirty pages
    model = mapped_four(path, nbytes)
    whole = nbytes // PAGE - 1  # whole pages inside each tensor (offsets are not page-aligned)
    parts = [["w0", "w1"], ["w2"], ["w3", "w1"]]
    with ReleasePlan.from_names(model, parts, drop_cache=True, prefetch=prefetch) as plan:  # type: ignore[arg-type]
        for name in ("w0", "w1"):
            getattr(model, name).sum()
        assert inner_cached(path, model.w0) >= whole
        plan.built(0)
        assert plan.wait_for_prefetch(60)
        assert inner_cached(path, model.w0) == 0, "a weight no partition reads again stayed in the page cache"
        assert inner_cached(path, model.w1) >= whole, "a weight partition 2 reads again was evicted"
        assert float(model.w0[PAGE]) == 1.0  # still readable, from the disk
    plain = mapped_four(path, nbytes)
    plain.w2.sum()
    ReleasePlan.from_names(plain, [["w2"]]).built(0)
    assert inner_cached(path, plain.w2) >= whole, "the default must leave the page cache alone"


def test_an_eviction_never_waits_behind_the_warming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "released.bin"
    path.write_bytes(b"\1" * (64 * PAGE))
    drop_cache(path)  # written back: the kernel never evicts dirty pages
    path.read_bytes()  # cached again, clean
    assert cached_pages(path, 0, 64 * PAGE) == 64
    release = threading.Event()
    warming = threading.Event()

    def stuck(self: Prefetcher, request: object, buffer: bytearray | None) -> None:
        warming.set()
        release.wait(60)  # a warming request the disk is slow to take: the kernel's queue is full

    monkeypatch.setattr(Prefetcher, "_warm", stuck)
    with Prefetcher("fadvise") as prefetcher:
        prefetcher.submit([FileRange(tmp_path / "next.bin", 0, PAGE, 0)], tag=1)
        assert warming.wait(60)
        prefetcher.evict([FileRange(path, 0, 64 * PAGE, 0)])
        # the released pages go while the request for the next ones is still in the kernel's hands
        assert wait_until(lambda: cached_pages(path, 0, 64 * PAGE) == 0), "the eviction waited for the warming"
        assert not prefetcher.wait(0.01)  # the warming request is still not done
        release.set()
        assert prefetcher.wait(60)
    assert prefetcher.stats.evicted_bytes == 64 * PAGE and prefetcher.stats.evict_s > 0


@pytest.mark.parametrize("method", PREFETCH_METHODS)
def test_several_readers_warm_everything_asked_for(cold_file: tuple[Path, int], method: str) -> None:
    path, nbytes = cold_file
    model = mapped_four(path, nbytes)
    ranges = file_ranges([getattr(model, n) for n in NAMES])
    if cached_fraction(path, ranges) > 0.05:
        pytest.skip("the file did not leave the page cache (fadvise DONTNEED refused here)")
    before = prefetch_threads()
    with Prefetcher(method, request_bytes=MIB, readers=3) as prefetcher:  # type: ignore[arg-type]
        prefetcher.submit(ranges)
        assert prefetch_threads() == before + 3
        assert prefetcher.wait(60), "prefetch did not finish in a minute"
        assert prefetcher.stats.errors == 0
        assert prefetcher.stats.warmed_bytes == prefetcher.stats.requested_bytes >= 4 * nbytes
    assert settled_fraction(path, ranges) >= 0.95, "prefetch did not warm the page cache"
    assert wait_until(lambda: prefetch_threads() == before), "a reader outlived close()"


@pytest.mark.parametrize("readers", [1, 2, 4])
def test_readers_ask_at_once_in_requests_of_the_size_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readers: int) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(8 * MIB))
    in_flight, most, sizes = 0, 0, []
    lock = threading.Lock()
    real_preadv = os.preadv

    def slow_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
            sizes.append(sum(len(b) for b in buffers))
        time.sleep(0.02)
        try:
            return real_preadv(fd, buffers, offset)
        finally:
            with lock:
                in_flight -= 1

    monkeypatch.setattr(prefetch_module.os, "preadv", slow_preadv)
    with Prefetcher("read", request_bytes=MIB // 2, readers=readers) as prefetcher:
        prefetcher.submit([FileRange(path, 0, 8 * MIB, 0)])
        assert prefetcher.wait(60)
        assert prefetcher.stats.warmed_bytes == 8 * MIB
    assert most == readers
    assert sizes == [MIB // 2] * 16


def test_a_failed_request_stops_the_rest_of_its_range_only(tmp_path: Path) -> None:
    there = tmp_path / "there.bin"
    there.write_bytes(bytes(MIB))
    with Prefetcher("read", request_bytes=PAGE * 16, readers=2) as prefetcher:
        prefetcher.submit([FileRange(tmp_path / "missing.bin", 0, MIB, 0), FileRange(there, 0, MIB, 0)])
        assert prefetcher.wait(60)
        assert prefetcher.stats.errors == 1  # once for the missing file; the rest of its range is not read
        assert prefetcher.stats.warmed_bytes == MIB
        assert prefetcher.stats.cancelled_bytes == MIB


def test_a_plan_passes_its_readers_and_request_size_on(cold_file: tuple[Path, int]) -> None:
    path, nbytes = cold_file
    model = mapped_four(path, nbytes)
    with pytest.raises(ValueError, match="readers=0"):
        Prefetcher("read", readers=0)
    before = prefetch_threads()
    with ReleasePlan.from_names(model, [[n] for n in NAMES], prefetch="read", prefetch_readers=2,
                                prefetch_request_bytes=MIB) as plan:
        assert "prefetch_readers=2" in repr(plan)
        plan.prefetch(0)
        assert prefetch_threads() == before + 2
        assert plan.wait_for_prefetch(60)
    assert wait_until(lambda: prefetch_threads() == before)
