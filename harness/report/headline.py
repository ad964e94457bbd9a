"""``<name>.headline.png``: how far each strategy lands from its floor, and where its wall time goes.

Top: one row per strategy. Its solid bar runs from zero to the build-phase host peak,
its baseline shaded, the floor drawn across it and the excess written at its end, exactly
as the table prints them; where the whole run went higher (the load), an outline carries
the bar on to that peak. On a GPU the host leads: the solid bar is the build-phase host
peak against the host floor (baseline + largest engine), and a second, lighter bar under
it is the build-phase host + GPU peak against its own floor, the figure the table compares.
Bottom: one bar per strategy, its wall time laid out phase by phase (the load, the export
where there is one, the build, and what lies between them), so that the wall is the sum
of what the bar shows; each engine's own time is in ``<name>.engine-times.png``.
"""

from __future__ import annotations

import textwrap
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from harness.catalog import strategy_label
from harness.report.enginetimes import engine_times_applies
from harness.report.markdown import spread_text
from harness.report.names import figure_name
from harness.report.style import FLOOR_STYLE, figure_legend, new_figure, strategy_colour, styled
from harness.report.text import (
    card_text,
    format_percent,
    format_seconds,
    gib_decimals,
    model_text,
    phases_text,
    status_text,
)
from harness.results.metrics import StrategyMetrics, floor_formula, phase_spans
from harness.results.reading import Results
from harness.results.spread import MedianSpread, median_spread, strategy_rounds
from harness.units import GIB, format_gib

__all__ = ["PHASE_COLOURS", "headline_figure"]

BASELINE_COLOUR = "#D9D9D9"
PHASE_COLOURS = {"load": "#555555", "export": "#B07A1F", "build": "#7FA7CF"}
"""The colour of each phase in the time panel; a phase not listed (a newer record's) is drawn grey."""
_OTHER_PHASE = "#AAAAAA"
_BETWEEN: dict[str, Any] = {"facecolor": "#FFFFFF", "edgecolor": "#888888", "hatch": "...."}
_BAR = 0.62  # bar height, in rows
_HOST_GPU_ALPHA = 0.4
_INTERVAL_COLOUR = "#000000"
_LABEL_PT = 10
_TEXT_GAP_PT = 4
_BOLD_EM = 0.64  # width of a bold character, in ems, on average (digits and lower case)
_AXIS_IN = 9.7  # both panels' width in a 12-inch figure, beside the strategies' described tick labels
_HEADROOM = 1.05
"""An axis's end over the furthest bar, outline, interval or floor it draws."""
_MIN_SHARE = 0.3
_REGULAR_EM = 0.56


def _failure(m: StrategyMetrics, planned: int) -> str:
    """How far a failed strategy got: every engine built (it failed after, in its check), or some."""
    if m.engines_built >= planned:
        return f"all {planned} engines built,\nthen {status_text(m, 36)}"
    return f"partial: FAILED after {m.engines_built} of {planned} engines"


def _excess_text(peak: int, excess: float, decimals: int, floor: str, what: str = "") -> str:
    """``1.23 GiB<what>: +4.5% of the model above the <floor>`` (``below`` when negative)."""
    if excess >= 0:
        return f"{format_gib(peak, decimals)}{what}: {format_percent(excess)} of the model above the {floor}"
    return (f"{format_gib(peak, decimals)}{what}: {format_percent(-excess).lstrip('+')} of the model below the "
            f"{floor}")


