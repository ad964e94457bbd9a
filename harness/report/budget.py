"""The report of a budget sweep: the smallest host memory to compile, and wall time against the limit.

:func:`render_budget` reads ``budget.json`` (:func:`harness.budget.record.read_budget`) and
writes beside the results directory:

* ``<name>.md``: context, the table "smallest host memory to compile" (each strategy's
  smallest completing limit beside its unconstrained group peak and wall time), the goals
  checked against the record, every attempt, and the hand-written notes kept in
  ``<name>.notes.md``;
* ``<name>.wall.png`` (:func:`wall_figure`): wall time against the memory limit, one line
  per strategy through the limits it completed under, failures marked at the time they
  failed (strategies' marks at one limit set side by side), and one dotted line per smallest
  completing limit, naming every strategy that has it (strategies with the same smallest limit
  share one line).

Where a limit was tried more than once, the table, the goals and the figure all show one attempt
there, the same one (:func:`shown_attempts`): the first that completed, or the unconstrained run at
its own limit.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import matplotlib as mpl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.lines import Line2D

from harness.budget.record import AttemptRecord, BudgetRecord, StrategyBudget, read_budget
from harness.catalog import HEADLINE_STRATEGY, strategy_colour
from harness.fileio.atomic import FileBatch
from harness.fileio.files import read_text_file
from harness.report.budget_search import (
    finding_lines,
    minimum_cell,
    predictions,
    search_lines,
    started_from_prediction,
)
from harness.report.names import figure_name
from harness.report.settings import settings_line
from harness.report.style import STYLE, figure_png, strategy_line, wrapped_title
from harness.report.text import cell, commit_text, gib_decimals, short_commit
from harness.units import DASH, GIB, format_gib

__all__ = ["Goal", "budget_goals", "budget_markdown", "failure_shifts", "render_budget", "shown_attempts",
           "wall_figure"]



def shown_attempts(strategy: StrategyBudget) -> dict[int, AttemptRecord]:
    """Limit -> the attempt the report shows there, limits in increasing order: the unconstrained run at its own
    limit, elsewhere the first attempt that completed there. Limits where none completed are left out."""
    shown: dict[int, AttemptRecord] = {}
    for a in strategy.attempts:
        if a.completed and (a.phase == "unconstrained" or a.limit_bytes not in shown):
            shown[a.limit_bytes] = a
    return dict(sorted(shown.items()))


def _walls(strategy: StrategyBudget, load_build_only: bool = False) -> dict[int, float]:
    """Limit -> wall time of the attempt shown there (:func:`shown_attempts`): the whole process, or with
    ``load_build_only`` the worker's load and build (limits whose attempt has none left out)."""
    walls = {limit: a.load_build_s if load_build_only else a.wall_s for limit, a in shown_attempts(strategy).items()}
    return {limit: wall for limit, wall in walls.items() if wall is not None}


@dataclass(frozen=True)
class Goal:
    """One goal of the sweep, checked against the record: what was asked, what was measured, met or not."""

    goal: str
    measured: str
    met: bool | None  # None: the record cannot say


