"""Page residency for tests: in this process (pagemap) and in the page cache (mincore)."""

from __future__ import annotations

import ctypes
import mmap
import os
import struct

import torch

PAGE = mmap.PAGESIZE
_PRESENT = 1 << 63

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


def present_pages(address: int, nbytes: int) -> int:
    """Pages of ``[address, address + nbytes)`` mapped into this process (its RSS), from /proc/self/pagemap."""
    first, last = address // PAGE, (address + nbytes - 1) // PAGE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        raw = f.read((last - first + 1) * 8)
    entries = struct.unpack(f"<{len(raw) // 8}Q", raw)
    return sum(1 for e in entries if e & _PRESENT)


def tensor_present_pages(tensor: torch.Tensor) -> int:
    """Pages of a tensor's storage that are in this process's RSS."""
    storage = tensor.untyped_storage()
    return present_pages(storage.data_ptr(), storage.nbytes())


def cached_pages(path: str | os.PathLike[str], offset: int = 0, length: int | None = None) -> int:
    """Pages of a file range in the page cache: ``mincore`` on a fresh read-only mapping.

    The mapping is never read, so it adds nothing to this process's RSS. The
    kernel reports page-cache residency to a process that may write the file
    (tests own their files).
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        length = size - offset if length is None else length
        start = offset // PAGE * PAGE
        span = offset + length - start
        if span <= 0:
            return 0
        address = _libc.mmap(None, span, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), start)
        if address in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
    try:
        vec = (ctypes.c_ubyte * ((span + PAGE - 1) // PAGE))()
        if _libc.mincore(address, span, vec) != 0:
            raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
        return sum(b & 1 for b in vec)
    finally:
        _libc.munmap(address, span)


def drop_cache(path: str | os.PathLike[str]) -> None:
    """Write back and evict a file's pages from the page cache (dirty pages are not dropped otherwise)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
