"""Page-cache residency of files: how many of their bytes the kernel holds in memory.

:class:`FileResidency` answers it with one of two kernel interfaces, through ctypes:

``mincore``
    Each file is mapped once, shared and read-only; no page of the mapping is ever
    touched, so it adds nothing to RSS and faults nothing in. Each call runs
    ``mincore(2)`` over the whole mapping into a vector allocated once per file and counts
    bit 0 of each entry with numpy, without allocating. Any Linux; BSD and macOS have it too.
``cachestat``
    ``cachestat(2)`` (Linux 6.5, x86-64 and arm64 here) returns the number of cached pages
    of a byte range of an open file; no mapping and no vector.

Both report the *page cache* (whoever read the pages), not the pages this process has
mapped: that is the residency of a checkpoint; the process's own share of it is its RSS
(``RssFile``). Both reveal the page cache only for files the caller owns or may write
(``CAP_FOWNER`` counts as owning); for other files ``cachestat`` refuses with ``EPERM`` and
``mincore`` (since Linux 5.0) reports only pages mapped in the caller's own mapping, here
always none. ``FileResidency.page_cache_visible`` says which case applies, and a
``RuntimeWarning`` is issued at construction when it is False.

Why two: their cost. ``mincore`` looks up every page of the range one by one, cached or not,
so a call costs time in proportion to the file's size; ``cachestat`` walks only the entries the
page cache holds (cached folios, and shadows of evicted pages), so its cost grows with the
file's cached pages and is next to nothing on a file little of which is cached (a cold
checkpoint, the state each strategy starts in). ``method="auto"`` (default) therefore uses
``cachestat`` wherever the kernel has it and ``mincore`` elsewhere. Under ``mincore`` one call
on a multi-GB checkpoint can
outlast a sampling interval of milliseconds, so a sampler must then read residency only every N-th
sample (``Sampler(residency_every=N)``): the thread spends cost / (N x interval) of its time in
``mincore``, and each such read delays the next RSS sample by its cost. Both calls release the GIL
(see ``_CachestatFile``), so their cost falls on the sampling thread only.

File sizes are taken at construction; bytes appended later are not counted.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import mmap
import os
import platform
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

import numpy as np

Method = Literal["auto", "cachestat", "mincore"]

_MincoreFn = Callable[[int, int, int], int]

# cachestat(2) has the same number in the generic syscall table that both of these use.
_CACHESTAT_NR = {"x86_64": 451, "amd64": 451, "aarch64": 451, "arm64": 451}


@functools.cache
def _libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise OSError(errno.ENOSYS, f"cannot load the C library ({name!r}): {exc}") from exc


@functools.cache
def _syscall_releasing_gil() -> Callable[..., int]:
    """libc's ``syscall``, bound so that calling it releases the GIL (see ``_CachestatFile``)."""
    fn = ctypes.CDLL(None, use_errno=True).syscall
    fn.restype = ctypes.c_long
    return fn  # type: ignore[no-any-return]


@functools.cache
def _mincore() -> _MincoreFn:
    """The C library's ``mincore``; raises ``OSError`` where there is none."""
    try:
        fn = _libc().mincore
    except AttributeError:
        raise OSError(errno.ENOSYS, "this platform's C library has no mincore(2)") from None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [
        ("nr_cache", ctypes.c_uint64),
        ("nr_dirty", ctypes.c_uint64),
        ("nr_writeback", ctypes.c_uint64),
        ("nr_evicted", ctypes.c_uint64),
        ("nr_recently_evicted", ctypes.c_uint64),
    ]


def _cachestat_nr() -> int | None:
    """cachestat's syscall number on this machine, or None where it is not known."""
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    return _CACHESTAT_NR.get(platform.machine().lower())


@dataclass(frozen=True)
class PageCounts:
    """One file's pages in the page cache, in bytes (pages times the page size)."""

    cached: int
    dirty: int
    writeback: int


