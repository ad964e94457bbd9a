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

Threads: Python unmaps an ``mmap`` before the weak-reference callbacks on it
run, so another thread can map a new file at the same address in between. The
registry is therefore keyed by identity, never by address alone:

* the callback only records *which* reference died (it takes no lock: it may
  run inside a garbage-collection pass on a thread that holds the lock), and
  the next registry call removes the entry holding that very reference, so a
  late callback can never remove a newer mapping's entry;
* an entry whose mapping is gone (dead reference, or a closed ``mmap``) is
  never returned: a lookup that meets one removes it and looks further, and a
  new mapping removes every dead entry its range overlaps, so a dead entry can
  never shadow a live mapping at the same address.

Lifetime: ``torch.frombuffer`` views hold a strong reference to the ``mmap``
object, and so does a :class:`~weightmap.MappedWeights` handle until it is
closed. The mapping is unmapped when the last of them goes, never earlier:
closing a mapping under a live view would turn the next read into a
segmentation fault. Nothing here ever calls ``mmap.close()``.
"""

from __future__ import annotations

import bisect
import collections
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
    """One live mapping: its start address, length and the file behind it.

    ``identity`` is the mapped file's ``(st_dev, st_ino)``: a path opened again later
    (to warm or evict its page cache) is checked against it, since the path may name
    another file by then.
    """

    base: int
    length: int
    path: Path
    ref: weakref.ReferenceType[mmap.mmap]
    identity: tuple[int, int] | None = None

    def contains(self, address: int, nbytes: int) -> bool:
        """True when ``[address, address + nbytes)`` lies inside this mapping."""
        return self.base <= address and address + nbytes <= self.base + self.length


# Python's mmap module does not name MAP_NORESERVE on every version; 0x4000 is its value on Linux.
_MAP_NORESERVE: int = getattr(mmap, "MAP_NORESERVE", 0x4000) if sys.platform.startswith("linux") else 0

_lock = threading.Lock()
_bases: list[int] = []  # sorted start addresses, parallel to _regions
_regions: list[Region] = []
_died: collections.deque[weakref.ReferenceType[mmap.mmap]] = collections.deque()  # appended without the lock


def _address_of(mm: mmap.mmap) -> int:
    """Start address of a writable mapping (the buffer export is released at once)."""
    probe = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(probe)
    finally:
        del probe


def _on_unmapped(ref: weakref.ReferenceType[mmap.mmap]) -> None:
    """Weak-reference callback: remember which mapping died; :func:`_sweep` removes its entry."""
    _died.append(ref)


def _is_gone(region: Region) -> bool:
    mm = region.ref()
    return mm is None or mm.closed


def _delete(i: int) -> None:
    del _bases[i]
    del _regions[i]


def _sweep() -> None:
    """Remove the entries whose mappings died since the last call, each by its own reference. Lock held."""
    if not _died:
        return
    died: dict[int, weakref.ReferenceType[mmap.mmap]] = {}  # kept alive, so that ids stay unique
    while _died:
        ref = _died.popleft()
        died[id(ref)] = ref
    for i in reversed(range(len(_regions))):
        if died.get(id(_regions[i].ref)) is _regions[i].ref:
            _delete(i)


def _register(region: Region) -> None:
    """Add a new mapping's entry, removing every dead entry its range overlaps. Lock held.

    Entries never overlap one another (live mappings cannot, and a new one removes the
    dead ones it overlaps), so the overlapping ones are the run just below its end.
    """
    _sweep()
    end = region.base + region.length
    i = bisect.bisect_left(_bases, end) - 1
    while i >= 0 and _regions[i].base + _regions[i].length > region.base:  # overlaps [base, end)
        if _is_gone(_regions[i]):
            _delete(i)
        i -= 1
    i = bisect.bisect_left(_bases, region.base)
    _bases.insert(i, region.base)
    _regions.insert(i, region)


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
    st = os.fstat(fd)
    region = Region(_address_of(mm), len(mm), path, weakref.ref(mm, _on_unmapped), (st.st_dev, st.st_ino))
    with _lock:
        _register(region)
    return mm


def find_region(address: int, nbytes: int) -> tuple[Region, mmap.mmap] | None:
    """The live mapping that holds ``[address, address + nbytes)``, with a strong reference to it.

    Returns None when no mapping of ours holds the whole range. Dead entries met
    on the way are removed, never returned.
    """
    with _lock:
        _sweep()
        i = bisect.bisect_right(_bases, address) - 1
        while i >= 0:
            region = _regions[i]
            mm = region.ref()
            if mm is not None and not mm.closed:
                break
            _delete(i)
            i -= 1
        else:
            return None
    if not region.contains(address, nbytes):
        return None
    return region, mm


def live_regions() -> list[Region]:
    """A snapshot of the mappings that are still alive (for diagnostics and tests)."""
    with _lock:
        _sweep()
        return [r for r in _regions if not _is_gone(r)]
