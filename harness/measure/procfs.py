"""Readers of ``/proc/self``: memory counters, the kernel's RSS high-water mark, per-file RSS.

All figures are in bytes. Linux only: on other platforms the readers raise ``OSError``
(``reset_peak`` returns False instead).

``/proc/self/status`` is cheap to read (the kernel formats about 1.5 KB from counters it
keeps; no page-table walk), so it is what a sampling loop calls.
``/proc/self/smaps`` walks every mapping and is far slower: :func:`mapping_rss` is for tests
and reports, never for a sampling loop.

The kernel's high-water mark ``VmHWM`` is the largest RSS the process has had, updated by
the kernel itself, so no sampling interval can miss a peak. Writing ``5`` to
``/proc/self/clear_refs`` resets it *to the current RSS* (not to zero): after a reset,
``VmHWM`` is the largest RSS since the reset, and is never below the RSS at the reset.
The reset is process-wide; see :class:`PeakTracker`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from collections.abc import Callable
from typing import NamedTuple

from harness.units import KIB

STATUS_PATH = "/proc/self/status"
CLEAR_REFS_PATH = "/proc/self/clear_refs"
SMAPS_PATH = "/proc/self/smaps"

_INITIAL_BUFFER = 8192


class StatusReading(NamedTuple):
    """Memory counters of this process from ``/proc/self/status``, in bytes.

    ``rss_bytes`` (VmRSS) is ``anon_bytes`` (RssAnon) + ``file_bytes`` (RssFile) +
    ``shmem_bytes`` (RssShmem). ``hwm_bytes`` is VmHWM: the peak of ``rss_bytes`` since
    the process started or since the last :func:`reset_peak`.
    """

    rss_bytes: int
    anon_bytes: int
    file_bytes: int
    shmem_bytes: int
    hwm_bytes: int


class StatusReader:
    """Reads ``/proc/self/status`` repeatedly at low cost.

    The file stays open and each read is one ``pread`` at offset 0 into a buffer allocated
    once (grown only if the kernel's text ever fills it); only the five needed lines are
    parsed. The ``pread`` is libc's, called through ctypes *without releasing the GIL* (the
    read takes microseconds): ``os.pread``/``os.preadv`` release it, and a sampling thread
    that gives the GIL away mid-sample waits up to ``sys.getswitchinterval()`` to get it
    back whenever another thread runs Python code, which stretches its intervals. Where
    libc's ``pread`` cannot be loaded, ``os.preadv`` is used.

    Safe to call from any thread (an internal lock guards the buffer). After
    ``fork`` the child reopens the file on its first read, so it never reports its parent.
    Call :meth:`close` to release the descriptor (it is also released when the reader is
    garbage-collected).
    """

    _KEYS = (b"VmRSS:", b"RssAnon:", b"RssFile:", b"RssShmem:", b"VmHWM:")

    def __init__(self, path: str = STATUS_PATH) -> None:
        self._path = path
        self._fd = -1
        self._pid = -1
        self._pread = _pread_holding_gil()
        self._lock = threading.Lock()
        self._set_buffer(_INITIAL_BUFFER)

    def _set_buffer(self, size: int) -> None:
        self._buf = bytearray(size)
        # A ctypes view of the buffer, made once: its address is what libc's pread fills.
        self._cbuf = (ctypes.c_char * size).from_buffer(self._buf)

    def read(self) -> StatusReading:
        """Return the current counters. Raises ``OSError`` if the file or a line is missing."""
        with self._lock:
            buf, n = self._read_locked()
            values = [_field_kib(buf, n, key, self._path) * KIB for key in self._KEYS]
        return StatusReading(*values)

    def close(self) -> None:
        """Close the file; a later :meth:`read` opens it again."""
        with self._lock:
            if self._fd >= 0 and self._pid == os.getpid():
                os.close(self._fd)
            self._fd = -1
            self._pid = -1

    def __del__(self) -> None:
        fd, pid = getattr(self, "_fd", -1), getattr(self, "_pid", -1)
        if fd >= 0 and pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(fd)

    def _read_locked(self) -> tuple[bytearray, int]:
        pid = os.getpid()
        if self._fd < 0 or self._pid != pid:
            # A descriptor inherited over fork names the parent's /proc entry: reopen.
            self._fd = os.open(self._path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            self._pid = pid
        while True:
            size = len(self._buf)
            if self._pread is not None:
                n = self._pread(self._fd, self._cbuf, size, 0)
                if n < 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"cannot read {self._path}: {os.strerror(err)}")
            else:
                n = os.preadv(self._fd, [self._buf], 0)
            if n < size:
                return self._buf, n
            self._set_buffer(2 * size)


@functools.cache
def _pread_holding_gil() -> Callable[[int, ctypes.Array[ctypes.c_char], int, int], int] | None:
    """libc's ``pread`` bound so that calling it keeps the GIL; None where it cannot be loaded."""
    try:
        fn = ctypes.PyDLL(None, use_errno=True).pread
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
    fn.restype = ctypes.c_ssize_t
    return fn  # type: ignore[no-any-return]


