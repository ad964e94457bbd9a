"""One disk, read and written at once: the checkpoint read cold beside as many bytes written as engine files.

Where a build writes its engines as files of their weights' bytes (the ``copy`` backend on the host,
a compiler's engines that hold their weights), every strategy that reads the checkpoint during the
build shares the disk with those writes. The read ceiling (:mod:`harness.measure.ceiling`) and
``load``'s build (the writes with every weight resident) say what each costs alone; how well the
disk serves both at once says how far reading and building can overlap there. :func:`shared_disk`
measures it, in three steps:

1. ``write``: as many bytes as the checkpoint's files hold, written as files of ``file_bytes`` under
   ``directory``, each fsynced, dropped from the page cache and removed, as the ``copy`` backend
   writes its engines (from one reused buffer of random bytes, so nothing is read meanwhile);
2. ``read``: the checkpoint read cold with ``read()`` into a reused buffer, each range dropped from the
   page cache once read (:func:`harness.measure.diskread.cold_read_bandwidth`), so that no page-cache
   growth is timed;
3. ``both``: the two started together on two threads, timed until both are done.

Where ``both`` is near the larger of the two alone, the disk serves reads and writes side by side;
near their sum, one at a time, and a build that reads while it writes cannot take less than ``both``.
``benchmarks/disk_shared.py`` repeats the three for a closer look.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from harness.measure.diskread import cold_read_bandwidth
from harness.results.disk import SharedDisk
from harness.units import MIB

__all__ = ["DEFAULT_CHUNK", "both_at_once", "read_cold", "shared_disk", "write_files"]

DEFAULT_CHUNK = 8 * MIB
"""Bytes per ``read()`` and per ``write()`` (8 MiB)."""


def write_files(directory: Path, nbytes: int, file_bytes: int, block: bytes) -> float:
    """Seconds to write ``nbytes`` as files of ``file_bytes`` under ``directory`` from ``block`` (reused), each
    fsynced, dropped from the page cache and removed; nothing is left behind, even on an error. These writes
    are what is measured, so they do not go through the atomic writer (:mod:`harness.fileio.atomic`)."""
    started = time.perf_counter()
    left = nbytes
    while left > 0:
        fd, name = tempfile.mkstemp(dir=directory, prefix="shared-disk-")
        try:
            size = min(file_bytes, left)
            written = 0
            while written < size:
                written += os.write(fd, block[: min(len(block), size - written)])
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
            os.unlink(name)
        left -= size
    return time.perf_counter() - started


def read_cold(paths: Sequence[Path], chunk: int) -> float:
    """Seconds to read the files ``paths`` whole, cold, each range dropped from the page cache once read."""
    return cold_read_bandwidth(paths, chunk=chunk, settle=False).seconds


def both_at_once(paths: Sequence[Path], nbytes: int, directory: Path, file_bytes: int, block: bytes,
                 chunk: int) -> float:
    """Seconds until a cold read of ``paths`` (:func:`read_cold`) and :func:`write_files` of ``nbytes``, started
    together on two threads, are both done."""
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            write_files(directory, nbytes, file_bytes, block)
        except BaseException as exc:  # re-raised on the calling thread
            failures.append(exc)

    thread = threading.Thread(target=writer, name="shared-disk-writer")
    started = time.perf_counter()
    thread.start()
    try:
        read_cold(paths, chunk)
    finally:
        thread.join()
    if failures:
        raise failures[0]
    return time.perf_counter() - started


def shared_disk(paths: Sequence[str | os.PathLike[str]], directory: str | os.PathLike[str], file_bytes: int, *,
                chunk: int = DEFAULT_CHUNK) -> SharedDisk:
    """The checkpoint's files ``paths`` read cold, as many bytes written as files of ``file_bytes`` under
    ``directory`` (made if missing), each alone and both at once (see the module docstring).

    Raises ``ValueError`` for no files or a ``file_bytes`` or ``chunk`` below 1, and ``OSError`` naming
    ``directory`` where it cannot be written.
    """
    if not paths:
        raise ValueError("the shared-disk measurement needs the checkpoint's files")
    if file_bytes < 1 or chunk < 1:
        raise ValueError(f"file_bytes and chunk must be at least 1, got {file_bytes} and {chunk}")
    files = [Path(p) for p in paths]
    nbytes = sum(f.stat().st_size for f in files)
    where = Path(directory)
    block = os.urandom(chunk)
    try:
        where.mkdir(parents=True, exist_ok=True)
        write_s = write_files(where, nbytes, file_bytes, block)
        read_s = read_cold(files, chunk)
        both_s = both_at_once(files, nbytes, where, file_bytes, block, chunk)
    except OSError as exc:
        raise OSError(f"{where}: reading the checkpoint while writing engine-sized files there failed: {exc}") from exc
    return SharedDisk(bytes=nbytes, file_bytes=file_bytes, read_s=round(read_s, 6),
                      write_s=round(write_s, 6), both_s=round(both_s, 6))
