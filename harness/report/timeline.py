"""``<name>.timeline.png``: one panel per strategy, on one time axis, each on a memory scale of its own.

Each panel shows the process's RSS split into anonymous and file-backed memory, GPU
memory where there is a GPU, the floor, the model size, and every engine build shaded and
numbered (a narrow band's number moves down a row rather than being left out). Each panel's
memory axis runs from zero to the highest value that panel draws (the floor included), with
room above for the engine numbers (:func:`panel_top`): a strategy that stays near its floor
fills its panel as one that holds the whole model fills its own, so both can be read. The
panels' scales therefore differ; the figure's title says so, and the model size, drawn
where it fits a panel's scale, is named at the panel's top where it does not. The
checkpoint's page-cache residency, which belongs to the machine rather than to the process,
is drawn in a strip of its own under each panel, in per cent of the checkpoint, so that it
never lies on the RSS it often equals.
"""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.report.style import (
    FLOOR_STYLE,
    MODEL_STYLE,
    SERIES_COLOURS,
    figure_legend,
    gib,
    model_label,
    new_figure,
    styled,
)
from harness.report.text import format_gib, gib_decimals, status_text
from harness.results.reading import Results
from harness.results.record import StrategyRecord
from harness.units import GIB

__all__ = ["engine_spans", "label_rows", "panel_top", "time_origin", "timeline_figure"]

_BANDS = ("#E3E3E3", "#F2F2F2")
_LABEL_ROWS = (0.975, 0.90, 0.825, 0.75)  # axes fractions where engine numbers go, top first


def time_origin(strategy: StrategyRecord, samples: pd.DataFrame) -> float:
    """Where a strategy's timeline starts counting: its load start (else its first sample).

    Panels share one time axis from each strategy's own load start, so that strategies line up
    although their processes spend different times importing before the load begins.
    """
    if strategy.phases.load_start_s is not None:
        return strategy.phases.load_start_s
    if len(samples) and samples["t_s"].notna().any():
        return float(samples["t_s"].min())
    return 0.0


def engine_spans(strategy: StrategyRecord, samples: pd.DataFrame, origin: float = 0.0
                 ) -> list[tuple[int, float, float]]:
    """(index, start, end) of every engine build, in seconds from ``origin``.

    An engine that started but never ended (a failed build) runs to the last sample.
    """
    spans = []
    last = float(samples["t_s"].max()) if len(samples) else None
    for engine in strategy.engines:
        end = engine.end_s if engine.end_s is not None else last
        if engine.start_s is not None and end is not None:
            spans.append((engine.index, engine.start_s - origin, end - origin))
    return spans


def _time_extent(strategy: StrategyRecord, samples: pd.DataFrame) -> tuple[float, float]:
    """First and last time a strategy's panel draws, in seconds from its origin."""
    origin = time_origin(strategy, samples)
    times = [t for _, start, end in engine_spans(strategy, samples, origin) for t in (start, end)]
    if len(samples) and samples["t_s"].notna().any():
        t_s = samples["t_s"]
        times += [float(t_s.min()) - origin, float(t_s.max()) - origin]
    return (min(times), max(times)) if times else (0.0, 1.0)


def _panel_top(run: Results, name: str) -> float:
    """The highest value (GiB) this strategy's panel draws on its memory axis."""
    frame = run.samples[name]
    tops = []
    if len(frame):
        tops.append(float(np.nanmax(gib(frame["rss_bytes"]))))
        host_gpu = gib(frame["rss_bytes"] + frame["gpu_used_bytes"])
        if np.isfinite(host_gpu).any():
            tops.append(float(np.nanmax(host_gpu)))
    m = run.metrics[name]
    tops += [v / GIB for v in (m.floor_bytes, m.compared_peak_bytes, m.record.host_peak_bytes) if v is not None]
    finite = [t for t in tops if np.isfinite(t)]
    return max(finite) if finite else 1.0


def label_rows(spans: list[tuple[int, float, float]], seconds_per_inch: float) -> list[int]:
    """For each engine band, the row its number is written in: the first row where it clears the last one.

    A number is centred on its band and takes about ``(digits * 0.6 + 0.5) * 9 pt`` of width;
    every band gets a number, in a lower row when a row is taken where it would go.
    """
    ends = [float("-inf")] * len(_LABEL_ROWS)
    rows = []
    for index, start, end in spans:
        half = (len(str(index)) * 0.6 + 0.5) * 9 / 72 / 2 * seconds_per_inch
        centre = (start + end) / 2
        row = next((r for r, last in enumerate(ends) if centre - half >= last), None)
        if row is None:
            row = min(range(len(ends)), key=lambda r: ends[r])
        ends[row] = centre + half
        rows.append(row)
    return rows