def _bar(ax: Axes, y: float, height: float, m: StrategyMetrics, peak: int, floor: int | None, text: str,
         order: list[str], gid: str, alpha: float, text_at: int | None = None) -> tuple[float, str]:
    """One peak bar from zero (baseline shaded) to ``peak``, ``floor`` drawn across it, ``text`` at its end (at
    ``text_at`` bytes where something is drawn past the bar: the whole-run outline). Returns where the text
    starts (GiB) and the text, for :func:`_axis_share`."""
    colour = strategy_colour(m.name, order)
    base = min(m.record.baseline_rss_bytes or 0, peak)
    ax.barh(y, base / GIB, height, color=BASELINE_COLOUR, zorder=2)
    bar = ax.barh(y, (peak - base) / GIB, height, left=base / GIB, color=colour, zorder=2,
                  alpha=alpha if m.record.ok else alpha * 0.45, edgecolor=colour, linewidth=1.0)
    bar.patches[0].set_gid(f"{gid}:{m.name}")
    if floor is not None:
        line = ax.vlines(floor / GIB, y - height / 2 - 0.05, y + height / 2 + 0.05, zorder=4, **FLOOR_STYLE)
        line.set_gid(f"{'floor' if gid == 'compared' else gid + '-floor'}:{m.name}")
    start = max(peak, text_at or 0) / GIB
    label = ax.annotate(text, (start, y + 0.02), xytext=(_TEXT_GAP_PT, 0), textcoords="offset points", va="center",
                        ha="left", fontsize=_LABEL_PT, fontweight="bold",
                        color="#000000" if m.record.ok else "#B00000", zorder=5,
                        bbox={"boxstyle": "square,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
    label.set_gid(f"{'excess' if gid == 'compared' else gid + '-excess'}:{m.name}")
    label.set_in_layout(False)  # the margin right of the axis leaves room for it (_axis_share)
    return start, text


def _axis_share(labels: list[tuple[float, str]], end: float, points: float = _LABEL_PT, em: float = _BOLD_EM
                ) -> float:
    """The share of the panel's width its axis takes, the rest a margin on its right that the labels run into.

    The axis runs to ``end`` (its data and reference lines with :data:`_HEADROOM`), so its scale fits what it
    draws; a label starting at ``start`` and ``w`` inches wide (its longest line, in type of ``points`` whose
    characters are ``em`` wide) ends inside the panel's width ``A`` (:data:`_AXIS_IN`) when the axis takes at
    most ``(A - w) / (A * start / end)`` of it. At least :data:`_MIN_SHARE`, at most all of it."""
    def most(start: float, text: str) -> float:
        width = (max(len(line) for line in text.splitlines()) * em * points + _TEXT_GAP_PT + 6) / 72
        return 1.0 if start <= 0 else (_AXIS_IN - width) / (_AXIS_IN * start / end)

    return max(_MIN_SHARE, min([1.0, *(most(start, text) for start, text in labels)]))


def _whole_run_end(m: StrategyMetrics, peak: int, right: float) -> int | None:
    """Where the outline carrying a bar of ``peak`` on to the whole-run host peak ends, in bytes; None where no
    outline is drawn (the whole run went no higher than 3% of the axis, ``right`` GiB, past the bar)."""
    whole = m.record.host_peak_bytes
    return None if whole is None or (whole - peak) / GIB <= 0.03 * right else whole


def _whole_run(ax: Axes, y: float, height: float, m: StrategyMetrics, peak: int, right: float, order: list[str],
               decimals: int) -> None:
    """The outline carrying a host bar on to the whole-run host peak, where that is higher."""
    whole = _whole_run_end(m, peak, right)
    if whole is None:
        return
    outline = Rectangle((peak / GIB, y - height / 2), (whole - peak) / GIB, height, fill=False,
                        edgecolor=strategy_colour(m.name, order), linestyle=(0, (4, 2)), linewidth=1.4, zorder=2)
    outline.set_gid(f"whole-run:{m.name}")
    ax.add_patch(outline)
    note = ax.text(whole / GIB, y + height / 2 + 0.03, f"whole-run host peak {format_gib(whole, decimals)}",
                   va="bottom", ha="right", fontsize=9, color="#333333")
    note.set_in_layout(False)


def _strategy_ticks(ax: Axes, metrics: list[StrategyMetrics], order: list[str], described: bool) -> None:
    """Rows top to bottom in run order, each named (``described``: with the catalog's label) in its colour."""
    ticks = [f"{m.name}\n" + "\n".join(textwrap.wrap(strategy_label(m.name), 26)) if described else m.name
             for m in metrics]
    ax.set_yticks(range(len(metrics) - 1, -1, -1), ticks)
    for tick, m in zip(ax.get_yticklabels(), metrics, strict=True):
        tick.set_color(strategy_colour(m.name, order))
    ax.set_ylim(-0.6, len(metrics) - 0.4)


def _peaks_panel(ax: Axes, run: Results, order: list[str]) -> float:
    """Each strategy's peak bars against their floors; returns the share of the panel's width its axis takes
    (:func:`_axis_share`)."""
    decimals = gib_decimals(run.record.model.bytes)
    metrics = list(run.metrics.values())
    gpu = run.on_gpu
    values = [v for m in metrics for v in (m.compared_peak_bytes, m.record.build_peak_bytes,
                                           m.record.host_peak_bytes, m.floor_bytes) if v]
    right = max(values, default=GIB) / GIB
    labels: list[tuple[float, str]] = []
    height = _BAR / 2 if gpu else _BAR
    for row, m in enumerate(metrics):
        y = len(metrics) - 1 - row
        host_y = y + height / 2 + 0.02 if gpu else y
        if gpu and m.record.build_peak_bytes is not None:
            host = m.record.build_peak_bytes
            text = (_excess_text(host, m.build_host_excess, decimals, "host floor", " host")
                    if m.record.ok and m.build_host_excess is not None else f"{format_gib(host, decimals)} host")
            labels.append(_bar(ax, host_y, height, m, host, m.build_host_floor_bytes, text, order, "host", 1.0,
                               _whole_run_end(m, host, right)))
            _whole_run(ax, host_y, height, m, host, right, order, decimals)
        peak = m.compared_peak_bytes
        if peak is None:
            ax.text(0.01, y, status_text(m, 90), va="center", color="#B00000", transform=ax.get_yaxis_transform())
            continue
        text = (_excess_text(peak, m.excess, decimals, "floor") if m.record.ok and m.excess is not None
                else f"{format_gib(peak, decimals)}, {_failure(m, run.record.engines)}")
        compared_y = y - height / 2 - 0.02 if gpu else y
        labels.append(_bar(ax, compared_y, height, m, peak, m.floor_bytes, text, order, "compared",
                           _HOST_GPU_ALPHA if gpu else 1.0, None if gpu else _whole_run_end(m, peak, right)))
        if not gpu:
            _whole_run(ax, y, height, m, peak, right, order, decimals)
    # the data and the floors with modest headroom, the labels in the margin right of it; no peak at all (every
    # strategy failed before one): 1 GiB
    end = right * _HEADROOM if values else 1.0
    ax.set_xlim(0, end)
    _strategy_ticks(ax, metrics, order, described=True)
    ax.set_xlabel("GiB", loc="left")
    ax.grid(axis="x", color="#E5E5E5", zorder=0)
    floor = floor_formula(run.on_gpu, run.engines_accumulate, run.engines_built_without_resident_weights,
                          run.engines_hold_compiler_memory)
    if gpu:
        ax.set_title(f"build-phase host peak (solid) against the host floor ({floor_formula(False)});\nunder it, "
                     f"the {run.compared_label} (light) against its floor ({floor})", loc="left")
    else:
        ax.set_title(f"{run.compared_label} against its floor ({floor})", loc="left")
    return _axis_share(labels, end)


def _wall_text(m: StrategyMetrics) -> str:
    if m.record.wall_s is None:
        text = "no wall time"
    elif m.load_s is not None and m.build_s is not None:
        text = f"wall {format_seconds(m.record.wall_s)} =\n" + phases_text(m, then=";\n")
    else:
        text = f"wall {format_seconds(m.record.wall_s)}"
    return text + ("" if m.record.ok else " (FAILED)")


def _wall_spread(m: StrategyMetrics) -> MedianSpread | None:
    """The median of the strategy's finished rounds' wall times and its interval, as the report prints it
    (:func:`~harness.results.spread.median_spread`); None for fewer than two rounds (no interval)."""
    walls = strategy_rounds(m).wall_s
    if len(walls) < 2:
        return None
    spread = median_spread(walls)
    return spread if spread.low is not None and spread.high is not None else None


def _times_panel(ax: Axes, run: Results, order: list[str]) -> tuple[list[str], float]:
    """Each strategy's wall time as one bar of its phases in time order, and, over several rounds, the median
    wall with its interval as an error bar; returns what was drawn (phases, and ``interval``) and the share of the
    panel's width its axis takes (:func:`_axis_share`)."""
    metrics = list(run.metrics.values())
    drawn: list[str] = []
    labels: list[tuple[float, str]] = []
    for row, m in enumerate(metrics):
        y = len(metrics) - 1 - row
        spans = phase_spans(m.record.phases)
        total = m.record.wall_s if m.record.wall_s is not None else max((end for _, _, end in spans), default=0.0)
        at = 0.0
        for phase, start, end in spans:
            start, end = max(start, at), min(end, total)
            if start > at:
                ax.barh(y, start - at, _BAR, left=at, zorder=2, gid=f"time:{m.name}:between", **_BETWEEN)
                drawn.append("between")
            if end > start:
                ax.barh(y, end - start, _BAR, left=start, color=PHASE_COLOURS.get(phase, _OTHER_PHASE), zorder=2,
                        alpha=1.0 if m.record.ok else 0.45, gid=f"time:{m.name}:{phase}")
                drawn.append(phase)
            at = max(at, end)
        if total > at:
            ax.barh(y, total - at, _BAR, left=at, zorder=2, gid=f"time:{m.name}:between", **_BETWEEN)
            drawn.append("between")
        text = _wall_text(m)
        end = total
        spread = _wall_spread(m)
        if spread is not None and spread.low is not None and spread.high is not None:
            bars = ax.errorbar(spread.median, y, xerr=[[spread.median - spread.low], [spread.high - spread.median]],
                               fmt="o", markersize=4, color=_INTERVAL_COLOUR, ecolor=_INTERVAL_COLOUR, elinewidth=1.6,
                               capsize=5, capthick=1.6, zorder=6)
            bars.lines[0].set_gid(f"wall-median:{m.name}")
            for line in bars.lines[2]:
                line.set_gid(f"wall-interval:{m.name}")
            text += "\nrounds: " + spread_text(strategy_rounds(m).wall_s)
            end = max(end, spread.high)
            drawn.append("interval")
        label = ax.annotate(text, (end, y), xytext=(_TEXT_GAP_PT, 0), textcoords="offset points", va="center",
                            ha="left", fontsize=9, color="#000000" if m.record.ok else "#B00000", zorder=5)
        label.set_gid(f"wall:{m.name}")
        label.set_in_layout(False)
        labels.append((end, text))
    _strategy_ticks(ax, metrics, order, described=False)
    end = max((start for start, _ in labels), default=0.0) * _HEADROOM or 1.0
    ax.set_xlim(0, end)  # the bars and intervals with modest headroom, the text after each in the margin
    ax.set_xlabel(f"seconds from the strategy's load start ({_engine_times_pointer(run)})", loc="left")
    ax.grid(axis="x", color="#E5E5E5", zorder=0)
    ax.set_title("where the wall time goes, phase by phase", loc="left", pad=24)  # above the phases' legend
    return list(dict.fromkeys(drawn)), _axis_share(labels, end, 9, _REGULAR_EM)


def _engine_times_pointer(run: Results) -> str:
    """Which figure shows each engine's own time: the engine-times figure, or, where it is not drawn, the
    compiler's."""
    if engine_times_applies(run):
        return f"each engine's build: {figure_name(run.name, 'engine-times')}"
    return f"each engine's compile: {figure_name(run.name, 'compiler')}"


def _phase_legend(ax: Axes, drawn: list[str]) -> None:
    """The time panel's own legend: the colour of each phase drawn (the error bar is in the figure's legend)."""
    names = {"load": "load", "export": "export", "build": "build (every engine)", "between": "between phases"}
    phases = [phase for phase in drawn if phase != "interval"]
    handles = [Patch(label=names.get(phase, phase), **_BETWEEN) if phase == "between" else
               Patch(label=names.get(phase, phase), color=PHASE_COLOURS.get(phase, _OTHER_PHASE)) for phase in phases]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=len(handles), frameon=False,
              borderaxespad=0.2, handlelength=1.6, columnspacing=1.2)


def _legend(run: Results, interval: bool) -> list[Any]:
    """The figure's legend: the peak panel's marks, and the time panel's error bar where one is drawn."""
    handles: list[Any] = [Patch(color=BASELINE_COLOUR, label="baseline (before the load)", gid="swatch:baseline")]
    if run.on_gpu:
        # the swatches in the first strategy's colour, as its bars are drawn: the light one must not read as the
        # baseline's grey
        order = list(run.metrics)
        colour = strategy_colour(order[0], order) if order else _INTERVAL_COLOUR
        each = " in each strategy's colour" if len(order) > 1 else ""
        handles += [
            Patch(facecolor=colour, label=f"build-phase host peak (solid{each})", gid="swatch:host"),
            Patch(facecolor=colour, alpha=_HOST_GPU_ALPHA, label=f"build-phase host + GPU peak (light{each})",
                  gid="swatch:host-gpu"),
            Line2D([], [], label="floor of each bar", **FLOOR_STYLE),
        ]
    else:
        handles.append(Line2D([], [], label="floor", **FLOOR_STYLE))
    handles.append(Patch(fill=False, edgecolor="#555555", linestyle=(0, (4, 2)),
                         label="whole-run host peak, where higher"))
    if interval:
        handles.append(Line2D([], [], color=_INTERVAL_COLOUR, marker="o", markersize=4, linewidth=1.6,
                              label="wall times: the rounds' median and its interval, as the report gives them"))
    return handles


def _model_text(run: Results) -> str:
    model = run.record.model
    return (f"{model_text(model)}, {format_gib(model.bytes, gib_decimals(model.bytes))}, {run.record.engines} engines"
            f"{card_text(run)}")


@styled
def headline_figure(run: Results) -> Figure:
    """Each strategy's peaks against their floors (the host first), and its wall time phase by phase."""
    order = list(run.metrics)
    rows = max(1, len(order))
    times_height = (0.6 if any(_wall_spread(m) for m in run.metrics.values()) else 0.45) * rows + 0.9
    fig = new_figure(12.0, 3.0 + 0.95 * rows + times_height, run)
    grid = fig.add_gridspec(2, 2, height_ratios=(0.95 * rows + 0.6, times_height), wspace=0)
    top, bottom = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, 0])
    peaks_share = _peaks_panel(top, run, order)
    drawn, times_share = _times_panel(bottom, run, order)
    share = min(peaks_share, times_share)  # both axes fit their data; the labels run on into the column right
    grid.set_width_ratios((share, max(1.0 - share, 1e-6)))
    _phase_legend(bottom, drawn)
    title = f"{run.name}: how far each loading strategy lands from its floor ({_model_text(run)})"
    figure_legend(fig, _legend(run, "interval" in drawn), title)
    return fig
