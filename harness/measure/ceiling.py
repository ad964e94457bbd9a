"""The disk's read ceiling: the best cold read rate over a small sweep of reader threads and request sizes.

One ``read()`` stream (:mod:`harness.measure.diskread`) is a reference, not the disk's limit:
a loader that faults pages in through a mapping, or reads with several threads, can beat it.
:func:`read_ceiling` reads the checkpoint cold at each point of a sweep, ``threads`` readers
times ``request_bytes`` per ``pread``, until ``point_s`` seconds have passed (or its part of the
checkpoint is read, if sooner; each reader makes at least one request), and records the rate of each.
Each point reads a part of the checkpoint of its own (the files taken end to end, cut into as
many equal parts as there are points, in order): a point that read what an earlier one read
would find it in caches a guest's page cache does not reach (a virtual disk's host cache, which
serves a second read of the same bytes several times faster than the disk).
Within a point the readers share one queue of request-sized ranges in file order, each into a
page-aligned buffer of its own, and drop every range from the page cache once read, so the page
cache does not grow. Before each point the files' pages are dropped (this process's files only,
never the machine's whole cache).

A short point is a noisy sample, and the fastest of twelve noisy samples sits above what the disk
holds to. So the sweep's ``best_settings`` fastest settings are read ``repeats`` times more, in
turn, each time a part of its own (the checkpoint is then cut into as many parts as there are
points, repeats included), and a setting's rate is the median of its reads
(:func:`harness.results.metrics.best_ceiling`). The best setting's median is the ceiling a
strategy's build time is set against. Run it before anything else reads the checkpoint.

``pread`` releases the GIL, so Python threads read in parallel.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from harness.measure.coldcache import drop_cached, page_aligned_buffer
from harness.results.disk import CeilingPoint
from harness.units import MIB

__all__ = ["BEST_SETTINGS", "DEFAULT_POINT_S", "DEFAULT_REQUESTS", "DEFAULT_THREADS", "REPEATS", "read_ceiling"]

DEFAULT_THREADS: tuple[int, ...] = (1, 2, 4, 8)
"""Reader threads swept by default: one stream up to more than this machine's cores."""
DEFAULT_REQUESTS: tuple[int, ...] = (MIB, 8 * MIB, 32 * MIB)
"""``pread`` sizes swept by default (1, 8 and 32 MiB)."""
DEFAULT_POINT_S = 2.0
"""Seconds each point reads for: long enough to pass the disk's caches, short enough for every run."""
BEST_SETTINGS = 3
"""How many of the sweep's fastest settings a run reads again (:func:`harness.checkpoint_reading.sweep_ceiling`)."""
REPEATS = 2
"""How many times more each of them is read: a setting's rate is then the median of three reads."""


def _ranges(files: Sequence[tuple[Path, int]], request: int, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """``(file index, offset, length)`` of the request-sized ranges of bytes ``start`` to ``end`` of the files
    taken end to end, in order."""
    base = 0
    for index, (_, size) in enumerate(files):
        low, high = max(start, base), min(end, base + size)
        for offset in range(low, high, request):
            yield index, offset - base, min(request, high - offset)
        base += size


def _point(files: Sequence[tuple[Path, int]], fds: Sequence[int], threads: int, request: int,
           point_s: float, start_byte: int, end_byte: int) -> CeilingPoint:
    for fd in fds:
        drop_cached(fd)
    work = _ranges(files, request, start_byte, end_byte)
    lock = threading.Lock()
    totals = [0] * threads
    errors: list[BaseException] = []
    start = time.monotonic()
    deadline = start + point_s

    def reader(slot: int) -> None:
        buffer = page_aligned_buffer(request)
        view = memoryview(buffer)
        try:
            while True:  # at least one request each, however late the thread started
                with lock:
                    item = next(work, None)
                if item is None:
                    return
                index, offset, length = item
                got = os.preadv(fds[index], [view[:length]], offset)
                drop_cached(fds[index], offset, length)
                totals[slot] += got
                if time.monotonic() >= deadline:
                    return
        except BaseException as exc:  # reported by the caller, with the file
            errors.append(exc)
        finally:
            view.release()
            buffer.close()

    workers = [threading.Thread(target=reader, args=(i,), name=f"ceiling-{i}", daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.monotonic() - start
    if errors:
        raise OSError(f"{', '.join(str(p) for p, _ in files)}: the read sweep failed: {errors[0]}") from errors[0]
    return CeilingPoint(threads, request, sum(totals), round(seconds, 3))


def read_ceiling(
    paths: Sequence[str | os.PathLike[str]],
    *,
    threads: Sequence[int] = DEFAULT_THREADS,
    requests: Sequence[int] = DEFAULT_REQUESTS,
    point_s: float = DEFAULT_POINT_S,
    best_settings: int = 0,
    repeats: int = REPEATS,
) -> tuple[CeilingPoint, ...]:
    """Every point of the sweep over ``threads`` x ``requests`` on the files ``paths``, then the repeats of its
    ``best_settings`` fastest settings (0: none), ``repeats`` rounds of them in turn (see the module docstring).

    The files' pages are dropped from the page cache before each point and once more at the end.
    Raises ``ValueError`` for an empty sweep, a thread count or request size below 1, a
    ``point_s`` that is not positive or a negative ``best_settings`` or ``repeats``, and ``OSError``
    naming the files where a read fails.
    """
    if not paths or not threads or not requests:
        raise ValueError("the read sweep needs files, thread counts and request sizes")
    if min(threads) < 1 or min(requests) < 1 or not point_s > 0:
        raise ValueError(f"thread counts and request sizes must be at least 1 and point_s positive, got "
                         f"{list(threads)}, {list(requests)}, {point_s}")
    if best_settings < 0 or repeats < 0:
        raise ValueError(f"best_settings and repeats must be at least 0, got {best_settings}, {repeats}")
    files = [(Path(p), os.stat(p).st_size) for p in paths]
    fds: list[int] = []
    try:
        fds.extend(os.open(p, os.O_RDONLY) for p, _ in files)
        sweep = [(t, r) for t in threads for r in requests]
        best_settings = min(best_settings, len(sweep)) if repeats else 0
        parts = len(sweep) + best_settings * repeats
        share = -(-sum(size for _, size in files) // parts)  # each point its own part of the checkpoint

        def point(i: int, t: int, r: int) -> CeilingPoint:
            return _point(files, fds, t, r, point_s, i * share, (i + 1) * share)

        points = [point(i, t, r) for i, (t, r) in enumerate(sweep)]
        fastest = sorted((p for p in points if p.bytes_per_s > 0), key=lambda p: -p.bytes_per_s)[:best_settings]
        for turn in range(repeats):
            for k, p in enumerate(fastest):
                points.append(point(len(sweep) + turn * len(fastest) + k, p.threads, p.request_bytes))
        for fd in fds:
            drop_cached(fd)
        return tuple(points)
    finally:
        for fd in fds:
            os.close(fd)
