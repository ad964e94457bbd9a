"""``<name>-timeline.png``: one panel per strategy, on one time axis and one memory scale.

Each panel shows the process's RSS split into anonymous and file-backed memory, GPU
memory where there is a GPU, the floor, the model size, and every engine build shaded and
numbered (a narrow band's number moves down a row rather than being left out). Every panel
has the same memory scale, from zero to the highest value any panel draws or the model
size, whichever is higher: a strategy that stays near its floor looks as small as it is
beside one that holds the whole model, and the model-size line sits at the same height in
every panel. The checkpoint's page-cache residency, which belongs to the machine rather
than to the process, is drawn against its own axis on the right, in per cent of the
checkpoint, on the same scale: 100% at the checkpoint's size in GiB, just above the
model-size line.
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
from harness.report.text import GIB, status_text
from harness.results.reading import Results
from harness.results.record import StrategyRecord

__all__ = ["engine_spans", "label_rows", "memory_top", "time_origin", "timeline_figure"]

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


def memory_top(run: Results) -> float:
    """The top of every panel's memory axis (GiB): the highest value any panel draws, or the model size if
    higher, with room above for the engine numbers."""
    tops = [_panel_top(run, name) for name in run.strategies] + [run.record.model.bytes / GIB]
    return max(tops) * 1.3


def _timeline_panel(ax: Axes, run: Results, name: str, seconds_per_inch: float, top: float) -> None:
    """One strategy's memory over time, in seconds from its load start, on the memory axis from 0 to ``top``."""
    s, m, samples = run.strategies[name], run.metrics[name], run.samples[name]
    origin = time_origin(s, samples)
    frame = samples.dropna(subset=["t_s", "rss_bytes"])
    spans = engine_spans(s, samples, origin)
    for index, start, end in spans:
        ax.axvspan(start, end, color=_BANDS[index % 2], linewidth=0, zorder=0)
    _label_engines(ax, spans, seconds_per_inch)
    residency = ax.twinx()
    residency.spines["right"].set_visible(True)
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
        checkpoint = run.record.checkpoint.bytes
        if checkpoint > 0:
            share = frame["resident_bytes"].to_numpy(dtype="float64") / checkpoint * 100
            residency.plot(t, share, color=SERIES_COLOURS["resident"], linewidth=1.4, zorder=3)
    else:
        ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center", va="center", color="#777777")
    for value, style in ((s.phases.load_start_s, ":"), (s.phases.partition_s, "-.")):
        if value is not None:
            ax.axvline(value - origin, color=SERIES_COLOURS["phase"], linestyle=style, linewidth=1.2, zorder=5)
    ax.axhline(run.record.model.bytes / GIB, zorder=2, **MODEL_STYLE)
    if m.floor_bytes is not None:
        ax.axhline(m.floor_bytes / GIB, zorder=2, **FLOOR_STYLE)
    ax.set_ylim(0, top)
    checkpoint_gib = run.record.checkpoint.bytes / GIB
    # on the memory scale: the whole checkpoint cached sits at its size in GiB, at the model-size line
    residency.set_ylim(0, top / checkpoint_gib * 100 if checkpoint_gib > 0 else 130)
    residency.set_yticks([0, 25, 50, 75, 100])
    residency.set_ylabel("page cache\n(% of checkpoint)", color=SERIES_COLOURS["resident"])
    residency.tick_params(axis="y", colors=SERIES_COLOURS["resident"])
    title = f"{name}: {'ok' if s.ok else 'FAILED'}"
    if m.record.wall_s is not None:
        title += f", wall {m.record.wall_s:.1f} s"
    if origin > 0:
        title += f", load began {origin:.1f} s after process start"
    ax.set_title(title, loc="left", color="#000000" if s.ok else "#B00000", fontweight="bold")
    if not m.gpu_measured:
        ax.set_title("no GPU", loc="right", color="#555555")
    if not s.ok:
        ax.text(0.99, 0.5, textwrap.fill(status_text(m), width=70), transform=ax.transAxes, ha="right",
                va="center", fontsize=10, color="#B00000", zorder=10,
                bbox={"boxstyle": "round,pad=0.4", "facecolor": "white", "edgecolor": "#B00000", "alpha": 0.95})
    ax.set_ylabel("process memory (GiB)")


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
        Line2D([], [], color=SERIES_COLOURS["resident"], linewidth=1.4, label="checkpoint in page cache (right)"),
        Line2D([], [], color=SERIES_COLOURS["phase"], linestyle=":", linewidth=1.2, label="load start"),
        Line2D([], [], color=SERIES_COLOURS["phase"], linestyle="-.", linewidth=1.2, label="partitioning"),
        Patch(facecolor=_BANDS[0], edgecolor="#BBBBBB", label="engine build (its number above)"),
    ]
    return handles


@styled
def timeline_figure(run: Results) -> Figure:
    """One panel per strategy, on one time axis and one memory scale (:func:`memory_top`)."""
    strategies = list(run.strategies)
    panels = max(1, len(strategies))
    fig = new_figure(12.0, 2.2 + 2.7 * panels, run)
    axes = fig.subplots(panels, 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    extents = [_time_extent(run.strategies[s], run.samples[s]) for s in strategies] or [(0.0, 1.0)]
    x_min = min(0.0, *(lo for lo, _ in extents))
    x_max = max(hi for _, hi in extents)
    x_max = x_max if x_max > x_min else x_min + 1.0
    margin = (x_max - x_min) * 0.01
    seconds_per_inch = (x_max - x_min + 2 * margin) / (fig.get_figwidth() * 0.78)
    top = memory_top(run)
    for ax, name in zip(axes, strategies, strict=False):
        _timeline_panel(ax, run, name, seconds_per_inch, top)
    if not strategies:
        axes[0].text(0.5, 0.5, "no strategies in this run", transform=axes[0].transAxes, ha="center")
    axes[0].set_xlim(x_min - margin, x_max + margin)
    axes[-1].set_xlabel("seconds from each strategy's load start")
    title = f"{run.name}: memory over time by loading strategy ({run.record.model.name}; one memory scale for all)"
    figure_legend(fig, _timeline_legend(run), title)
    return fig
