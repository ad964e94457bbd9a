"""``<base>-vs-<new>.md`` and ``<base>-vs-<new>.png``: a :class:`~harness.results.comparison.Comparison` for
a reviewer.

The markdown names both runs (name, scenario, commit, creation, machine), says what moved beyond the
noise, then gives a memory table (each figure's delta NEW − BASE in GiB and in % of BASE's model), each run's
predicted build-phase host peak beside its measured one (:mod:`harness.report.prediction`), a
time table (BASE median → NEW median, the ratio NEW / BASE and its interval), and the methods behind
the noise and the intervals. The figure shows, per strategy, the time ratios as points with their
intervals around 1, and the memory deltas as bars against the noise band.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.fileio.atomic import write_atomic
from harness.report.prediction import error_cell, predicted_cell, predictions
from harness.report.style import SERIES_COLOURS, STYLE, figure_legend, save_figure
from harness.report.text import TableColumn, gib_decimals, machine_text, markdown_table, short_commit
from harness.results.comparison import TIME_RESOLUTION_S, TIMES, Comparison, MemoryDelta, StrategyComparison, TimeRatio
from harness.results.labels import (
    ANON_ABOVE_BASELINE,
    BUILD_HOST_GPU_PEAK,
    BUILD_HOST_PEAK,
    EXCESS,
    FLOOR,
    PREDICTED_BUILD_PEAK,
    PREDICTION_ERROR,
    WHOLE_RUN_GPU_PEAK,
    WHOLE_RUN_HOST_PEAK,
)
from harness.results.names import comparison_name as name_of_comparison
from harness.results.reading import Results
from harness.results.spread import chance_flag
from harness.units import DASH, GIB, format_gib

__all__ = ["UNTIMED", "comparison_figure", "comparison_markdown", "comparison_name", "write_comparison"]

_UP, _DOWN = "▲", "▼"
_TIME_COLOURS = {"wall": "#000000", "load": "#E69F00", "build": "#0072B2"}
_MEMORY_COLOURS = {
    BUILD_HOST_PEAK: "#0072B2",
    BUILD_HOST_GPU_PEAK: SERIES_COLOURS["host_gpu"],
    FLOOR: SERIES_COLOURS["floor"],
    EXCESS: "#D55E00",
    WHOLE_RUN_HOST_PEAK: "#56B4E9",
    ANON_ABOVE_BASELINE: SERIES_COLOURS["anon"],
    WHOLE_RUN_GPU_PEAK: SERIES_COLOURS["gpu"],
}


def comparison_name(comparison: Comparison) -> str:
    """``<base>-vs-<new>``: the file name of the comparison's report and figure, without suffix (no results name
    holds ``-vs-``: :mod:`harness.results.names`)."""
    return name_of_comparison(comparison.base.name, comparison.new.name)


def _rounds(results: Results) -> str:
    counts = sorted({len(m.record.repeats) or 1 for m in results.metrics.values()})
    return f"{counts[0]} to {counts[-1]}" if len(counts) > 1 else str(counts[0])


def _header(comparison: Comparison) -> list[str]:
    rows: list[tuple[str, Callable[[Results], str]]] = [
        ("results", lambda r: str(r.directory)),
        ("scenario", lambda r: r.record.scenario),
        ("commit", lambda r: short_commit(r.record.commit)),
        ("created", lambda r: r.record.created or "unknown"),
        ("machine", machine_text),
        ("device, backend, cache", lambda r: f"{r.record.device}, {r.record.backend}, {r.record.cache}"),
        ("model", lambda r: f"{r.record.model.name}, {format_gib(r.record.model.bytes)}"),
        ("rounds per strategy", _rounds),
    ]
    columns: list[TableColumn[tuple[str, Callable[[Results], str]]]] = [
        TableColumn("", lambda row: row[0], text=True),
        TableColumn("BASE", lambda row: row[1](comparison.base), text=True),
        TableColumn("NEW", lambda row: row[1](comparison.new), text=True),
    ]
    return markdown_table(columns, rows)


def _verdict(comparison: Comparison) -> list[str]:
    lines = [f"- {note[0].upper()}{note[1:]}." for note in comparison.notes]
    for which, names in (("BASE", comparison.only_base), ("NEW", comparison.only_new)):
        if names:
            lines.append(f"- Only in {which}, not compared: {', '.join(names)}.")
    flagged = comparison.flagged()
    regressions = "; ".join(r.describe() for r in comparison.regressions())
    if not flagged:
        lines.append("- Nothing moved beyond the noise" + (f"; regressions: {regressions}." if regressions else "."))
    else:
        lines.append(f"- {flagged} figure{'s' if flagged != 1 else ''} moved beyond the noise "
                     f"({_UP} up or slower, {_DOWN} down or faster); regressions: {regressions or 'none'}.")
    untimed = comparison.untimed()
    if untimed:
        which = "any strategy" if len(untimed) == len(comparison.strategies) else ", ".join(untimed)
        lines.append(f"- {UNTIMED.format(which=which)}")
    return lines


UNTIMED = ("Time regressions cannot be marked for {which}: one round in BASE or in NEW gives a time no interval, "
           "so no change of time is marked, however large; run both with [run] repeats = 3 or more to compare "
           "times.")
"""What the report (and ``compare --fail-on-regression``) says where a strategy has one round on a side."""


def _mark(up: bool) -> str:
    return f" {_UP}" if up else f" {_DOWN}"


def _signed(value: float, decimals: int) -> str:
    """``value`` with its sign (``+1.25``, ``−0.40``) to ``decimals`` places; one that shows as zero has none
    (``0.00``), whichever side of zero it was."""
    text = f"{value:+.{decimals}f}"
    if float(text) == 0:
        return f"{0:.{decimals}f}"
    return text.replace("-", "−")


def _memory_cell(delta: MemoryDelta, decimals: int) -> str:
    if delta.delta_bytes is None or delta.delta_fraction is None:
        return DASH
    text = f"{_signed(delta.delta_bytes / GIB, decimals)} GiB, {_signed(delta.delta_fraction * 100, 1)}%"
    return text + (_mark(delta.delta_bytes > 0) if delta.flagged else "")


def _memory_table(comparison: Comparison) -> list[str]:
    decimals = gib_decimals(comparison.base.record.model.bytes)
    labels = [d.label for d in comparison.strategies[0].memory]

    def column(i: int) -> Callable[[StrategyComparison], str]:
        return lambda s: _memory_cell(s.memory[i], decimals)

    columns: list[TableColumn[StrategyComparison]] = [TableColumn("strategy", lambda s: s.name, text=True)]
    columns += [TableColumn(label, column(i)) for i, label in enumerate(labels)]
    columns.append(TableColumn("noise", lambda s: f"{format_gib(s.noise_bytes, decimals)}, "
                                                  f"{s.noise_bytes / s.memory[0].model_bytes:.1%}"))
    return markdown_table(columns, comparison.strategies)


def _prediction_table(comparison: Comparison) -> list[str]:
    """Each run's predicted build-phase host peak (:mod:`harness.report.prediction`) and its error, side by side."""
    decimals = gib_decimals(comparison.base.record.model.bytes)
    sides = {"BASE": comparison.base, "NEW": comparison.new}
    found = {role: predictions(run) for role, run in sides.items()}

    def predicted(role: str) -> Callable[[StrategyComparison], str]:
        return lambda s: predicted_cell(found[role][s.name], decimals)

    def error(role: str) -> Callable[[StrategyComparison], str]:
        return lambda s: error_cell(sides[role], s.name, found[role][s.name])

    columns: list[TableColumn[StrategyComparison]] = [TableColumn("strategy", lambda s: s.name, text=True)]
    for role in sides:
        columns += [TableColumn(f"{role} {PREDICTED_BUILD_PEAK}", predicted(role)),
                    TableColumn(f"{role} {PREDICTION_ERROR}", error(role))]
    return markdown_table(columns, comparison.strategies)


