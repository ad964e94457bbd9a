"""Figures of a results directory, for reviewers who read them without running anything.

* ``<name>-timeline.png`` (:mod:`harness.plots.timeline`): one panel per strategy on a shared time
  axis: RSS split into anonymous and file-backed memory, the checkpoint's page-cache residency, GPU
  memory, engine builds shaded.
* ``<name>-peaks.png`` (:mod:`harness.plots.peaks`): the strategies' peaks side by side, with
  reference figures hatched.
* ``<name>-engines.png`` (:mod:`harness.plots.engines`): engine by engine, each strategy's host
  high-water mark and what it released.

Every figure carries a footer saying what machine, backend, cache state and versions made it
(:mod:`harness.plots.style`, shared by all figures). Figures are drawn on the Agg canvas without
pyplot, so rendering touches no global backend state.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.plots.engines import engines_figure
from harness.plots.peaks import peaks_figure
from harness.plots.style import (
    SERIES_COLOURS,
    STYLE,
    footer_text,
    save_figure,
    strategy_colour,
)
from harness.plots.timeline import time_origin, timeline_figure
from harness.record import RecordError
from harness.report import write_report
from harness.results import load_results

__all__ = [
    "FIGURE_KINDS",
    "SERIES_COLOURS",
    "STYLE",
    "engines_figure",
    "figure_paths",
    "footer_text",
    "main_plot",
    "peaks_figure",
    "render_all",
    "save_figure",
    "strategy_colour",
    "time_origin",
    "timeline_figure",
]

FIGURE_KINDS = ("timeline", "peaks", "engines")


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
    except RecordError as error:
        print(f"plot: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
