"""``<name>-peaks.png``: the strategies' peaks side by side, with reference figures hatched."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.metrics import compared_label
from harness.report.style import (
    FLOOR_STYLE,
    MODEL_STYLE,
    figure_legend,
    model_label,
    new_figure,
    strategy_colour,
    styled,
)
from harness.report.text import GIB, gib_decimals
from harness.results import Results

_REFERENCE_HATCHES = ("//", "\\\\", "xx", "..")


def _peak_metrics(run: Results) -> list[tuple[str, str]]:
    """(attribute, label) of the bar groups; host + GPU only when a GPU was measured."""
    metrics = [
        ("host_at_partitioning", "host at\npartitioning"),
        ("host_peak", "host peak"),
        ("anon_peak", "anonymous peak"),
    ]
    if run.gpu_measured:
        metrics.append(("host_gpu_peak", "host + GPU peak"))
    return metrics


def _bar_label(ax: Axes, x: float, value: float | None, text: str, top: float) -> None:
    """Write ``text`` upright above a bar (or ``n/a`` at the axis where there is no value)."""
    text = "n/a" if value is None else text
    y = 0.0 if value is None else value
    ax.text(
        x,
        y + top * 0.012,
        text,
        rotation=90,
        ha="center",
        va="bottom",
        fontsize=9,
        zorder=6,
        bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
    )


@styled
def peaks_figure(run: Results) -> Figure:
    """Grouped bars: each metric's value per strategy, references hatched, model size and floor."""
    record = run.record
    decimals = gib_decimals(record.model.bytes)
    metrics = _peak_metrics(run)
    strategies = list(run.metrics.values())
    order = [s.name for s in strategies]
    series = len(strategies) + len(record.references)
    fig = new_figure(max(9.0, 2.2 * len(metrics) + 0.5 * series * len(metrics) / 2), 6.4, run)
    ax = fig.subplots()
    width = 0.8 / max(1, series)
    x = np.arange(len(metrics), dtype="float64")
    values: list[float] = [record.model.bytes / GIB]
    bars: list[tuple[float, float | None, str]] = []
    handles: list[Any] = []
    compared = "host_gpu_peak" if run.on_gpu else "host_peak"
    floor_drawn = False
    for i, s in enumerate(strategies):
        colour = strategy_colour(s.name, order)
        offsets = x - 0.4 + width * (i + 0.5)
        for offset, (attribute, _) in zip(offsets, metrics, strict=True):
            raw = getattr(record.strategies[s.name], f"{attribute}_bytes")
            value = None if raw is None else raw / GIB
            if value is not None:
                ax.bar(offset, value, width, color=colour, alpha=1.0 if s.ok else 0.45, edgecolor="white")
                values.append(value)
            bars.append((offset, value, "" if value is None else f"{value:.{decimals}f}"))
            floor = s.floor_bytes
            if attribute == compared and floor is not None:
                ax.hlines(floor / GIB, offset - width * 0.6, offset + width * 0.6, zorder=5, **FLOOR_STYLE)
                values.append(floor / GIB)
                floor_drawn = True
        label = s.name if s.ok else f"{s.name} (FAILED, partial)"
        handles.append(Patch(color=colour, alpha=1.0 if s.ok else 0.45, label=label))
    for j, ref in enumerate(record.references):
        i = len(strategies) + j
        hatch = _REFERENCE_HATCHES[j % len(_REFERENCE_HATCHES)]
        offsets = x - 0.4 + width * (i + 0.5)
        for offset, (attribute, _) in zip(offsets, metrics, strict=True):
            value = getattr(ref, f"{attribute}_gib", None)
            if value is not None:
                ax.bar(offset, value, width, facecolor="white", edgecolor="#666666", hatch=hatch, linewidth=1)
                values.append(value)
            bars.append((offset, value, "" if value is None else f"{value:g}"))
        handles.append(
            Patch(
                facecolor="white",
                edgecolor="#666666",
                hatch=hatch,
                label=f"reference: {ref.label} (different setup)",
            )
        )
    top = (max(values) or 1.0) * 1.22
    for offset, value, text in bars:
        _bar_label(ax, offset, value, text, top)
    ax.axhline(record.model.bytes / GIB, zorder=4, **MODEL_STYLE)
    handles.append(Line2D([], [], label=model_label(run), **MODEL_STYLE))
    if floor_drawn:
        floor_label = f"floor: lowest possible {compared_label(run.on_gpu)}"
        handles.append(Line2D([], [], label=floor_label, **FLOOR_STYLE))
    ax.set_xticks(x, [label for _, label in metrics])
    ax.set_xlim(-0.5, len(metrics) - 0.5)
    ax.set_ylim(0, top)
    ax.set_ylabel("GiB")
    if not run.gpu_measured:
        ax.set_title("no GPU: host + GPU peak not measured", loc="right", color="#555555")
    ax.set_title(f"values in GiB, {decimals} decimals", loc="left", color="#555555")
    figure_legend(fig, handles, f"{run.name}: memory peaks by loading strategy ({record.model.name})")
    return fig
