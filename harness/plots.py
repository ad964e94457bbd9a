"""Figures of a results directory, for reviewers who read them without running anything.

* ``<name>-timeline.png``: one panel per strategy on a shared time axis: RSS split into anonymous
  and file-backed memory, the checkpoint's page-cache residency, GPU memory, engine builds shaded.
* ``<name>-peaks.png``: the strategies' peaks side by side, with reference figures hatched.
* ``<name>-engines.png``: engine by engine, each strategy's host high-water mark and what it released.

Every figure carries a footer saying what machine, backend, cache state and versions made it.
Figures are drawn on the Agg canvas without pyplot, so rendering touches no global backend state.
"""

from __future__ import annotations

import argparse
import functools
import io
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from harness.floor import compared_peak_label, floor_or_none
from harness.report import gib_decimals, machine_text, short_commit, status_text, write_report
from harness.results import GIB, RunResults, StrategyResult, load_results, write_atomic

STYLE: dict[str, Any] = {
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
"""Matplotlib settings every figure is drawn with: no text under 9 pt."""

SERIES_COLOURS = {
    "anon": "#E69F00",
    "file": "#56B4E9",
    "resident": "#009E73",
    "gpu": "#7B3294",
    "host_gpu": "#8B0000",
    "model": "#555555",
    "floor": "#000000",
    "weights": "#C8C8C8",
    "phase": "#444444",
}
"""One colour per memory series, the same in every figure."""

STRATEGY_COLOURS = {"map": "#0072B2", "load": "#D55E00", "load_file": "#CC79A7"}
"""One colour per strategy, the same in every figure."""

_EXTRA_COLOURS = ("#44AA99", "#882255", "#999933", "#332288", "#117733", "#AA4499")
_BANDS = ("#E6E6E6", "#F4F4F4")
_REFERENCE_HATCHES = ("//", "\\\\", "xx", "..")
_MODEL_STYLE: dict[str, Any] = {"color": SERIES_COLOURS["model"], "linestyle": "-", "linewidth": 1.3}
_FLOOR_STYLE: dict[str, Any] = {"color": SERIES_COLOURS["floor"], "linestyle": "--", "linewidth": 1.4}
_FOOTER_PT = 9
_DPI = 120
FIGURE_KINDS = ("timeline", "peaks", "engines")


def strategy_colour(name: str, order: Sequence[str]) -> str:
    """The colour of strategy ``name``; strategies without a fixed colour take one by position."""
    if name in STRATEGY_COLOURS:
        return STRATEGY_COLOURS[name]
    others = [n for n in order if n not in STRATEGY_COLOURS]
    index = others.index(name) if name in others else len(others)
    return _EXTRA_COLOURS[index % len(_EXTRA_COLOURS)]


def _styled(build: Callable[[RunResults], Figure]) -> Callable[[RunResults], Figure]:
    """Draw a figure under :data:`STYLE`, whoever calls the builder."""

    @functools.wraps(build)
    def wrapper(run: RunResults) -> Figure:
        with mpl.rc_context(cast(Any, STYLE)):
            return build(run)

    return wrapper


def footer_text(run: RunResults) -> str:
    """Provenance: machine, backend, device, cache, versions, commit, date (wrapped when drawn)."""
    versions = ", ".join(f"{k} {v}" for k, v in run.versions.items() if v)
    commit = short_commit(run.commit, 10)
    parts = [
        f"machine: {machine_text(run)}",
        f"backend {run.backend}, device {run.device}, cache {run.cache or 'unknown'}",
        versions,
        f"commit {commit}",
        f"created {run.created or 'unknown'}",
    ]
    return "   |   ".join(p for p in parts if p)


def _new_figure(width: float, height: float, run: RunResults) -> Figure:
    """A constrained-layout figure with the provenance footer reserved at the bottom."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    chars = max(60, int(width * 72 / (_FOOTER_PT * 0.56)))
    lines = textwrap.wrap(footer_text(run), width=chars, break_on_hyphens=False)
    footer_in = (len(lines) * _FOOTER_PT * 1.35 + 8) / 72
    fig.text(
        0.01,
        0.04 / height,
        "\n".join(lines),
        fontsize=_FOOTER_PT,
        color="#333333",
        ha="left",
        va="bottom",
        linespacing=1.35,
    )
    engine = fig.get_layout_engine()
    if isinstance(engine, ConstrainedLayoutEngine):
        engine.set(rect=(0.0, footer_in / height, 1.0, 1.0 - footer_in / height))
    return fig


def _legend_columns(widths: list[float], ncols: int) -> list[list[float]]:
    """Split entries into columns as matplotlib does: in order, column sizes differing by at most one."""
    base, extra = divmod(len(widths), ncols)
    columns, start = [], 0
    for i in range(ncols):
        size = base + (1 if i < extra else 0)
        if size:
            columns.append(widths[start : start + size])
        start += size
    return columns


def _legend(fig: Figure, handles: list[Any], title: str) -> None:
    """The figure's legend above the axes, titled with the figure's title.

    The title lives in the legend because constrained layout does not keep a suptitle clear of a
    legend placed outside the axes. Columns are as many as the figure's width holds.
    """
    widths = [(len(h.get_label()) * 0.6 * 9 + 45) / 72 for h in handles]
    ncols = 1
    for candidate in range(len(widths), 0, -1):
        if sum(max(column) for column in _legend_columns(widths, candidate)) <= fig.get_figwidth() * 0.95:
            ncols = candidate
            break
    fig.legend(
        handles=handles,
        loc="outside upper center",
        ncols=ncols,
        frameon=False,
        title=title,
        title_fontproperties={"size": 12, "weight": "bold"},
    )


def _model_label(run: RunResults) -> str:
    return f"model size ({run.model.bytes / GIB:.{gib_decimals(run.model.bytes)}f} GiB)"


def _gib(values: Any) -> Any:
    return np.asarray(values, dtype="float64") / GIB


def time_origin(strategy: StrategyResult) -> float:
    """Where a strategy's timeline starts counting: its load start (else its first sample).

    Panels share one time axis from each strategy's own load start, so that strategies line up
    although their processes spend different times importing before the load begins.
    """
    if strategy.phases.load_start_s is not None:
        return strategy.phases.load_start_s
    if len(strategy.samples) and strategy.samples["t_s"].notna().any():
        return float(strategy.samples["t_s"].min())
    return 0.0


def _engine_spans(strategy: StrategyResult, origin: float = 0.0) -> list[tuple[int, float, float]]:
    """(index, start, end) of every engine build, in seconds from ``origin``.

    An engine that started but never ended (a failed build) runs to the last sample.
    """
    spans = []
    last = float(strategy.samples["t_s"].max()) if len(strategy.samples) else None
    for engine in strategy.engines:
        end = engine.end_s if engine.end_s is not None else last
        if engine.start_s is not None and end is not None:
            spans.append((engine.index, engine.start_s - origin, end - origin))
    return spans


def _time_extent(strategy: StrategyResult) -> tuple[float, float]:
    """First and last time a strategy's panel draws, in seconds from its origin."""
    origin = time_origin(strategy)
    times = [t for _, start, end in _engine_spans(strategy, origin) for t in (start, end)]
    if len(strategy.samples) and strategy.samples["t_s"].notna().any():
        t_s = strategy.samples["t_s"]
        times += [float(t_s.min()) - origin, float(t_s.max()) - origin]
    return (min(times), max(times)) if times else (0.0, 1.0)


def _timeline_top(run: RunResults) -> float:
    """The highest value (GiB) any panel draws, so panels can share one y-axis."""
    tops = [run.model.bytes / GIB]
    for s in run.strategies.values():
        frame = s.samples
        if len(frame):
            tops.append(float(np.nanmax(_gib(frame["rss_bytes"]))))
            tops.append(float(np.nanmax(_gib(frame["resident_bytes"]))))
            host_gpu = _gib(frame["rss_bytes"] + frame["gpu_used_bytes"])
            if np.isfinite(host_gpu).any():
                tops.append(float(np.nanmax(host_gpu)))
        floor = floor_or_none(s, run.device)
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


def _timeline_panel(ax: Axes, fig: Figure, run: RunResults, s: StrategyResult, x_range: float) -> None:
    """One strategy's memory over time, in seconds from its load start."""
    origin = time_origin(s)
    frame = s.samples.dropna(subset=["t_s", "rss_bytes"])
    spans = _engine_spans(s, origin)
    for index, start, end in spans:
        ax.axvspan(start, end, color=_BANDS[index % 2], linewidth=0, zorder=0)
    _label_engines(ax, fig, spans, x_range)
    if len(frame):
        t = frame["t_s"].to_numpy(dtype="float64") - origin
        anon = np.nan_to_num(_gib(frame["anon_bytes"]))
        file_ = np.nan_to_num(_gib(frame["file_bytes"]))
        ax.stackplot(
            t,
            anon,
            file_,
            colors=(SERIES_COLOURS["anon"], SERIES_COLOURS["file"]),
            alpha=0.8,
            linewidth=0,
            zorder=1,
        )
        ax.plot(t, _gib(frame["resident_bytes"]), color=SERIES_COLOURS["resident"], linewidth=1.5, zorder=3)
        gpu = _gib(frame["gpu_used_bytes"])
        if np.isfinite(gpu).any():
            ax.plot(t, gpu, color=SERIES_COLOURS["gpu"], linewidth=1.5, zorder=3)
            host_gpu = _gib(frame["rss_bytes"] + frame["gpu_used_bytes"])
            ax.plot(t, host_gpu, color=SERIES_COLOURS["host_gpu"], linewidth=1.5, zorder=4)
    else:
        ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center", va="center", color="#777777")
    for value, style in ((s.phases.load_start_s, ":"), (s.phases.partition_s, "-.")):
        if value is not None:
            x = value - origin
            ax.axvline(x, color=SERIES_COLOURS["phase"], linestyle=style, linewidth=1.2, zorder=5)
    ax.axhline(run.model.bytes / GIB, zorder=2, **_MODEL_STYLE)
    floor = floor_or_none(s, run.device)
    if floor is not None:
        ax.axhline(floor / GIB, zorder=2, **_FLOOR_STYLE)
    title = f"{s.name}: {'ok' if s.ok else 'FAILED'}"
    if s.wall_s is not None:
        title += f", wall {s.wall_s:.1f} s"
    if origin > 0:
        title += f", load began {origin:.1f} s after process start"
    if s.peak_source:
        title += f", peaks from {s.peak_source}"
    ax.set_title(title, loc="left", color="#000000" if s.ok else "#B00000", fontweight="bold")
    if not s.gpu_measured:
        ax.set_title("no GPU", loc="right", color="#555555")
    if not s.ok:
        reason = textwrap.fill(status_text(s), width=70)
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


def _timeline_legend(run: RunResults) -> list[Any]:
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
    floor_label = f"floor: lowest possible {compared_peak_label(run.device)}"
    handles += [
        Line2D([], [], label=_model_label(run), **_MODEL_STYLE),
        Line2D([], [], label=floor_label, **_FLOOR_STYLE),
        Line2D([], [], color=SERIES_COLOURS["phase"], linestyle=":", linewidth=1.2, label="load start"),
        Line2D([], [], color=SERIES_COLOURS["phase"], linestyle="-.", linewidth=1.2, label="partitioning"),
        Patch(facecolor=_BANDS[0], edgecolor="#BBBBBB", label="engine build (number at top)"),
    ]
    return handles


@_styled
def timeline_figure(run: RunResults) -> Figure:
    """One panel per strategy on a shared time axis."""
    strategies = list(run.strategies.values())
    panels = max(1, len(strategies))
    fig = _new_figure(12.0, 2.0 + 2.6 * panels, run)
    axes = fig.subplots(panels, 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    extents = [_time_extent(s) for s in strategies] or [(0.0, 1.0)]
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
    title = f"{run.name}: memory over time by loading strategy ({run.model.name})"
    _legend(fig, _timeline_legend(run), title)
    return fig


def _peak_metrics(run: RunResults) -> list[tuple[str, str]]:
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


@_styled
def peaks_figure(run: RunResults) -> Figure:
    """Grouped bars: each metric's value per strategy, references hatched, model size and floor."""
    decimals = gib_decimals(run.model.bytes)
    metrics = _peak_metrics(run)
    strategies = list(run.strategies.values())
    order = [s.name for s in strategies]
    series = len(strategies) + len(run.references)
    fig = _new_figure(max(9.0, 2.2 * len(metrics) + 0.5 * series * len(metrics) / 2), 6.4, run)
    ax = fig.subplots()
    width = 0.8 / max(1, series)
    x = np.arange(len(metrics), dtype="float64")
    values: list[float] = [run.model.bytes / GIB]
    bars: list[tuple[float, float | None, str]] = []
    handles: list[Any] = []
    compared = "host_gpu_peak" if run.on_gpu else "host_peak"
    floor_drawn = False
    for i, s in enumerate(strategies):
        colour = strategy_colour(s.name, order)
        offsets = x - 0.4 + width * (i + 0.5)
        for offset, (attribute, _) in zip(offsets, metrics, strict=True):
            raw = getattr(s, f"{attribute}_bytes")
            value = None if raw is None else raw / GIB
            if value is not None:
                ax.bar(offset, value, width, color=colour, alpha=1.0 if s.ok else 0.45, edgecolor="white")
                values.append(value)
            bars.append((offset, value, "" if value is None else f"{value:.{decimals}f}"))
            floor = floor_or_none(s, run.device)
            if attribute == compared and floor is not None:
                ax.hlines(floor / GIB, offset - width * 0.6, offset + width * 0.6, zorder=5, **_FLOOR_STYLE)
                values.append(floor / GIB)
                floor_drawn = True
        label = s.name if s.ok else f"{s.name} (FAILED, partial)"
        handles.append(Patch(color=colour, alpha=1.0 if s.ok else 0.45, label=label))
    for j, ref in enumerate(run.references):
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
    ax.axhline(run.model.bytes / GIB, zorder=4, **_MODEL_STYLE)
    handles.append(Line2D([], [], label=_model_label(run), **_MODEL_STYLE))
    if floor_drawn:
        floor_label = f"floor: lowest possible {compared_peak_label(run.device)}"
        handles.append(Line2D([], [], label=floor_label, **_FLOOR_STYLE))
    ax.set_xticks(x, [label for _, label in metrics])
    ax.set_xlim(-0.5, len(metrics) - 0.5)
    ax.set_ylim(0, top)
    ax.set_ylabel("GiB")
    if not run.gpu_measured:
        ax.set_title("no GPU: host + GPU peak not measured", loc="right", color="#555555")
    ax.set_title(f"values in GiB, {decimals} decimals", loc="left", color="#555555")
    _legend(fig, handles, f"{run.name}: memory peaks by loading strategy ({run.model.name})")
    return fig


@_styled
def engines_figure(run: RunResults) -> Figure:
    """Per engine: weights (bars) and each strategy's host high-water mark; below, what each released."""
    strategies = list(run.strategies.values())
    order = [s.name for s in strategies]
    fig = _new_figure(12.0, 7.6, run)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    weights: dict[int, int] = {}
    for s in strategies:
        for e in s.engines:
            weights.setdefault(e.index, e.weight_bytes)
    indices = sorted(weights)
    handles: list[Any] = []
    if indices:
        top.bar(indices, _gib([weights[i] for i in indices]), 0.6, color=SERIES_COLOURS["weights"], zorder=1)
        handles.append(Patch(color=SERIES_COLOURS["weights"], label="engine weights"))
    count = max(1, len(strategies))
    width = 0.8 / count
    for i, s in enumerate(strategies):
        colour = strategy_colour(s.name, order)
        label = s.name if s.ok else f"{s.name} (FAILED, partial)"
        hwm = [(e.index, e.host_hwm_bytes) for e in s.engines if e.host_hwm_bytes is not None]
        if hwm:
            xs, ys = zip(*hwm, strict=True)
            top.plot(xs, _gib(ys), marker="o", markersize=5, linewidth=1.6, color=colour, zorder=3)
        released = [(e.index, e.released_bytes) for e in s.engines if e.released_bytes is not None]
        total = sum(r for _, r in released)
        if released:
            xs, ys = zip(*released, strict=True)
            bottom.bar(np.asarray(xs) - 0.4 + width * (i + 0.5), _gib(ys), width, color=colour, zorder=2)
        if released and run.model.bytes > 0:
            label += f", released {total / run.model.bytes * 100:.0f}% of the model"
        handles.append(Line2D([], [], color=colour, marker="o", linewidth=1.6, label=label))
    top.set_ylabel("host high-water mark (GiB)")
    top.set_ylim(bottom=0)
    top.set_title("host high-water mark while each engine is built (lines), its weights (bars)", loc="left")
    bottom.set_ylabel("released (GiB)")
    bottom.set_ylim(bottom=0)
    bottom.set_title("released after each engine's build", loc="left")
    bottom.set_xlabel("engine (build order)")
    if 0 < len(indices) <= 40:
        bottom.set_xticks(indices)
    else:
        bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    if not indices:
        top.text(0.5, 0.5, "no engines recorded", transform=top.transAxes, ha="center", color="#777777")
    _legend(fig, handles, f"{run.name}: memory engine by engine ({run.model.name})")
    return fig


def save_figure(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=_DPI)
    return write_atomic(path, buffer.getvalue())


def figure_paths(name: str, out_dir: Path) -> dict[str, Path]:
    """Where each figure of run ``name`` goes."""
    return {kind: out_dir / f"{name}-{kind}.png" for kind in FIGURE_KINDS}


def render_all(results_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Render the three figures and the markdown report of ``results_dir``.

    ``out_dir`` defaults to the results directory's parent (``results/``), where reviewers find
    ``<name>-timeline.png``, ``<name>-peaks.png``, ``<name>-engines.png`` and ``<name>.md``.
    Returns the written paths.
    """
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir.parent
    run = load_results(results_dir)
    builders = {"timeline": timeline_figure, "peaks": peaks_figure, "engines": engines_figure}
    written = [save_figure(builders[kind](run), path) for kind, path in figure_paths(run.name, out).items()]
    figures = [p.name for p in written]
    written.append(write_report(run, out / f"{run.name}.md", figures))
    return written


def main_plot(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m harness plot results/<name> [--out DIR]``. Returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m harness plot",
        description="Re-render the figures and the markdown report of a results directory.",
    )
    parser.add_argument("results_dir", type=Path, help="a results directory holding summary.json")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: its parent)")
    args = parser.parse_args(argv)
    try:
        written = render_all(args.results_dir, args.out)
    except FileNotFoundError as error:
        print(f"plot: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