def file_page_counts(fd: int) -> PageCounts | None:
    """Cached, dirty and under-writeback bytes of the open file ``fd``, from ``cachestat(2)``.

    None where the kernel cannot tell this caller: no ``cachestat`` (Linux before 6.5, other
    platforms), a sandbox that filters it, or a file the caller neither owns nor may write
    (``EPERM``).
    """
    nr = _cachestat_nr()
    if nr is None:
        return None
    try:
        fn = _syscall_releasing_gil()
    except (OSError, AttributeError):
        return None
    out = _Cachestat()
    rng = _CachestatRange(0, 0)  # length 0: to the end of the file
    if fn(ctypes.c_long(nr), ctypes.c_long(fd), ctypes.byref(rng), ctypes.byref(out), ctypes.c_long(0)) != 0:
        return None
    page = mmap.PAGESIZE
    return PageCounts(out.nr_cache * page, out.nr_dirty * page, out.nr_writeback * page)


def _owner_or_writer(path: Path, st: os.stat_result) -> bool:
    """Whether ``mincore`` may report page-cache state for ``path`` (Linux >= 5.0 rule)."""
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:
        return True
    euid = geteuid()
    return euid == 0 or st.st_uid == euid or os.access(path, os.W_OK)


class _MincoreFile:
    """One file read with ``mincore``: its read-only mapping and its preallocated vector."""

    __slots__ = ("path", "size", "visible", "_fn", "_map", "_addr", "_vec", "_vec_addr", "_tail")

    def __init__(self, path: Path, fd: int, st: os.stat_result) -> None:
        self._fn = _mincore()
        self.path = path
        self.size = st.st_size
        self.visible = _owner_or_writer(path, st)
        self._map = mmap.mmap(fd, self.size, access=mmap.ACCESS_READ) if self.size > 0 else None
        self._vec = np.zeros(-(-self.size // mmap.PAGESIZE), dtype=np.uint8)
        self._vec_addr = int(self._vec.ctypes.data)
        self._tail = self.size % mmap.PAGESIZE  # the file's bytes in its last page; 0 if full
        self._addr = 0
        if self._map is not None:
            # The buffer export yields the mapping's address only: it touches no page and is
            # dropped at once, so that the mapping can be closed later.
            view = np.frombuffer(self._map, dtype=np.uint8)
            self._addr = int(view.ctypes.data)
            del view

    def resident(self) -> int:
        if self._map is None:
            return 0
        if self._fn(self._addr, self.size, self._vec_addr) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mincore failed for {self.path}: {os.strerror(err)}")
        vec = self._vec
        np.bitwise_and(vec, 1, out=vec)  # bit 0 is residency; the others are reserved
        nbytes = int(np.count_nonzero(vec)) * mmap.PAGESIZE
        if self._tail and vec[-1]:
            nbytes -= mmap.PAGESIZE - self._tail
        return nbytes

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


class _CachestatFile:
    """One file read with ``cachestat``: an open descriptor and preallocated arguments.

    Full pages and the partial last page are asked for separately, so that a cached last
    page counts only the file's bytes in it. The call releases the GIL: its cost grows with
    the file's cached pages, to milliseconds per GiB cached, and a sampler that held the GIL
    that long at every sample would starve the thread it measures. ``mincore`` releases it too.
    """

    __slots__ = ("path", "size", "visible", "_nr", "_syscall", "_fd", "_full", "_last", "_out", "_tail")

    def __init__(self, path: Path, fd: int, st: os.stat_result, nr: int) -> None:
        self.path = path
        self.size = st.st_size
        self.visible = True
        self._nr = ctypes.c_long(nr)
        self._syscall = _syscall_releasing_gil()
        self._tail = self.size % mmap.PAGESIZE
        full = self.size - self._tail
        self._full = ctypes.pointer(_CachestatRange(0, full))
        self._last = ctypes.pointer(_CachestatRange(full, self._tail))
        self._out = ctypes.pointer(_Cachestat())
        self._fd = os.dup(fd)

    def probe(self) -> int:
        """0 if cachestat works on this file, else the errno it fails with (a sandbox that
        filters the call may answer ``EPERM`` or ``ENOSYS``)."""
        try:
            self._call(ctypes.pointer(_CachestatRange(0, 0)), always=True)  # len 0: to end of file
        except OSError as exc:
            return exc.errno or errno.EIO
        return 0

    def _call(self, rng: ctypes._Pointer[_CachestatRange], *, always: bool = False) -> int:
        if rng.contents.len == 0 and not always:
            return 0
        rc = self._syscall(self._nr, ctypes.c_long(self._fd), rng, self._out, ctypes.c_long(0))
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cachestat failed for {self.path}: {os.strerror(err)}")
        return int(self._out.contents.nr_cache)

    def resident(self) -> int:
        if self._fd < 0:
            return 0
        nbytes = self._call(self._full) * mmap.PAGESIZE
        if self._tail and self._call(self._last):
            nbytes += self._tail
        return nbytes

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _track(path: Path, method: Method) -> _MincoreFile | _CachestatFile:
    with open(path, "rb") as fh:
        fd = fh.fileno()
        st = os.fstat(fd)
        nr = _cachestat_nr() if method != "mincore" else None
        if nr is not None:
            tracked = _CachestatFile(path, fd, st, nr)
            err = tracked.probe()
            if err == 0:
                return tracked
            tracked.close()
            if method == "cachestat":
                raise OSError(err, f"cachestat is not usable for {path}: {os.strerror(err)}")
            # An old kernel, a seccomp filter or a file the kernel hides: mincore decides
            # visibility by the same rule, and a hidden file is warned about by the caller.
        elif method == "cachestat":
            raise OSError(errno.ENOSYS, "cachestat(2) is not available on this platform")
        return _MincoreFile(path, fd, st)


class FileResidency:
    """Page-cache residency, in bytes, of a fixed set of files.

    ``method`` picks the kernel interface (see the module docstring): ``"auto"`` uses
    ``cachestat`` where the kernel has it and ``mincore`` elsewhere; ``"mincore"`` or
    ``"cachestat"`` forces one. Construction opens every file (and, for ``mincore``, maps
    it; an empty file is tracked without a mapping and reads 0). It raises ``OSError`` if
    a file cannot be opened or the platform has neither interface (or lacks the one
    forced). Residency never exceeds a file's size: a cached last page counts only the
    file's bytes in it.

    Not thread-safe: callers serialise calls (the sampler holds its lock). Use as a
    context manager or call :meth:`close`; reading after ``close`` raises ``ValueError``.
    """

    def __init__(self, paths: Iterable[str | os.PathLike[str]], *, method: Method = "auto") -> None:
        if method not in ("auto", "cachestat", "mincore"):
            raise ValueError(f"unknown residency method {method!r}")
        if method == "mincore" or _cachestat_nr() is None:
            _mincore()  # fail here, clearly, where there is no mincore
        self._files: list[_MincoreFile | _CachestatFile] = []
        self._closed = False
        try:
            for p in paths:
                self._files.append(_track(Path(p), method))
        except BaseException:
            self.close()
            raise
        hidden = [str(f.path) for f in self._files if not f.visible]
        if hidden:
            warnings.warn(
                "the kernel hides the page cache of files this user neither owns nor may write; "
                f"residency will read 0 for: {', '.join(hidden)}",
                RuntimeWarning,
                stacklevel=2,
            )

    @property
    def paths(self) -> tuple[Path, ...]:
        """The tracked files, in construction order."""
        return tuple(f.path for f in self._files)

    @property
    def methods(self) -> dict[Path, str]:
        """The interface used for each file: ``"cachestat"`` or ``"mincore"``."""
        return {f.path: "cachestat" if isinstance(f, _CachestatFile) else "mincore" for f in self._files}

    @property
    def total_bytes(self) -> int:
        """Sum of the files' sizes at construction: the most :meth:`resident_bytes` can be."""
        return sum(f.size for f in self._files)

    @property
    def page_cache_visible(self) -> bool:
        """False if, for some file, the kernel hides its page cache from this user."""
        return all(f.visible for f in self._files)

    def resident_bytes(self) -> int:
        """Bytes of all tracked files now in the page cache."""
        self._check_open()
        return sum(f.resident() for f in self._files)

    def per_file(self) -> dict[Path, int]:
        """Bytes in the page cache, per file (a path given twice appears once)."""
        self._check_open()
        return {f.path: f.resident() for f in self._files}

    def close(self) -> None:
        """Release every mapping and descriptor. Idempotent."""
        self._closed = True
        for f in self._files:
            f.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("FileResidency used after close()")

    def __enter__(self) -> FileResidency:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