def _seconds(*values: float) -> list[str]:
    """``values`` to the same decimal places, so that they read against each other: three significant digits
    of the largest, less the trailing zeros they all have (``18.0 → 19.2``, ``0.023 → 0.020``, ``10 → 20``);
    whole seconds from 100 s (``99 → 120``)."""
    largest = max((abs(v) for v in values), default=0.0)
    decimals = 0 if largest >= 100 or largest == 0 else min(6, 2 - math.floor(math.log10(largest)))
    texts = [f"{v:.{decimals}f}" for v in values]
    while decimals and all(t.endswith("0") for t in texts):
        decimals -= 1
        texts = [t[:-1].rstrip(".") if decimals == 0 else t[:-1] for t in texts]
    return texts


def _time_cell(ratio: TimeRatio) -> str:
    r = ratio.ratio
    if r is None:
        return DASH
    base, new = _seconds(r.base.median, r.new.median)
    text = f"{base} → {new} s: {r.value:.2f}×"
    if r.low is not None and r.high is not None:
        text += f" [{r.low:.2f}, {r.high:.2f}]"
    return text + (_mark(r.value > 1) if ratio.flagged else "")


def _time_table(comparison: Comparison) -> list[str]:
    def column(name: str) -> Callable[[StrategyComparison], str]:
        return lambda s: _time_cell(s.time(name))

    def rounds(s: StrategyComparison) -> str:
        return " / ".join(str(len(m.record.repeats) or 1) for m in (s.base, s.new))

    columns: list[TableColumn[StrategyComparison]] = [TableColumn("strategy", lambda s: s.name, text=True),
                                                      TableColumn("rounds", rounds)]
    columns += [TableColumn(name, column(name)) for name in TIMES]
    return markdown_table(columns, comparison.strategies)


