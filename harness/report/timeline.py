"""``<name>-timeline.png``: one panel per strategy on a shared time axis.

Each panel shows RSS split into anonymous and file-backed memory, the checkpoint's page-cache
residency, GPU memory, and engine builds shaded.
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

from harness.metrics import compared_label
from harness.record import StrategyRecord
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
from harness.results import Results

_BANDS = ("#E6E6E6", "#F4F4F4")


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


def _engine_spans(strategy: StrategyRecord, samples: pd.DataFrame, origin: float = 0.0
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
    times = [t for _, start, end in _engine_spans(strategy, samples, origin) for t in (start, end)]
    if len(samples) and samples["t_s"].notna().any():
        t_s = samples["t_s"]
        times += [float(t_s.min()) - origin, float(t_s.max()) - origin]
    return (min(times), max(times)) if times else (0.0, 1.0)


def _timeline_top(run: Results) -> float:
    """The highest value (GiB) any panel draws, so panels can share one y-axis."""
    tops = [run.record.model.bytes / GIB]
    for name in run.strategies:
        frame = run.samples[name]
        if len(frame):
            tops.append(float(np.nanmax(gib(frame["rss_bytes"]))))
            tops.append(float(np.nanmax(gib(frame["resident_bytes"]))))
            host_gpu = gib(frame["rss_bytes"] + frame["gpu_used_bytes"])
            if np.isfinite(host_gpu).any():
                tops.append(float(np.nanmax(host_gpu)))
        floor = run.metrics[name].floor_bytes
        if floor is not None:
            tops.append(floor / GIB)
    finite = [t for t in tops if np.isfinite(t)]
    return max(finite) if finite else 1.0


def _label_engines(ax: Axes, fig: Figure, spans: list[tuple[int, float, float]], x_range: float) -> None:
    """Write engine numbers at the top of bands wide enough to hold them."""
    axes_width_in = fig.get_figwidth() * 0.86
    for index, start, end in spans:
        label = str(index)
        band_in = (end - start) / x_range * axes_width_in
        if band_in < (len(label) * 0.6 + 0.8) * 9 / 72:
            continue
        ax.text(
            (start + end) / 2,
            0.985,
            label,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="top",
            fontsize=9,
            color="#555555",
        )


def _timeline_panel(ax: Axes, fig: Figure, run: Results, name: str, x_range: float) -> None:
    """One strategy's memory over time, in seconds from its load start."""
    s, m, samples = run.strategies[name], run.metrics[name], run.samples[name]
    origin = time_origin(s, samples)
    frame = samples.dropna(subset=["t_s", "rss_bytes"])
    spans = _engine_spans(s, samples, origin)
    for index, start, end in spans:
        ax.axvspan(start, end, color=_BANDS[index % 2], linewidth=0, zorder=0)
    _label_engines(ax, fig, spans, x_range)
    if len(frame):
        t = frame["t_s"].to_numpy(dtype="float64") - origin
        anon = np.nan_to_num(gib(frame["anon_bytes"]))
        file_ = np.nan_to_num(gib(frame["file_bytes"]))
        ax.stackplot(
            t,
            anon,
            file_,
            colors=(SERIES_COLOURS["anon"], SERIES_COLOURS["file"]),
            alpha=0.8,
            linewidth=0,
            zorder=1,
        )
        ax.plot(t, gib(frame["resident_bytes"]), color=SERIES_COLOURS["resident"], linewidth=1.5, zorder=3)
        gpu = gib(frame["gpu_used_bytes"])
        if np.isfinite(gpu).any():
            ax.plot(t, gpu, color=SERIES_COLOURS["gpu"], linewidth=1.5, zorder=3)
            host_gpu = gib(frame["rss_bytes"] + frame["gpu_used_bytes"])
            ax.plot(t, host_gpu, color=SERIES_COLOURS["host_gpu"], linewidth=1.5, zorder=4)
    else:
        ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center", va="center", color="#777777")
    for value, style in ((s.phases.load_start_s, ":"), (s.phases.partition_s, "-.")):
        if value is not None:
            x = value - origin
            ax.axvline(x, color=SERIES_COLOURS["phase"], linestyle=style, linewidth=1.2, zorder=5)
    ax.axhline(run.record.model.bytes / GIB, zorder=2, **MODEL_STYLE)
    if m.floor_bytes is not None:
        ax.axhline(m.floor_bytes / GIB, zorder=2, **FLOOR_STYLE)
    title = f"{name}: {'ok' if s.ok else 'FAILED'}"
    if s.wall_s is not None:
        title += f", wall {s.wall_s:.1f} s"
    if origin > 0:
        title += f", load began {origin:.1f} s after process start"
    if s.peak_source:
        title += f", peaks from {s.peak_source}"
    ax.set_title(title, loc="left", color="#000000" if s.ok else "#B00000", fontweight="bold")
    if not m.gpu_measured:
        ax.set_title("no GPU", loc="right", color="#555555")
    if not s.ok:
        reason = textwrap.fill(status_text(m), width=70)
        ax.text(
            0.99,
            0.5,
            reason,
            transform=ax.transAxes,
            ha="right",
            va="center",
            fontsize=10,
            color="#B00000",
            zorder=10,
            bbox={"boxstyle": "round,pad=0.4", "facecolor": "white", "edgecolor": "#B00000", "alpha": 0.95},
        )
    ax.set_ylabel("GiB")


