"""What a results directory shows reviewers: a markdown report and figures, derived from its record.

:func:`render_all` reads a results directory once (:func:`harness.results.reading.load_results`:
the record, the samples and :mod:`harness.results.metrics`' figures) and writes, beside it:

* ``<name>.md`` (:mod:`harness.report.markdown`): context, the table, observations, and
  the hand-written notes kept in ``<name>.notes.md`` (flagged when the figures they were
  checked against have changed);
* ``<name>.headline.png`` (:mod:`harness.report.headline`): how far each strategy lands from
  its floor, and where its wall time goes;
* ``<name>.timeline.png`` (:mod:`harness.report.timeline`): memory over time, one panel
  per strategy;
* ``<name>.engines.png`` (:mod:`harness.report.engines`): engine by engine;
* ``<name>.peaks.png`` (:mod:`harness.report.peaks`): the strategies' peaks side by side;
* ``<name>.compiler.png`` (:mod:`harness.report.compiler`): what a compiler added per engine,
  for runs of a compiler backend only (:data:`FIGURE_APPLIES`);
* ``<name>.engine-times.png`` (:mod:`harness.report.enginetimes`): each engine's build
  time, split into waiting for pages and copying, against the disk's read time; not for a
  compiler's run that recorded no such split, whose build times the compiler figure shows.

The figures are :data:`FIGURES`, listed here in its order, the order the report shows them
(``harness/tests/test_docs.py`` checks this list against it). Figure files are named by
:func:`harness.report.names.figure_name`: the results name, a dot (which no results name
holds), the kind.

All of them are put in place together once every one is written, so a failed render (a full
disk) leaves the earlier report and figures as they were.

The formats the table and the figures share (GiB at the run's decimals, signed percentages of
the model, seconds, the dash of a missing value, the provenance line) come from
:mod:`harness.report.text`, where a figure shown another way (the compiler's MiB, a reference
as published) is formatted where it is shown; every figure draws through
:mod:`harness.report.style`, and none of them opens a results file itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from matplotlib.figure import Figure

from harness.errors import HarnessError
from harness.fileio.atomic import FileBatch
from harness.report.compiler import compiler_figure, has_compiler
from harness.report.engines import engines_figure
from harness.report.enginetimes import engine_times_applies, engine_times_figure
from harness.report.headline import headline_figure
from harness.report.markdown import write_report
from harness.report.names import figure_name
from harness.report.notes import notes_path, read_notes, stamp_notes
from harness.report.peaks import peaks_figure
from harness.report.style import figure_png
from harness.report.timeline import timeline_figure
from harness.results.reading import Results, load_results

__all__ = ["FIGURES", "FIGURE_APPLIES", "Rendered", "figure_paths", "render_all", "render_staged"]

FIGURES: dict[str, Callable[[Results], Figure]] = {
    "headline": headline_figure,
    "timeline": timeline_figure,
    "engines": engines_figure,
    "peaks": peaks_figure,
    "compiler": compiler_figure,
    "engine-times": engine_times_figure,
}
"""Every figure of a run, by its kind (:func:`~harness.report.names.figure_name`), in the order the report shows
them."""

FIGURE_APPLIES: dict[str, Callable[[Results], bool]] = {
    "compiler": has_compiler,
    "engine-times": engine_times_applies,
}
"""Figures drawn only for some runs: the kind, and which runs it is drawn for (every other figure: all)."""


def figure_paths(name: str, out_dir: Path, run: Results | None = None) -> dict[str, Path]:
    """Where each figure of run ``name`` goes; with ``run``, only the figures that apply to it."""
    kinds = [k for k in FIGURES if run is None or FIGURE_APPLIES.get(k, lambda r: True)(run)]
    return {kind: Path(out_dir) / figure_name(name, kind) for kind in kinds}


@dataclass(frozen=True)
class Rendered:
    """What :func:`render_all` wrote, and what changed since the run's notes were last checked."""

    paths: list[Path]
    stale_notes: list[str]


def render_all(results_dir: Path, out_dir: Path | None = None, *, notes_checked: bool = False,
               published_as: Path | None = None, batch: FileBatch | None = None) -> Rendered:
    """Render every figure and the markdown report of ``results_dir``.

    ``out_dir`` defaults to the results directory's parent (``results/``), where the notes
    file ``<name>.notes.md`` is looked for too. ``notes_checked`` stamps the notes with the
    current figures first (they were re-read). The report and figures are put in place
    together once all are written (a :class:`~harness.fileio.atomic.FileBatch`): when one cannot be
    written (a full disk), every earlier one stays as it was. With ``batch``, they are
    written into it and go in place when the caller commits it. ``published_as``: where the
    results directory will be once in place (the report names it), when rendered from
    elsewhere. Raises :class:`~harness.results.record.RecordError` for a results directory this
    harness cannot read, :class:`~harness.errors.OutputError` when a file cannot be written.
    """
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir.parent
    run = load_results(results_dir)
    if published_as is not None:
        run = replace(run, directory=Path(published_as))
    report = out / f"{run.name}.md"
    if notes_checked:
        notes = read_notes(notes_path(report))
        if notes is None:
            raise HarnessError(f"{notes_path(report)}: no notes to mark as checked")
        stamp_notes(notes, run)
    if batch is not None:
        return _render(run, out, report, batch)
    with FileBatch("the earlier report and figures are unchanged") as own:
        rendered = _render(run, out, report, own)
        own.commit()
    return rendered


def render_staged(staging: Path, published_as: Path, batch: FileBatch) -> Rendered:
    """Render a finished run from where it was staged, beside where it will be published, into ``batch``.

    The report names ``published_as``; the files go to its parent (``results/``) when the caller
    commits ``batch``, together with the results (:func:`harness.run.run_scenario`'s ``render``).
    """
    return render_all(staging, Path(published_as).parent, published_as=published_as, batch=batch)


def _render(run: Results, out: Path, report: Path, batch: FileBatch) -> Rendered:
    written = [batch.write(path, figure_png(FIGURES[kind](run)))
               for kind, path in figure_paths(run.name, out, run).items()]
    path, stale = write_report(run, report, [p.name for p in written], batch)
    return Rendered([*written, path], stale)
