"""``<name>.timeline.png``: one panel per strategy, each on its own time axis, all on one memory scale.

Each panel shows the process's RSS split into anonymous and file-backed memory, GPU
memory where there is a GPU, the floor, the baseline + model size (where the whole model
would sit on top of what the process held before its load, so that it means on this
absolute-RSS axis what it says), and every engine build shaded and numbered (a narrow
band's number moves down a row; where the bands are too narrow for every number, every
k-th engine is numbered, the smallest k that keeps all numbers apart).

The panels share one memory axis (:func:`memory_top`): from zero to the highest value any
panel draws, reference lines included, with room above for the engine numbers, so that
two strategies are compared by eye. Each panel runs on its own time axis, from its
strategy's load start to its last sample, so that a strategy that takes a few seconds is
as readable as one that takes a minute; its title gives its wall time. The checkpoint's
page-cache residency, which belongs to the machine rather than to the process, is drawn
in a strip of its own under each panel, in per cent of the checkpoint, so that it never
lies on the RSS it often equals.
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
from harness.report.text import run_subject, status_text
from harness.results.reading import Results
from harness.results.record import StrategyRecord
from harness.units import GIB

__all__ = ["engine_spans", "label_rows", "memory_top", "model_level", "time_origin", "timeline_figure"]

_BANDS = ("#E3E3E3", "#F2F2F2")
_LABEL_ROWS = (0.975, 0.90, 0.825, 0.75)  # axes fractions where engine numbers go, top first
_HEADROOM = 1.3
"""The memory axis's top over the highest value drawn: the engine numbers' rows lie above 0.75 of the axis."""


def time_origin(strategy: StrategyRecord, samples: pd.DataFrame) -> float:
    """Where a strategy's timeline starts counting: its load start (else its first sample).

    Each panel counts from its strategy's own load start, so that strategies line up although
    their processes spend different times importing before the load begins.
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


def model_level(run: Results, name: str) -> float | None:
    """Where strategy ``name``'s panel draws the model size (GiB): on top of the process's baseline (its RSS
    before the load), which every value on the panel's absolute-RSS axis includes; None without a baseline."""
    baseline = run.strategies[name].baseline_rss_bytes
    return None if baseline is None else (baseline + run.record.model.bytes) / GIB


def _panel_top(run: Results, name: str) -> float:
    """The highest value (GiB) this strategy's panel draws on its memory axis, its reference lines included."""
    frame = run.samples[name]
    tops = []
    if len(frame):
        tops.append(float(np.nanmax(gib(frame["rss_bytes"]))))
        host_gpu = gib(frame["rss_bytes"] + frame["gpu_used_bytes"])
        if np.isfinite(host_gpu).any():
            tops.append(float(np.nanmax(host_gpu)))
    m = run.metrics[name]
    tops += [v / GIB for v in (m.floor_bytes, m.compared_peak_bytes, m.record.host_peak_bytes) if v is not None]
    level = model_level(run, name)
    if level is not None:
        tops.append(level)
    finite = [t for t in tops if np.isfinite(t)]
    return max(finite) if finite else 1.0


def memory_top(run: Results) -> float:
    """The top of every panel's memory axis (GiB): the highest value any panel draws (reference lines included),
    with room above (:data:`_HEADROOM`) for the engine numbers."""
    return max((_panel_top(run, name) for name in run.strategies), default=1.0) * _HEADROOM


def _rows(spans: list[tuple[int, float, float]], seconds_per_inch: float) -> list[int] | None:
    """The row of each band's number, each in the first row where it clears the last one; None when one clears
    no row."""
    ends = [float("-inf")] * len(_LABEL_ROWS)
    rows = []
    for index, start, end in spans:
        half = (len(str(index)) * 0.6 + 0.5) * 9 / 72 / 2 * seconds_per_inch
        centre = (start + end) / 2
        row = next((r for r, last in enumerate(ends) if centre - half >= last), None)
        if row is None:
            return None
        ends[row] = centre + half
        rows.append(row)
    return rows


def label_rows(spans: list[tuple[int, float, float]], seconds_per_inch: float) -> list[int | None]:
    """For each engine band, the row its number is written in, or None where it is not numbered.

    A number is centred on its band and takes about ``(digits * 0.6 + 0.5) * 9 pt`` of width; it goes in
    the first row where it clears the last number written there. Where some number would clear no row,
    only every k-th band is numbered (the first included), with the smallest k that lets every number
    written clear the others: numbers never run together.
    """
    for step in range(1, len(spans) + 1):
        rows = _rows(spans[::step], seconds_per_inch)
        if rows is not None:
            chosen = iter(rows)
            return [next(chosen) if i % step == 0 else None for i in range(len(spans))]
    return [None] * len(spans)


