"""The disk's cold sequential read rate for a checkpoint, measured in the same run as the strategies.

:func:`cold_read_bandwidth` prepares the files cold (:func:`harness.measure.coldcache.prepare_cold`),
reads them from start to end with ``read()`` into one reused, page-aligned buffer, and drops
their pages again, so that the strategy measured next starts cold as well. The process keeps
nothing it read: its RSS grows by the buffer only. The result, a :class:`ReadBandwidth`, is
the reference a strategy's read-bound time is put against: model bytes / ``bytes_per_s`` is
what reading the model once costs on this disk at that time. (A loader that faults pages in
through a mapping has no copy in the kernel and can read faster than this ``read()``.)

It also records the CPU time the read took (``cpu_seconds``, the kernel's copy into the
buffer) and how the machine's CPUs were spent meanwhile (``machine_cpu``, shares of
``/proc/stat``): on a machine whose CPUs are busy with other work the copy waits for a CPU,
and the figure is a rate of this machine at that time rather than of its disk.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.measure.coldcache import CacheReport, drop_cached, page_aligned_buffer, prepare_cold
from harness.units import MIB

__all__ = ["DEFAULT_CHUNK", "ReadBandwidth", "cold_read_bandwidth", "cpu_times"]

DEFAULT_CHUNK = 32 * MIB
"""Bytes per ``read()``: 16 to 64 MiB read at the same rate here; smaller buffers pay more
system calls, larger ones only cost memory."""

STAT = "/proc/stat"
_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_times() -> dict[str, int] | None:
    """The machine's CPU time so far, in clock ticks, by kind (``/proc/stat``); None where unreadable."""
    try:
        with open(STAT) as fh:
            first = fh.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    values = [int(v) for v in first[1 : 1 + len(_STAT_FIELDS)]]
    values += [0] * (len(_STAT_FIELDS) - len(values))
    return dict(zip(_STAT_FIELDS, values, strict=True))


def _shares(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, float]:
    if before is None or after is None:
        return {}
    delta = {k: after[k] - before[k] for k in before}
    total = sum(delta.values())
    if total <= 0:
        return {}
    grouped = {
        "user": delta["user"] + delta["nice"],
        "system": delta["system"] + delta["irq"] + delta["softirq"],
        "idle": delta["idle"],
        "iowait": delta["iowait"],
        "steal": delta["steal"],
    }
    return {k: round(v / total, 3) for k, v in grouped.items()}


@dataclass
class ReadBandwidth:
    """One cold sequential read of a checkpoint.

    ``bytes`` were read in ``seconds`` (wall time of the reads alone, not the preparation):
    ``bytes_per_s``. ``cpu_seconds`` is this process's CPU time over the reads; close to
    ``seconds`` means the read was bound by the copy on the CPU, not by the disk.
    ``drop_behind`` says whether each range was dropped from the page cache once read (see
    :func:`cold_read_bandwidth`). ``machine_cpu`` is the machine's CPU time over the reads
    by kind (shares of 1; ``steal`` is time a hypervisor gave to other machines).
    ``load_average_1m`` is the machine's load average when the read began. ``cache`` is how
    the files were prepared cold before the read; ``resident_bytes_after`` is their
    residency after the pages were dropped again. ``per_file`` lists
    ``(path, bytes, seconds)``.
    """

    paths: list[str]
    bytes: int
    seconds: float
    bytes_per_s: float
    chunk_bytes: int
    method: str
    drop_behind: bool
    cpu_seconds: float
    cache: CacheReport
    resident_bytes_after: int
    machine_cpu: dict[str, float] = field(default_factory=dict)
    load_average_1m: float | None = None
    per_file: list[tuple[str, int, float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; ``cache`` as :meth:`CacheReport.to_json` gives it."""
        data = asdict(self)
        data["cache"] = self.cache.to_json()
        data["per_file"] = [list(row) for row in self.per_file]
        return data


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cold_read_bandwidth(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    chunk: int = DEFAULT_CHUNK,
    limit_bytes: int | None = None,
    settle: bool = True,
    drop_behind: bool = True,
    timeout_s: float | None = None,
) -> ReadBandwidth:
    """Read ``path`` (a file, or the files of a sharded checkpoint, in order) cold and time it.

    The files are prepared with :func:`~harness.measure.coldcache.prepare_cold` (``settle`` is passed
    on, and ``timeout_s`` when given), read sequentially with ``read()`` into one page-aligned
    ``chunk``-byte buffer (the whole of each file, or ``limit_bytes`` in all), and dropped from the page cache again
    with another :func:`~harness.measure.coldcache.prepare_cold` (without the settling).

    ``drop_behind`` (default): each range is dropped from the page cache as soon as it has
    been read (``posix_fadvise(POSIX_FADV_DONTNEED)``), so the page cache does not grow by
    the file and the kernel reuses the pages it just freed. ``drop_behind=False`` keeps
    every page cached until the end, as a loader that reads through the page cache does,
    and measures that rate instead, which can be several times lower: record both where the
    difference matters. Raises ``ValueError`` for a ``chunk`` or ``limit_bytes`` below 1, and as
    :func:`~harness.measure.coldcache.prepare_cold` does for missing files.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 byte, got {chunk}")
    if limit_bytes is not None and limit_bytes < 1:
        raise ValueError(f"limit_bytes must be at least 1, got {limit_bytes}")
    paths = [Path(path)] if isinstance(path, str | os.PathLike) else [Path(p) for p in path]
    cache = prepare_cold(paths, settle=settle) if timeout_s is None else prepare_cold(paths, settle=settle,
                                                                                     timeout_s=timeout_s)
    buffer = page_aligned_buffer(chunk)
    view = memoryview(buffer)
    per_file: list[tuple[str, int, float]] = []
    total = 0
    try:
        with open("/proc/loadavg") as fh:
            load: float | None = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        load = None
    cpu0, machine0 = _cpu_seconds(), cpu_times()
    start = time.monotonic()
    try:
        for p in paths:
            if limit_bytes is not None and total >= limit_bytes:
                break
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                t = time.monotonic()
                done = 0
                while limit_bytes is None or total + done < limit_bytes:
                    want = len(view) if limit_bytes is None else min(len(view), limit_bytes - total - done)
                    got = os.readv(fd, [view[:want]])
                    if got == 0:
                        break
                    if drop_behind:
                        drop_cached(fd, done, got)
                    done += got
                per_file.append((str(p), done, round(time.monotonic() - t, 3)))
                total += done
            finally:
                os.close(fd)
    finally:
        seconds = time.monotonic() - start
        cpu = _cpu_seconds() - cpu0
        machine = _shares(machine0, cpu_times())
        view.release()
        buffer.close()
    after = prepare_cold(paths, settle=False)
    return ReadBandwidth(
        paths=[str(p) for p in paths],
        bytes=total,
        seconds=seconds,
        bytes_per_s=total / seconds if seconds > 0 else 0.0,
        chunk_bytes=chunk,
        method=(
            f"read() into one reused page-aligned {chunk}-byte buffer"
            + (", each range dropped from the page cache once read" if drop_behind else ", pages kept cached")
            + f", after {cache.record.method}"
        ),
        drop_behind=drop_behind,
        cpu_seconds=round(cpu, 3),
        cache=cache,
        resident_bytes_after=after.record.resident_after_bytes,
        machine_cpu=machine,
        load_average_1m=load,
        per_file=per_file,
    )