def budget_goals(record: BudgetRecord) -> list[Goal]:
    """The sweep's goals: map under baseline + 2 x the largest engine, within 1.5x of its wall there,
    no group left behind, killed attempts recorded with the OOM reason."""
    d = gib_decimals(record.model_bytes)
    goals = []
    m = record.strategies.get(HEADLINE_STRATEGY)
    if m is not None:
        limit = record.goal_limit_bytes(HEADLINE_STRATEGY)
        title = "map completes under baseline + 2 x the largest engine"
        if m.minimum_bytes is None or limit is None:
            goals.append(Goal(title, "no minimum found", False))
        else:
            goals.append(Goal(f"{title} ({format_gib(limit, d)})",
                              f"smallest completing limit {format_gib(m.minimum_bytes, d)}", m.minimum_bytes <= limit))
            title = (f"map's load + build at the goal limit ({format_gib(limit, d)}) within 1.5x of its "
                     "unconstrained one")
            free = m.unconstrained
            load_build_walls, whole_walls = _walls(m, load_build_only=True), _walls(m)
            # The limit itself where a run completed there, else the nearest completed limit under it (a
            # compiler's sweep adds no run at the limit): a run with less memory is not faster.
            at = max((lim for lim in load_build_walls if lim <= limit and lim in whole_walls), default=None)
            where = "" if at is None else f"at {format_gib(at, d)}" + (
                "" if at == limit else ", the nearest completed limit under it") + ": "
            if free is None or free.load_build_s is None or at is None:
                goals.append(Goal(title, "no completed run at or under that limit", None))
            elif free.load_build_s <= 0 or free.wall_s <= 0:  # times are recorded to the millisecond
                goals.append(Goal(title, f"the unconstrained run's times ({free.load_build_s:.3f} s, "
                                         f"{free.wall_s:.3f} s) are too short to compare with", None))
            else:
                at_limit, whole = load_build_walls[at], whole_walls[at]
                ratio = at_limit / free.load_build_s
                goals.append(Goal(title, f"{where}{at_limit:.1f} s against {free.load_build_s:.1f} s: {ratio:.2f}x "
                                         f"(whole process {whole:.1f} s against {free.wall_s:.1f} s: "
                                         f"{whole / free.wall_s:.2f}x)", ratio <= 1.5))
    attempts = [a for s in record.strategies.values() for a in s.attempts]
    left = max((a.groups_left for a in attempts), default=0)
    goals.append(Goal("no memory cgroup left behind by any attempt",
                      f"{len(attempts)} attempts, at most {left} of this run's groups present after one",
                      left == 0))
    failed = [a for a in attempts if not a.completed]
    oom = [a for a in failed if a.oom_kills]
    with_reason = [a for a in oom if a.reason and "OOM-killed" in a.reason]
    other = len(failed) - len(oom)
    goals.append(Goal(
        "a killed attempt is recorded as failed, with the OOM kill in the group's counters as its reason",
        f"{len(failed)} failed attempts: {len(oom)} with OOM kills in the group's counters, all {len(with_reason)} "
        f"of those with the OOM reason" + (f"; {other} failed otherwise (their reasons are listed below)"
                                           if other else ""),
        len(with_reason) == len(oom)))
    return goals


def _seconds(attempt: AttemptRecord | None) -> str:
    if attempt is None or attempt.load_build_s is None:
        return DASH
    return f"{attempt.load_build_s:.1f} s (process {attempt.wall_s:.1f} s)"


def _mark(met: bool | None) -> str:
    return {True: "met", False: "not met", None: "cannot tell"}[met]


def _subtitle(record: BudgetRecord) -> str:
    """What the sweep is, from its record: the model, and how many attempts of one run each."""
    attempts = sum(len(s.attempts) for s in record.strategies.values())
    limits = len({a.limit_bytes for s in record.strategies.values() for a in s.attempts})
    d = gib_decimals(record.model_bytes)
    return (f"{record.model_name}, {format_gib(record.model_bytes, d)}, {record.engines} engines, backend "
            f"{record.backend} on {record.device}: {attempts} attempts of {len(record.strategies)} strategies "
            f"under {limits} memory limits, each attempt one run of a fresh process on a cold cache")