def _field_kib(buf: bytearray, n: int, key: bytes, path: str) -> int:
    """Value of the ``key:   <number> kB`` line in ``buf[:n]``, in KiB."""
    start = buf.find(key, 0, n)
    if start < 0:
        raise OSError(f"{path} has no {key.decode()} line")
    start += len(key)
    end = buf.find(b"kB", start, n)
    if end < 0:
        raise OSError(f"{path}: cannot parse the {key.decode()} line")
    return int(buf[start:end])


_default_reader = StatusReader()


def read_status() -> StatusReading:
    """Current VmRSS, RssAnon, RssFile, RssShmem and VmHWM of this process, in bytes."""
    return _default_reader.read()


def read_peak() -> int:
    """VmHWM in bytes: the peak RSS since process start or since the last :func:`reset_peak`."""
    return _default_reader.read().hwm_bytes


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS by writing ``5`` to ``/proc/self/clear_refs``.

    Returns True on success and False when the file is missing or the kernel refuses the
    write (non-Linux, kernels before 4.0, some sandboxes); never raises for that. The reset
    is process-wide: it also discards the peak that any other observer was waiting for. Written in
    place: a kernel interface, not a file the atomic writer (:mod:`harness.fileio.atomic`) could replace.
    """
    try:
        fd = os.open(CLEAR_REFS_PATH, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        return os.write(fd, b"5") == 1
    except OSError:
        return False
    finally:
        os.close(fd)


class PeakTracker:
    """Exact peak RSS over a stretch of code, from the kernel's high-water mark.

    ``begin()`` resets VmHWM (see :func:`reset_peak`); ``end()`` reads it. Because the
    kernel updates VmHWM itself, ``end()`` includes spikes shorter than any sampling
    interval. After a reset VmHWM starts at the RSS at that moment, so ``end()`` is never
    below the RSS at ``begin()``: it is a peak, not an increase over a baseline.

    ``supported`` is True until a reset is refused; from then on ``begin()`` returns False
    without trying again and ``end()`` returns None, and callers fall back to samples.

    The reset is process-wide, so only one tracker should be between ``begin`` and ``end``
    at a time, and resets destroy the process's lifetime VmHWM. To keep it,
    ``overall_bytes`` folds in the VmHWM read just before each reset and at each ``end``:
    it is the peak RSS from process start up to the last ``begin``/``end`` call.
    """

    def __init__(self) -> None:
        self.supported: bool = True
        self._armed = False
        self._overall: int | None = None

    def begin(self) -> bool:
        """Reset VmHWM; True on success, False (remembered) if the kernel refuses."""
        self._armed = False
        if not self.supported:
            return False
        before = read_peak()
        if not reset_peak():
            self.supported = False
            return False
        self._fold(before)
        self._armed = True
        return True

    def end(self) -> int | None:
        """VmHWM in bytes since the last successful ``begin``; None if that ``begin`` was refused
        or never called. Calling it again before the next ``begin`` reads the mark again."""
        if not self._armed:
            return None
        peak = read_peak()
        self._fold(peak)
        return peak

    @property
    def overall_bytes(self) -> int | None:
        """Peak RSS since process start as far as this tracker has seen; None before any
        successful ``begin``."""
        return self._overall

    def _fold(self, value: int) -> None:
        self._overall = value if self._overall is None else max(self._overall, value)


def mapping_rss(path: str | os.PathLike[str]) -> int:
    """Sum of ``Rss`` over this process's ``/proc/self/smaps`` entries that map ``path``.

    ``path`` is resolved with ``os.path.realpath`` and compared with the pathname the kernel
    shows; a file deleted or renamed since it was mapped is not matched. Returns 0 when the
    file is not mapped. Slow for processes with many mappings (it reads all of smaps).
    """
    target = os.fsencode(os.path.realpath(path))
    total_kib = 0
    inside = False
    with open(SMAPS_PATH, "rb") as smaps:
        for line in smaps:
            head = line.split(None, 1)[0] if line.strip() else b""
            if not head.endswith(b":"):
                # Mapping header: "start-end perms offset dev inode [pathname]".
                parts = line.rstrip(b"\n").split(None, 5)
                inside = len(parts) == 6 and parts[5] == target
            elif inside and head == b"Rss:":
                total_kib += int(line.split()[1])
    return total_kib * KIB