def _timeline_legend(run: Results) -> list[Any]:
    """The timeline's legend entries; GPU series only when a GPU was measured."""
    handles: list[Any] = [
        Patch(color=SERIES_COLOURS["anon"], alpha=0.8, label="RSS: anonymous"),
        Patch(color=SERIES_COLOURS["file"], alpha=0.8, label="RSS: file-backed"),
        Line2D([], [], color=SERIES_COLOURS["resident"], linewidth=1.5, label="checkpoint in page cache"),
    ]
    if run.gpu_measured:
        handles += [
            Line2D([], [], color=SERIES_COLOURS["gpu"], linewidth=1.5, label="GPU used"),
            Line2D([], [], color=SERIES_COLOURS["host_gpu"], linewidth=1.5, label="host + GPU"),
        ]
    floor_label = f"floor: lowest possible {compared_label(run.on_gpu)}"
    handles += [
        Line2D([], [], label=model_label(run), **MODEL_STYLE),
        Line2D([], [], label=floor_label, **FLOOR_STYLE),
        Line2D([], [], color=SERIES_COLOURS["phase"], linestyle=":", linewidth=1.2, label="load start"),
        Line2D([], [], color=SERIES_COLOURS["phase"], linestyle="-.", linewidth=1.2, label="partitioning"),
        Patch(facecolor=_BANDS[0], edgecolor="#BBBBBB", label="engine build (number at top)"),
    ]
    return handles


@styled
def timeline_figure(run: Results) -> Figure:
    """One panel per strategy on a shared time axis."""
    strategies = list(run.strategies)
    panels = max(1, len(strategies))
    fig = new_figure(12.0, 2.0 + 2.6 * panels, run)
    axes = fig.subplots(panels, 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    extents = [_time_extent(run.strategies[s], run.samples[s]) for s in strategies] or [(0.0, 1.0)]
    x_min = min(0.0, *(lo for lo, _ in extents))
    x_max = max(hi for _, hi in extents)
    x_max = x_max if x_max > x_min else x_min + 1.0
    margin = (x_max - x_min) * 0.01
    for ax, s in zip(axes, strategies, strict=False):
        _timeline_panel(ax, fig, run, s, x_max - x_min)
    if not strategies:
        axes[0].text(0.5, 0.5, "no strategies in this run", transform=axes[0].transAxes, ha="center")
    axes[0].set_xlim(x_min - margin, x_max + margin)
    axes[0].set_ylim(0, _timeline_top(run) * 1.15)
    axes[-1].set_xlabel("seconds from each strategy's load start")
    title = f"{run.name}: memory over time by loading strategy ({run.record.model.name})"
    figure_legend(fig, _timeline_legend(run), title)
    return fig
