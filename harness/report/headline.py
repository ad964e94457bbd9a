"""``<name>-headline.png``: how far each strategy lands from its floor, and where its time goes.

Top: one bar per strategy, from zero to the peak compared with the floor (the
build-phase host peak, or host + GPU on a GPU), its baseline shaded, the floor drawn
across it and the excess written at its end, exactly as the table prints them. Where the
whole run went higher (the load), an outline carries the bar on to that peak. Bottom:
seconds spent loading, then building each engine, every engine labelled, one bar per
strategy.
"""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from harness.catalog import strategy_label
from harness.report.style import FLOOR_STYLE, figure_legend, new_figure, strategy_colour, styled
from harness.report.text import GIB, format_gib, format_percent, format_seconds, gib_decimals, status_text
from harness.results.metrics import StrategyMetrics, floor_formula
from harness.results.reading import Results

__all__ = ["headline_figure"]

BASELINE_COLOUR = "#D9D9D9"
_BAR = 0.62  # bar height, in rows


def _failure(m: StrategyMetrics, planned: int) -> str:
    """How far a failed strategy got: every engine built (it failed after, in its check), or some."""
    if m.engines_built >= planned:
        return f"all {planned} engines built, then {status_text(m, 60)}"
    return f"partial: FAILED after {m.engines_built} of {planned} engines"


def _peaks_panel(ax: Axes, run: Results, order: list[str]) -> None:
    decimals = gib_decimals(run.record.model.bytes)
    metrics = list(run.metrics.values())
    values = [v for m in metrics for v in (m.compared_peak_bytes, m.record.host_peak_bytes, m.floor_bytes) if v]
    right = max(values, default=GIB) / GIB
    for row, m in enumerate(metrics):
        y = len(metrics) - 1 - row
        colour = strategy_colour(m.name, order)
        peak = m.compared_peak_bytes
        if peak is None:
            ax.text(0.01, y, status_text(m, 90), va="center", color="#B00000", transform=ax.get_yaxis_transform())
            continue
        base = min(m.record.baseline_rss_bytes or 0, peak)
        ax.barh(y, base / GIB, _BAR, color=BASELINE_COLOUR, zorder=2)
        bar = ax.barh(y, (peak - base) / GIB, _BAR, left=base / GIB, color=colour, alpha=1.0 if m.record.ok else 0.45,
                      zorder=2)
        bar.patches[0].set_gid(f"compared:{m.name}")
        whole = m.record.host_peak_bytes
        if whole is not None and (whole - peak) / GIB > 0.03 * right:
            outline = Rectangle((peak / GIB, y - _BAR / 2), (whole - peak) / GIB, _BAR, fill=False,
                                edgecolor=colour, linestyle=(0, (4, 2)), linewidth=1.4, zorder=2)
            outline.set_gid(f"whole-run:{m.name}")
            ax.add_patch(outline)
            note = ax.text(whole / GIB, y + _BAR / 2 + 0.03, f"whole-run host peak {format_gib(whole, decimals)}",
                           va="bottom", ha="right", fontsize=9, color="#333333")
            note.set_in_layout(False)
        if m.floor_bytes is not None:
            line = ax.vlines(m.floor_bytes / GIB, y - _BAR / 2 - 0.08, y + _BAR / 2 + 0.08, zorder=4, **FLOOR_STYLE)
            line.set_gid(f"floor:{m.name}")
        if m.record.ok and m.excess is not None:
            text = (f"{format_gib(peak, decimals)}: {format_percent(m.excess)} of the model above the floor"
                    if m.excess >= 0 else
                    f"{format_gib(peak, decimals)}: {format_percent(-m.excess).lstrip('+')} of the model "
                    "below the floor")
        else:
            text = f"{format_gib(peak, decimals)}, {_failure(m, run.record.engines)}"
        label = ax.text(peak / GIB + right * 0.01, y + 0.02, text, va="center", ha="left", fontsize=10,
                        fontweight="bold", color="#000000" if m.record.ok else "#B00000", zorder=5,
                        bbox={"boxstyle": "square,pad=0.15", "facecolor": "white", "edgecolor": "none",
                              "alpha": 0.85})
        label.set_gid(f"excess:{m.name}")
        label.set_in_layout(False)  # the axis leaves room for it; it must not shrink the axes
    ticks = [f"{m.name}\n" + "\n".join(textwrap.wrap(strategy_label(m.name), 26)) for m in metrics]
    ax.set_yticks(range(len(metrics) - 1, -1, -1), ticks)
    for tick, m in zip(ax.get_yticklabels(), metrics, strict=True):
        tick.set_color(strategy_colour(m.name, order))
    # room for the text after each bar (about 40% of the axis); an outline's label sits above its end
    ends = [max((m.compared_peak_bytes or 0) / GIB / 0.6, (m.record.host_peak_bytes or 0) / GIB * 1.04)
            for m in metrics]
    ax.set_xlim(0, max(ends, default=0.0) or 1.0)  # no peak at all (every strategy failed before one): 1 GiB
    ax.set_ylim(-0.6, len(metrics) - 0.4)
    ax.set_xlabel("GiB")
    ax.grid(axis="x", color="#E5E5E5", zorder=0)
    floor = floor_formula(run.on_gpu, run.engines_accumulate)
    ax.set_title(f"{run.compared_label} against its floor ({floor})", loc="left")