def _label_engines(ax: Axes, spans: list[tuple[int, float, float]], seconds_per_inch: float) -> None:
    for (index, start, end), row in zip(spans, label_rows(spans, seconds_per_inch), strict=True):
        ax.text((start + end) / 2, _LABEL_ROWS[row], str(index), transform=ax.get_xaxis_transform(),
                ha="center", va="top", fontsize=9, color="#444444", zorder=6, gid=f"engine:{index}")


def panel_top(run: Results, name: str) -> float:
    """The top of strategy ``name``'s memory axis (GiB): the highest value its panel draws (the floor included),
    with room above for the engine numbers."""
    return _panel_top(run, name) * 1.3


def _model_line(ax: Axes, run: Results, top: float) -> str | None:
    """The model size across the panel where it fits the panel's scale; else a note naming it, for the panel's
    right-hand title."""
    model = run.record.model.bytes
    if model / GIB <= top:
        ax.axhline(model / GIB, zorder=2, **MODEL_STYLE)
        return None
    return f"model size {format_gib(model, gib_decimals(model))}: above this panel's scale"


def _residency_strip(strip: Axes, run: Results, name: str, frame: pd.DataFrame, origin: float,
                     spans: list[tuple[int, float, float]]) -> None:
    """The checkpoint's page-cache residency over time, in per cent of the checkpoint, under its panel."""
    for index, start, end in spans:
        strip.axvspan(start, end, color=_BANDS[index % 2], linewidth=0, zorder=0)
    checkpoint = run.record.checkpoint.bytes
    if len(frame) and checkpoint > 0:
        t = frame["t_s"].to_numpy(dtype="float64") - origin
        share = frame["resident_bytes"].to_numpy(dtype="float64") / checkpoint * 100
        strip.plot(t, share, color=SERIES_COLOURS["resident"], linewidth=1.4, zorder=3, gid=f"resident:{name}")
    strip.set_ylim(0, 110)
    strip.set_yticks([0, 50, 100])
    strip.set_ylabel("page cache\n(% of ckpt)", color=SERIES_COLOURS["resident"])
    strip.tick_params(axis="y", colors=SERIES_COLOURS["resident"])
    strip.grid(axis="y", color="#E5E5E5", zorder=0)


def _timeline_panel(ax: Axes, strip: Axes, run: Results, name: str, seconds_per_inch: float) -> None:
    """One strategy's memory over time, in seconds from its load start, on its own memory scale
    (:func:`panel_top`), and its page-cache residency in ``strip``."""
    s, m, samples = run.strategies[name], run.metrics[name], run.samples[name]
    top = panel_top(run, name)
    origin = time_origin(s, samples)
    frame = samples.dropna(subset=["t_s", "rss_bytes"])
    spans = engine_spans(s, samples, origin)
    for index, start, end in spans:
        ax.axvspan(start, end, color=_BANDS[index % 2], linewidth=0, zorder=0)
    _label_engines(ax, spans, seconds_per_inch)
    _residency_strip(strip, run, name, frame, origin, spans)
    if len(frame):
        t = frame["t_s"].to_numpy(dtype="float64") - origin
        anon = np.nan_to_num(gib(frame["anon_bytes"]))
        file_ = np.nan_to_num(gib(frame["file_bytes"]))
        ax.stackplot(t, anon, file_, colors=(SERIES_COLOURS["anon"], SERIES_COLOURS["file"]), alpha=0.8,
                     linewidth=0, zorder=1)
        gpu = gib(frame["gpu_used_bytes"])
        if np.isfinite(gpu).any():
            ax.plot(t, gpu, color=SERIES_COLOURS["gpu"], linewidth=1.5, zorder=3)
            ax.plot(t, gib(frame["rss_bytes"] + frame["gpu_used_bytes"]), color=SERIES_COLOURS["host_gpu"],
                    linewidth=1.5, zorder=4)
    else:
        ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center", va="center", color="#777777")
    for target in (ax, strip):
        for value, style in ((s.phases.load_start_s, ":"), (s.phases.partition_s, "-.")):
            if value is not None:
                target.axvline(value - origin, color=SERIES_COLOURS["phase"], linestyle=style, linewidth=1.2,
                               zorder=5)
    notes = [note for note in (None if m.gpu_measured else "no GPU", _model_line(ax, run, top)) if note]
    if m.floor_bytes is not None:
        ax.axhline(m.floor_bytes / GIB, zorder=2, **FLOOR_STYLE)
    ax.set_ylim(0, top)
    title = f"{name}: {'ok' if s.ok else 'FAILED'}"
    if m.record.wall_s is not None:
        title += f", wall {m.record.wall_s:.1f} s"
    if origin > 0:
        title += f", load began {origin:.1f} s after process start"
    ax.set_title(title, loc="left", color="#000000" if s.ok else "#B00000", fontweight="bold")
    if notes:
        ax.set_title("; ".join(notes), loc="right", color="#555555")
    if not s.ok:
        ax.text(0.99, 0.5, textwrap.fill(status_text(m), width=70), transform=ax.transAxes, ha="right",
                va="center", fontsize=10, color="#B00000", zorder=10,
                bbox={"boxstyle": "round,pad=0.4", "facecolor": "white", "edgecolor": "#B00000", "alpha": 0.95})
    ax.set_ylabel("process memory\n(GiB, own scale)")


