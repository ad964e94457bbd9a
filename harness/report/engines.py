"""``<name>-engines.png``: engine by engine, each strategy's host high-water mark and what it released."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from harness.report.style import SERIES_COLOURS, figure_legend, gib, new_figure, strategy_colour, styled
from harness.results import Results


@styled
def engines_figure(run: Results) -> Figure:
    """Per engine: weights (bars) and each strategy's host high-water mark; below, what each released."""
    strategies = [(name, record, run.metrics[name]) for name, record in run.strategies.items()]
    order = [name for name, _, _ in strategies]
    fig = new_figure(12.0, 7.6, run)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    weights: dict[int, int] = {}
    for _, s, _ in strategies:
        for e in s.engines:
            weights.setdefault(e.index, e.weight_bytes)
    indices = sorted(weights)
    handles: list[Any] = []
    if indices:
        top.bar(indices, gib([weights[i] for i in indices]), 0.6, color=SERIES_COLOURS["weights"], zorder=1)
        handles.append(Patch(color=SERIES_COLOURS["weights"], label="engine weights"))
    count = max(1, len(strategies))
    width = 0.8 / count
    for i, (name, s, _) in enumerate(strategies):
        colour = strategy_colour(name, order)
        label = name if s.ok else f"{name} (FAILED, partial)"
        hwm = [(e.index, e.host_hwm_bytes) for e in s.engines if e.host_hwm_bytes is not None]
        if hwm:
            xs, ys = zip(*hwm, strict=True)
            top.plot(xs, gib(ys), marker="o", markersize=5, linewidth=1.6, color=colour, zorder=3)
        released = [(e.index, e.released_bytes) for e in s.engines if e.released_bytes is not None]
        total = sum(r for _, r in released)
        if released:
            xs, ys = zip(*released, strict=True)
            bottom.bar(np.asarray(xs) - 0.4 + width * (i + 0.5), gib(ys), width, color=colour, zorder=2)
        if released and run.record.model.bytes > 0:
            label += f", released {total / run.record.model.bytes * 100:.0f}% of the model"
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
    figure_legend(fig, handles, f"{run.name}: memory engine by engine ({run.record.model.name})")
    return fig
