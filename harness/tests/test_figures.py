"""Tests that the figures show what they claim: one memory scale, no series hidden, times that add up."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.text import Text

from harness.budget.record import read_budget
from harness.report import figure_paths
from harness.report.budget import budget_goals, budget_markdown, shown_attempts, wall_figure
from harness.report.engines import engines_figure
from harness.report.enginetimes import engine_times_figure
from harness.report.headline import headline_figure
from harness.report.markdown import spread_text
from harness.report.names import figure_name
from harness.report.peaks import level_labels, peaks_figure
from harness.report.style import coinciding, figure_legend
from harness.report.table import strategy_cells
from harness.report.timeline import label_rows, memory_top, model_level, timeline_figure
from harness.results.metrics import host_floor_bytes, phase_spans
from harness.results.reading import load_results
from harness.results.record import Phases
from harness.results.spread import median_spread, strategy_rounds
from harness.tests.fixtures import make_results
from harness.units import GIB, MIB

RESULTS = Path(__file__).resolve().parents[2] / "results"


@pytest.fixture(params=["cpu", "cuda"])
def results_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return make_results(tmp_path / "results", device=request.param)


def _gid(fig: Figure | Axes, gid: str) -> list[Any]:
    return [a for a in fig.findobj() if a.get_gid() == gid]


def _gid_prefix(fig: Figure, prefix: str) -> list[Any]:
    return [a for a in fig.findobj() if str(a.get_gid()).startswith(prefix)]


def _legend_texts(fig: Figure) -> list[str]:
    return [" ".join(t.get_text().split()) for legend in fig.legends for t in legend.get_texts()]


def _edit_summary(directory: Path, edit: Any) -> None:
    path = directory / "summary.json"
    summary = json.loads(path.read_text())
    edit(summary)
    path.write_text(json.dumps(summary))


# Derived figures the headline draws


def test_phase_spans_are_the_phases_from_the_load_start_in_time_order() -> None:
    phases = Phases(load_start_s=10.0, load_end_s=12.0, partition_s=20.0, build_end_s=50.0, export_start_s=12.5,
                    export_end_s=19.5)
    assert phase_spans(phases) == (("load", 0.0, 2.0), ("export", 2.5, 9.5), ("build", 10.0, 40.0))
    reached = Phases(load_start_s=1.0, load_end_s=2.0, partition_s=2.5)  # failed before the build ended
    assert phase_spans(reached) == (("load", 0.0, 1.0),)
    assert phase_spans(Phases()) == ()


def test_the_host_floor_on_a_gpu_is_the_baseline_and_the_largest_engine(tmp_path: Path) -> None:
    run = load_results(make_results(tmp_path / "results", device="cuda"))
    m = run.metrics["map"]
    sizes = [e.weight_bytes for e in m.record.engines]
    assert m.record.baseline_rss_bytes is not None and m.record.build_peak_bytes is not None
    assert m.build_host_floor_bytes == host_floor_bytes(m.record.baseline_rss_bytes, sizes)
    assert m.floor_bytes is not None and m.build_host_floor_bytes < m.floor_bytes  # host + GPU holds more
    expected = (m.record.build_peak_bytes - m.build_host_floor_bytes) / run.record.model.bytes
    assert m.build_host_excess == pytest.approx(expected)
    assert run.metrics["load_file"].build_host_floor_bytes is None  # failed: no floor, as floor_bytes


def test_without_a_gpu_the_host_floor_is_the_floor(tmp_path: Path) -> None:
    run = load_results(make_results(tmp_path / "results"))
    for m in run.metrics.values():
        assert m.build_host_floor_bytes == m.floor_bytes
        assert m.build_host_excess == m.excess


# Timeline


def _reference_levels(run: Any, name: str) -> list[float]:
    """The horizontal lines a strategy's timeline panel draws, in GiB: its floor and baseline + model size."""
    m = run.metrics[name]
    levels = [m.floor_bytes / GIB] if m.floor_bytes is not None else []
    level = model_level(run, name)
    return levels + ([level] if level is not None else [])


