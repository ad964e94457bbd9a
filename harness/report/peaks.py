"""``<name>.peaks.png``: the strategies' peaks side by side.

Groups, left to right: host at partitioning; the peak compared with the floor (the
build-phase host peak, or host + GPU on a GPU), with each strategy's floor drawn over
its bar; then the whole-run peaks, which include the load. The values are
:mod:`harness.results.metrics`' and are written on the bars as the table prints them.

The model-size line and the floors are named at their heights in a margin right of the last
group (:func:`level_labels`), nudged apart where they lie closer than a label's height, so that
a floor a few hundredths of a GiB above the model size (a GPU run's) is told from it.

A scenario's references (figures measured on another setup: another model export,
another GPU, another builder) are not drawn: beside the run's own bars they would invite
a comparison they cannot carry, and most of their cells were not measured there. The
report's table keeps them, with their notes; the figure says where they are.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.report.style import (
    FLOOR_STYLE,
    MODEL_STYLE,
    keep_units,
    model_label,
    new_figure,
    strategy_colour,
    styled,
)
from harness.report.text import gib_decimals, run_subject
from harness.results.metrics import StrategyMetrics
from harness.results.reading import Results
from harness.units import GIB

__all__ = ["level_labels", "peak_groups", "peaks_figure"]

Group = tuple[str, Callable[[StrategyMetrics], int | None]]

_MARGIN = 1.0  # x units right of the last group where the levels are named


def peak_groups(run: Results) -> list[Group]:
    """(label, strategy value in bytes) of each bar group."""
    groups: list[Group] = [
        ("host at\npartitioning", lambda m: m.record.host_at_partitioning_bytes),
        ("\n".join(textwrap.wrap(run.compared_label, 16)) + "\n(floor drawn)", lambda m: m.compared_peak_bytes),
        ("whole-run\nhost peak", lambda m: m.record.host_peak_bytes),
        ("anonymous peak\nabove baseline", lambda m: m.anon_above_baseline_bytes),
    ]
    if run.gpu_measured:
        groups.append(("whole-run\nGPU peak", lambda m: m.record.gpu_peak_bytes))
    return groups


def level_labels(levels: list[tuple[str, float]], gap: float) -> list[tuple[str, float, float]]:
    """``(text, level, label height)`` of horizontal levels ``(text, value)``: each label at its level, moved up
    as little as keeps it ``gap`` above the label below (lowest first), so that none overlaps another."""
    placed: list[tuple[str, float, float]] = []
    for text, value in sorted(levels, key=lambda level: level[1]):
        at = value if not placed else max(value, placed[-1][2] + gap)
        placed.append((text, value, at))
    return placed


def _name_levels(ax: Axes, levels: list[tuple[str, float, dict[str, Any]]], x: float, top: float) -> None:
    """Each level's line carried into the margin at ``x`` and named there, labels kept apart (:func:`level_labels`)."""
    styles = {text: style for text, _, style in levels}
    for text, value, at in level_labels([(text, value) for text, value, _ in levels], top * 0.045):
        ax.hlines(value, x, x + 0.18, zorder=5, **styles[text])
        if abs(at - value) > top * 0.005:  # moved: a leader from the line to its name
            ax.plot([x + 0.18, x + 0.24], [value, at], color="#777777", linewidth=0.8, zorder=5)
        ax.text(x + 0.26, at, text, va="center", ha="left", fontsize=9, zorder=6, gid=f"level:{text}")


def _bar_label(ax: Axes, x: float, value: float | None, text: str, top: float) -> None:
    """Write ``text`` upright above a bar (or ``n/a`` at the axis where there is no value)."""
    ax.text(x, (0.0 if value is None else value) + top * 0.012, "n/a" if value is None else text, rotation=90,
            ha="center", va="bottom", fontsize=9, zorder=6,
            bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8})


@styled
def peaks_figure(run: Results) -> Figure:
    """Grouped bars: each figure per strategy, the model size, and the floor; references left to the table."""
    record = run.record
    decimals = gib_decimals(record.model.bytes)
    groups = peak_groups(run)
    strategies = list(run.metrics.values())
    order = [s.name for s in strategies]
    series = len(strategies)
    fig = new_figure(12.0, 6.4, run)
    ax = fig.subplots()
    width = 0.8 / max(1, series)
    x = np.arange(len(groups), dtype="float64")
    values: list[float] = [record.model.bytes / GIB]
    bars: list[tuple[float, float | None, str]] = []
    handles: list[Any] = []
    floor_drawn = False
    for i, s in enumerate(strategies):
        colour = strategy_colour(s.name, order)
        for g, (offset, (_, value_of)) in enumerate(zip(x - 0.4 + width * (i + 0.5), groups, strict=True)):
            raw = value_of(s)
            value = None if raw is None else raw / GIB
            if value is not None:
                ax.bar(offset, value, width, color=colour, alpha=1.0 if s.record.ok else 0.45, edgecolor="white",
                       gid=f"peak:{g}:{s.name}")
                values.append(value)
            bars.append((offset, value, "" if value is None else f"{value:.{decimals}f}"))
            if g == 1 and s.floor_bytes is not None:
                ax.hlines(s.floor_bytes / GIB, offset - width * 0.6, offset + width * 0.6, zorder=5,
                          gid=f"floor:{s.name}", **FLOOR_STYLE)
                values.append(s.floor_bytes / GIB)
                floor_drawn = True
        handles.append(Patch(color=colour, alpha=1.0 if s.record.ok else 0.45,
                             label=s.name if s.record.ok else f"{s.name} (FAILED, partial)"))
    top = (max(values) or 1.0) * 1.22
    for offset, value, text in bars:
        _bar_label(ax, offset, value, text, top)
    ax.hlines(record.model.bytes / GIB, -0.5, len(groups) - 0.5, zorder=4, gid="model", **MODEL_STYLE)
    handles.append(Line2D([], [], label=model_label(run), **MODEL_STYLE))
    if floor_drawn:
        handles.append(Line2D([], [], label=f"floor of the {run.compared_label}", **FLOOR_STYLE))
    floors = {f"{s.floor_bytes / GIB:.{decimals}f}": s.floor_bytes / GIB for s in strategies
              if s.floor_bytes is not None}
    levels = [(f"model size {record.model.bytes / GIB:.{decimals}f}", record.model.bytes / GIB, MODEL_STYLE)]
    levels += [(f"floor {text}", value, FLOOR_STYLE) for text, value in floors.items()]
    _name_levels(ax, levels, len(groups) - 0.45, top)
    ax.set_xticks(x, [label for label, _ in groups])
    ax.set_xlim(-0.5, len(groups) - 0.5 + _MARGIN)
    ax.set_ylim(0, top)
    ax.set_ylabel("GiB")
    subtitle = (f"values in GiB, {decimals} decimals; model size and floors named on the right"
                + ("" if run.gpu_measured else "; no GPU"))
    if record.references:
        subtitle += "; the references measured on another setup are in the report's table, not drawn here"
    ax.set_title(textwrap.fill(subtitle, 120), loc="left", color="#555555")
    for handle in handles:
        handle.set_label("\n".join(textwrap.wrap(keep_units(handle.get_label()), 36)))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)
    fig.suptitle(f"{run.name}: memory peaks by loading strategy ({run_subject(run)})", fontsize=12,
                 fontweight="bold")
    return fig
