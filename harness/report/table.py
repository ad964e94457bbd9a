"""The results table: its columns and the text of each cell, from :mod:`harness.results.metrics` only.

One row per strategy, then the disk-read row where the run measured the disk (a cold
sequential ``read()`` of the checkpoint in the same run: the time reading the model once
takes on this disk, against which every strategy's read-bound time is set), then one per
reference figure measured elsewhere. The peak the
floor is compared with comes right before the floor and the excess, named for what it
is (``build-phase host peak``, or ``build-phase host + GPU peak`` on a GPU); whole-run
peaks, which include the load, follow in columns of their own. The markdown report
prints these rows, the notes check stamps them, and the figures are tested against them.

The table is one :class:`~harness.report.text.TableColumn` per column, rendered by
:func:`~harness.report.text.markdown_table` like every other table of the reports; its row
is a :data:`TableRow`, one of the three kinds of row, and each column gives a cell for each kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.report.prediction import GPU_PEAK, error_cell, predicted_cell, predictions
from harness.report.text import TableColumn, format_percent, format_seconds, gib_decimals, markdown_table, status_text
from harness.results import labels
from harness.results.metrics import DiskMetrics, StrategyMetrics
from harness.results.reading import Results
from harness.results.record import Reference
from harness.units import DASH, MB, format_gib, format_gib_figure, format_mb_per_s

__all__ = [
    "DISK_LABEL",
    "DiskRow",
    "ReferenceRow",
    "StrategyRow",
    "TableRow",
    "columns",
    "rows",
    "strategy_cells",
    "table_lines",
]

_STATUS_CHARS = 160

DISK_LABEL = "disk: cold sequential read() of the checkpoint, this run"
"""The strategy cell of the disk-read row."""


@dataclass(frozen=True)
class StrategyRow:
    """A strategy's row: its metrics, and the decimals of the run's GiB figures (:func:`gib_decimals`)."""

    metrics: StrategyMetrics
    decimals: int


@dataclass(frozen=True)
class DiskRow:
    """The disk-read row: the run's cold sequential reads of the checkpoint."""

    disk: DiskMetrics


@dataclass(frozen=True)
class ReferenceRow:
    """A reference figure measured elsewhere, and whether this run built on a GPU (which names its peak)."""

    reference: Reference
    on_gpu: bool


TableRow = StrategyRow | DiskRow | ReferenceRow
"""A row of the results table: a strategy, the disk read, or a reference."""


def _column(header: str, strategy: Callable[[StrategyMetrics, int], str],
            reference: Callable[[Reference, bool], str] | None = None,
            disk: Callable[[DiskMetrics], str] | None = None, *, text: bool = False) -> TableColumn[TableRow]:
    """A column of the results table: its header, the cell of a strategy, of a reference and of the disk read
    (a dash where a kind of row has none)."""
    def value(row: TableRow) -> str:
        if isinstance(row, StrategyRow):
            return strategy(row.metrics, row.decimals)
        if isinstance(row, DiskRow):
            return DASH if disk is None else disk(row.disk)
        return DASH if reference is None else reference(row.reference, row.on_gpu)

    return TableColumn(header, value, text=text)


def _reference_compared(reference: Reference, on_gpu: bool) -> str:
    if reference.host_gpu_peak_gib is None:
        return DASH
    return format_gib_figure(reference.host_gpu_peak_gib) + ("" if on_gpu else " (host + GPU)")


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
    return f"{d.reads}: {d.min_bytes_per_s / MB:.0f}–{format_mb_per_s(d.max_bytes_per_s)}"