def _methods(comparison: Comparison) -> list[str]:
    """Each interval method used, once, with the strategies it applies to."""
    used: dict[str, list[str]] = {}
    for s in comparison.strategies:
        for t in s.times:
            if t.ratio is not None and s.name not in used.setdefault(t.ratio.method, []):
                used[t.ratio.method].append(s.name)
    lines = [f"- {next(iter(used))}."] if len(used) == 1 else [
        f"- {', '.join(names)}: {method}." for method, names in used.items()]
    chances = [chance_flag(t.ratio.base, t.ratio.new) for s in comparison.strategies for t in s.times
               if t.ratio is not None and t.ratio.low is not None]
    known = [c for c in chances if c is not None]
    if known:
        lines.append(f"- With no change, about {sum(known):.1f} of these {len(known)} ratios would be marked by "
                     "chance; a slower machine (shared, or another one) moves every time together.")
    return lines


def comparison_markdown(comparison: Comparison, figure: str | None = None) -> str:
    """The comparison in markdown; ``figure`` is the file name of its figure, to link."""
    base, new = comparison.base, comparison.new
    model = base.record.model.bytes
    lines = [f"# {base.name} (BASE) vs {new.name} (NEW)", "", *_header(comparison), "", *_verdict(comparison), ""]
    if figure:
        lines += [f"![{base.name} vs {new.name}]({figure})", ""]
    if not comparison.strategies:
        lines.append("No strategy ran in both.")
        return "\n".join(lines) + "\n"
    lines += [
        "## Memory",
        "",
        f"NEW − BASE, in GiB and in % of BASE's model ({format_gib(model, gib_decimals(model))}); figures from "
        "each run's record (with repeats, its representative round). Marked when larger than the strategy's noise "
        f"({_UP} up, {_DOWN} down): "
        + "; ".join(sorted({s.noise_source for s in comparison.strategies}))
        + "; for a maximum of samples (anonymous peak, whole-run GPU peak), the largest rise between two "
        "consecutive samples in either run where that is wider (a peak between samples is missed by up to "
        "that). "
        "A rise of the floor is the plan's (baseline + engines), not counted as a regression, nor is the part of "
        "a peak's rise that the floor's rise explains: a peak is a regression where it rose beyond the noise "
        "once that is taken off.",
        "",
        *_memory_table(comparison),
        "",
        "Each run's build-phase host peak beside its prediction (`python -m harness predict`, from that run's own "
        "engines and baseline), predicted − measured in % of that run's model:",
        "",
        *_prediction_table(comparison),
        "",
        "## Time",
        "",
        "BASE median → NEW median over each strategy's finished rounds, the ratio NEW / BASE and its interval; "
        f"marked only when the interval excludes 1 and the medians differ by "
        f"{TIME_RESOLUTION_S:g} s or more ({_UP} slower, {_DOWN} faster).",
        "",
        *_time_table(comparison),
        "",
        "Intervals:",
        "",
        *_methods(comparison),
    ]
    return "\n".join(lines) + "\n"


def _title(comparison: Comparison) -> str:
    def run(r: Results, role: str) -> str:
        return f"{r.name} ({role}: commit {short_commit(r.record.commit, 10)}, {r.record.created or 'undated'})"

    return f"{run(comparison.base, 'BASE')} vs {run(comparison.new, 'NEW')}"