def test_the_timeline_panels_share_one_memory_scale(results_dir: Path) -> None:
    run = load_results(results_dir)
    fig = timeline_figure(run)
    panels = fig.axes[: len(run.strategies)]  # the strips come after
    tops = {ax.get_ylim() for ax in panels}
    assert tops == {(0.0, memory_top(run))}, "every panel on one memory scale"
    highest = max(v or 0 for m in run.metrics.values() for v in (m.record.host_peak_bytes, m.compared_peak_bytes)) / GIB
    assert highest / memory_top(run) >= 0.7, "the scale is the highest panel's, not more"
    title = " ".join(" ".join(legend.get_title().get_text().split()) for legend in fig.legends)
    assert "every panel on one memory scale" in title and "own scale" not in title


def test_every_timeline_reference_line_has_room_above_it(results_dir: Path) -> None:
    def model_is_the_highest(summary: dict[str, Any]) -> None:  # as on lerobot-compile-packaged-compiler
        summary["model"]["bytes"] = 2 * max(s["host_peak_bytes"] or 0 for s in summary["strategies"].values())

    _edit_summary(results_dir, model_is_the_highest)
    run = load_results(results_dir)
    top = timeline_figure(run).axes[0].get_ylim()[1]
    for name in run.strategies:
        for level in _reference_levels(run, name):
            assert level <= top / 1.2, (name, level, top)


def test_the_model_size_is_drawn_on_top_of_each_strategys_baseline(results_dir: Path) -> None:
    run = load_results(results_dir)
    fig = timeline_figure(run)
    for name, ax in zip(run.strategies, fig.axes[: len(run.strategies)], strict=True):
        baseline = run.strategies[name].baseline_rss_bytes
        assert baseline is not None and baseline > 0
        (line,) = _gid(ax, f"model:{name}")
        assert line.get_ydata()[0] == pytest.approx((baseline + run.record.model.bytes) / GIB)
    (entry,) = [t for t in _legend_texts(fig) if "model size" in t]
    assert entry.startswith("baseline (RSS before the load) + model size"), entry


def test_each_timeline_panel_runs_on_its_own_time_axis(tmp_path: Path) -> None:
    directory = make_results(tmp_path / "results", failed=None)

    def load_takes_ten_times_longer(summary: dict[str, Any]) -> None:
        load = summary["strategies"]["load"]
        start = load["phases"]["load_start_s"]
        for engine in load["engines"]:
            engine["start_s"] = start + (engine["start_s"] - start) * 10
            engine["end_s"] = start + (engine["end_s"] - start) * 10

    _edit_summary(directory, load_takes_ten_times_longer)
    run = load_results(directory)
    fig = timeline_figure(run)
    for name, ax in zip(run.strategies, fig.axes[: len(run.strategies)], strict=True):
        s = run.strategies[name]
        assert s.phases.load_start_s is not None
        end = max([e.end_s for e in s.engines if e.end_s is not None]
                  + [float(run.samples[name]["t_s"].max())]) - s.phases.load_start_s
        low, high = ax.get_xlim()
        assert low <= 0.0 < high and high == pytest.approx(end, rel=0.05), name


def test_engine_numbers_never_run_together() -> None:
    spans = [(i, 10.0 + 0.02 * i, 10.02 + 0.02 * i) for i in range(16)]  # sixteen bands in 0.32 s, as load's

    def half(index: int) -> float:  # half a number's width in seconds, at one second an inch
        return (len(str(index)) * 0.6 + 0.5) * 9 / 72 / 2

    rows = label_rows(spans, seconds_per_inch=1.0)
    assert rows[0] is not None and any(row is None for row in rows), "every few numbered"
    step = rows.index(next(r for r in rows[1:] if r is not None), 1)
    assert all((row is not None) == (i % step == 0) for i, row in enumerate(rows)), "every k-th, evenly"
    written = [(span, row) for span, row in zip(spans, rows, strict=True) if row is not None]
    for i, (a, row_a) in enumerate(written):
        for b, row_b in written[i + 1:]:
            if row_a == row_b:
                apart = (b[1] + b[2]) / 2 - (a[1] + a[2]) / 2
                assert apart >= half(a[0]) + half(b[0]) - 1e-9, (a, b, "in one row")
    roomy = label_rows([(i, float(i), i + 1.0) for i in range(16)], seconds_per_inch=1.0)
    assert roomy == [0] * 16, "bands wide enough each get their number in the top row"


