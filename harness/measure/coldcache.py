"""Put checkpoint files into a known page-cache state before a measured run, and say how.

:func:`prepare_cold` makes every strategy start from the same cold state:

1. **Flush.** ``fsync`` each file, then check that the kernel holds none of its pages dirty
   or under writeback, re-flushing until it does or ``timeout_s`` runs out. ``fsync`` works
   on a descriptor opened read-only (Linux writes back the inode's pages whoever dirtied
   them), so a read-only checkpoint needs no write permission. It also sends the device a
   cache flush, so a virtual disk's host has the data too. Why flush first:
   ``posix_fadvise(POSIX_FADV_DONTNEED)`` drops only pages that are clean when it gets to
   them. It may start the writeback of dirty pages itself, but skips those still under
   writeback, so on a file written a moment before it can leave much of it cached, and the
   measured read then shares the disk with that writeback. ``fsync`` returns only once the
   writeback has finished.
2. **Settle** (``settle=True``): ``sync`` the machine and wait, at most ``timeout_s``, until
   the whole machine's ``Dirty`` + ``Writeback`` (``/proc/meminfo``) falls to
   ``settle_bytes`` or less, so that no other file's writeback competes with the read
   either (a writer running during the read competes too, and no preparation can prevent
   that). Where other users keep writing, the wait ends at the timeout, and the
   report says what was left.
3. **Drop.** ``posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` on each file (no root
   needed).
4. **Check.** Measure each file's page-cache residency with :class:`~harness.measure.residency.FileResidency`.
   Pages that some process still maps cannot be dropped; they show up here.

Per-file dirty and writeback counts come from ``cachestat(2)`` (Linux 6.5+), which answers
only for files the caller owns or may write. Elsewhere one ``fsync`` per file is trusted
(it returns once the file's writeback is done), only the machine-wide counters are
reported, and the report says so (``dirty_source``).

:func:`prepare_warm` reads every byte of each file once and reports the residency that
leaves.

Both return a :class:`CacheReport`: the :class:`~harness.results.record.CacheRecord` the results
keep, and the per-file detail; ``to_json()`` gives a JSON-ready dict of both.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.measure.residency import FileResidency, PageCounts, file_page_counts
from harness.results.record import CacheRecord
from harness.units import KIB, MIB

__all__ = [
    "CacheReport",
    "FileCacheState",
    "PageCounts",
    "drop_cached",
    "file_page_counts",
    "page_aligned_buffer",
    "prepare_cold",
    "prepare_warm",
    "read_through",
    "system_dirty_bytes",
    "write_back_and_drop",
]

MEMINFO = "/proc/meminfo"
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_SETTLE_BYTES = 64 * MIB
"""Machine-wide ``Dirty`` + ``Writeback`` at or below which the machine counts as settled."""
COLD_TOLERANCE_BYTES = MIB
"""Residency at or below this counts as cold: a few pages that a running process maps (one
that read the file's header, say) cannot be dropped and need not spoil a cold start."""
_READ_CHUNK = 32 * MIB
_POLL_S = 0.05

def system_dirty_bytes() -> int | None:
    """The machine's ``Dirty`` + ``Writeback`` from ``/proc/meminfo``, in bytes; None where unreadable."""
    try:
        with open(MEMINFO) as fh:
            text = fh.read()
    except OSError:
        return None
    total = 0
    seen = 0
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Dirty", "Writeback"):
            total += int(rest.split()[0]) * KIB
            seen += 1
    return total if seen == 2 else None


def drop_cached(fd: int, offset: int = 0, length: int = 0) -> None:
    """``posix_fadvise(POSIX_FADV_DONTNEED)`` on a byte range of ``fd`` (length 0: to the end).

    Drops the range's clean, unmapped pages from the page cache. Dirty pages, pages under
    writeback and pages some process maps stay.
    """
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def write_back_and_drop(file: int | str | os.PathLike[str]) -> None:
    """Write a file's dirty data back (``fdatasync``), then drop its pages from the page cache (:func:`drop_cached`).

    ``file`` is an open descriptor, which is left open, or a path. Used on a file just written, so that
    it holds no page-cache memory of the run's once let go.
    """
    if isinstance(file, int):
        os.fdatasync(file)
        drop_cached(file)
        return
    fd = os.open(file, os.O_RDONLY)
    try:
        write_back_and_drop(fd)
    finally:
        os.close(fd)


@dataclass
class FileCacheState:
    """One file before and after its preparation, in bytes.

    ``dirty_bytes_*`` and ``writeback_bytes_*`` are None where the kernel does not tell this
    user a file's dirty state (see :func:`file_page_counts`).
    """

    path: str
    size_bytes: int
    resident_bytes_before: int
    resident_bytes_after: int
    dirty_bytes_before: int | None = None
    writeback_bytes_before: int | None = None
    dirty_bytes_after: int | None = None
    writeback_bytes_after: int | None = None
    flush_seconds: float = 0.0
    flushes: int = 0


@dataclass
class CacheReport:
    """How files were put in a cache state, and what the kernel reported afterwards.

    ``record``: what the results keep (:class:`~harness.results.record.CacheRecord`: the state,
    what was done in words, residency before and after, ``notes`` on anything that kept the state
    from being what was asked for; its ``resident_at_load_bytes`` is the caller's to fill). The
    rest is detail: ``files``, each file before and after; ``system_dirty_bytes_*``, the machine's
    ``Dirty`` + ``Writeback`` before and after (None where ``/proc/meminfo`` is not readable);
    ``dirty_source``, ``"cachestat"`` when every file's own dirty state was read, else ``"meminfo"``.
    """

    record: CacheRecord
    files: list[FileCacheState]
    flush_seconds: float = 0.0
    settle_seconds: float = 0.0
    system_dirty_bytes_before: int | None = None
    system_dirty_bytes_after: int | None = None
    dirty_source: str = "meminfo"
    residency_method: str = ""
    page_cache_visible: bool = True

    @property
    def cold_ok(self) -> bool:
        """True when every file's residency is within :data:`COLD_TOLERANCE_BYTES` and none is
        left dirty (as far as the kernel tells)."""
        return all(
            f.resident_bytes_after <= COLD_TOLERANCE_BYTES and not (f.dirty_bytes_after or f.writeback_bytes_after)
            for f in self.files
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: the record's fields and the detail's, plus ``cold_ok`` (None when warm)."""
        data = asdict(self)
        data.update(data.pop("record"))
        data["notes"] = list(self.record.notes)
        data["cold_ok"] = self.cold_ok if self.record.state == "cold" else None
        return data


def _record(state: str, method: str, states: list[FileCacheState], start: float, settled: bool | None,
            notes: list[str]) -> CacheRecord:
    """What the results keep of a preparation of ``states``' files that began at ``start``."""
    return CacheRecord(
        state=state, method=method, flushed=any(f.flushes > 0 for f in states), settled=settled,
        dropped=state == "cold", resident_before_bytes=sum(f.resident_bytes_before for f in states),
        resident_after_bytes=sum(f.resident_bytes_after for f in states), resident_at_load_bytes=None,
        total_bytes=sum(f.size_bytes for f in states), seconds=round(time.monotonic() - start, 3),
        notes=tuple(notes),
    )


def _paths(files: Iterable[str | os.PathLike[str]]) -> list[Path]:
    paths = [Path(f) for f in files]
    if not paths:
        raise ValueError("no files to prepare")
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(errno.ENOENT, f"cannot prepare the page cache of {p}: not a regular file", str(p))
    return paths


@contextlib.contextmanager
def _opened(paths: Sequence[Path]) -> Iterator[list[int]]:
    fds: list[int] = []
    try:
        for p in paths:
            fds.append(os.open(p, os.O_RDONLY))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def _fsync(fd: int, path: Path, notes: list[str]) -> bool:
    """fsync ``fd``; False (with a note) where the filesystem does not support it."""
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EROFS, errno.EBADF, errno.ENOTSUP):
            notes.append(f"{path}: fsync not supported here ({os.strerror(exc.errno)}); not flushed")
            return False
        raise
    return True


def _flush(fd: int, path: Path, state: FileCacheState, deadline: float, notes: list[str]) -> None:
    """fsync until the kernel reports no dirty or under-writeback page of the file, or the deadline."""
    start = time.monotonic()
    while True:
        if not _fsync(fd, path, notes):
            break
        state.flushes += 1
        counts = file_page_counts(fd)
        if counts is None or (counts.dirty == 0 and counts.writeback == 0):
            break
        if time.monotonic() >= deadline:
            notes.append(
                f"{path}: still {counts.dirty} bytes dirty and {counts.writeback} under writeback after "
                f"{state.flushes} flushes (someone is writing it)"
            )
            break
        time.sleep(_POLL_S)
    state.flush_seconds = round(time.monotonic() - start, 3)


def _settle(settle_bytes: int, deadline: float, notes: list[str]) -> tuple[float, bool | None]:
    """``sync``, then wait for the machine's Dirty + Writeback to fall to ``settle_bytes``.

    ``sync(2)`` blocks until the machine's dirty data is written, which on a machine where
    others keep writing can take long: it runs on a daemon thread, waited for until the
    deadline at most (the thread then finishes on its own).
    """
    start = time.monotonic()
    syncer = threading.Thread(target=os.sync, name="coldcache-sync", daemon=True)
    syncer.start()
    syncer.join(max(0.0, deadline - time.monotonic()))
    if syncer.is_alive():
        notes.append(f"sync did not return within {time.monotonic() - start:.1f} s")
    while True:
        now = system_dirty_bytes()
        if now is None:
            notes.append(f"{MEMINFO} is not readable: machine-wide writeback not checked")
            return time.monotonic() - start, None
        if now <= settle_bytes:
            return time.monotonic() - start, True
        if time.monotonic() >= deadline:
            notes.append(
                f"the machine still had {now} bytes dirty or under writeback after {time.monotonic() - start:.1f} s "
                f"(other writers); the read may share the disk with their writeback"
            )
            return time.monotonic() - start, False
        time.sleep(_POLL_S * 4)


def prepare_cold(
    files: Iterable[str | os.PathLike[str]],
    *,
    settle: bool = True,
    settle_bytes: int = DEFAULT_SETTLE_BYTES,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> CacheReport:
    """Flush ``files``, let writeback finish, drop them from the page cache; report how it went.

    See the module docstring for the steps. ``timeout_s`` bounds the flushing and the settling
    together; running out is not an error (a shared machine may never settle): the report's
    ``notes``, ``settled`` and ``cold_ok`` say what was reached. Raises ``FileNotFoundError``
    for a path that is not a regular file and ``ValueError`` for no files; the files are
    never written.
    """
    paths = _paths(files)
    start = time.monotonic()
    deadline = start + timeout_s
    notes: list[str] = []
    system_before = system_dirty_bytes()
    with FileResidency(paths) as residency, _opened(paths) as fds:
        before = residency.per_file()
        states: list[FileCacheState] = []
        per_file_dirty = True
        for p, fd in zip(paths, fds, strict=True):
            st = FileCacheState(str(p), os.fstat(fd).st_size, before[p], 0)
            counts = file_page_counts(fd)
            if counts is None:
                per_file_dirty = False
            else:
                st.dirty_bytes_before, st.writeback_bytes_before = counts.dirty, counts.writeback
            _flush(fd, p, st, deadline, notes)
            states.append(st)
        flush_seconds = time.monotonic() - start
        settle_seconds, settled = (0.0, None)
        if settle:
            settle_seconds, settled = _settle(settle_bytes, deadline, notes)
        for fd in fds:
            drop_cached(fd)
        after = residency.per_file()
        for p, fd, st in zip(paths, fds, states, strict=True):
            st.resident_bytes_after = after[p]
            counts = file_page_counts(fd)
            if counts is not None:
                st.dirty_bytes_after, st.writeback_bytes_after = counts.dirty, counts.writeback
            if st.resident_bytes_after > COLD_TOLERANCE_BYTES:
                notes.append(
                    f"{p}: {st.resident_bytes_after} bytes still in the page cache after POSIX_FADV_DONTNEED "
                    "(pages mapped by a running process, or written again meanwhile)"
                )
        methods = sorted(set(residency.methods.values()))
        visible = residency.page_cache_visible
    if not visible:
        notes.append("the kernel hides the page cache of some files from this user: residency reads 0 for them")
    how = "fsync until no dirty or writeback pages (cachestat)" if per_file_dirty else "fsync"
    if settle:
        how += f" + sync and wait for machine-wide Dirty+Writeback <= {settle_bytes} bytes"
    how += " + posix_fadvise(POSIX_FADV_DONTNEED)"
    return CacheReport(
        record=_record("cold", how, states, start, settled, notes),
        files=states,
        flush_seconds=round(flush_seconds, 3),
        settle_seconds=round(settle_seconds, 3),
        system_dirty_bytes_before=system_before,
        system_dirty_bytes_after=system_dirty_bytes(),
        dirty_source="cachestat" if per_file_dirty else "meminfo",
        residency_method="+".join(methods),
        page_cache_visible=visible,
    )


def read_through(fd: int, buffer: memoryview, limit: int | None = None) -> int:
    """Read ``fd`` from offset 0 to its end (or ``limit`` bytes) into ``buffer`` again and again;
    returns the bytes read. Nothing is kept: the buffer is reused for every read."""
    done = 0
    size = len(buffer)
    while limit is None or done < limit:
        want = size if limit is None else min(size, limit - done)
        got = os.preadv(fd, [buffer[:want]], done)
        if got == 0:
            break
        done += got
    return done


def page_aligned_buffer(nbytes: int) -> mmap.mmap:
    """An anonymous, page-aligned buffer of ``nbytes`` (rounded up to whole pages).

    Page alignment matters for ``read()``: the kernel's copy into a buffer at a 16-byte
    offset (what ``bytearray`` gives) can take several times the CPU of a copy into a
    page-aligned one.
    """
    page = mmap.PAGESIZE
    return mmap.mmap(-1, max(page, -(-nbytes // page) * page))


def prepare_warm(files: Iterable[str | os.PathLike[str]], *, chunk: int = _READ_CHUNK) -> CacheReport:
    """Read every byte of ``files`` once, so their pages are in the page cache; report residency.

    The bytes go through one reused ``chunk``-sized buffer, so the process keeps nothing.
    Where memory is short the kernel may evict some pages again: the report's residency says
    how much stayed. Raises as :func:`prepare_cold` does.
    """
    paths = _paths(files)
    start = time.monotonic()
    notes: list[str] = []
    buffer = page_aligned_buffer(chunk)
    try:
        view = memoryview(buffer)
        with FileResidency(paths) as residency, _opened(paths) as fds:
            before = residency.per_file()
            states = []
            for p, fd in zip(paths, fds, strict=True):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                read_through(fd, view)
                states.append(FileCacheState(str(p), os.fstat(fd).st_size, before[p], 0))
            after = residency.per_file()
            for p, st in zip(paths, states, strict=True):
                st.resident_bytes_after = after[p]
                if st.resident_bytes_after < st.size_bytes:
                    notes.append(f"{p}: {st.size_bytes - st.resident_bytes_after} bytes not in the page cache after "
                                 "reading it (evicted under memory pressure)")
            methods = sorted(set(residency.methods.values()))
            visible = residency.page_cache_visible
        view.release()
    finally:
        buffer.close()
    if not visible:
        notes.append("the kernel hides the page cache of some files from this user: residency reads 0 for them")
    return CacheReport(
        record=_record("warm", f"read once with read() into a reused {chunk}-byte buffer", states, start, None,
                       notes),
        files=states,
        residency_method="+".join(methods),
        page_cache_visible=visible,
    )
