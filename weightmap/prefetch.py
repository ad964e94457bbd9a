"""Warming the page cache for mapped weights before they are read.

A partition's build faults its mapped pages in a few at a time, waiting on the
disk for each miss. Telling the kernel in advance which file ranges come next
lets it read them while the previous partition is still being built. Nothing
here touches the mapping's pages: the file's pages come into the page cache,
not into this process, so its RSS does not rise; the build then maps them with
minor faults.

Three ways of asking, picked by name (:data:`PREFETCH_METHODS`):

* ``"madvise"``: ``madvise(MADV_WILLNEED)`` on the mapped ranges. On a file
  mapping the kernel turns it into readahead of the mapped file itself, with
  no second open of it;
* ``"fadvise"``: ``posix_fadvise(POSIX_FADV_WILLNEED)`` on the file ranges,
  through a read-only descriptor opened from the mapping's path (a path that
  names another file since it was mapped, or a named pipe, is not warmed: an
  error is counted, and nothing blocks);
* ``"read"``: ``pread()`` of the ranges into one small reused buffer per
  reader: the bytes are copied and thrown away, and the page cache keeps the
  pages.

Linux caps one readahead request at the device's ``read_ahead_kb`` (a single
``WILLNEED`` on 256 MiB read 8 MiB here), so ranges are asked for in requests
of ``request_bytes`` (default :data:`CHUNK_BYTES`). The requests run on
``readers`` background threads (default 1), each taking the next request in
the order asked, so that up to ``readers`` requests are in flight at once: a
disk that reads fastest with several readers (the harness's read-ceiling
sweep measures which) is asked as it reads fastest. Asking never blocks the
caller: with the device's queue full, each ``WILLNEED`` call waits for room
(1 GiB took 0.8 to 1.6 s of calls here), and that wait happens on a prefetch
thread. A request for a partition that is already built is dropped
(:meth:`Prefetcher.cancel_through`).
Dropping released ranges from the page cache (:meth:`Prefetcher.evict`) runs
on a second thread, so that it never holds up the next request: the disk
reads only while the warming thread keeps asking.

What each costs and buys, measured with ``benchmarks/prefetch.py`` (2 GiB in 8
partitions, a cold cache each run, 250 ms of CPU work per partition, 2 shared
cores): the two ``WILLNEED`` methods with the next partition warming during
the build cut the build's wall time to 0.7 to 0.97 of no prefetch (median
about 0.82 over five runs), with VmHWM and the largest RssFile unchanged to
the MiB. They read faster than one sequential reader (a deeper queue: 1 GiB
in 1.7 to 2.6 s against 3.6 to 6.8 s by ``pread``). ``"read"`` was slower than
no prefetch (1.05 to 1.23): it spends a core copying bytes it throws away, on
a machine with two. Warming only the partition being built (``ahead=0``)
gained nothing (0.99), and two partitions ahead no more than one.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from weightmap import registry
from weightmap.filekinds import non_regular_kind

if TYPE_CHECKING:
    import torch

__all__ = ["PREFETCH_METHODS", "FileRange", "Prefetcher", "PrefetchMethod", "PrefetchStats", "file_ranges",
           "evict_ranges", "open_mapped_file"]

log = logging.getLogger("weightmap")

PrefetchMethod = Literal["fadvise", "madvise", "read"]
PREFETCH_METHODS: tuple[PrefetchMethod, ...] = ("fadvise", "madvise", "read")
"""The ways a :class:`Prefetcher` can warm the page cache (see the module's docstring)."""

CHUNK_BYTES = 2 * 2**20  # one readahead request; below every kernel's read_ahead_kb cap that matters
MERGE_GAP_BYTES = 2**20  # ranges this close in one file are asked for as one


@dataclass(frozen=True)
class FileRange:
    """Bytes ``[offset, offset + length)`` of ``path``, mapped at ``address`` in this process.

    ``identity`` is the mapped file's ``(st_dev, st_ino)`` (None: not known): the path is
    only opened again if it still names that file (see :func:`open_mapped_file`).
    """

    path: Path
    offset: int
    length: int
    address: int
    identity: tuple[int, int] | None = None


def open_mapped_file(r: FileRange) -> int:
    """A read-only descriptor of the file behind ``r``, for advice about its page cache.

    Opened with ``O_NONBLOCK``, so that a path replaced by a named pipe cannot block the
    caller (a prefetch thread that :meth:`Prefetcher.close` waits for, say). Raises
    :class:`OSError` naming the path when it is no longer a regular file, or no longer the
    file that was mapped (``r.identity``): advice about another file is never given.
    """
    fd = os.open(r.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        kind = non_regular_kind(st.st_mode)
        if kind is not None:
            raise OSError(errno.EINVAL, f"is {kind} now, not the file that was mapped", str(r.path))
        if r.identity is not None and (st.st_dev, st.st_ino) != r.identity:
            raise OSError(errno.ESTALE, "names another file now, not the one that was mapped", str(r.path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def file_ranges(storages: Iterable[torch.UntypedStorage | torch.Tensor], *,
                merge_gap: int = MERGE_GAP_BYTES) -> list[FileRange]:
    """The file ranges behind the mapped storages among ``storages``, merged and in file order.

    Storages that :func:`weightmap.map_weights` did not map are skipped, so
    are empty ones. Ranges of one mapping at most ``merge_gap`` bytes apart are
    merged into one, the gap included (``merge_gap=0``: only ranges that touch).

    Example::

        ranges = file_ranges([model.layers[3].weight, model.layers[3].bias])
        sum(r.length for r in ranges)     # bytes a prefetch of them reads
    """
    import torch  # the names of this module import without torch; ranges are asked of torch's storages

    by_region: dict[int, tuple[registry.Region, list[tuple[int, int]]]] = {}
    for item in storages:
        storage = item.untyped_storage() if isinstance(item, torch.Tensor) else item
        if storage.device.type != "cpu" or storage.nbytes() == 0:
            continue
        found = registry.find_region(storage.data_ptr(), storage.nbytes())
        if found is None:
            continue
        region = found[0]
        spans = by_region.setdefault(region.base, (region, []))[1]
        spans.append((storage.data_ptr() - region.base, storage.nbytes()))
    ranges = []
    for region, spans in by_region.values():
        spans.sort()
        start, end = spans[0][0], spans[0][0] + spans[0][1]
        for offset, length in spans[1:]:
            if offset <= end + merge_gap:
                end = max(end, offset + length)
                continue
            ranges.append(FileRange(region.path, start, end - start, region.base + start, region.identity))
            start, end = offset, offset + length
        ranges.append(FileRange(region.path, start, end - start, region.base + start, region.identity))
    ranges.sort(key=lambda r: (str(r.path), r.offset))
    return ranges


_libc: ctypes.CDLL | None = None


def _madvise(address: int, length: int, advice: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc.madvise.restype = ctypes.c_int
    if _libc.madvise(address, length, advice) != 0:  # ctypes releases the GIL around the call
        err = ctypes.get_errno()
        raise OSError(err, f"madvise at 0x{address:x} ({length} bytes): {os.strerror(err)}")


def evict_ranges(ranges: Iterable[FileRange]) -> None:
    """Ask the kernel to drop the ranges' clean pages from the page cache (``POSIX_FADV_DONTNEED``).

    Only page-aligned pages entirely inside each range are named, so pages a
    neighbour shares stay. Pages another process maps or that are dirty stay
    too: the kernel only drops what nobody uses. A path that no longer names the
    mapped file raises :class:`OSError` (see :func:`open_mapped_file`); the ranges
    before it were dropped.
    """
    page = mmap.PAGESIZE
    for r in ranges:
        start = -(-r.offset // page) * page
        end = (r.offset + r.length) // page * page
        if end <= start:
            continue
        fd = open_mapped_file(r)
        try:
            os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@dataclass
class _Request:
    """One request: ``length`` bytes of the range ``r`` from ``start`` bytes into it, asked for under ``tag``."""

    tag: int
    r: FileRange
    start: int
    length: int


@dataclass
class PrefetchStats:
    """What a :class:`Prefetcher` did.

    Bytes asked for, warmed, and dropped from requests cancelled; seconds the
    warming threads spent warming, summed over them (with several readers it
    can exceed the wall time); bytes evicted from the page cache and the
    seconds that took; errors, one per range that failed (logged, never raised).
    """

    requested_bytes: int = 0
    warmed_bytes: int = 0
    cancelled_bytes: int = 0
    errors: int = 0
    busy_s: float = 0.0
    evicted_bytes: int = 0
    evict_s: float = 0.0


@dataclass
class Prefetcher:
    """Warms the page cache for file ranges on ``readers`` background threads.

    ``method`` is one of :data:`PREFETCH_METHODS`. Ranges are asked for in
    requests of ``request_bytes`` (one ``WILLNEED`` advice, or one ``pread``
    into the ``"read"`` method's buffer of that size per reader, its only
    memory); ``readers`` threads take the requests in the order submitted, so
    up to ``readers`` are in flight at once, and requests of one range are
    started in file order. :meth:`submit` returns at once; :meth:`wait` blocks
    until everything asked for is done (for tests and benchmarks; a builder
    never needs it). Errors (a file removed, a mapping gone) are logged on the
    ``weightmap`` logger and counted, never raised: prefetch is advice; after
    an error the rest of that range is not asked for.

    Example::

        prefetcher = Prefetcher("fadvise")
        prefetcher.submit(file_ranges(next_partition_tensors), tag=1)
        build(current_partition)      # the disk reads the next partition meanwhile
        prefetcher.close()
    """

    method: PrefetchMethod = "fadvise"
    request_bytes: int = CHUNK_BYTES
    readers: int = 1
    stats: PrefetchStats = field(default_factory=PrefetchStats, init=False)
    _requests: deque[_Request] = field(default_factory=deque, init=False, repr=False)
    _cond: threading.Condition = field(default_factory=threading.Condition, init=False, repr=False)
    _cancelled: int = field(default=-1, init=False, repr=False)
    _busy: int = field(default=0, init=False, repr=False)
    _running: int = field(default=0, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)
    _threads: list[threading.Thread] = field(default_factory=list, init=False, repr=False)
    _failed: set[tuple[int, FileRange]] = field(default_factory=set, init=False, repr=False)
    _fds: dict[Path, int] = field(default_factory=dict, init=False, repr=False)
    _evictions: deque[list[FileRange]] = field(default_factory=deque, init=False, repr=False)
    _evicting: bool = field(default=False, init=False, repr=False)
    _evictor: threading.Thread | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.method not in PREFETCH_METHODS:
            raise ValueError(f"prefetch method {self.method!r} is not one of {', '.join(PREFETCH_METHODS)}")
        if self.request_bytes < mmap.PAGESIZE:
            raise ValueError(f"prefetch request_bytes={self.request_bytes} is under one page ({mmap.PAGESIZE})")
        if self.readers < 1:
            raise ValueError(f"prefetch readers={self.readers}: must be 1 or more")

    def submit(self, ranges: Sequence[FileRange], tag: int = 0) -> None:
        """Queue ``ranges`` to be warmed; returns at once. ``tag`` names the request for :meth:`cancel_through`."""
        if not ranges:
            return
        with self._cond:
            if self._closed:
                raise RuntimeError("this Prefetcher is closed")
            for r in ranges:
                self._requests.extend(_Request(tag, r, start, min(self.request_bytes, r.length - start))
                                      for start in range(0, r.length, self.request_bytes))
            self.stats.requested_bytes += sum(r.length for r in ranges)
            self._start()
            self._cond.notify_all()

    def evict(self, ranges: Sequence[FileRange]) -> None:
        """Queue dropping ``ranges`` from the page cache (as :func:`evict_ranges`); returns at once.

        Evictions run in the order asked on a second thread of their own, beside
        the warming, and are never cancelled: an eviction is the release of pages
        nobody will read, done off the caller's thread because the kernel can
        make it wait, and off the warming thread so that it never delays the
        pages asked for next. :meth:`shutdown` lets the queued ones finish.
        """
        if not ranges:
            return
        with self._cond:
            if self._closed:
                raise RuntimeError("this Prefetcher is closed")
            self._evictions.append(list(ranges))
            if self._evictor is None:
                self._evictor = threading.Thread(target=self._run_evictions, name="weightmap-evict", daemon=True)
                self._evictor.start()
            self._cond.notify_all()

    def _start(self) -> None:
        while len(self._threads) < self.readers:
            thread = threading.Thread(target=self._run, name="weightmap-prefetch", daemon=True)
            self._threads.append(thread)
            self._running += 1
            thread.start()

    def cancel_through(self, tag: int) -> None:
        """Drop what is still to do for requests tagged ``tag`` or lower (they are no longer ahead)."""
        with self._cond:
            self._cancelled = max(self._cancelled, tag)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every request is done or dropped; False if ``timeout`` seconds passed first.

        Done means asked of the kernel: after ``"fadvise"`` and ``"madvise"``
        the reads may still be in flight; after ``"read"`` they have landed.
        """
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._requests and not self._busy and not self._evictions and not self._evicting, timeout)

    @property
    def closed(self) -> bool:
        """True once :meth:`shutdown` or :meth:`close` was called: nothing more can be submitted."""
        return self._closed

    def shutdown(self) -> None:
        """Tell the warming threads to stop after the request in hand (what is queued is dropped) and the eviction
        thread to stop once its queue is done; does not wait."""
        with self._cond:
            self._closed = True
            self._requests.clear()
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the threads and wait for them (the queued evictions done); they close the descriptors they opened."""
        self.shutdown()
        for thread in (*self._threads, self._evictor):
            if thread is not None and thread is not threading.current_thread():
                thread.join()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        buffer = bytearray(self.request_bytes) if self.method == "read" else None
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._requests or self._closed)
                    if self._closed:
                        return
                    request = self._requests.popleft()
                    self._busy += 1
                try:
                    self._warm(request, buffer)
                finally:
                    with self._cond:
                        self._busy -= 1
                        self._cond.notify_all()
        finally:
            with self._cond:
                self._running -= 1
                if self._running == 0:  # the last reader out closes the descriptors they shared
                    for fd in self._fds.values():
                        os.close(fd)
                    self._fds.clear()
                self._cond.notify_all()

    def _run_evictions(self) -> None:
        while True:
            with self._cond:
                self._evicting = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._evictions or self._closed)
                if not self._evictions:
                    return  # closed, and nothing left to drop
                ranges = self._evictions.popleft()
                self._evicting = True
            self._evict(ranges)

    def _evict(self, ranges: Sequence[FileRange]) -> None:
        started = time.perf_counter()
        try:
            evict_ranges(ranges)
            self.stats.evicted_bytes += sum(r.length for r in ranges)
        except OSError as exc:
            with self._cond:  # the warming thread counts its errors too
                self.stats.errors += 1
            log.debug("dropping %d ranges from the page cache stopped: %s", len(ranges), exc)
        finally:
            self.stats.evict_s += time.perf_counter() - started

    def _live(self, tag: int) -> bool:
        return not self._closed and tag > self._cancelled

    def _warm(self, request: _Request, buffer: bytearray | None) -> None:
        """Warm one request, unless its request was cancelled or an earlier part of its range failed."""
        with self._cond:
            if not self._live(request.tag) or (request.tag, request.r) in self._failed:
                self.stats.cancelled_bytes += request.length
                return
        started = time.perf_counter()
        done = 0
        try:
            done = self._warm_mapped(request) if self.method == "madvise" else self._warm_file(request, buffer)
        except OSError as exc:
            with self._cond:  # counted once per range, however many of its requests were in flight
                if (request.tag, request.r) not in self._failed:
                    self.stats.errors += 1
                    self._failed.add((request.tag, request.r))
            log.debug("prefetch of %s [%d, +%d) stopped: %s", request.r.path, request.r.offset + request.start,
                      request.length, exc)
        finally:
            with self._cond:
                self.stats.busy_s += time.perf_counter() - started
                self.stats.warmed_bytes += done
                if done < request.length:
                    self.stats.cancelled_bytes += request.length - done

    def _fd(self, r: FileRange) -> int:
        with self._cond:
            fd = self._fds.get(r.path)
            if fd is None:
                fd = self._fds[r.path] = open_mapped_file(r)
            return fd

    def _warm_file(self, request: _Request, buffer: bytearray | None) -> int:
        fd = self._fd(request.r)
        offset = request.r.offset + request.start
        if buffer is None:
            os.posix_fadvise(fd, offset, request.length, os.POSIX_FADV_WILLNEED)
            return request.length
        view = memoryview(buffer)
        done = 0
        while done < request.length:
            n = os.preadv(fd, [view[: request.length - done]], offset + done)
            if n <= 0:
                break  # the file is shorter than it was when mapped
            done += n
        return done

    def _warm_mapped(self, request: _Request) -> int:
        r = request.r
        found = registry.find_region(r.address, r.length)  # a strong reference: not unmapped meanwhile
        if found is None:
            return 0
        page = mmap.PAGESIZE
        first = r.address + request.start
        start = first // page * page
        end = first + request.length
        _madvise(start, end - start, mmap.MADV_WILLNEED)
        del found
        return request.length