def test_page_cache_residency_has_a_strip_of_its_own(results_dir: Path) -> None:
    run = load_results(results_dir)
    fig = timeline_figure(run)
    n = len(run.strategies)
    panels, strips = fig.axes[:n], fig.axes[n:]
    assert len(strips) == n
    for name, panel, strip in zip(run.strategies, panels, strips, strict=True):
        assert not _gid(panel, f"resident:{name}") and not panel.child_axes
        (line,) = _gid(strip, f"resident:{name}")
        assert strip.get_ylim() == (0, 110)
        share = np.asarray(line.get_ydata(), dtype="float64")
        assert np.nanmax(share) <= 100.0


# Engines


def test_coinciding_detects_series_equal_within_the_tolerance_at_every_point() -> None:
    series = {
        "a": {0: 1.0, 1: 2.0},
        "b": {0: 1.004, 1: 1.996},  # within 0.005 of a everywhere
        "c": {0: 1.0, 1: 2.1},  # apart at one point
        "d": {0: 1.0},  # other points
        "e": {0: 1.0, 1: 2.1},
        "f": {},
    }
    assert coinciding(series, 0.005) == {"b": "a", "e": "c"}


def test_the_engines_legend_says_when_a_line_lies_on_another(tmp_path: Path) -> None:
    directory = make_results(tmp_path / "results", failed=None)

    def same_marks(summary: dict[str, Any]) -> None:
        marks = [e["host_hwm_bytes"] for e in summary["strategies"]["map"]["engines"]]
        for engine, mark in zip(summary["strategies"]["load_file"]["engines"], marks, strict=True):
            engine["host_hwm_bytes"] = mark + 1000  # equal to the printed decimals

    _edit_summary(directory, same_marks)
    fig = engines_figure(load_results(directory))
    legend = _legend_texts(fig)
    assert any(t.startswith("load_file (line same as map's, to 0.01 GiB)") for t in legend), legend
    assert not any(t.startswith("load (line same") or t.startswith("map (line same") for t in legend)
    (under,), (over,) = _gid(fig, "hwm:map"), _gid(fig, "hwm:load_file")
    assert np.allclose(under.get_ydata(), over.get_ydata(), atol=1e-5)
    assert not np.intersect1d(under.get_xdata(), over.get_xdata()).size, "the two lines sit side by side"
    assert under.get_marker() != over.get_marker() and under.get_linestyle() != over.get_linestyle()


def test_lines_that_differ_are_not_called_the_same(tmp_path: Path) -> None:
    fig = engines_figure(load_results(make_results(tmp_path / "results", failed=None)))
    assert not any("same as" in t for t in _legend_texts(fig))


PI05 = RESULTS / "pi05"


def test_the_engines_legend_gives_the_build_phase_the_table_prints(results_dir: Path) -> None:
    run = load_results(results_dir)
    legend = _legend_texts(engines_figure(run))
    cells = strategy_cells(run)
    for name in run.strategies:
        (entry,) = [t for t in legend if t.split(",")[0].split(" (")[0] == name]
        if run.metrics[name].build_s is not None:
            assert f"build phase {cells[name]['build time']}" in entry, entry


def test_a_wrapped_legend_entry_keeps_each_number_with_its_unit() -> None:
    fig = Figure()
    label = "x" * 55 + " 12.7 s, then 1.25 GiB"  # wrapped at 60 characters, the break would fall before "s"
    figure_legend(fig, [Line2D([], [], label=label)], "title")
    (text,) = fig.legends[0].get_texts()
    lines = text.get_text().splitlines()
    assert len(lines) == 2 and lines[1].startswith("12.7") and "1.25\u00a0GiB" in lines[1]


@pytest.mark.skipif(not (PI05 / "summary.json").is_file(), reason="no committed pi0.5 results")
def test_no_legend_puts_a_unit_on_a_line_of_its_own() -> None:
    run = load_results(PI05)
    for build in (engines_figure, engine_times_figure, headline_figure, timeline_figure):
        for legend in build(run).legends:
            for text in legend.get_texts():
                assert not re.search(r"\d\n(s|GiB|MiB|MB/s)\b", text.get_text()), (build.__name__, text.get_text())