def _times_panel(ax: Axes, run: Results, order: list[str]) -> None:
    metrics = list(run.metrics.values())
    engines = sorted({i for m in metrics for i, _ in m.engine_s})
    labels = ["load", *map(str, engines)]
    x = np.arange(len(labels), dtype="float64")
    width = 0.8 / max(1, len(metrics))
    for i, m in enumerate(metrics):
        seconds = dict(m.engine_s)
        heights = [m.load_s if m.load_s is not None else np.nan] + [seconds.get(e, np.nan) for e in engines]
        ax.bar(x - 0.4 + width * (i + 0.5), heights, width, color=strategy_colour(m.name, order),
               alpha=1.0 if m.record.ok else 0.45, zorder=2, gid=f"times:{m.name}")
    ax.set_xticks(x, labels, rotation=90 if len(labels) > 40 else 0)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_ylabel("seconds")
    ax.set_xlabel("phase: the load, then engine by engine in build order")
    ax.grid(axis="y", color="#E5E5E5", zorder=0)
    ax.set_title("where the time goes: the load, then each engine's build", loc="left")


def _legend(run: Results, order: list[str]) -> list[Any]:
    handles: list[Any] = []
    for m in run.metrics.values():
        wall = f"wall {format_seconds(m.record.wall_s)}" if m.record.wall_s is not None else "no wall time"
        parts = [wall]
        if m.load_s is not None and m.build_s is not None:
            parts.append(f"load {format_seconds(m.load_s)} + build {format_seconds(m.build_s)}")
        label = f"{m.name}: {', '.join(parts)}" + ("" if m.record.ok else " (FAILED)")
        handles.append(Patch(color=strategy_colour(m.name, order), alpha=1.0 if m.record.ok else 0.45, label=label))
    handles += [
        Patch(color=BASELINE_COLOUR, label="baseline (before the load)"),
        Line2D([], [], label="floor", **FLOOR_STYLE),
        Patch(fill=False, edgecolor="#555555", linestyle=(0, (4, 2)), label="whole-run host peak, where higher"),
    ]
    return handles


def _model_text(run: Results) -> str:
    model = run.record.model
    return f"{model.name}, {format_gib(model.bytes, gib_decimals(model.bytes))}, {run.record.engines} engines"


@styled
def headline_figure(run: Results) -> Figure:
    """The build-phase peak of each strategy against its floor, and its time per phase and engine."""
    order = list(run.metrics)
    rows = max(1, len(order))
    fig = new_figure(12.0, 3.6 + 0.95 * rows + 3.0, run)
    top, bottom = fig.subplots(2, 1, height_ratios=(0.95 * rows + 0.6, 3.0))
    _peaks_panel(top, run, order)
    _times_panel(bottom, run, order)
    title = f"{run.name}: how far each loading strategy lands from its floor ({_model_text(run)})"
    figure_legend(fig, _legend(run, order), title)
    return fig