def columns(run: Results) -> list[TableColumn[TableRow]]:
    """The table's columns for ``run``: GPU columns only where engines were built on a GPU, the GPU peak's
    prediction beside it only where the run measured the GPU. The strategy and the status columns are text (aligned
    left), every other one aligned right."""
    on_gpu = run.on_gpu
    cols = [
        _column("strategy", lambda m, d: m.name, lambda r, g: f"reference: {r.label} (reference, different setup)",
                lambda k: DISK_LABEL, text=True),
        _column("host at partitioning", lambda m, d: format_gib(m.record.host_at_partitioning_bytes, d),
                lambda r, g: format_gib_figure(r.host_at_partitioning_gib)),
        _column(run.compared_label, lambda m, d: format_gib(m.compared_peak_bytes, d), _reference_compared),
        _column(labels.FLOOR, lambda m, d: format_gib(m.floor_bytes, d)),
        _column(labels.EXCESS_SHARE, lambda m, d: format_percent(m.excess)),
    ]
    if on_gpu:
        cols.append(_column(labels.BUILD_HOST_PEAK, lambda m, d: format_gib(m.record.build_peak_bytes, d)))
    predicted = predictions(run)
    cols += [
        _column(labels.PREDICTED_BUILD_PEAK, lambda m, d: predicted_cell(predicted[m.name], d)),
        _column(labels.PREDICTION_ERROR, lambda m, d: error_cell(run, m.name, predicted[m.name])),
    ]
    cols += [
        _column(labels.WHOLE_RUN_HOST_PEAK, lambda m, d: format_gib(m.record.host_peak_bytes, d),
                lambda r, g: format_gib_figure(r.host_peak_gib)),
        _column(labels.ANON_ABOVE_BASELINE, lambda m, d: format_gib(m.anon_above_baseline_bytes, d)),
    ]
    if on_gpu:
        cols.append(_column(labels.WHOLE_RUN_GPU_PEAK, lambda m, d: format_gib(m.record.gpu_peak_bytes, d)))
    if on_gpu and run.gpu_measured:
        cols += [
            _column(labels.PREDICTED_GPU_PEAK, lambda m, d: predicted_cell(predicted[m.name], d, GPU_PEAK)),
            _column(labels.GPU_PREDICTION_ERROR, lambda m, d: error_cell(run, m.name, predicted[m.name], GPU_PEAK)),
        ]
    cols += [
        _column("released", lambda m, d: format_gib(m.record.released_bytes, d)),
        _column("prefetch", lambda m, d: m.record.prefetch or "off"),
        _column("resident at load start", lambda m, d: format_gib(m.resident_at_load_bytes, d)),
        _column("load time", lambda m, d: format_seconds(m.load_s), disk=lambda k: format_seconds(k.median_seconds)),
        _column("build time", lambda m, d: format_seconds(m.build_s)),
        _column("wall time", lambda m, d: format_seconds(m.wall_median_s if m.runs > 1 else m.record.wall_s),
                disk=lambda k: format_seconds(k.median_seconds)),
        _column("runs", lambda m, d: _runs(m), disk=_disk_runs),
        _column("status", _status, lambda r, g: "reference",
                lambda k: f"reference: {format_mb_per_s(k.median_bytes_per_s)}, {k.median_cpu_seconds:.1f} CPU-s",
                text=True),
    ]
    return cols


def _strategy_rows(run: Results) -> dict[str, StrategyRow]:
    decimals = gib_decimals(run.record.model.bytes)
    return {name: StrategyRow(m, decimals) for name, m in run.metrics.items()}


def rows(run: Results) -> list[TableRow]:
    """The table's rows for ``run``: a row per strategy in the order they ran, the disk-read row where the run
    measured the disk, then a row per reference."""
    found: list[TableRow] = list(_strategy_rows(run).values())
    if run.disk is not None:
        found.append(DiskRow(run.disk))
    found += [ReferenceRow(r, run.on_gpu) for r in run.record.references]
    return found


def table_lines(run: Results) -> list[str]:
    """The table as markdown lines (:func:`~harness.report.text.markdown_table` of :func:`columns` and
    :func:`rows`)."""
    return markdown_table(columns(run), rows(run))


def strategy_cells(run: Results) -> dict[str, dict[str, str]]:
    """``{strategy: {header: cell}}`` for every strategy, in the order they ran (the cells as computed, before
    :func:`~harness.report.text.cell` makes them safe inside the markdown table)."""
    cols = columns(run)
    return {name: {c.header: c.value(row) for c in cols} for name, row in _strategy_rows(run).items()}
