"""How the strategies that map read the checkpoint, as a run records it: the prefetch method, the readers and request
size it asks with, and whether released weights leave the page cache (:class:`ReadingChoice`), each with why.

Chosen by :mod:`harness.checkpoint_reading`; held by the plan, the run's record and a budget sweep's record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.fileio.codec import Record
from harness.results.disk import ReadProbe
from harness.units import MIB

__all__ = ["EARLIER_REQUEST_BYTES", "ReadingChoice"]


EARLIER_REQUEST_BYTES = 2 * MIB
"""weightmap's default prefetch request size (``ReleasePlan``'s ``prefetch_request_bytes``): what a
:class:`ReadingChoice` asks with unless prefetch is sized to a read-ceiling sweep, and what runs recorded before
version 16, which record none, asked with."""


@dataclass(frozen=True)
class ReadingChoice(Record):
    """The prefetch method (``None``: off) and drop-cache setting of the strategies that map, and why each
    (version 7, :func:`harness.checkpoint_reading.choose_reading`; a record's ``reading``, its ``speed`` until
    version 18): set by the scenario, or chosen from ``probe``; ``probe_error`` says why the probe failed, where
    it did (version 12). ``prefetch_readers`` threads ask at once, in requests of ``prefetch_request_bytes``
    (version 16; earlier runs: one thread, 2 MiB requests): the read-ceiling sweep's best point where the run
    measured one (:func:`harness.checkpoint_reading.sized_to_ceiling`), and ``prefetch_sizing_why`` says which."""

    prefetch: str | None
    drop_cache: bool
    prefetch_why: str
    drop_cache_why: str
    probe: ReadProbe | None = None
    # version 12
    probe_error: str | None = field(default=None, metadata={"absent_until": 11})
    # version 16
    prefetch_readers: int = field(default=1, metadata={"absent_until": 15})
    prefetch_request_bytes: int = field(default=EARLIER_REQUEST_BYTES, metadata={"absent_until": 15})
    prefetch_sizing_why: str | None = field(default=None, metadata={"absent_until": 15})