def _timeline_legend(run: Results) -> list[Any]:
    """The timeline's legend entries; GPU series only when a GPU was measured."""
    handles: list[Any] = [
        Patch(color=SERIES_COLOURS["anon"], alpha=0.8, label="RSS: anonymous"),
        Patch(color=SERIES_COLOURS["file"], alpha=0.8, label="RSS: file-backed"),
    ]
    if run.gpu_measured:
        handles += [
            Line2D([], [], color=SERIES_COLOURS["gpu"], linewidth=1.5, label="GPU used"),
            Line2D([], [], color=SERIES_COLOURS["host_gpu"], linewidth=1.5, label="host + GPU"),
        ]
    handles += [
        Line2D([], [], label=f"floor of the {run.compared_label}", **FLOOR_STYLE),
        Line2D([], [], label=model_label(run), **MODEL_STYLE),
        Line2D([], [], color=SERIES_COLOURS["resident"], linewidth=1.4,
               label="checkpoint in page cache (the strip under each panel)"),
        Line2D([], [], color=SERIES_COLOURS["phase"], linestyle=":", linewidth=1.2, label="load start"),
        Line2D([], [], color=SERIES_COLOURS["phase"], linestyle="-.", linewidth=1.2, label="partitioning"),
        Patch(facecolor=_BANDS[0], edgecolor="#BBBBBB", label="engine build (its number above)"),
    ]
    return handles


@styled
def timeline_figure(run: Results) -> Figure:
    """One panel per strategy, on one time axis, each on its own memory scale (:func:`panel_top`), each with its
    page-cache strip under it. The memory panels are the figure's first axes, in run order; their strips
    follow."""
    strategies = list(run.strategies)
    panels = max(1, len(strategies))
    fig = new_figure(12.0, 2.2 + 3.2 * panels, run)
    grid = fig.add_gridspec(2 * panels, 1, height_ratios=(3.0, 1.0) * panels)
    axes = [fig.add_subplot(grid[2 * i, 0]) for i in range(panels)]
    strips = [fig.add_subplot(grid[2 * i + 1, 0], sharex=axes[0]) for i in range(panels)]
    for ax in axes[1:]:
        ax.sharex(axes[0])
    for ax in (*axes, *strips[:-1]):
        ax.tick_params(labelbottom=False)
    extents = [_time_extent(run.strategies[s], run.samples[s]) for s in strategies] or [(0.0, 1.0)]
    x_min = min(0.0, *(lo for lo, _ in extents))
    x_max = max(hi for _, hi in extents)
    x_max = x_max if x_max > x_min else x_min + 1.0
    margin = (x_max - x_min) * 0.01
    seconds_per_inch = (x_max - x_min + 2 * margin) / (fig.get_figwidth() * 0.78)
    for ax, strip, name in zip(axes, strips, strategies, strict=False):
        _timeline_panel(ax, strip, run, name, seconds_per_inch)
    if not strategies:
        axes[0].text(0.5, 0.5, "no strategies in this run", transform=axes[0].transAxes, ha="center")
    axes[0].set_xlim(x_min - margin, x_max + margin)
    strips[-1].set_xlabel("seconds from each strategy's load start")
    title = (f"{run.name}: memory over time by loading strategy ({run.record.model.name}; each panel on its own "
             "memory scale, from zero to what it draws: read the values on its axis)")
    figure_legend(fig, _timeline_legend(run), title)
    return fig
