"""Tests that the figures show what they claim: one memory scale, no series hidden, times that add up."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from harness.budget.record import read_budget
from harness.report.budget import wall_figure
from harness.report.engines import engines_figure
from harness.report.headline import headline_figure
from harness.report.peaks import peaks_figure
from harness.report.style import coinciding
from harness.report.text import GIB
from harness.report.timeline import timeline_figure
from harness.results.metrics import host_floor_bytes, phase_spans
from harness.results.reading import load_results
from harness.results.record import Phases
from harness.tests.fixtures import make_results

RESULTS = Path(__file__).resolve().parents[2] / "results"


@pytest.fixture(params=["cpu", "cuda"])
def results_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return make_results(tmp_path / "results", device=request.param)


def _gid(fig: Figure, gid: str) -> list[Any]:
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


def test_timeline_panels_share_one_memory_range_with_the_model_at_one_height(results_dir: Path) -> None:
    run = load_results(results_dir)
    fig = timeline_figure(run)
    panels = fig.axes[: len(run.strategies)]  # the right-hand residency axes come after the panels
    assert len({ax.get_ylim() for ax in panels}) == 1
    top = panels[0].get_ylim()[1]
    peaks = [m.record.host_peak_bytes for m in run.metrics.values() if m.record.host_peak_bytes is not None]
    assert top >= max(peaks) / GIB and top >= run.record.model.bytes / GIB
    model = run.record.model.bytes / GIB
    for ax in panels:
        levels = [np.asarray(line.get_ydata(), dtype="float64") for line in ax.get_lines()]
        heights = [float(y[0]) for y in levels if y.size and (y == y[0]).all()]
        assert model in heights, "every panel draws the model size, at the same height"


def test_a_strategy_near_its_floor_fills_little_of_its_panel(tmp_path: Path) -> None:
    run = load_results(make_results(tmp_path / "results", failed=None))
    fig = timeline_figure(run)
    axes = dict(zip(run.strategies, fig.axes[: len(run.strategies)], strict=True))
    top = axes["map"].get_ylim()[1]
    map_peak, load_peak = run.strategies["map"].host_peak_bytes, run.strategies["load"].host_peak_bytes
    assert map_peak is not None and load_peak is not None
    assert map_peak / GIB / top < 0.6 * load_peak / GIB / top  # map's panel looks as much smaller as it is


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


# Headline


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


def test_references_from_another_setup_are_left_to_the_table(tmp_path: Path) -> None:
    run = load_results(make_results(tmp_path / "results"))
    assert run.record.references
    fig = peaks_figure(run)
    assert not [p for p in fig.findobj(Rectangle) if p.get_hatch()]
    texts = [t.get_text() for t in fig.findobj(Text)]
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


def test_the_engine_times_legend_explains_only_the_parts_a_run_recorded(tmp_path: Path) -> None:
    from harness.report.enginetimes import engine_times_figure
    from harness.results.reading import load_results
    from harness.tests.fixtures import make_results

    run = load_results(make_results(tmp_path))
    assert not any(m.engine_copy_s for m in run.metrics.values())  # the fixture records no split
    labels = [t.get_text() for legend in engine_times_figure(run).legends for t in legend.get_texts()]
    assert any(label.startswith("solid: the engine's whole build") for label in labels)
    assert not any("hatched bottom" in label for label in labels)