def budget_markdown(record: BudgetRecord, figure_names: list[str], notes: str | None,
                    directory: Path | None = None) -> str:
    """The whole markdown report of a budget sweep; ``directory``: its results directory, whose plan the
    predicted minimums are computed from (:mod:`harness.report.budget_search`)."""
    d = gib_decimals(record.model_bytes)
    found = predictions(directory, record)
    m = record.machine
    lines = [
        f"# {record.name}: smallest host memory to compile, by loading strategy", "",
        f"*{_subtitle(record)}*", "",
        f"Model **{record.model_name}** ({format_gib(record.model_bytes, d)}), {record.engines} engines (the largest "
        f"{format_gib(record.largest_engine_bytes, d)}), backend `{record.backend}`, device `{record.device}`; "
        f"machine: {m.cpus} CPUs, {format_gib(m.mem_total_bytes, 1)} memory, kernel {m.kernel}; {record.controller}, "
        f"swap off in each group. Each attempt is a fresh worker "
        f"process in a fresh group, on a cold cache (the files it reads flushed and dropped first). Search: "
        f"bisection between the baseline and the unconstrained group peak to {format_gib(record.precision_bytes, d)}"
        f"{', starting from the predicted minimum' if started_from_prediction(record) else ''}; "
        f"timeout per attempt {record.timeout_factor:g}x the unconstrained wall time, at least "
        f"{record.min_timeout_s:.0f} s. The whole sweep took {record.sweep_wall_s / 60:.1f} min. "
        f"Commit {short_commit(record.commit)}, created {record.created}.", "",
        *([] if record.reading is None else [settings_line(record.reading), ""]),
        "## Smallest host memory to compile", "",
        "| strategy | smallest limit that completes | predicted (predicted − measured, % of model) | fails at | "
        "unconstrained group peak | load + build unconstrained | load + build at the smallest limit | attempts | "
        "what it does with its weights |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, s in record.strategies.items():
        free = s.unconstrained
        at_min = None if s.minimum_bytes is None else shown_attempts(s).get(s.minimum_bytes)
        if (at := s.at_limit) is not None:  # run at one limit, not swept
            smallest = (f"≤ {format_gib(at.limit_bytes, d)} (one run at it, not swept)" if at.completed
                        else f"> {format_gib(at.limit_bytes, d)} (one run at it, not swept)")
            fails = DASH if at.completed else format_gib(at.limit_bytes, d)
            at_min = at if at.completed else None
        elif s.ok:
            smallest = ("≤ " if s.at_lower_bound else "") + format_gib(s.minimum_bytes, d)
            fails = "not below the baseline" if s.at_lower_bound else format_gib(s.largest_failing_bytes, d)
        else:
            smallest, fails = f"FAILED: {s.error}", DASH
        lines.append("| " + " | ".join(cell(x) for x in (
            f"{name} ({s.label})", smallest, minimum_cell(record, s, found[name]), fails,
            format_gib(free.group_peak_bytes if free else None, d),
            _seconds(free), _seconds(at_min),
            str(len(s.attempts)), s.release_note or DASH)) + " |")
    lines += ["", "Load + build: the worker's load and engine builds, from the start of the load to the end of "
              "the last engine; the process's wall time adds Python's start, torch's import and writing the "
              "results. Limits are the group's `memory.limit_in_bytes` (`memory.max` on cgroup v2): page cache the "
              "run reads or writes is charged to it, and the kernel reclaims clean file pages before it "
              "OOM-kills. The unconstrained group peak therefore counts the checkpoint's page cache, which the "
              "kernel gives back under a tighter limit. GiB = 2^30 bytes.", "",
              "Predicted: the smallest limit `python -m harness predict` gives before a run, from the sweep's plan "
              "and each strategy's unconstrained baseline, computed when the report is rendered (rules in "
              "`harness/predict/rules.py`). Runs of each search (the unconstrained run and the curve's extra points "
              "aside), and what the sweep's own arithmetic makes from the other start on the verdicts it recorded "
              "(a limit it never tried completes where at or above its minimum):", "",
              *search_lines(record, found), *finding_lines(record, found), "", "## Goals", "",
              "| goal | measured | |", "| --- | --- | --- |"]
    lines += [f"| {cell(g.goal)} | {cell(g.measured)} | {_mark(g.met)} |" for g in budget_goals(record)]
    lines += ["", "## Figures", ""] + [f"![{Path(n).stem}]({n})" for n in figure_names]
    lines += ["", "## Every attempt", ""]
    for name, s in record.strategies.items():
        lines += [f"**{name}**" + (f" (timeout {s.timeout_s:.0f} s)" if s.timeout_s else ""), "",
                  "| # | phase | limit | completed | load + build | process wall | group peak | OOM kills | reason |",
                  "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | --- |"]
        for i, a in enumerate(s.attempts):
            lines.append("| " + " | ".join(cell(x) for x in (
                str(i), a.phase, format_gib(a.limit_bytes, d), "yes" if a.completed else "no",
                DASH if a.load_build_s is None else f"{a.load_build_s:.1f} s", f"{a.wall_s:.1f} s",
                format_gib(a.group_peak_bytes, d), DASH if a.oom_kills is None else str(a.oom_kills),
                a.reason or "")) + " |")
        lines.append("")
    if notes is not None:
        lines += ["## Notes", "", f"*Hand-written, kept in `{record.name}.notes.md`.*", "", notes.strip(), ""]
    return "\n".join(lines)


_SIDE_BY_SIDE = 0.08
"""How far apart failure marks at one limit are set, in powers of two of the limit (the axis is log 2)."""


def failure_shifts(record: BudgetRecord) -> dict[tuple[int, str], float]:
    """``(limit, strategy) -> factor`` the failure marks are drawn at (limit x factor): where several strategies
    failed at one limit, their marks side by side in the record's order, centred on the limit; 1 elsewhere."""
    failing: dict[int, list[str]] = {}
    for name, s in record.strategies.items():
        for limit in dict.fromkeys(a.limit_bytes for a in s.attempts if not a.completed):
            failing.setdefault(limit, []).append(name)
    return {(limit, name): 2.0 ** ((i - (len(names) - 1) / 2) * _SIDE_BY_SIDE)
            for limit, names in failing.items() for i, name in enumerate(names)}


def wall_figure(record: BudgetRecord) -> Figure:
    """Wall time against the memory limit, one line per strategy: the whole process (failures marked where
    they stopped) on the left, the load + build of the runs that completed on the right."""
    with mpl.rc_context(cast(Any, STYLE)):
        fig = Figure(figsize=(12.0, 5.8), layout="constrained")
        FigureCanvasAgg(fig)
        whole, load_build_ax = fig.subplots(1, 2, sharex=True)
        order = list(record.strategies)
        handles = []
        d = gib_decimals(record.model_bytes)
        goal = record.goal_limit_bytes(HEADLINE_STRATEGY)
        m = record.strategies.get(HEADLINE_STRATEGY)
        smallest: dict[str, tuple[int, list[str]]] = {}  # smallest limit as written -> (bytes, strategies)
        shift = failure_shifts(record)
        for name, s in record.strategies.items():
            colour = strategy_colour(name, order)
            marker = strategy_line(name, order)["marker"]
            for ax, load_build_only in ((whole, False), (load_build_ax, True)):
                walls = _walls(s, load_build_only)
                if walls:
                    ax.plot([limit / GIB for limit in walls], list(walls.values()), marker=marker, markersize=4,
                            color=colour, linewidth=1.6, gid=f"wall:{name}")
            failed = [a for a in s.attempts if not a.completed]
            if failed:
                whole.scatter([a.limit_bytes / GIB * shift.get((a.limit_bytes, name), 1.0) for a in failed],
                              [a.wall_s for a in failed], marker="x", s=40, color=colour, linewidths=1.5, zorder=3,
                              gid=f"failed:{name}")
            if s.minimum_bytes is not None:
                text = f"smallest {'≤ ' if s.at_lower_bound else ''}{format_gib(s.minimum_bytes, d)}"
                smallest.setdefault(text, (s.minimum_bytes, []))[1].append(name)
            label = (name if s.minimum_bytes is not None
                     else f"{name}: one limit, not swept" if s.at_limit is not None else f"{name}: no minimum")
            handles.append(Line2D([], [], color=colour, marker=marker, markersize=4, label=label))
        for text, (limit, names) in smallest.items():
            colour = strategy_colour(names[0], order) if len(names) == 1 else "#555555"
            for ax in (whole, load_build_ax):
                ax.axvline(limit / GIB, color=colour, linewidth=1.0, linestyle=":", alpha=0.9,
                           gid=f"smallest:{','.join(names)}")
            handles.append(Line2D([], [], color=colour, linewidth=1.0, linestyle=":",
                                  label=f"{', '.join(names)}: {text} (dotted)"))
        if goal is not None:
            for ax in (whole, load_build_ax):
                ax.axvline(goal / GIB, color="#000000", linewidth=1.2, linestyle="--")
            handles.append(Line2D([], [], color="#000000", linestyle="--",
                                  label=f"map's baseline + 2 x largest engine ({format_gib(goal, d)})"))
        if m is not None and m.unconstrained is not None and m.unconstrained.load_build_s is not None:
            bound = 1.5 * m.unconstrained.load_build_s
            load_build_ax.axhline(bound, color="#0072B2", linewidth=0.9, linestyle="-.")
            handles.append(Line2D([], [], color="#0072B2", linestyle="-.",
                                  label=f"1.5 x map's unconstrained load + build ({bound:.1f} s)"))
        spread = "; several at one limit side by side, in the legend's order" if any(
            factor != 1.0 for factor in shift.values()) else ""
        handles.append(Line2D([], [], color="#555555", marker="x", linestyle="", label="did not complete "
                              f"(OOM-killed or timed out), at the time it stopped{spread}"))
        for ax, ylabel in ((whole, "wall time of the whole process (s)"),
                           (load_build_ax, "load + build of the runs that completed (s)")):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_xlabel("memory limit of the attempt's cgroup (GiB, log scale)")
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
            ax.grid(True, which="both", alpha=0.25)
        title = (f"{record.name}: wall time against the memory limit (each point one attempt, a fresh process on a "
                 "cold cache: the first to complete at its limit, as the table gives it; the unconstrained run is "
                 "the rightmost)")
        for handle in handles:  # long labels wrap, so that three columns fit the figure's width
            handle.set_label("\n".join(textwrap.wrap(str(handle.get_label()), 58)))
        fig.legend(handles=handles, loc="outside upper center", ncols=3, frameon=False,
                   title=wrapped_title(fig, title, 11),
                   title_fontproperties={"size": 11, "weight": "bold"})
        footer = (f"{record.model_name}, {format_gib(record.model_bytes, d)}, {record.engines} engines, "
                  f"{record.backend} backend on {record.device}; {record.machine.cpus} CPUs; "
                  f"{commit_text(record.commit, 12)}, {record.created}")
        lines = textwrap.wrap(footer, 150)
        fig.text(0.01, 0.01, "\n".join(lines), fontsize=9, color="#333333", va="bottom", linespacing=1.35)
        footer_height = (len(lines) * 9 * 1.35 + 10) / 72 / fig.get_figheight()  # figure fraction
        engine = fig.get_layout_engine()
        if isinstance(engine, ConstrainedLayoutEngine):
            engine.set(rect=(0, footer_height, 1, 1 - footer_height))
    return fig


def render_budget(results_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Write ``<name>.wall.png`` and ``<name>.md`` for the budget results in ``results_dir``; returns the paths.

    Both are put in place together once both are written; when either cannot be (a full
    disk), the earlier ones stay as they were.
    """
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir.parent
    record = read_budget(results_dir)
    notes = read_text_file(out / f"{record.name}.notes.md")
    with FileBatch("the earlier report and figure are unchanged") as batch:
        figure = batch.write(out / figure_name(record.name, "wall"), figure_png(wall_figure(record)))
        batch.write(out / f"{record.name}.md", budget_markdown(record, [figure.name], notes, results_dir))
        return batch.commit()
