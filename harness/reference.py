"""The run's reference measurements, beside its strategies: how one that fails is recorded, the disk's cold read,
and the disk shared by reads and writes.

A reference measurement (the disk's cold read before a round, :func:`measure_disk`; the shared disk after the last
round, :func:`measure_shared_disk`) that fails is recorded as failed with its reason and never costs the run
(:func:`reference`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from harness import stopping
from harness.measure.diskread import cold_read_bandwidth
from harness.measure.shared_disk import shared_disk
from harness.progress import print_progress, shared_line
from harness.results.disk import DiskRead
from harness.results.record import RunRecord, write_summary

__all__ = ["DISK_SETTLE_TIMEOUT_S", "SHARED_DISK_TIMES", "measure_disk", "measure_shared_disk", "reference"]

T = TypeVar("T")


def reference(measurement: Callable[[], T]) -> tuple[T | None, str | None]:
    """A reference measurement's result, or ``None`` and why it failed: it is recorded as failed, with its
    reason, and never costs the run (a disk that fills up, a file gone under it).

    A signal is no failure of the measurement: :class:`~harness.stopping.Interrupted` goes through, and a
    signal caught while it ran is raised after it (:func:`harness.stopping.check`), even where the
    measurement's own code swallowed what it raised.
    """
    try:
        result: T | None = measurement()
        error = None
    except Exception as exc:
        result, error = None, " ".join(f"{type(exc).__name__}: {exc}".split())
    stopping.check()
    return result, error


DISK_SETTLE_TIMEOUT_S = 30.0
"""How long the disk read waits for the machine's writeback to settle (see :mod:`harness.measure.coldcache`)."""


def measure_disk(files: Sequence[str], before: int) -> DiskRead:
    """A cold sequential read of the checkpoint's ``files`` (the plan's), as the run's record keeps it."""
    read = cold_read_bandwidth([Path(f) for f in files], timeout_s=DISK_SETTLE_TIMEOUT_S)
    # the rate is derived from the time as recorded, so that the two stored figures agree; the time keeps
    # microseconds, as a millisecond is a percent of a small checkpoint's read
    seconds = round(read.seconds, 6)
    return DiskRead(before=before, bytes=read.bytes, seconds=seconds,
                    bytes_per_s=round(read.bytes / seconds, 1) if seconds > 0 else 0.0,
                    cpu_seconds=read.cpu_seconds, method=read.method,
                    resident_at_start_bytes=read.cache.record.resident_after_bytes)


SHARED_DISK_TIMES = 3
"""How many times a cold run whose engines are files measures the disk read and written at once, after its
last round (:mod:`harness.measure.shared_disk`)."""


def measure_shared_disk(run: RunRecord, staging: Path, files: Sequence[str], workdir: str,
                        engine_bytes: int) -> RunRecord:
    """``run`` with the disk read and written at once, :data:`SHARED_DISK_TIMES` times
    (:func:`harness.measure.shared_disk.shared_disk` of the checkpoint's ``files``, writing ``engine_bytes`` under
    ``workdir``), each time recorded in ``shared_disk`` (``summary.json`` in ``staging`` rewritten) and said; one
    that fails is recorded in ``shared_disk_error``, the times before it stand, and no more are taken."""
    for time_ in range(SHARED_DISK_TIMES):
        print_progress(f"the disk read and written at once, {time_ + 1} of {SHARED_DISK_TIMES}")
        shared, error = reference(lambda: shared_disk(files, workdir, engine_bytes))
        if error is not None:
            run = run.replace(shared_disk_error=f"time {time_ + 1} of {SHARED_DISK_TIMES}: {error}")
            write_summary(staging, run)
            print_progress(f"disk shared: failed ({run.shared_disk_error})")
            break
        assert shared is not None
        run = run.replace(shared_disk=(*run.shared_disk, shared))
        write_summary(staging, run)
        print_progress(shared_line(shared))
    return run
