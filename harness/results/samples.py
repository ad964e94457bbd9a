"""A strategy's CSV files: their names, columns and readers (:mod:`harness.results.record` holds the rest of the
results layout).

``samples-<strategy>.csv`` holds one row per sample (:data:`SAMPLE_COLUMNS`), ``events-<strategy>.csv`` the load,
partition and engine events (:data:`EVENT_COLUMNS`). A row must hold every column, the file must end with a whole
row and hold as many rows as its strategy's record states (from layout 11), and a number in it must be finite and in
range; :func:`harness.fileio.files.read_csv` checks it and raises :class:`harness.fileio.codec.RecordError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness.fileio.files import empty_frame, read_csv

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "EVENT_COLUMNS",
    "SAMPLE_COLUMNS",
    "empty_events",
    "empty_samples",
    "events_file",
    "read_events",
    "read_samples",
    "samples_file",
]

SAMPLE_COLUMNS: tuple[str, ...] = (
    "t_s",
    "rss_bytes",
    "anon_bytes",
    "file_bytes",
    "resident_bytes",
    "gpu_used_bytes",
    "gpu_reserved_bytes",
    "engine",
    "phase",
)
"""``samples-<strategy>.csv``: one row per sample of :class:`harness.measure.sampler.Sampler` (all versions)."""

EVENT_COLUMNS: tuple[str, ...] = (
    "t_s",
    "event",
    "engine",
    "weight_bytes",
    "host_hwm_bytes",
    "released_bytes",
    "rss_bytes",
    "gpu_used_bytes",
)
"""``events-<strategy>.csv``: load, partition and engine events of :mod:`harness.worker` (all versions)."""


def samples_file(strategy: str) -> str:
    """File name of a strategy's samples."""
    return f"samples-{strategy}.csv"


def events_file(strategy: str) -> str:
    """File name of a strategy's events."""
    return f"events-{strategy}.csv"


def empty_samples() -> pd.DataFrame:
    """Samples of a strategy that wrote none: the columns of :func:`read_samples`, no rows."""
    return empty_frame(SAMPLE_COLUMNS, "phase")


def empty_events() -> pd.DataFrame:
    """Events of a strategy that wrote none: the columns of :func:`read_events`, no rows."""
    return empty_frame(EVENT_COLUMNS, "event")


def read_samples(path: Path, rows: int | None = None) -> pd.DataFrame:
    """A ``samples-<strategy>.csv``: numbers as float64 (empty cells NaN), ``phase`` as text; with ``rows`` (the
    record's ``sample_rows``), exactly that many rows or a :class:`RecordError`."""
    return read_csv(Path(path), SAMPLE_COLUMNS, "phase", rows)


def read_events(path: Path, rows: int | None = None) -> pd.DataFrame:
    """An ``events-<strategy>.csv``: numbers as float64 (empty cells NaN), ``event`` as text; with ``rows`` (the
    record's ``event_rows``), exactly that many rows or a :class:`RecordError`."""
    return read_csv(Path(path), EVENT_COLUMNS, "event", rows)
