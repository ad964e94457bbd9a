"""``<name>.engines.png``: engine by engine, each strategy's host high-water mark, what it released, its build time.

Every strategy's marks, bars and line sit at its own small offset from the engine's
position, with its own marker and line style, so that no line hides another; a strategy
whose marks equal an earlier one's at every engine, to the decimals the report prints
(:func:`harness.report.style.coinciding`), says so in the legend. Each legend entry gives the
strategy's build phase as the report's table prints it (:attr:`~harness.results.metrics.StrategyMetrics.build_s`
formatted by :func:`~harness.report.text.format_seconds`); the bars under it are each engine's
own span, whose sum leaves out the moments between engines. The released panel gives a slot
only to the strategies that released something (its title names the others), so that no empty
slot splits an engine's group.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.report.style import SERIES_COLOURS, coinciding, figure_legend, gib, new_figure, strategy_line, styled
from harness.report.text import format_seconds, gib_decimals, run_subject
from harness.results.reading import Results
from harness.units import GIB

__all__ = ["engines_figure"]


@styled
def engines_figure(run: Results) -> Figure:
    """Per engine: weights (bars) and each strategy's host high-water mark; what each released; build seconds."""
    names = list(run.strategies)
    fig = new_figure(12.0, 9.6, run)
    top, middle, bottom = fig.subplots(3, 1, sharex=True, height_ratios=(3, 2, 2))
    weights: dict[int, int] = {}
    for record in run.strategies.values():
        for e in record.engines:
            weights.setdefault(e.index, e.weight_bytes)
    indices = sorted(weights)
    handles: list[Any] = []
    if indices:
        top.bar(indices, gib([weights[i] for i in indices]), 0.6, color=SERIES_COLOURS["weights"], zorder=1)
        handles.append(Patch(color=SERIES_COLOURS["weights"], label="engine weights"))
    width = 0.8 / max(1, len(names))
    model = run.record.model.bytes
    decimals = gib_decimals(model)
    marks = {name: {e.index: e.host_hwm_bytes / GIB for e in run.strategies[name].engines
                    if e.host_hwm_bytes is not None} for name in names}
    same = coinciding(marks, 0.5 * 10**-decimals)
    # the released panel gives slots only to strategies that released something, so no empty slot splits a group
    releasing = [name for name in names if any(e.released_bytes for e in run.strategies[name].engines)]
    released_width = 0.8 / max(1, len(releasing))
    for i, name in enumerate(names):
        record, metrics = run.strategies[name], run.metrics[name]
        line = strategy_line(name, names)
        colour = line["color"]
        offsets = -0.4 + width * (i + 0.5)
        label = name if record.ok else f"{name} (FAILED, partial)"
        if name in same:
            label += f" (line same as {same[name]}'s, to {10**-decimals:.{decimals}f} GiB)"
        if marks[name]:
            top.plot(np.asarray(list(marks[name]), dtype="float64") + offsets, list(marks[name].values()),
                     markersize=5, linewidth=1.6, zorder=3, gid=f"hwm:{name}", **line)
        released = [(e.index, e.released_bytes) for e in record.engines if e.released_bytes]
        if released:
            xs, ys = zip(*released, strict=True)
            slot = releasing.index(name)
            middle.bar(np.asarray(xs) - 0.4 + released_width * (slot + 0.5), gib(ys), released_width, color=colour,
                       zorder=2, gid=f"released:{name}")
        if any(e.released_bytes is not None for e in record.engines) and metrics.released_share is not None:
            label += f", released {metrics.released_share * 100:.0f}% of the model"
        if metrics.engine_s:
            xs, seconds = zip(*metrics.engine_s, strict=True)
            bottom.bar(np.asarray(xs) + offsets, seconds, width, color=colour, zorder=2, gid=f"build-s:{name}")
        if metrics.build_s is not None:
            label += f", build phase {format_seconds(metrics.build_s)}"
        handles.append(Line2D([], [], linewidth=1.6, markersize=5, label=label, **line))
    top.set_ylabel("host high-water\nmark (GiB)")
    top.set_ylim(bottom=0)
    top.set_title("host high-water mark while each engine is built (lines), its weights (bars)", loc="left")
    middle.set_ylabel("released (GiB)")
    middle.set_ylim(bottom=0)
    kept = [name for name in names if name not in releasing]
    middle.set_title("released after each engine's build" + (f" (none by {', '.join(kept)})" if kept else ""),
                     loc="left")
    bottom.set_ylabel("build time (s)")
    bottom.set_ylim(bottom=0)
    bottom.set_title("time to build each engine (its weights read, copied and released)", loc="left")
    bottom.set_xlabel("engine (build order)")
    for ax in (top, middle, bottom):
        ax.grid(axis="y", color="#E5E5E5", zorder=0)
    if indices:
        bottom.set_xticks(indices, [str(i) for i in indices], rotation=90 if len(indices) > 40 else 0)
    else:
        top.text(0.5, 0.5, "no engines recorded", transform=top.transAxes, ha="center", color="#777777")
    figure_legend(fig, handles, f"{run.name}: memory and time engine by engine ({run_subject(run)})")
    return fig