def _label_engines(ax: Axes, spans: list[tuple[int, float, float]], seconds_per_inch: float) -> bool:
    """Number the engine bands (:func:`label_rows`); whether every band got its number."""
    rows = label_rows(spans, seconds_per_inch)
    for (index, start, end), row in zip(spans, rows, strict=True):
        if row is not None:
            ax.text((start + end) / 2, _LABEL_ROWS[row], str(index), transform=ax.get_xaxis_transform(),
                    ha="center", va="top", fontsize=9, color="#444444", zorder=6, gid=f"engine:{index}")
    return all(row is not None for row in rows)


def _model_line(ax: Axes, run: Results, name: str) -> str | None:
    """The baseline + model size across the panel (:func:`model_level`); where the strategy recorded no baseline,
    a note saying why it is not drawn, for the panel's right-hand title."""
    level = model_level(run, name)
    if level is None:
        return "no baseline recorded: baseline + model size not drawn"
    ax.axhline(level, zorder=2, gid=f"model:{name}", **MODEL_STYLE)
    return None


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


def _timeline_panel(ax: Axes, strip: Axes, run: Results, name: str, top: float, width_in: float) -> None:
    """One strategy's memory over time, on its own time axis in seconds from its load start and on the figure's
    memory scale (``top``, :func:`memory_top`), and its page-cache residency in ``strip``; ``width_in``: the
    figure's width (inches), which places the engine numbers."""
    s, m, samples = run.strategies[name], run.metrics[name], run.samples[name]
    origin = time_origin(s, samples)
    frame = samples.dropna(subset=["t_s", "rss_bytes"])
    spans = engine_spans(s, samples, origin)
    lo, hi = _time_extent(s, samples)
    hi = hi if hi > lo else lo + 1.0
    margin = (hi - lo) * 0.01
    ax.set_xlim(min(0.0, lo) - margin, hi + margin)
    for index, start, end in spans:
        ax.axvspan(start, end, color=_BANDS[index % 2], linewidth=0, zorder=0)
    seconds_per_inch = (hi - min(0.0, lo) + 2 * margin) / (width_in * 0.78)
    every = _label_engines(ax, spans, seconds_per_inch)
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
    notes = [note for note in (None if m.gpu_measured else "no GPU", _model_line(ax, run, name),
                               None if every else "engines too narrow to number each: every few numbered") if note]
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
    ax.set_ylabel("process memory\n(GiB)")


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
        Line2D([], [], label=f"baseline (RSS before the load) + {model_label(run)}", **MODEL_STYLE),
        Line2D([], [], color=SERIES_COLOURS["resident"], linewidth=1.4,
               label="checkpoint in page cache (the strip under each panel)"),
        Line2D([], [], color=SERIES_COLOURS["phase"], linestyle=":", linewidth=1.2, label="load start"),
        Line2D([], [], color=SERIES_COLOURS["phase"], linestyle="-.", linewidth=1.2, label="partitioning"),
        Patch(facecolor=_BANDS[0], edgecolor="#BBBBBB", label="engine build (its number above)"),
    ]
    return handles


@styled
def timeline_figure(run: Results) -> Figure:
    """One panel per strategy, each on its own time axis, all on one memory scale (:func:`memory_top`), each with
    its page-cache strip under it. The memory panels are the figure's first axes, in run order; their strips
    follow."""
    strategies = list(run.strategies)
    panels = max(1, len(strategies))
    fig = new_figure(12.0, 2.2 + 3.4 * panels, run)
    grid = fig.add_gridspec(2 * panels, 1, height_ratios=(3.0, 1.0) * panels)
    axes = [fig.add_subplot(grid[2 * i, 0]) for i in range(panels)]
    strips = [fig.add_subplot(grid[2 * i + 1, 0], sharex=axes[i]) for i in range(panels)]
    for ax in axes:
        ax.tick_params(labelbottom=False)
    top = memory_top(run)
    for ax, strip, name in zip(axes, strips, strategies, strict=False):
        _timeline_panel(ax, strip, run, name, top, fig.get_figwidth())
        strip.set_xlabel("seconds from the strategy's load start", labelpad=1)
    if not strategies:
        axes[0].text(0.5, 0.5, "no strategies in this run", transform=axes[0].transAxes, ha="center")
    title = (f"{run.name}: memory over time by loading strategy ({run_subject(run)}; every panel on one memory "
             "scale, each on its own time axis: read the seconds on its axis)")
    figure_legend(fig, _timeline_legend(run), title)
    return fig
