"""Registry of the checkpoint mappings that weightmap made.

Every file is mapped copy-on-write (``mmap.ACCESS_COPY``, i.e. ``MAP_PRIVATE``
with read and write): in-place writes go to private pages and the file is never
written. The registry keeps a *weak* reference to each mapping together with its
address range, so that a storage can be recognised as "ours" from its address
alone (:func:`find_region`) without keeping the mapping alive.

Lifetime: ``torch.frombuffer`` views hold a strong reference to the ``mmap``
object, and so does a :class:`~weightmap.MappedWeights` handle until it is
closed. The mapping is unmapped when the last of them goes, never earlier:
closing a mapping under a live view would turn the next read into a
segmentation fault. Nothing here ever calls ``mmap.close()``.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Region", "map_file", "find_region", "live_regions"]


@dataclass(frozen=True)
class Region:
    """One live mapping: its start address, length and the file behind it."""

    base: int
    length: int
    path: Path
    ref: weakref.ReferenceType[mmap.mmap]

    def contains(self, address: int, nbytes: int) -> bool:
        """True when ``[address, address + nbytes)`` lies inside this mapping."""
        return self.base <= address and address + nbytes <= self.base + self.length


_lock = threading.Lock()
_bases: list[int] = []  # sorted start addresses, parallel to _regions
_regions: list[Region] = []


def _address_of(mm: mmap.mmap) -> int:
    """Start address of a writable mapping (the buffer export is released at once)."""
    probe = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(probe)
    finally:
        del probe


def _forget(base: int) -> None:
    with _lock:
        i = bisect.bisect_left(_bases, base)
        if i < len(_bases) and _bases[i] == base:
            del _bases[i]
            del _regions[i]


def map_file(path: str | os.PathLike[str]) -> mmap.mmap:
    """Map ``path`` copy-on-write and register its address range.

    The returned object is the only strong reference the registry hands out;
    the registry itself only holds a weak one, so the mapping is unmapped as
    soon as nothing (no view, no handle) refers to it.
    """
    path = Path(path)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    base = _address_of(mm)

    def on_unmap(_ref: weakref.ReferenceType[mmap.mmap]) -> None:
        _forget(base)

    region = Region(base, len(mm), path, weakref.ref(mm, on_unmap))
    with _lock:
        i = bisect.bisect_left(_bases, base)
        _bases.insert(i, base)
        _regions.insert(i, region)
    return mm


def find_region(address: int, nbytes: int) -> tuple[Region, mmap.mmap] | None:
    """The live mapping that holds ``[address, address + nbytes)``, with a strong reference to it.

    Returns None when no mapping of ours holds the whole range.
    """
    with _lock:
        i = bisect.bisect_right(_bases, address) - 1
        if i < 0:
            return None
        region = _regions[i]
    if not region.contains(address, nbytes):
        return None
    mm = region.ref()
    if mm is None:
        return None
    return region, mm


def live_regions() -> list[Region]:
    """A snapshot of the mappings that are still alive (for diagnostics and tests)."""
    with _lock:
        return [r for r in _regions if r.ref() is not None]