@pytest.mark.skipif(not (PI05 / "summary.json").is_file(), reason="no committed pi0.5 results")
def test_the_engine_times_legend_says_what_the_rest_of_a_span_holds() -> None:
    run = load_results(PI05)
    legend = _legend_texts(engine_times_figure(run))
    (rest,) = [t for t in legend if t.startswith("outlined top")]
    assert "read_file reading its tensors with pread" in rest and "stream opening its tensors as views" in rest
    (read_file,) = [t for t in legend if t.startswith("read_file:")]
    assert "rest: reading its tensors with pread first" in read_file
    (map_,) = [t for t in legend if t.startswith("map:")]
    assert f"of its {run.metrics['map'].build_s:.1f} s build phase" in map_ and "pread" not in map_


def _compiled(summary: dict[str, Any]) -> None:
    for strategy in summary["strategies"].values():
        strategy.update(compiler="inductor", compiler_weights="mapped")
        for engine in strategy["engines"]:
            engine.update(compile_s=1.0, artifact_bytes=MIB, rss_before_bytes=engine["host_hwm_bytes"])


def test_a_compilers_run_without_the_split_gets_no_engine_times_figure(tmp_path: Path) -> None:
    directory = make_results(tmp_path / "results", failed=None)
    assert "engine-times" in figure_paths("smoke", tmp_path, load_results(directory))
    _edit_summary(directory, _compiled)
    run = load_results(directory)
    kinds = figure_paths("smoke", tmp_path, run)
    assert "compiler" in kinds and "engine-times" not in kinds  # its bars: the compiler figure's compile times
    axes = headline_figure(run).axes
    assert any(figure_name("smoke", "compiler") in ax.get_xlabel() for ax in axes)
    assert not any("engine-times" in ax.get_xlabel() for ax in axes)


# Headline


def test_the_whole_run_outline_leaves_its_label_clear(results_dir: Path) -> None:
    def higher_during_the_load(summary: dict[str, Any]) -> None:  # as load's whole run does on pi0.5
        load = summary["strategies"]["load"]
        load["host_peak_bytes"] = 2 * max(load["build_peak_bytes"], load["host_gpu_peak_bytes"])

    _edit_summary(results_dir, higher_during_the_load)
    fig = headline_figure(load_results(results_dir))
    fig.canvas.draw()
    outlines = [p for p in fig.findobj(Rectangle) if str(p.get_gid()).startswith("whole-run:")]
    assert outlines
    for outline in outlines:
        name = str(outline.get_gid()).split(":")[1]
        box = outline.get_window_extent()
        labels = [t for t in _gid_prefix(fig, "") if isinstance(t, Text) and str(t.get_gid()).endswith(f"xcess:{name}")]
        (label,) = [t for t in labels if abs(t.get_window_extent().y0 + t.get_window_extent().y1 - box.y0 - box.y1)
                    < box.height]  # the label of the bar the outline carries on
        extent = label.get_window_extent()
        assert extent.x0 >= box.x1, f"{name}'s label starts after its whole-run outline"
        # the axis fits its data; a label runs on into the margin right of it, and ends inside the figure
        assert extent.x1 <= fig.get_window_extent().x1, f"{name}'s label ends in the figure"


@pytest.mark.skipif(not (PI05 / "summary.json").is_file(), reason="no committed pi0.5 results")
def test_the_headline_draws_each_wall_times_interval_as_the_report_gives_it() -> None:
    run = load_results(PI05)
    fig = headline_figure(run)
    for name, m in run.metrics.items():
        spread = median_spread(strategy_rounds(m).wall_s)
        assert spread.low is not None and spread.high is not None and spread.rounds == 9
        (whisker,) = [line for line in _gid(fig, f"wall-interval:{name}") if len(line.get_segments()[0]) == 2]
        (start, _), (end, _) = whisker.get_segments()[0]
        assert (start, end) == pytest.approx((spread.low, spread.high))
        (label,) = _gid(fig, f"wall:{name}")
        assert spread_text(strategy_rounds(m).wall_s) in label.get_text()
    assert any("interval, as the report gives them" in t for t in _legend_texts(fig))


