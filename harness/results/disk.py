"""The disk measured in a run beside its strategies, as :mod:`harness.results.record` writes it into the summary:
cold sequential reads of the checkpoint (:class:`DiskRead`), the read-ceiling sweep (:class:`CeilingPoint`), the
disk read and written at once (:class:`SharedDisk`), and the read probe (:class:`ReadProbe`), from which the
settings of the strategies that map are chosen (:class:`~harness.results.checkpoint_reading.ReadingChoice`). Each
says the results layout version that added it (:data:`harness.results.record.LAYOUT_VERSION` numbers, the ``since``
and ``absent_until`` of its fields, wherever the record is held: ``summary.json``, ``plan.json`` and
``budget.json`` each state the layout of the records they hold)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from harness.fileio.codec import Record

__all__ = ["CeilingPoint", "DiskRead", "ReadProbe", "SharedDisk"]


@dataclass(frozen=True)
class DiskRead(Record):
    """A cold sequential ``read()`` of the checkpoint, made in the run (version 4).

    ``bytes`` read in ``seconds``: ``bytes_per_s``; ``cpu_seconds`` of the reading
    process meanwhile (close to ``seconds``: the copy on the CPU bound it, not the disk);
    ``before``: which repeat's strategies it preceded; ``method``: how it was read
    (:func:`harness.measure.diskread.cold_read_bandwidth`); ``resident_at_start_bytes``: the
    checkpoint's residency once prepared cold.
    """

    before: int
    bytes: int
    seconds: float
    bytes_per_s: float
    cpu_seconds: float
    method: str
    resident_at_start_bytes: int


@dataclass(frozen=True)
class CeilingPoint(Record):
    """One point of the disk's read-ceiling sweep (version 7, :func:`harness.measure.ceiling.read_ceiling`):
    ``threads`` readers of ``request_bytes`` per ``pread`` read ``bytes`` of the checkpoint cold in ``seconds``."""

    threads: int
    request_bytes: int
    bytes: int
    seconds: float

    @property
    def bytes_per_s(self) -> float:
        """The point's read rate (0 where nothing was read)."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class SharedDisk(Record):
    """The disk read and written at once (version 10, :func:`harness.measure.shared_disk.shared_disk`): the
    checkpoint's ``bytes`` read cold (``read_s``), as many written as files of ``file_bytes``, each fsynced,
    dropped from the page cache and removed (``write_s``), and the two started together, until both were done
    (``both_s``)."""

    bytes: int
    file_bytes: int
    read_s: float
    write_s: float
    both_s: float

    @property
    def overlap(self) -> float | None:
        """``both_s`` over the larger time alone: 1 where the disk serves reads and writes side by side,
        :attr:`one_at_a_time` where it serves one at a time; None where neither took time."""
        larger = max(self.read_s, self.write_s)
        return self.both_s / larger if larger > 0 else None

    @property
    def one_at_a_time(self) -> float | None:
        """What :attr:`overlap` would be with one served at a time: the sum alone over the larger."""
        larger = max(self.read_s, self.write_s)
        return (self.read_s + self.write_s) / larger if larger > 0 else None


def _median_rate(nbytes: int, seconds: tuple[float, ...]) -> float:
    """``nbytes`` over the median of ``seconds`` (0 where there is none)."""
    median = statistics.median(seconds) if seconds else 0.0
    return nbytes / median if median > 0 else 0.0


@dataclass(frozen=True)
class ReadProbe(Record):
    """Reads of regions of the checkpoint, cold, timed (version 7, :func:`harness.measure.probe.read_probe`),
    each region read once. ``kept_s`` / ``dropped_s``: regions of ``cache_region_bytes`` read by ``pread``,
    in turn, the kept ones left in the page cache until the probe ends (so it grows as a run's would) and
    the dropped ones dropped behind the reader; ``faulted_s`` / ``willneed_s``: regions of
    ``advice_region_bytes`` mapped and every page touched, without advice / after ``madvise(MADV_WILLNEED)``
    over the region (how the prefetcher asks)."""

    cache_region_bytes: int
    kept_s: tuple[float, ...]
    dropped_s: tuple[float, ...]
    advice_region_bytes: int
    faulted_s: tuple[float, ...]
    willneed_s: tuple[float, ...]

    @property
    def kept_bytes_per_s(self) -> float:
        """The median rate of the last three kept regions: a run keeps far more than the probe, and the first
        kept pages may come from pages the kernel had just freed (fast), which a whole checkpoint outgrows."""
        return _median_rate(self.cache_region_bytes, self.kept_s[-3:])

    @property
    def dropped_bytes_per_s(self) -> float:
        return _median_rate(self.cache_region_bytes, self.dropped_s)

    @property
    def faulted_bytes_per_s(self) -> float:
        return _median_rate(self.advice_region_bytes, self.faulted_s)

    @property
    def willneed_bytes_per_s(self) -> float:
        return _median_rate(self.advice_region_bytes, self.willneed_s)
