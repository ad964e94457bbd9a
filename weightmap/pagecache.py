"""Reading a file for a check, and leaving its page cache as it was before.

:func:`read_and_forget` maps a whole file read-only and shared, notes which of its pages
the page cache holds (``mincore``), lets the caller read through the mapping, then drops
from the page cache every page that the reads brought in (and that the kernel's read-ahead
brought with them, anywhere in the file): first this process's own page-table entries
(``MADV_DONTNEED``: the kernel never drops a page that a process maps), then the pages
(``POSIX_FADV_DONTNEED``). Pages that were cached before stay cached.

Limits, as the kernel sets them: ``mincore`` reports the page cache only to a process that
owns the file or may write it (Linux 5.0 and later); for other files it reports only the
pages this mapping maps, so every page read counts as "not cached before" and is dropped.
Dirty pages and pages that another process maps are never dropped. A page that another
process brought into the cache while the check ran is dropped with the check's own. Where
the platform lacks ``mincore`` or ``posix_fadvise`` nothing is dropped.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["read_and_forget", "readonly_view"]

PAGE = mmap.PAGESIZE


@functools.cache
def _mincore() -> Callable[..., Any] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).mincore
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


def readonly_view(mm: mmap.mmap, dtype: torch.dtype, count: int, offset: int) -> torch.Tensor:
    """``count`` items of ``dtype`` at byte ``offset`` of a read-only mapping: a view, no copy.

    The tensor must never be written (the mapping is read-only: a write is a segmentation
    fault) and must not outlive ``mm``.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(mm, dtype=dtype, count=count, offset=offset)


def _cached(address: int, length: int) -> torch.Tensor | None:
    """One bool per page of ``[address, address + length)``: in the page cache. None without ``mincore``."""
    fn = _mincore()
    if fn is None:
        return None
    vector = (ctypes.c_ubyte * -(-length // PAGE))()
    if fn(address, length, vector) != 0:
        return None
    return torch.frombuffer(bytearray(vector), dtype=torch.uint8).bitwise_and(1).bool()


def _evict(fd: int, pages: torch.Tensor) -> None:
    """``POSIX_FADV_DONTNEED`` on every run of pages marked True."""
    if not bool(pages.any()):
        return
    marks = torch.cat([torch.zeros(1, dtype=torch.int8), pages.to(torch.int8), torch.zeros(1, dtype=torch.int8)])
    edges = torch.nonzero(marks.diff()).flatten().tolist()
    for start, end in zip(edges[::2], edges[1::2], strict=True):
        os.posix_fadvise(fd, start * PAGE, (end - start) * PAGE, os.POSIX_FADV_DONTNEED)


@contextlib.contextmanager
def read_and_forget(fd: int, size: int) -> Iterator[mmap.mmap]:
    """A read-only shared mapping of the first ``size`` bytes of ``fd``; on exit, the pages read
    through it (or brought in by read-ahead meanwhile) leave the page cache (see the module).

    Views made with :func:`readonly_view` must be dropped before the block ends: the mapping
    is left to close when its last reference goes, never closed under a view.
    """
    mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    probe = readonly_view(mm, torch.uint8, size, 0)
    address = probe.data_ptr()
    del probe
    before = _cached(address, size)
    try:
        yield mm
    finally:
        after = _cached(address, size)
        if hasattr(mmap, "MADV_DONTNEED"):
            mm.madvise(mmap.MADV_DONTNEED)  # this process's entries only: the file is not written
        if before is not None and after is not None and hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):  # advice: a refusal leaves the pages cached, nothing worse
                _evict(fd, after & ~before)