def test_the_headline_time_bar_of_a_strategy_sums_to_its_wall(results_dir: Path) -> None:
    run = load_results(results_dir)
    fig = headline_figure(run)
    for name, m in run.metrics.items():
        segments = sorted(_gid_prefix(fig, f"time:{name}:"), key=lambda p: p.get_x())
        assert segments, name
        assert segments[0].get_x() == pytest.approx(0.0)
        for before, after in zip(segments, segments[1:], strict=False):
            assert after.get_x() == pytest.approx(before.get_x() + before.get_width()), "no gap, no overlap"
        if m.record.wall_s is not None:
            assert sum(s.get_width() for s in segments) == pytest.approx(m.record.wall_s, abs=1e-3)
            (label,) = _gid(fig, f"wall:{name}")
            assert label.get_text().strip().startswith(f"wall {m.record.wall_s:.1f} s")


def test_an_export_is_a_phase_of_its_own_in_the_time_bar(tmp_path: Path) -> None:
    directory = make_results(tmp_path / "results", failed=None)

    def with_export(summary: dict[str, Any]) -> None:
        phases = summary["strategies"]["map"]["phases"]
        phases["export_start_s"] = phases["load_end_s"] + 0.001
        phases["export_end_s"] = phases["partition_s"] - 0.001

    _edit_summary(directory, with_export)
    run = load_results(directory)
    fig = headline_figure(run)
    phases = run.strategies["map"].phases
    assert phases.export_start_s is not None and phases.export_end_s is not None
    (export,) = _gid(fig, "time:map:export")
    assert export.get_width() == pytest.approx(phases.export_end_s - phases.export_start_s)
    assert not _gid(fig, "time:load:export")
    wall = run.strategies["map"].wall_s
    assert sum(s.get_width() for s in _gid_prefix(fig, "time:map:")) == pytest.approx(wall, abs=1e-3)


def test_on_a_gpu_the_headline_leads_with_the_host_peak(tmp_path: Path) -> None:
    run = load_results(make_results(tmp_path / "results", device="cuda"))
    fig = headline_figure(run)
    for name, m in run.metrics.items():
        (host,) = _gid(fig, f"host:{name}")
        (both,) = _gid(fig, f"compared:{name}")
        assert host.get_y() > both.get_y(), "the host bar comes first, above the host + GPU bar"
        assert host.get_alpha() is None or host.get_alpha() > both.get_alpha()
        assert m.record.build_peak_bytes is not None
        assert round((host.get_x() + host.get_width()) * GIB) == pytest.approx(m.record.build_peak_bytes, abs=2)
        if m.build_host_floor_bytes is None:
            assert not _gid(fig, f"host-floor:{name}")
            continue
        (floor,) = _gid(fig, f"host-floor:{name}")
        assert floor.get_segments()[0][0, 0] * GIB == pytest.approx(m.build_host_floor_bytes)
        (text,) = _gid(fig, f"host-excess:{name}")
        assert "host floor" in text.get_text()
    whole = [p for p in fig.findobj(Rectangle) if str(p.get_gid()).startswith("whole-run:")]
    for outline in whole:  # the whole-run host peak carries on the host bar, not the host + GPU one
        (host,) = _gid(fig, f"host:{str(outline.get_gid()).split(':')[1]}")
        assert outline.get_y() == pytest.approx(host.get_y())


def test_without_a_gpu_the_headline_draws_one_memory_bar_per_strategy(tmp_path: Path) -> None:
    run = load_results(make_results(tmp_path / "results"))
    fig = headline_figure(run)
    assert not _gid_prefix(fig, "host:")
    assert all(len(_gid(fig, f"compared:{name}")) == 1 for name in run.strategies)


# Peaks


def test_levels_closer_than_a_label_are_named_apart() -> None:
    placed = level_labels([("model size 8.71", 8.71), ("floor 8.76", 8.76), ("floor 1.21", 1.21)], gap=1.0)
    assert [(text, value) for text, value, _ in placed] == [("floor 1.21", 1.21), ("model size 8.71", 8.71),
                                                            ("floor 8.76", 8.76)]
    heights = [at for _, _, at in placed]
    assert heights[:2] == [1.21, 8.71] and heights[2] == pytest.approx(9.71)


