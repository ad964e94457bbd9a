"""The results table: its columns and the text of each cell, from :mod:`harness.results.metrics` only.

One row per strategy, then the disk-read row where the run measured the disk (a cold
sequential ``read()`` of the checkpoint in the same run: the time reading the model once
takes on this disk, against which every strategy's read-bound time is set), then one per
reference figure measured elsewhere. The peak the
floor is compared with comes right before the floor and the excess, named for what it
is (``build-phase host peak``, or ``build-phase host + GPU peak`` on a GPU); whole-run
peaks, which include the load, follow in columns of their own. The markdown report
prints these rows, the notes check stamps them, and the figures are tested against them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.report.text import DASH, format_gib, format_percent, format_seconds, gib_decimals, status_text
from harness.results import labels
from harness.results.metrics import DiskMetrics, StrategyMetrics
from harness.results.reading import Results
from harness.results.record import Reference

__all__ = ["Column", "columns", "disk_cells", "reference_cells", "strategy_cells"]

_STATUS_CHARS = 160


@dataclass(frozen=True)
class Column:
    """One column: its header, the cell of a strategy, and the cell of a reference (a dash if it has none)."""

    header: str
    strategy: Callable[[StrategyMetrics, int], str]
    reference: Callable[[Reference, bool], str] = lambda reference, on_gpu: DASH
    disk: Callable[[DiskMetrics], str] = lambda disk: DASH


def _gib(value: float | None) -> str:
    return DASH if value is None else f"{value:g} GiB"


def _reference_compared(reference: Reference, on_gpu: bool) -> str:
    if reference.host_gpu_peak_gib is None:
        return DASH
    return _gib(reference.host_gpu_peak_gib) + ("" if on_gpu else " (host + GPU)")


def _status(m: StrategyMetrics, decimals: int) -> str:
    text = status_text(m, _STATUS_CHARS)
    return text if m.record.ok else f"**{text}**"


def _runs(m: StrategyMetrics) -> str:
    if m.runs <= 1:
        return "1"
    text = f"{m.runs_finished} of {m.runs}" if m.runs_finished != m.runs else str(m.runs)
    if m.wall_min_s is not None and m.wall_max_s is not None and m.wall_spread is not None:
        text += f": {m.wall_min_s:.1f}–{m.wall_max_s:.1f} s (±{m.wall_spread * 100:.0f}%)"
    return text


def _disk_runs(d: DiskMetrics) -> str:
    if d.reads <= 1:
        return "1"
    return f"{d.reads}: {d.min_bytes_per_s / 1e6:.0f}–{d.max_bytes_per_s / 1e6:.0f} MB/s"


def columns(run: Results) -> list[Column]:
    """The table's columns for ``run``: GPU columns only where engines were built on a GPU."""
    on_gpu = run.on_gpu
    cols = [
        Column("strategy", lambda m, d: m.name, lambda r, g: f"reference: {r.label} (reference, different setup)"),
        Column("host at partitioning", lambda m, d: format_gib(m.record.host_at_partitioning_bytes, d),
               lambda r, g: _gib(r.host_at_partitioning_gib)),
        Column(run.compared_label, lambda m, d: format_gib(m.compared_peak_bytes, d), _reference_compared),
        Column(labels.FLOOR, lambda m, d: format_gib(m.floor_bytes, d)),
        Column(labels.EXCESS_SHARE, lambda m, d: format_percent(m.excess)),
    ]
    if on_gpu:
        cols.append(Column(labels.BUILD_HOST_PEAK, lambda m, d: format_gib(m.record.build_peak_bytes, d)))
    cols += [
        Column(labels.WHOLE_RUN_HOST_PEAK, lambda m, d: format_gib(m.record.host_peak_bytes, d),
               lambda r, g: _gib(r.host_peak_gib)),
        Column(labels.ANON_ABOVE_BASELINE, lambda m, d: format_gib(m.anon_above_baseline_bytes, d)),
    ]
    if on_gpu:
        cols.append(Column(labels.WHOLE_RUN_GPU_PEAK, lambda m, d: format_gib(m.record.gpu_peak_bytes, d)))
    cols += [
        Column("released", lambda m, d: format_gib(m.record.released_bytes, d)),
        Column("prefetch", lambda m, d: m.record.prefetch or "off"),
        Column("resident at load start", lambda m, d: format_gib(m.resident_at_load_bytes, d)),
        Column("load time", lambda m, d: format_seconds(m.load_s), disk=lambda k: format_seconds(k.median_seconds)),
        Column("build time", lambda m, d: format_seconds(m.build_s)),
        Column("wall time", lambda m, d: format_seconds(m.wall_median_s if m.runs > 1 else m.record.wall_s),
               disk=lambda k: format_seconds(k.median_seconds)),
        Column("runs", lambda m, d: _runs(m), disk=_disk_runs),
        Column("status", _status, lambda r, g: "reference",
               lambda k: f"reference: {k.median_bytes_per_s / 1e6:.0f} MB/s, {k.median_cpu_seconds:.1f} CPU-s"),
    ]
    return cols


DISK_LABEL = "disk: cold sequential read() of the checkpoint, this run"


def disk_cells(run: Results) -> dict[str, str] | None:
    """``{header: cell}`` of the disk-read row; None where the run did not measure the disk."""
    disk = run.disk
    if disk is None:
        return None
    cells = {c.header: c.disk(disk) for c in columns(run)}
    cells["strategy"] = DISK_LABEL
    return cells


def strategy_cells(run: Results) -> dict[str, dict[str, str]]:
    """``{strategy: {header: cell}}`` for every strategy, in the order they ran."""
    decimals = gib_decimals(run.record.model.bytes)
    cols = columns(run)
    return {name: {c.header: c.strategy(m, decimals) for c in cols} for name, m in run.metrics.items()}


def reference_cells(run: Results) -> list[dict[str, str]]:
    """``{header: cell}`` for every reference of the run."""
    cols = columns(run)
    return [{c.header: c.reference(r, run.on_gpu) for c in cols} for r in run.record.references]
