"""A short read probe of the checkpoint: what keeping read pages and asking ahead cost on this machine.

The strategies that map have two settings whose best value differs from machine to machine.
:func:`read_probe` measures the two questions directly, cold, on regions of the checkpoint itself,
before any strategy runs:

* **does a growing page cache cost read time?** (Recorded and reported, but no rule's input:
  :mod:`harness.checkpoint_reading` reads the kernel's free page reporting instead, since reads alone do not show
  what keeping pages costs the writes that follow; see :mod:`harness.measure.hostmemory`.) Regions
  read by ``pread`` with their pages kept (``kept``; they stay until the probe ends, so the cache
  grows as a run's would), every fourth region instead read the same way and dropped behind the
  reader (``dropped``), over up to :data:`DEFAULT_CACHE_BYTES` of the checkpoint. Where the host
  takes freed memory back, the kernel hands out the pages it freed moments before (not yet given
  back) first, and kept regions read as fast as dropped ones until those run out: so the cache
  question reads past them, and the last kept regions answer it.
* **does asking ahead read as fast as faulting?** A mapped region whose pages are touched one by
  one (``faulted``: the kernel's fault readahead, what a build without prefetch does) in turn with
  one touched after ``madvise(MADV_WILLNEED)`` over it (``willneed``: what the ``madvise``
  prefetcher asks for while the previous engine builds); each dropped once read.

Every read is of a region of its own, dropped from the page cache first: a region read twice
would come from a cache outside a virtual machine's page cache (see
:mod:`harness.measure.ceiling`). The regions lie in the largest file of the checkpoint, one after
another. A file with room for fewer than :data:`MIN_CACHE_REGIONS` cache regions besides the
advice regions (:func:`probe_bytes`, 2.4 GiB with the defaults) is not probed.
:func:`harness.checkpoint_reading.choose_reading` turns the figures into the run's settings.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from harness.measure.coldcache import drop_cached, page_aligned_buffer
from harness.results.disk import ReadProbe
from harness.units import GIB, MIB

__all__ = [
    "ADVICE_ROUNDS", "DEFAULT_ADVICE_REGION_BYTES", "DEFAULT_CACHE_BYTES", "DEFAULT_CACHE_REGION_BYTES",
    "MIN_CACHE_REGIONS", "probe_bytes", "read_probe",
]

DEFAULT_CACHE_BYTES = 8 * GIB
"""Bytes of the checkpoint the cache question reads at most (three quarters kept): 8 GiB, past the
few GiB of just-freed pages a kernel may hand out again first."""
DEFAULT_CACHE_REGION_BYTES = 256 * MIB
"""Bytes per kept or dropped region: 256 MiB."""
MIN_CACHE_REGIONS = 8
"""The fewest cache regions a probe reads (six kept, two dropped); a smaller checkpoint is not probed."""
DEFAULT_ADVICE_REGION_BYTES = 64 * MIB
"""Bytes per faulted or advised region: 64 MiB, more than the readahead windows."""
ADVICE_ROUNDS = 3
"""Faulted and advised regions, each: the median of three is robust to one disturbed read."""
_REQUEST = 8 * MIB  # pread size of the two pread ways; also the madvise chunk (one readahead request is capped)


def _pread_region(fd: int, offset: int, length: int, drop_behind: bool) -> None:
    buffer = page_aligned_buffer(min(_REQUEST, length))
    view = memoryview(buffer)
    try:
        done = 0
        while done < length:
            want = min(len(view), length - done)
            got = os.preadv(fd, [view[:want]], offset + done)
            if got <= 0:
                raise OSError(f"short read at byte {offset + done}")
            if drop_behind:
                drop_cached(fd, offset + done, got)
            done += got
    finally:
        view.release()
        buffer.close()


def _touch_region(fd: int, offset: int, length: int, willneed: bool) -> None:
    with mmap.mmap(fd, length, prot=mmap.PROT_READ, offset=offset) as mapped:
        if willneed:
            for start in range(0, length, _REQUEST):
                mapped.madvise(mmap.MADV_WILLNEED, start, min(_REQUEST, length - start))
        pages = np.frombuffer(mapped, dtype=np.uint8)[::mmap.PAGESIZE]
        int(pages.sum())  # one byte of every page read: every page faulted in
        del pages


def probe_bytes(cache_region_bytes: int = DEFAULT_CACHE_REGION_BYTES,
                advice_region_bytes: int = DEFAULT_ADVICE_REGION_BYTES) -> int:
    """The smallest file :func:`read_probe` probes with these region sizes."""
    return MIN_CACHE_REGIONS * cache_region_bytes + 2 * ADVICE_ROUNDS * advice_region_bytes


def read_probe(paths: Sequence[str | os.PathLike[str]], *, cache_bytes: int = DEFAULT_CACHE_BYTES,
               cache_region_bytes: int = DEFAULT_CACHE_REGION_BYTES,
               advice_region_bytes: int = DEFAULT_ADVICE_REGION_BYTES) -> ReadProbe | None:
    """The probe of the module docstring over the largest of ``paths``; ``None`` when that file is smaller
    than :func:`probe_bytes`.

    The cache question reads as many whole regions as fit in ``cache_bytes`` and in the file beside the
    advice regions. The kept pages are dropped when the probe ends, read or failed. Raises ``ValueError``
    for region sizes that are not whole pages, and ``OSError`` naming the file where a read fails.
    """
    page = mmap.ALLOCATIONGRANULARITY
    if any(n < page or n % page for n in (cache_region_bytes, advice_region_bytes)):
        raise ValueError(f"the read probe needs regions of whole pages, got {cache_region_bytes} and "
                         f"{advice_region_bytes}")
    if not paths:
        raise ValueError("the read probe needs a file")
    path = max((Path(p) for p in paths), key=lambda p: p.stat().st_size)
    advice_bytes = 2 * ADVICE_ROUNDS * advice_region_bytes
    regions = min(cache_bytes, path.stat().st_size - advice_bytes) // cache_region_bytes
    if regions < MIN_CACHE_REGIONS:
        return None
    cache_len, advice_len = cache_region_bytes, advice_region_bytes
    reads = [("dropped" if i % 4 == 3 else "kept", cache_len) for i in range(regions)]
    reads += [("faulted" if i % 2 == 0 else "willneed", advice_len) for i in range(2 * ADVICE_ROUNDS)]
    times: dict[str, list[float]] = {"kept": [], "dropped": [], "faulted": [], "willneed": []}
    fd = os.open(path, os.O_RDONLY)
    try:
        offset = 0
        for way, length in reads:
            drop_cached(fd, offset, length)
            start = time.monotonic()
            try:
                if way in ("kept", "dropped"):
                    _pread_region(fd, offset, length, drop_behind=way == "dropped")
                else:
                    _touch_region(fd, offset, length, willneed=way == "willneed")
            except OSError as exc:
                raise OSError(f"{path}: the read probe failed ({way} read of bytes {offset}-{offset + length}): "
                              f"{exc}") from exc
            times[way].append(round(time.monotonic() - start, 6))
            if way != "kept":
                drop_cached(fd, offset, length)
            offset += length
    finally:
        drop_cached(fd)
        os.close(fd)
    return ReadProbe(cache_region_bytes=cache_len, kept_s=tuple(times["kept"]), dropped_s=tuple(times["dropped"]),
                     advice_region_bytes=advice_len, faulted_s=tuple(times["faulted"]),
                     willneed_s=tuple(times["willneed"]))