def test_the_peaks_figure_names_the_floor_and_the_model_size_at_their_heights(tmp_path: Path) -> None:
    directory = make_results(tmp_path / "results", device="cuda", failed=None)
    run = load_results(directory)
    floor = run.metrics["map"].floor_bytes
    assert floor is not None
    near = floor - GIB // 20  # a model 0.05 GiB under the floor, as lerobot-compile's is
    _edit_summary(directory, lambda summary: summary["model"].update(bytes=near))
    run = load_results(directory)
    fig = peaks_figure(run)
    (model,) = _gid_prefix(fig, "level:model size")
    floors = _gid_prefix(fig, "level:floor")
    assert floors and model.get_text() == f"model size {near / GIB:.2f}"
    top = fig.axes[0].get_ylim()[1]
    for label in floors:
        assert abs(label.get_position()[1] - model.get_position()[1]) >= 0.04 * top, "apart from the model's"


def test_references_from_another_setup_are_left_to_the_table(tmp_path: Path) -> None:
    run = load_results(make_results(tmp_path / "results"))
    assert run.record.references
    fig = peaks_figure(run)
    assert not [p for p in fig.findobj(Rectangle) if p.get_hatch()]
    texts = [" ".join(t.get_text().split()) for t in fig.findobj(Text)]
    assert not any("seed run" in t for t in texts)
    assert any("references measured on another setup are in the report's table" in t for t in texts)
    plain = peaks_figure(load_results(make_results(tmp_path / "plain", references=False)))
    assert not any("reference" in t.get_text() for t in plain.findobj(Text))


# Budget


BUDGET = RESULTS / "pi05-budget"