def _ratio_panel(ax: Axes, comparison: Comparison) -> None:
    """Each strategy's time ratios NEW / BASE as points with their intervals, around 1 (log scale)."""
    finite = [v for s in comparison.strategies for t in s.times if t.ratio is not None
              for v in (t.ratio.value, t.ratio.low, t.ratio.high) if v is not None and np.isfinite(v) and v > 0]
    spread = max([abs(np.log2(v)) for v in finite] + [np.log2(1.25)]) * 1.15
    low, high = 2.0 ** -spread, 2.0 ** spread
    offsets = dict(zip(TIMES, (-0.25, 0.0, 0.25), strict=True))
    for row, s in enumerate(comparison.strategies):
        for t in s.times:
            r = t.ratio
            if r is None:
                continue
            y = row + offsets[t.time]
            colour = _TIME_COLOURS[t.time]
            if r.low is not None and r.high is not None:
                ax.plot([r.low, min(r.high, high)], [y, y], color=colour, linewidth=1.6, solid_capstyle="butt")
                ax.plot([r.low, min(r.high, high)], [y, y], linestyle="none", marker="|", color=colour, markersize=7)
            ax.plot([r.value], [y], marker="o", markersize=6, color=colour,
                    markerfacecolor=colour if t.flagged else "white", markeredgewidth=1.4)
    ax.axvline(1.0, color="#555555", linewidth=1.0, zorder=0)
    ax.set_xscale("log", base=2)
    ax.set_xlim(low, high)
    near = (0.8, 0.9, 1.0, 1.1, 1.25)
    far = (0.67, 1.5, *(2.0**k for k in range(-6, 7)))
    ticks = sorted(v for v in (near if spread < np.log2(1.5) else far) if low <= v <= high)
    ax.set_xticks(ticks, [f"{v:g}×" for v in ticks])
    ax.minorticks_off()
    ax.set_xlabel("time NEW / BASE (median, interval over the rounds)")
    ax.set_title("time: bar = interval over the rounds (none: one run), filled point = it excludes 1", loc="left")


def _memory_panel(ax: Axes, comparison: Comparison) -> None:
    """Each strategy's memory deltas as bars, in % of BASE's model, over its noise band."""
    labels = [d.label for d in comparison.strategies[0].memory]
    height = 0.8 / len(labels)
    values = []
    for row, s in enumerate(comparison.strategies):
        noise = s.noise_bytes / s.memory[0].model_bytes * 100
        ax.fill_betweenx([row - 0.45, row + 0.45], -noise, noise, color="#DDDDDD", linewidth=0, zorder=0)
        for i, d in enumerate(s.memory):
            share = d.delta_fraction
            if share is None:
                continue
            y = row - 0.4 + height * (i + 0.5)
            values.append(share * 100)
            ax.barh(y, share * 100, height=height * 0.9, color=_MEMORY_COLOURS[d.label],
                    edgecolor="black" if d.flagged else "none", linewidth=1.2, zorder=2)
            ax.plot([share * 100], [y], marker="|", markersize=8, markeredgewidth=1.6,
                    color=_MEMORY_COLOURS[d.label], zorder=3)  # a delta of 0 shows too
    edge = max([abs(v) for v in values] + [s.noise_bytes / s.memory[0].model_bytes * 100
                                            for s in comparison.strategies] + [1.0]) * 1.15
    ax.set_xlim(-edge, edge)
    ax.axvline(0.0, color="#555555", linewidth=1.0, zorder=1)
    ax.set_xlabel("memory NEW − BASE, % of BASE's model")
    ax.set_title("memory: outlined bar = beyond the noise (grey band)", loc="left")


def comparison_figure(comparison: Comparison) -> Figure:
    """Two panels, one row per strategy: time ratios with intervals, and memory deltas against the noise."""
    rows = len(comparison.strategies)
    with mpl.rc_context(cast(Any, STYLE)):
        fig = Figure(figsize=(12.0, 3.4 + 0.62 * max(rows, 1)), layout="constrained")
        FigureCanvasAgg(fig)
        time_ax, memory_ax = fig.subplots(1, 2, sharey=True)
        if rows:
            _ratio_panel(time_ax, comparison)
            _memory_panel(memory_ax, comparison)
        for ax in (time_ax, memory_ax):
            for row in range(rows - 1):
                ax.axhline(row + 0.5, color="#CCCCCC", linewidth=0.8, zorder=0)
        names = [s.name for s in comparison.strategies]
        time_ax.set_yticks(range(rows), names)
        time_ax.set_ylim(rows - 0.5, -0.5)
        handles: list[Any] = [Line2D([], [], color=_TIME_COLOURS[t], marker="o", linewidth=1.6, label=f"{t} time")
                              for t in TIMES]
        labels = [d.label for d in comparison.strategies[0].memory] if rows else []
        handles += [Patch(color=_MEMORY_COLOURS[label], label=label) for label in labels]
        handles.append(Patch(color="#DDDDDD", label="memory noise"))
        figure_legend(fig, handles, _title(comparison))
    return fig


def write_comparison(comparison: Comparison, out: Path) -> list[Path]:
    """Write ``<base>-vs-<new>.png`` and ``<base>-vs-<new>.md`` into ``out``; returns their paths."""
    name = comparison_name(comparison)
    figure = save_figure(comparison_figure(comparison), Path(out) / f"{name}.png")
    report = write_atomic(Path(out) / f"{name}.md", comparison_markdown(comparison, figure.name).encode())
    return [figure, report]
