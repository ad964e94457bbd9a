"""``<name>.engine-times.png``: each engine's build time per strategy, split into waiting for pages and copying.

One group of bars per engine, one bar per strategy: the lower, hatched part is the time
the build spent bringing the engine's weights into memory (one read of every page:
page faults, and disk reads for what was not in the page cache), the upper, solid part
the time it spent copying the resident weights to the engine and flushing it (see
:mod:`harness.engines.copy`), and an outlined cap the rest of the engine's span: for the
strategies that get each engine's tensors right before its build
(:data:`~harness.catalog.FETCHED_PER_ENGINE`: ``stream`` opens them as views, ``read_file`` reads
them with ``pread``), getting them; then releasing its weights (and, with prefetch, asking for the
next engine's pages) and the harness's own bookkeeping. Each strategy's legend entry sets its
engines' summed time beside its build phase, the figure the report's table prints. Where the run
measured the disk, a black tick over each group marks the engine's weights ÷ the disk's median
cold read rate: the time reading them once takes on this disk. Strategies without the split
(another backend) show one solid bar of the whole engine time.

A compiler's run that recorded no split is not drawn (:func:`engine_times_applies`): its bars
would be the compile times the compiler figure and the engines figure already show.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.catalog import FETCHED_PER_ENGINE
from harness.report.compiler import has_compiler
from harness.report.style import figure_legend, new_figure, strategy_colour, styled
from harness.report.text import format_seconds, run_subject
from harness.results.reading import Results
from harness.units import format_mb_per_s

__all__ = ["engine_times_applies", "engine_times_figure"]


def _split(run: Results) -> bool:
    """Whether any strategy's engines recorded the split into pages and copying."""
    return any(m.engine_copy_s for m in run.metrics.values())


def engine_times_applies(run: Results) -> bool:
    """Whether the figure is drawn for ``run``: unless it is a compiler's run without the split, whose engine times
    are the compile times the compiler figure and the engines figure show."""
    return not has_compiler(run) or _split(run)


def _rest_text(names: list[str]) -> str:
    """What the outlined top holds, for the strategies ``names`` of the run."""
    fetched = [f"{name} {FETCHED_PER_ENGINE[name]}" for name in names if name in FETCHED_PER_ENGINE]
    text = "outlined top: the rest of the engine's span: "
    return text + (f"first {', '.join(fetched)}; then " if fetched else "") + "releasing its weights, bookkeeping"


@styled
def engine_times_figure(run: Results) -> Figure:
    """Per engine and strategy: seconds waiting for pages (hatched) and copying (solid); the disk's time as ticks."""
    names = list(run.strategies)
    fig = new_figure(12.0, 6.4, run)
    ax = fig.subplots(1, 1)
    weights: dict[int, int] = {}
    for record in run.strategies.values():
        for e in record.engines:
            weights.setdefault(e.index, e.weight_bytes)
    indices = sorted(weights)
    width = 0.8 / max(1, len(names))
    handles: list[Any] = []
    for i, name in enumerate(names):
        metrics = run.metrics[name]
        colour = strategy_colour(name, names)
        offset = -0.4 + width * (i + 0.5)
        pages = dict(metrics.engine_pages_s)
        copies = dict(metrics.engine_copy_s)
        totals = dict(metrics.engine_s)
        xs = [x for x in indices if x in totals]
        if not xs:
            continue
        low = np.asarray([pages.get(x, 0.0) if x in copies else 0.0 for x in xs])
        high = np.asarray([copies[x] if x in copies else totals[x] for x in xs])
        rest = np.clip(np.asarray([totals[x] for x in xs]) - low - high, 0.0, None)
        at = np.asarray(xs, dtype=float) + offset
        ax.bar(at, low, width, color=colour, alpha=0.35, hatch="///", edgecolor=colour, linewidth=0, zorder=2,
               gid=f"pages-s:{name}")
        ax.bar(at, high, width, bottom=low, color=colour, zorder=2, gid=f"copy-s:{name}")
        ax.bar(at, rest, width, bottom=low + high, facecolor="#FFFFFF", edgecolor=colour, linewidth=1.0, zorder=2,
               gid=f"rest-s:{name}")
        label = f"{name}: engines {format_seconds(sum(totals[x] for x in xs))}"
        if metrics.build_s is not None:
            label += f" of its {format_seconds(metrics.build_s)} build phase"
        if metrics.pages_s is not None and metrics.copy_s is not None:
            fetched = f": {FETCHED_PER_ENGINE[name]} first" if name in FETCHED_PER_ENGINE else ""
            label += (f" ({format_seconds(metrics.pages_s)} pages, {format_seconds(metrics.copy_s)} copy, "
                      f"{format_seconds(float(rest.sum()))} rest{fetched})")
        if not metrics.record.ok:
            label += " (FAILED, partial)"
        handles.append(Patch(color=colour, label=label))
    split = _split(run)
    if split:
        handles += [
            Patch(facecolor="#FFFFFF", edgecolor="#555555", hatch="///",
                  label="hatched bottom: bringing weights' pages in"),
            Patch(facecolor="#555555", label="middle: copying to the engine and flushing it"),
            Patch(facecolor="#FFFFFF", edgecolor="#555555", label=_rest_text(names)),
        ]
    else:
        handles.append(Patch(facecolor="#555555", label="solid: the engine's whole build (this run recorded no "
                                                        "split into pages, copying and release)"))
    disk = run.disk
    if disk is not None and indices:
        ticks = [disk.read_s(weights[x]) for x in indices]
        ax.hlines(ticks, np.asarray(indices) - 0.42, np.asarray(indices) + 0.42, color="#000000", linewidth=1.6,
                  zorder=4, gid="disk-s")
        handles.append(Line2D([], [], color="#000000", linewidth=1.6,
                              label=f"engine weights ÷ disk read rate ({format_mb_per_s(disk.median_bytes_per_s)}, "
                                    "this run)"))
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("engine (build order)")
    ax.set_title("time to build each engine: waiting for its weights' pages (hatched), copying (solid), "
                 "the rest of its span (outlined)" if split else "time to build each engine", loc="left")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.06)  # room above the tallest bar
    ax.grid(axis="y", color="#E5E5E5", zorder=0)
    if indices:
        ax.set_xticks(indices, [str(i) for i in indices], rotation=90 if len(indices) > 40 else 0)
    else:
        ax.text(0.5, 0.5, "no engines recorded", transform=ax.transAxes, ha="center", color="#777777")
    repeats = run.record.repeats or 1
    shown = "" if repeats <= 1 else f"; the median run of {repeats} per strategy"
    figure_legend(fig, handles, f"{run.name}: where each engine's build time went ({run_subject(run)}{shown})")
    return fig