@pytest.mark.skipif(not (BUDGET / "budget.json").is_file(), reason="no committed budget results")
def test_coinciding_smallest_limits_are_drawn_once_with_every_name() -> None:
    record = read_budget(BUDGET)
    minimums: dict[str, list[str]] = {}  # equal as the figure writes them (2 decimals), not to the byte
    for name, s in record.strategies.items():
        if s.minimum_bytes is not None:
            minimums.setdefault(f"{s.minimum_bytes / GIB:.2f}", []).append(name)
    assert any(len(names) > 1 for names in minimums.values()), "the committed sweep has strategies sharing one"
    fig = wall_figure(record)
    assert len(_gid_prefix(fig, "smallest:")) == 2 * len(minimums)  # one per limit on each of the two panels
    for limit, names in minimums.items():
        drawn = _gid(fig, f"smallest:{','.join(names)}")
        assert len(drawn) == 2 and all(f"{line.get_xdata()[0]:.2f}" == limit for line in drawn)
    shared = max(minimums.values(), key=len)
    assert any(t.startswith(", ".join(shared) + ": smallest") for t in _legend_texts(fig))
    # with every limit its own, every strategy gets its own line
    apart = replace(record, strategies={
        name: replace(s, minimum_bytes=None if s.minimum_bytes is None else s.minimum_bytes + i * GIB // 10)
        for i, (name, s) in enumerate(record.strategies.items())})
    separate = _gid_prefix(wall_figure(apart), "smallest:")
    assert len(separate) == 2 * sum(s.minimum_bytes is not None for s in record.strategies.values())
    assert all("," not in line.get_gid() for line in separate)


@pytest.mark.skipif(not (BUDGET / "budget.json").is_file(), reason="no committed budget results")
def test_the_budget_figure_plots_at_each_limit_the_attempt_the_table_gives() -> None:
    record = read_budget(BUDGET)
    m = record.strategies["map"]
    assert m.minimum_bytes is not None
    tried = [a for a in m.attempts if a.limit_bytes == m.minimum_bytes and a.completed]
    assert len({a.load_build_s for a in tried}) > 1, "the committed sweep tried map's smallest limit twice"
    lines = budget_markdown(record, [], None).splitlines()
    (row,) = [line for line in lines if line.startswith("| map (")]
    header = next(line for line in lines if line.startswith("| strategy | smallest limit"))
    table = row.split(" | ")[header.split(" | ").index("load + build at the smallest limit")]
    fig = wall_figure(record)
    whole, load_build = (line for line in _gid(fig, "wall:map"))
    at = list(load_build.get_xdata()).index(m.minimum_bytes / GIB)
    plotted = load_build.get_ydata()[at]
    assert table.startswith(f"{plotted:.1f} s (process {whole.get_ydata()[at]:.1f} s)")
    assert shown_attempts(m)[m.minimum_bytes] == tried[0]


@pytest.mark.skipif(not (BUDGET / "budget.json").is_file(), reason="no committed budget results")
def test_failure_marks_at_one_limit_are_set_side_by_side() -> None:
    record = read_budget(BUDGET)
    failing: dict[int, list[str]] = {}
    for name, s in record.strategies.items():
        for limit in {a.limit_bytes for a in s.attempts if not a.completed}:
            failing.setdefault(limit, []).append(name)
    limit, names = max(failing.items(), key=lambda item: len(item[1]))
    assert len(names) > 2, "the committed sweep has strategies failing at one limit"
    fig = wall_figure(record)
    at = {name: {float(x) for mark in _gid(fig, f"failed:{name}") for x in np.asarray(mark.get_offsets())[:, 0]
                 if abs(np.log2(x * GIB / limit)) < 0.5} for name in names}  # each strategy's marks near the limit
    assert all(len(xs) == 1 for xs in at.values()), at
    xs = [x for found in at.values() for x in found]
    assert len(set(xs)) == len(names), "no strategy's marks hide another's"
    assert min(xs) < limit / GIB < max(xs)
    assert any("side by side" in text for text in _legend_texts(fig))


@pytest.mark.skipif(not (BUDGET / "budget.json").is_file(), reason="no committed budget results")
def test_the_budget_goal_names_the_limit_it_judges_the_time_at() -> None:
    record = read_budget(BUDGET)
    goal = record.goal_limit_bytes("map")
    assert goal is not None
    (timing,) = [g for g in budget_goals(record) if g.goal.startswith("map's load + build at the goal limit")]
    assert f"({goal / GIB:.2f} GiB)" in timing.goal
    assert timing.measured.startswith(f"at {goal / GIB:.2f} GiB: ")


@pytest.mark.skipif(not (BUDGET / "budget.json").is_file(), reason="no committed budget results")
def test_the_budget_report_says_what_its_attempts_are_from_the_record() -> None:
    record = replace(read_budget(BUDGET), description="pi0.5, 8.71 GiB, cold cache, 3 runs each")
    subtitle = budget_markdown(record, [], None).splitlines()[2]
    attempts = sum(len(s.attempts) for s in record.strategies.values())
    assert "runs each" not in subtitle
    assert f"{attempts} attempts of {len(record.strategies)} strategies" in subtitle
    assert "each attempt one run" in subtitle


def test_the_engine_times_legend_explains_only_the_parts_a_run_recorded(tmp_path: Path) -> None:
    from harness.report.enginetimes import engine_times_figure
    from harness.results.reading import load_results
    from harness.tests.fixtures import make_results

    run = load_results(make_results(tmp_path))
    assert not any(m.engine_copy_s for m in run.metrics.values())  # the fixture records no split
    labels = [t.get_text() for legend in engine_times_figure(run).legends for t in legend.get_texts()]
    assert any(label.startswith("solid: the engine's whole build") for label in labels)
    assert not any("hatched bottom" in label for label in labels)


# What the figures' axes, swatches, titles and footers say


def test_the_headline_axes_fit_their_data(tmp_path: Path) -> None:
    run = load_results(make_results(tmp_path / "results", device="cuda", failed=None))
    fig = headline_figure(run)
    peaks, times = fig.axes[:2]
    furthest = max(v for m in run.metrics.values() for v in (m.compared_peak_bytes, m.record.build_peak_bytes,
                                                             m.record.host_peak_bytes, m.floor_bytes) if v) / GIB
    assert furthest <= peaks.get_xlim()[1] <= furthest * 1.1, "the peaks axis fits the bars and floors"
    walls = max(m.record.wall_s or 0.0 for m in run.metrics.values())
    assert walls <= times.get_xlim()[1] <= walls * 1.1, "the time axis fits the walls"
    fig.canvas.draw()
    right = fig.get_window_extent().x1
    for label in _gid_prefix(fig, "excess:") + _gid_prefix(fig, "host-excess:") + _gid_prefix(fig, "wall:"):
        assert label.get_window_extent().x1 <= right, f"{label.get_gid()} ends in the figure"


def test_the_headline_swatches_are_told_from_the_baseline(tmp_path: Path) -> None:
    from matplotlib.colors import to_rgba

    run = load_results(make_results(tmp_path / "results", device="cuda"))
    legend = headline_figure(run).legends[0]
    swatches = {" ".join(t.get_text().split()): h for t, h in zip(legend.get_texts(), legend.legend_handles,
                                                                  strict=True)}

    def seen(label: str) -> np.ndarray:  # the swatch's colour as drawn on white
        (handle,) = [h for text, h in swatches.items() if text.startswith(label)]
        assert isinstance(handle, Patch)
        r, g, b, a = to_rgba(handle.get_facecolor())
        alpha = handle.get_alpha()
        a = a if alpha is None else alpha
        return np.asarray([r, g, b]) * a + (1 - a)

    baseline = seen("baseline")
    for label in ("build-phase host peak", "build-phase host + GPU peak"):
        colour = seen(label)
        assert np.abs(colour - baseline).max() > 0.15, f"{label} is not the baseline's grey"
        assert colour.max() - colour.min() > 0.1, f"{label} is a colour, not a grey"


def test_no_empty_released_bar_splits_an_engines_group(tmp_path: Path) -> None:
    directory = make_results(tmp_path / "results", failed=None)

    def load_file_releases_nothing(summary: dict[str, Any]) -> None:  # as load_file and torch_mmap on pi0.5
        for engine in summary["strategies"]["load_file"]["engines"]:
            engine["released_bytes"] = 0

    _edit_summary(directory, load_file_releases_nothing)
    fig = engines_figure(load_results(directory))
    assert not _gid(fig, "released:load_file")
    bars = sorted((p for name in ("map", "load") for p in _gid(fig, f"released:{name}")), key=lambda p: p.get_x())
    assert bars and all(p.get_height() > 0 for p in bars)
    by_engine: dict[int, list[Rectangle]] = {}
    for bar in bars:
        by_engine.setdefault(round(bar.get_x() + bar.get_width() / 2), []).append(bar)
    for group in by_engine.values():
        assert len(group) == 2
        assert group[1].get_x() == pytest.approx(group[0].get_x() + group[0].get_width()), "side by side, no hole"
    assert "none by load_file" in fig.axes[1].get_title(loc="left")


def _titles(fig: Figure) -> str:
    titles = [legend.get_title().get_text() for legend in fig.legends]
    titles += [fig.get_suptitle()] if fig.get_suptitle() else []  # type: ignore[attr-defined]
    return " ".join(" ".join(titles).split())


def test_titles_name_the_model_as_its_record_does_and_the_gpu_it_ran_on(tmp_path: Path) -> None:
    directory = make_results(tmp_path / "results", device="cuda", failed=None)
    _edit_summary(directory, lambda summary: summary["model"].update(name="pi05-trim2-9daf6755",
                                                                       source="lerobot 0.6.1"))
    run = load_results(directory)
    for build in (headline_figure, timeline_figure, engines_figure, peaks_figure, engine_times_figure):
        title = _titles(build(run))
        assert "pi05 less 2 trimmed tensors from lerobot 0.6.1" in title, (build.__name__, title)
        assert "9daf6755" not in title, build.__name__
        assert "on NVIDIA H200" in title, build.__name__
    cpu = load_results(make_results(tmp_path / "cpu"))
    assert "fixture-model from its weight spec" in _titles(timeline_figure(cpu))
    assert " on " not in _titles(timeline_figure(cpu)).split("(", 1)[1].split(";")[0]


@pytest.mark.skipif(not (BUDGET / "budget.json").is_file(), reason="no committed budget results")
def test_a_sweep_from_uncommitted_changes_says_so_in_words() -> None:
    record = read_budget(BUDGET)
    sha = "0123456789abcdef0123456789abcdef01234567"
    for commit, said in ((f"{sha}-dirty", "commit 0123456789ab with uncommitted changes"),
                         (sha, "commit 0123456789ab,")):
        texts = " ".join(t.get_text() for t in wall_figure(replace(record, commit=commit)).texts)
        assert said in " ".join(texts.split()) and "-dirty" not in texts, texts


def test_a_run_from_uncommitted_changes_says_so_in_its_footer(tmp_path: Path) -> None:
    directory = make_results(tmp_path / "results")
    _edit_summary(directory, lambda summary: summary.update(commit=summary["commit"] + "-dirty"))
    texts = " ".join(" ".join(t.get_text().split()) for t in peaks_figure(load_results(directory)).texts)
    assert "commit 0123456789 with uncommitted changes" in texts and "-dirty" not in texts
