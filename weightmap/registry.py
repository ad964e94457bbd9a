"""Registry of the checkpoint mappings that weightmap made.

Every file is mapped copy-on-write: ``MAP_PRIVATE`` with read and write, so
in-place writes go to private pages and the file is never written. On Linux
the mapping also has ``MAP_NORESERVE``: without it the kernel's overcommit
check charges the whole private writable mapping up front, as if every page
were about to be written, and a checkpoint larger than RAM + swap cannot be
mapped at all (``ENOMEM``). With it, only the pages actually written become
private memory. Under strict accounting (``vm.overcommit_memory = 2``) the
kernel ignores ``MAP_NORESERVE`` and charges the mapping in full again. A
mapping the kernel refuses raises :class:`~weightmap.MappingError` naming the
file, its size and the reason.

The registry keeps a *weak* reference to each mapping together with its
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
import errno
import mmap
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from weightmap.errors import MappingError

__all__ = ["Region", "find_region", "live_regions", "map_descriptor"]


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


# Python's mmap module does not name MAP_NORESERVE on every version; 0x4000 is its value on Linux.
_MAP_NORESERVE: int = getattr(mmap, "MAP_NORESERVE", 0x4000) if sys.platform.startswith("linux") else 0

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


def _refusal(path: Path, length: int, exc: OSError) -> MappingError:
    """The error for a mapping the kernel refused: the file, its size, the reason and what limits it."""
    reason = exc.strerror or str(exc)
    hint = ""
    if exc.errno == errno.ENOMEM:
        hint = (
            ": the address space is limited (ulimit -v), the process has too many mappings "
            "(vm.max_map_count), or the kernel charges private mappings in full (vm.overcommit_memory = 2)"
        )
    return MappingError(f"{path}: cannot map its {length} bytes copy-on-write: {reason}{hint}")


def _map_private(fd: int, length: int, path: Path) -> mmap.mmap:
    """A private (copy-on-write) mapping of ``length`` bytes of ``fd``, not charged up front on Linux."""
    try:
        if not hasattr(mmap, "MAP_PRIVATE"):  # Windows
            return mmap.mmap(fd, length, access=mmap.ACCESS_COPY)
        flags, prot = mmap.MAP_PRIVATE | _MAP_NORESERVE, mmap.PROT_READ | mmap.PROT_WRITE
        if sys.version_info >= (3, 13):  # the mapping does not keep a duplicate of the descriptor open
            return mmap.mmap(fd, length, flags=flags, prot=prot, trackfd=False)
        return mmap.mmap(fd, length, flags=flags, prot=prot)
    except (OSError, ValueError) as exc:
        if isinstance(exc, OSError):
            raise _refusal(path, length, exc) from exc
        raise MappingError(f"{path}: cannot map its {length} bytes copy-on-write: {exc}") from exc


def map_descriptor(fd: int, length: int, path: str | os.PathLike[str]) -> mmap.mmap:
    """Map the first ``length`` bytes of the open file ``fd`` copy-on-write and register the range.

    ``path`` only names the file in the registry and in errors: the descriptor is
    what is mapped. The returned object is the only strong reference the
    registry hands out; the registry itself only holds a weak one, so the
    mapping is unmapped as soon as nothing (no view, no handle) refers to it.
    Raises :class:`~weightmap.MappingError` when the kernel refuses the mapping.
    """
    path = Path(os.fsdecode(path))
    mm = _map_private(fd, length, path)
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
