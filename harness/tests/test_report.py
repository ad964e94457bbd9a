"""Tests of the reporting side: the reader, floors, figures and the markdown report."""

from __future__ import annotations

import json
import os
import re
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from harness.cli import main
from harness.errors import HarnessError
from harness.fileio.codec import field_since
from harness.report import FIGURES, figure_paths, render_all
from harness.report.comparison import comparison_figure
from harness.report.enginetimes import engine_times_figure
from harness.report.headline import headline_figure
from harness.report.markdown import render_report
from harness.report.names import figure_name
from harness.report.peaks import peaks_figure
from harness.report.table import columns
from harness.report.text import short_commit
from harness.report.timeline import label_rows, timeline_figure
from harness.results import labels
from harness.results.comparison import compare_results
from harness.results.metrics import (
    SampleColumns,
    excess_fraction,
    floor_bytes,
    gpu_floor_bytes,
    host_floor_bytes,
    sampled_peaks,
)
from harness.results.reading import load_results
from harness.results.record import EngineRecord, Phases, RecordError, RunRecord, StrategyRecord
from harness.results.spread import median_spread
from harness.schema import at_layout
from harness.tests.fixtures import ENGINE_GIB, FAILED_REASON, make_results
from harness.tests.recorded import OLD_LAYOUTS, run_id
from harness.units import GIB, MIB

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _texts(fig: Figure) -> list[str]:
    """Every piece of text drawn on a figure (titles, labels, legend entries, annotations)."""
    return [t.get_text() for t in fig.findobj(Text)]


def _table(markdown: str) -> dict[str, dict[str, str]]:
    """The report's table as {first cell: {column: cell}}."""
    all_lines = markdown.splitlines()
    first = next(i for i, line in enumerate(all_lines) if line.startswith("| "))
    lines = []
    for line in all_lines[first:]:
        if not line.startswith("| "):
            break
        lines.append(line)
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def _markdown(results_dir: Path) -> str:
    """The report of a results directory, rendered without the figures."""
    return render_report(load_results(results_dir))


def _gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


@pytest.fixture(params=["cpu", "cuda"])
def results_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return make_results(tmp_path / "results", device=request.param)


@pytest.fixture
def cpu_dir(tmp_path: Path) -> Path:
    return make_results(tmp_path / "results", device="cpu")


@pytest.fixture
def cuda_dir(tmp_path: Path) -> Path:
    return make_results(tmp_path / "results", device="cuda")


def _engines(sizes: list[int], baseline: int) -> tuple[EngineRecord, ...]:
    """Engines of the given sizes in build order, each peaking at baseline + its size."""
    return tuple(
        EngineRecord(i, size, float(i), float(i) + 0.5, baseline + size, None, None, None)
        for i, size in enumerate(sizes)
    )


# Floors


def test_floor_hand_computed_cpu_and_gpu() -> None:
    base = 5 * GIB
    engines = [3 * GIB, 1 * GIB, 2 * GIB]
    assert host_floor_bytes(base, engines) == base + 3 * GIB
    # max over k of (engines up to and including k + engine k) = max(3+3, 4+1, 6+2)
    assert gpu_floor_bytes(base, engines) == base + 8 * GIB
    records = _engines(engines, base)
    assert floor_bytes(base, records, on_gpu=False) == base + 3 * GIB
    assert floor_bytes(base, records, on_gpu=True) == base + 8 * GIB


def test_engines_that_hold_their_weights_need_not_accumulate_on_the_gpu() -> None:
    base = 5 * GIB
    engines = [3 * GIB, 1 * GIB, 2 * GIB]
    # each packaged engine leaves the GPU once written: its weights on the host + their device copy
    assert gpu_floor_bytes(base, engines, accumulate_engines=False) == base + 6 * GIB
    records = _engines(engines, base)
    assert floor_bytes(base, records, on_gpu=True, compiler_weights="packaged") == base + 6 * GIB
    assert floor_bytes(base, records, on_gpu=True, compiler_weights="mapped") == base + 8 * GIB
    assert floor_bytes(base, records, on_gpu=True, compiler_weights="packaged_compiler") == base + 6 * GIB
    # on the host, the compiler's packaging holds the engine's copy; the harness's streams it (nothing resident)
    assert floor_bytes(base, records, on_gpu=False, compiler_weights="packaged_compiler") == base + 3 * GIB
    assert floor_bytes(base, records, on_gpu=False, compiler_weights="packaged") == base


def test_a_packaged_gpu_run_is_judged_against_the_non_accumulating_floor(cuda_dir: Path) -> None:
    summary_path = cuda_dir / "summary.json"
    summary = json.loads(summary_path.read_text())
    for strategy in summary["strategies"].values():
        strategy["compiler"], strategy["compiler_weights"] = "inductor", "packaged"
    summary_path.write_text(json.dumps(summary))
    run = load_results(cuda_dir)
    assert not run.engines_accumulate
    metrics = run.metrics["map"]
    largest = max(e.weight_bytes for e in run.strategies["map"].engines)
    baseline = metrics.record.baseline_rss_bytes
    assert baseline is not None
    assert metrics.floor_bytes == baseline + 2 * largest
    report = render_report(run)
    assert "engines that hold their weights leave it once built" in report
    assert "baseline + max over k of 2 x engine k" in report and "engines 0..k" not in report


def test_floor_takes_engines_in_build_order() -> None:
    records = _engines([3, 1, 2], 100)
    shuffled = (records[2], records[0], records[1])
    assert floor_bytes(100, shuffled, on_gpu=False) == 103
    assert floor_bytes(100, shuffled, on_gpu=True) == 108


def test_gpu_floor_is_tight_form_of_simple_bound() -> None:
    # Equal to baseline + model + largest when the largest engine is built last, below it otherwise.
    assert gpu_floor_bytes(0, [1, 2, 3]) == 6 + 3
    assert gpu_floor_bytes(0, [3, 2, 1]) < 6 + 3


def test_floor_needs_engines() -> None:
    with pytest.raises(ValueError):
        host_floor_bytes(0, [])
    with pytest.raises(ValueError):
        gpu_floor_bytes(0, [])


def test_excess_fraction() -> None:
    assert excess_fraction(12, 10, 4) == pytest.approx(0.5)
    assert excess_fraction(9, 10, 4) == pytest.approx(-0.25)
    with pytest.raises(ValueError):
        excess_fraction(1, 0, 0)


def test_build_phase_peak_takes_engines_and_build_window_samples_only() -> None:
    samples = SampleColumns.of({
        "t_s": [0.0, 1.0, 2.0, 9.0],
        "rss_bytes": [100.0 * GIB, 7.0 * GIB, 1.0 * GIB, 50.0 * GIB],
        "anon_bytes": [1.0, 1.0, 1.0, 1.0],
        "gpu_used_bytes": [float("nan")] * 4,
    })
    record = StrategyRecord(status="ok", load_hwm_bytes=101 * GIB, engines=_engines([3 * GIB], 2 * GIB),
                            phases=Phases(load_start_s=0.0, load_end_s=0.5, partition_s=0.9, build_end_s=2.5))
    peaks = sampled_peaks(record, samples)
    # engine high-water mark 5 GiB, build-window sample 7 GiB; the 100 GiB load and the 50 GiB after are not
    assert peaks["build_peak_bytes"] == 7 * GIB
    assert peaks["host_gpu_peak_bytes"] == 7 * GIB  # no GPU: host alone
    assert peaks["host_peak_bytes"] == 101 * GIB  # the whole run includes the load's high-water mark
    assert peaks["gpu_peak_bytes"] is None
    assert peaks["wall_s"] == 2.5


# Reader


def test_reader_keeps_missing_values_missing(cpu_dir: Path) -> None:
    run = load_results(cpu_dir)
    assert list(run.strategies) == ["map", "load", "load_file"]
    failed = run.strategies["load_file"]
    assert failed.status == "failed" and failed.error == FAILED_REASON
    assert failed.wall_s is None and run.metrics["load_file"].floor_bytes is None
    assert run.samples["map"]["gpu_used_bytes"].isna().all()
    assert not run.gpu_measured
    assert len(run.samples["load_file"]) < len(run.samples["map"])


def test_reader_rejects_a_directory_without_summary(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="summary.json: not found"):
        load_results(tmp_path)


# Rendering


def test_render_all_writes_five_pngs_and_the_report(results_dir: Path) -> None:
    written = render_all(results_dir).paths
    out = results_dir.parent
    names = ["smoke.headline.png", "smoke.timeline.png", "smoke.engines.png", "smoke.peaks.png",
             "smoke.engine-times.png", "smoke.md"]
    assert [p.name for p in written] == names
    for path in written:
        assert path.parent == out and path.stat().st_size > 0
    for path in written[:5]:
        assert path.read_bytes()[:8] == PNG_SIGNATURE
    report = written[5].read_text(encoding="utf-8")
    assert report.startswith("# smoke")
    assert all(f"![{p.stem}]({p.name})" in report for p in written[:5])
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def test_no_figure_file_is_named_like_another_scenarios_results(tmp_path: Path) -> None:
    names = sorted(tomllib.loads(p.read_text(encoding="utf-8"))["name"] for p in SCENARIOS.glob("*.toml"))
    assert {"lerobot-compile-packaged", "lerobot-compile-packaged-compiler"} <= set(names)
    figures = {name: [p.name for p in figure_paths(name, tmp_path).values()] for name in names}
    budgets = {name: figure_name(f"{name}-budget", "wall") for name in names}
    # the files a scenario's figures are recognised by: the start every one of their names shares
    starts = {name: os.path.commonprefix(found) for name, found in figures.items()}
    for name in names:
        for other in names:
            if other == name:
                continue
            results = {other, f"{other}.md", f"{other}.notes.md", f"{other}.png", *figures[other], budgets[other]}
            for figure in [*figures[name], budgets[name]]:
                assert figure not in results, f"{figure}, a figure of {name}, is named as {other}'s results"
                assert not figure.startswith(starts[other]), f"{figure}, a figure of {name}, reads as {other}'s"


def test_render_all_to_another_directory(cpu_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "elsewhere"
    written = render_all(cpu_dir, out).paths
    assert all(p.parent == out for p in written)
    assert not (cpu_dir.parent / "smoke.md").exists()


def test_table_columns_name_what_they_compare(tmp_path: Path) -> None:
    cpu_dir, cuda_dir = make_results(tmp_path / "cpu"), make_results(tmp_path / "cuda", device="cuda")
    cpu = list(next(iter(_table(_markdown(cpu_dir)).values())))
    assert cpu[:5] == ["strategy", "host at partitioning", "build-phase host peak", "floor",
                       "excess over floor (% of model)"]
    assert "whole-run host peak" in cpu and not any("GPU" in c for c in cpu)
    gpu = list(next(iter(_table(_markdown(cuda_dir)).values())))
    assert gpu[2] == "build-phase host + GPU peak"
    assert {"build-phase host peak", "whole-run host peak", "whole-run GPU peak"} <= set(gpu)


def test_the_memory_figures_are_named_by_one_declaration(tmp_path: Path) -> None:
    run = load_results(make_results(tmp_path / "cuda", device="cuda"))
    assert {labels.BUILD_HOST_GPU_PEAK, labels.FLOOR, labels.EXCESS_SHARE, labels.BUILD_HOST_PEAK,
            labels.WHOLE_RUN_HOST_PEAK, labels.ANON_ABOVE_BASELINE, labels.WHOLE_RUN_GPU_PEAK} <= {
        c.header for c in columns(run)}
    comparison = compare_results(run, run)
    assert [d.label for d in comparison.strategies[0].memory] == [
        labels.BUILD_HOST_PEAK, labels.BUILD_HOST_GPU_PEAK, labels.FLOOR, labels.EXCESS, labels.WHOLE_RUN_HOST_PEAK,
        labels.ANON_ABOVE_BASELINE, labels.WHOLE_RUN_GPU_PEAK]
    # each figure has one label: the comparison's rows are the table's headers, the excess with its unit there
    headers = {c.header for c in columns(run)}
    assert {d.label for d in comparison.strategies[0].memory} - headers == {labels.EXCESS}
    assert [h for h in headers if h.startswith(labels.EXCESS)] == [labels.EXCESS_SHARE]
    legend = [t.get_text() for t in comparison_figure(comparison).legends[0].get_texts()]
    assert set(legend) >= {d.label for d in comparison.strategies[0].memory}  # each row has its colour


def test_table_has_one_row_per_strategy_and_marked_references(results_dir: Path) -> None:
    rows = _table(_markdown(results_dir))
    names = list(rows)
    assert names[:3] == ["map", "load", "load_file"]
    assert names[3:] == ["reference: seed run (reference, different setup)"]
    reference = rows[names[3]]
    assert reference["host at partitioning"] == "2.23 GiB"
    assert reference["whole-run host peak"] == "—"
    on_gpu = "build-phase host + GPU peak" in reference
    compared = reference["build-phase host + GPU peak" if on_gpu else "build-phase host peak"]
    assert compared == ("7.07 GiB" if on_gpu else "7.07 GiB (host + GPU)")


def test_report_figures_equal_the_record(results_dir: Path) -> None:
    summary = json.loads((results_dir / "summary.json").read_text())
    markdown = _markdown(results_dir)
    assert "rounded to 2 decimals" in markdown
    rows = _table(markdown)
    for name in ("map", "load"):
        s = summary["strategies"][name]
        row = rows[name]
        assert row["host at partitioning"] == _gib(s["host_at_partitioning_bytes"])
        assert row["whole-run host peak"] == _gib(s["host_peak_bytes"])
        samples = pd.read_csv(results_dir / f"samples-{name}.csv")
        before_load = samples[samples["t_s"] <= s["phases"]["load_start_s"]]
        baseline_anon = int((before_load if len(before_load) else samples.head(1))["anon_bytes"].iloc[-1])
        assert row["anonymous peak above baseline"] == _gib(s["anon_peak_bytes"] - baseline_anon)
        assert row["released"] == _gib(s["released_bytes"])
        assert row["wall time"] == f"{s['wall_s']:.1f} s"
        phases = s["phases"]
        assert row["load time"] == f"{phases['load_end_s'] - phases['load_start_s']:.1f} s"
        assert row["status"] == "ok"
        engines = [e["weight_bytes"] for e in sorted(s["engines"], key=lambda e: e["index"])]
        if summary["device"] == "cuda":
            floor = gpu_floor_bytes(s["baseline_rss_bytes"], engines, s.get("compiler_weights") != "packaged")
            compared = row["build-phase host + GPU peak"]
            assert compared == _gib(s["host_gpu_peak_bytes"])
            assert row["build-phase host peak"] == _gib(s["build_peak_bytes"])
            excess = (s["host_gpu_peak_bytes"] - floor) / summary["model"]["bytes"]
        else:
            floor = host_floor_bytes(s["baseline_rss_bytes"], engines)
            peak = max(e["host_hwm_bytes"] for e in s["engines"])  # the fixture's samples stay below the marks
            assert row["build-phase host peak"] == _gib(peak)
            excess = (peak - floor) / summary["model"]["bytes"]
        assert row["floor"] == _gib(floor)
        assert row["excess over floor (% of model)"] == f"{excess * 100:+.1f}%".replace("-", "−")


def _gid(fig: Figure, gid: str) -> list[Any]:
    return [a for a in fig.findobj() if a.get_gid() == gid]


def test_the_headline_figure_and_the_table_agree(results_dir: Path) -> None:
    run = load_results(results_dir)
    rows = _table(render_report(run))
    compared = run.compared_label
    fig = headline_figure(run)
    for name in run.strategies:
        row = rows[name]
        (bar,) = _gid(fig, f"compared:{name}")
        assert _gib(round((bar.get_x() + bar.get_width()) * GIB)) == row[compared]
        (text,) = _gid(fig, f"excess:{name}")
        assert text.get_text().startswith(row[compared])
        if row["floor"] == "—":
            assert not _gid(fig, f"floor:{name}")
            continue
        assert f"{row['excess over floor (% of model)']} of the model above the floor" in text.get_text()
        (floor,) = _gid(fig, f"floor:{name}")
        assert {_gib(round(x * GIB)) for x in floor.get_segments()[0][:, 0]} == {row["floor"]}


def test_the_peaks_figure_draws_the_floor_on_the_compared_peak(results_dir: Path) -> None:
    run = load_results(results_dir)
    rows = _table(render_report(run))
    fig = peaks_figure(run)
    for name in run.strategies:
        row = rows[name]
        (bar,) = _gid(fig, f"peak:1:{name}")
        assert _gib(round(bar.get_height() * GIB)) == row[run.compared_label]
        (whole,) = _gid(fig, f"peak:2:{name}")
        assert _gib(round(whole.get_height() * GIB)) == row["whole-run host peak"]
        floors = _gid(fig, f"floor:{name}")
        if row["floor"] == "—":
            assert not floors
        else:
            segment = floors[0].get_segments()[0]
            assert {_gib(round(y * GIB)) for y in segment[:, 1]} == {row["floor"]}
            centre = segment[:, 0].mean()
            assert bar.get_x() < centre < bar.get_x() + bar.get_width(), "the floor is drawn on the compared bar"


def test_every_engine_is_labelled(cpu_dir: Path) -> None:
    run = load_results(cpu_dir)
    timeline = timeline_figure(run)
    panels = timeline.axes[: len(run.strategies)]  # the right-hand residency axes come after the panels
    for ax, (name, record) in zip(panels, run.strategies.items(), strict=True):
        gids = [str(t.get_gid()) for t in ax.texts]
        labels = sorted(int(gid.split(":")[1]) for gid in gids if gid.startswith("engine:"))
        assert labels == [e.index for e in record.engines], name
    times = engine_times_figure(run)  # each engine's own build time: its figure, not the headline's
    ticks = [t.get_text() for t in times.axes[0].get_xticklabels()]
    assert ticks == list(map(str, range(len(ENGINE_GIB))))


def test_narrow_engine_bands_move_their_number_down_a_row() -> None:
    spans = [(0, 0.0, 10.0), (1, 10.0, 10.1), (2, 10.1, 10.2), (3, 10.2, 20.0)]
    rows = label_rows(spans, seconds_per_inch=1.0)
    assert rows[0] == 0 and rows[3] == 0
    assert rows[1] != rows[2], "two numbers that would overlap are in different rows"


PI05 = Path(__file__).resolve().parents[2] / "results" / "pi05"


@pytest.mark.skipif(not (PI05 / "summary.json").is_file(), reason="no committed pi0.5 results")
def test_timeline_panels_show_every_strategy_on_one_memory_scale() -> None:
    run = load_results(PI05)  # map stays near 1.2 GiB, load holds 17.7 GiB: on one scale, read by eye
    fig = timeline_figure(run)
    axes = dict(zip(run.strategies, fig.axes[: len(run.strategies)], strict=True))
    map_top, load_top = axes["map"].get_ylim()[1], axes["load"].get_ylim()[1]
    assert map_top == load_top and load_top > 17


def test_failed_strategy_shows_status_and_reason(results_dir: Path) -> None:
    markdown = _markdown(results_dir)
    row = _table(markdown)["load_file"]
    assert row["status"] == f"**FAILED: {FAILED_REASON}**"
    assert row["floor"] == "—" and row["wall time"] == "—"
    assert "partial data" in markdown
    texts = " ".join(_texts(timeline_figure(load_results(results_dir))))
    assert "load_file: FAILED" in texts
    assert "ran out of host memory" in texts


def test_the_headline_says_how_far_a_failed_strategy_got(cpu_dir: Path) -> None:
    # A strategy can fail part-way through its engines, or after building all of them (a
    # compiler run whose built model fails its check): the label must not call the latter partial.
    summary = cpu_dir / "summary.json"
    data = json.loads(summary.read_text())
    data["strategies"]["map"].update(status="failed", error="built model differs from eager: RMS 18.8x eager's")
    summary.write_text(json.dumps(data))
    run = load_results(cpu_dir)
    fig = headline_figure(run)
    (partial,) = _gid(fig, "excess:load_file")
    assert partial.get_text().endswith(f"partial: FAILED after 2 of {len(ENGINE_GIB)} engines")
    (checked,) = _gid(fig, "excess:map")
    assert (f"all {len(ENGINE_GIB)} engines built, then FAILED: built model differs from eager"
            in " ".join(checked.get_text().split()))
    assert "partial" not in checked.get_text()


def test_notes_live_apart_and_are_flagged_when_their_figures_change(cpu_dir: Path) -> None:
    notes = cpu_dir.parent / "smoke.notes.md"
    notes.write_text("The map strategy's peak comes from engine 0.\n\n| hand | table |\n", encoding="utf-8")
    report = render_all(cpu_dir, notes_checked=True).paths[-1].read_text(encoding="utf-8")
    assert report.endswith("The map strategy's peak comes from engine 0.\n\n| hand | table |\n")
    assert "checked against the figures above" in report and "Check these notes" not in report
    assert notes.read_text(encoding="utf-8").startswith("<!-- notes checked against:\n{\"map\": {")
    summary_path = cpu_dir / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["strategies"]["map"]["host_peak_bytes"] = 9 * GIB
    summary_path.write_text(json.dumps(summary))
    rendered = render_all(cpu_dir)
    again = rendered.paths[-1].read_text(encoding="utf-8")
    assert _table(again)["map"]["whole-run host peak"] == "9.00 GiB"
    (change,) = rendered.stale_notes
    assert change.startswith("1 other figure changed: map whole-run host peak: ") and change.endswith(" → 9.00 GiB")
    assert "**Check these notes**" in again and change in again
    assert again.endswith("| hand | table |\n"), "the notes themselves are kept as written"


def test_stale_notes_are_the_sentences_that_cite_a_changed_figure_each_once(cpu_dir: Path) -> None:
    notes = cpu_dir.parent / "smoke.notes.md"
    notes.write_text("Intro without figures.\n", encoding="utf-8")
    render_all(cpu_dir, notes_checked=True)
    old = _table(_markdown(cpu_dir))["map"]["whole-run host peak"]
    stamp = notes.read_text(encoding="utf-8").split(" -->\n")[0] + " -->\n"
    cited = f"The map peak was {old}, the lowest. It stays at {old} after the build."
    notes.write_text(stamp + f"Intro without figures.\n\n{cited} Nothing else moved.\n", encoding="utf-8")
    summary_path = cpu_dir / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["strategies"]["map"]["host_peak_bytes"] = 9 * GIB
    summary_path.write_text(json.dumps(summary))
    stale = render_all(cpu_dir).stale_notes
    assert stale == [f"The map peak was {old}, the lowest.", f"It stays at {old} after the build."]


def test_times_that_moved_inside_the_run_to_run_spread_do_not_make_notes_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import harness.report.notes as notes_module

    before = {"map": {"wall time": "10.9 s", "runs": "3: 9.9–13.3 s (±22%)", "floor": "1.20 GiB"}}
    inside = {"map": {"wall time": "12.0 s", "runs": "3: 11.0–14.0 s (±17%)", "floor": "1.20 GiB"}}
    outside = {"map": {"wall time": "18.8 s", "runs": "3: 17.0–20.1 s (±10%)", "floor": "1.20 GiB"}}
    monkeypatch.setattr(notes_module, "_figures", lambda cells: cells)  # the table's cells, given directly
    notes = notes_module.Notes(Path("n.md"), "", before)
    assert notes_module.figure_changes(notes, inside) == []  # type: ignore[arg-type]
    changed = notes_module.figure_changes(notes, outside)  # type: ignore[arg-type]
    assert [c.figure for c in changed] == ["wall time", "runs"]


def test_notes_at_the_end_of_an_old_report_move_to_their_own_file(cpu_dir: Path) -> None:
    old = "# smoke\n\nold table\n\n<!-- notes: kept when this file is regenerated -->\n\n## Notes\n\nHand-written.\n"
    (cpu_dir.parent / "smoke.md").write_text(old, encoding="utf-8")
    rendered = render_all(cpu_dir)
    assert (cpu_dir.parent / "smoke.notes.md").read_text(encoding="utf-8") == "Hand-written.\n"
    assert rendered.stale_notes == ["never checked against any figures"]
    assert "old table" not in rendered.paths[-1].read_text(encoding="utf-8")


def test_marking_notes_checked_needs_notes(cpu_dir: Path) -> None:
    with pytest.raises(HarnessError, match="smoke.notes.md: no notes to mark as checked"):
        render_all(cpu_dir, notes_checked=True)


def test_no_gpu_data_says_no_gpu_and_draws_no_gpu_bars(cpu_dir: Path) -> None:
    run = load_results(cpu_dir)
    peaks = peaks_figure(run)
    ticks = [t.get_text() for ax in peaks.axes for t in ax.get_xticklabels()]
    assert ticks and not any("GPU" in t for t in ticks)
    assert any("no GPU" in t for t in _texts(peaks))
    timeline = timeline_figure(run)
    assert sum(t == "no GPU" for t in _texts(timeline)) == len(run.strategies)
    assert not any("GPU used" in t for t in _texts(timeline))
    markdown = _markdown(cpu_dir)
    assert not any("GPU" in c for c in _table(markdown)["map"])
    assert "No GPU was measured" in markdown


@pytest.mark.parametrize(("device", "sampled"), [("cpu", "anonymous peak"), ("cuda", "anonymous and GPU peaks")])
def test_the_report_says_which_peaks_only_the_samples_saw(tmp_path: Path, device: str, sampled: str) -> None:
    # the kernel's high-water mark bounds RSS only: a peak of anonymous or GPU memory between two
    # samples is missed, which a reader of a run with long gaps between samples must be told
    markdown = _markdown(make_results(tmp_path / "results", device=device))
    lines = [line for line in markdown.splitlines() if "longest gap between samples" in line]
    assert lines and all(f"host peaks from the kernel high-water mark, {sampled} from the samples alone, " in line
                         for line in lines)


def test_gpu_data_draws_gpu_series(cuda_dir: Path) -> None:
    run = load_results(cuda_dir)
    ticks = [t.get_text() for ax in peaks_figure(run).axes for t in ax.get_xticklabels()]
    assert "whole-run\nGPU peak" in ticks
    assert any("host + GPU" in " ".join(t.split()) for t in ticks)
    texts = _texts(timeline_figure(run))
    assert "no GPU" not in texts
    assert "GPU used" in texts and "host + GPU" in texts


def test_timeline_panels_count_from_their_own_load_start(cpu_dir: Path) -> None:
    run = load_results(cpu_dir)
    fig = timeline_figure(run)
    for ax, (name, s) in zip(fig.axes, run.strategies.items(), strict=False):  # each on its own time axis
        assert s.phases.load_start_s is not None
        span = max([float(run.samples[name]["t_s"].max())] + [e.end_s for e in s.engines if e.end_s is not None])
        low, high = ax.get_xlim()
        assert low <= 0.0 < high
        assert high == pytest.approx(span - s.phases.load_start_s, rel=0.05), name


def test_every_figure_carries_the_footer(cuda_dir: Path) -> None:
    run = load_results(cuda_dir)
    for build in FIGURES.values():
        footer = " ".join(_texts(build(run)))
        facts = ("16 CPUs", "128 GiB memory", "NVIDIA H200", "backend copy", "cache cold", "torch 2.13.0")
        for fact in facts:
            assert fact in footer, (build.__name__, fact)
        assert "0123456789" in footer and "2025-01-02" in footer


def test_small_text_is_at_least_9pt(results_dir: Path) -> None:
    run = load_results(results_dir)
    for build in FIGURES.values():
        fig = build(run)
        sizes = [float(t.get_fontsize()) for t in fig.findobj(Text) if t.get_text()]
        assert min(sizes) >= 9, build.__name__


def test_short_commit_keeps_dirty_marker() -> None:
    assert short_commit("0123456789abcdef0123-dirty", 7) == "0123456-dirty"
    assert short_commit("0123456789abcdef", 7) == "0123456"
    assert short_commit(None) == "not recorded"


def test_plot_command(cpu_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(cpu_dir), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "smoke.headline.png").is_file()
    assert "smoke.md" in capsys.readouterr().out
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'missing'}: not a results directory (no such directory)\n"


@pytest.mark.skipif(not (PI05 / "summary.json").is_file(), reason="no committed pi0.5 results")
def test_observations_say_when_the_whole_run_went_higher() -> None:
    markdown = render_report(load_results(PI05))
    lines = {line.split("**")[1]: line for line in markdown.splitlines() if line.startswith("- **")}
    details = markdown.split("- **load**")[1].split("- **load_file**")[0]
    # load holds two copies while it loads, one at partitioning: its whole run went higher (the figure
    # itself is the committed run's).
    assert re.search(r"whole-run host peak \d+\.\d\d GiB, above the build phase's, reached during the load", details)
    after = markdown.split("- **load_file**")[1].split("- Lowest")[0]
    assert "whole-run host peak" not in after, "load_file's whole run went no higher than its build phase"
    assert set(lines) >= {"map", "load", "load_file"}


def test_the_fastest_strategy_is_named_with_its_spread_and_only_called_clear_when_its_rounds_are(
    tmp_path: Path,
) -> None:
    from harness.report.markdown import fastest_observation

    committed = Path(__file__).resolve().parents[2] / "results" / "pi05"
    copy = tmp_path / "pi05"
    shutil.copytree(committed, copy)
    summary = json.loads((copy / "summary.json").read_text())
    rounds = len(summary["strategies"]["map"]["repeats"])
    assert rounds >= 3, "the committed pi0.5 run has repeats"

    def walls(name: str, first: float) -> None:
        for i, r in enumerate(summary["strategies"][name]["repeats"]):
            r["wall_s"] = first + i

    for k, name in enumerate(summary["strategies"]):
        walls(name, 100.0 + 10 * k)  # every other strategy far behind
    walls("map", 10.0)
    walls("map_no_prefetch", 10.5)  # overlapping map's rounds
    (copy / "summary.json").write_text(json.dumps(summary))
    line, peer = fastest_observation(load_results(copy))
    # up to 8 rounds an interval is the range, and the words speak of rounds; from 9 on, of the medians' intervals
    spread = median_spread([float(r) for r in range(rounds)])
    ranges, span = spread.k == 1, spread.span()
    overlap = "their rounds overlap" if ranges else "the intervals of their medians overlap"

    def clear(a: str, b: str) -> str:
        return (f"every round of {a} was faster than every round of {b}" if ranges else
                f"the interval of {a}'s median lies below {b}'s, beyond the noise")

    assert line.startswith("- Lowest median wall: **map**, median ") and span in line
    assert "next: map_no_prefetch" in line
    assert overlap in line and "a rerun may order them differently" in line
    # map's own variant is next; the goal is against the fastest other way of loading
    fastest_peer = min((n for n in summary["strategies"] if not n.startswith("map")),
                       key=lambda n: summary["strategies"][n]["repeats"][0]["wall_s"])
    assert peer.startswith("- **map** against the fastest other way of loading")
    assert f"{clear('map', fastest_peer)} ({fastest_peer} took" in peer
    walls("map_no_prefetch", 10.0 + rounds)  # every round after map's slowest
    (copy / "summary.json").write_text(json.dumps(summary))
    ahead, _ = fastest_observation(load_results(copy))
    assert f"{clear('map', 'map_no_prefetch')} (map_no_prefetch took" in ahead
    walls(fastest_peer, 1.0)  # a peer now beats map in every round: said that way round, on the first line
    (copy / "summary.json").write_text(json.dumps(summary))
    (beaten,) = fastest_observation(load_results(copy))
    assert beaten.startswith(f"- Lowest median wall: **{fastest_peer}**") and "next: map," in beaten
    assert f"{clear(fastest_peer, 'map')} (map took" in beaten
    walls(fastest_peer, 11.0 + rounds)  # map first, its variant second, the peer after both
    walls("map_no_prefetch", 10.0 + rounds)
    walls("map", 1.0)
    (copy / "summary.json").write_text(json.dumps(summary))
    _, slower_peer = fastest_observation(load_results(copy))
    assert clear("map", fastest_peer) in slower_peer


def test_strategies_tied_on_the_lowest_peak_are_all_named(tmp_path: Path) -> None:
    from harness.report.markdown import comparison_observations

    copy = tmp_path / "pi05"
    shutil.copytree(Path(__file__).resolve().parents[2] / "results" / "pi05", copy)
    summary = json.loads((copy / "summary.json").read_text())
    strategies = summary["strategies"]
    assert strategies["map"]["build_peak_bytes"] is not None, "the committed pi0.5 run ran on the CPU"

    def peaks(**gib: float) -> str:
        for k, name in enumerate(strategies):
            strategies[name]["build_peak_bytes"] = int(gib.get(name, 5.0 + k) * GIB)
        (copy / "summary.json").write_text(json.dumps(summary))
        return next(x for x in comparison_observations(load_results(copy))
                    if x.startswith("- Lowest build-phase host peak"))

    tied = peaks(map=2.0, stream=2.0 + 2**-12, map_no_prefetch=2.1)  # 2.00 and 2.00 in the table; 2.10 not
    assert tied.startswith("- Lowest build-phase host peak: **map**, **stream** (2.00 GiB, equal at this precision)")
    alone = peaks(map=2.0, stream=2.1)
    assert alone.startswith("- Lowest build-phase host peak: **map** (2.00 GiB), ")


def test_the_header_says_which_run_the_times_are_with_an_odd_or_an_even_count_of_rounds(tmp_path: Path) -> None:
    from harness.report.markdown import _repeats_text

    record = load_results(make_results(tmp_path)).record
    odd, even = _repeats_text(record.replace(repeats=5)), _repeats_text(record.replace(repeats=2))
    assert odd is not None and "times are the median run's (the figures show it)" in odd
    # with two rounds no run took the median time: the header must not call it a run's
    assert even is not None and "median run's" not in even and "the mean of the middle two" in even


def test_the_report_gives_the_order_of_every_round_where_it_changed(tmp_path: Path) -> None:
    directory = make_results(tmp_path)
    summary = json.loads((directory / "summary.json").read_text())
    summary["repeats"] = 3
    summary["round_orders"] = [["map", "load", "load_file"], ["load", "load_file", "map"],
                               ["load_file", "map", "load"]]
    (directory / "summary.json").write_text(json.dumps(summary))
    report = render_report(load_results(directory))
    assert "interleaved in an order that changes from round to round" in report
    line = next(x for x in report.splitlines() if x.startswith("- **round orders**"))
    assert line.endswith("1: map, load, load_file; 2: load, load_file, map; 3: load_file, map, load.")
    summary["round_orders"] = [["map", "load", "load_file"]] * 3
    (directory / "summary.json").write_text(json.dumps(summary))
    report = render_report(load_results(directory))
    assert "interleaved in the same order every round" in report and "**round orders**" not in report
    summary["round_orders"][1] = ["map", "load", "map"]
    (directory / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(RecordError, match=r"round_orders\[1\]: expected every strategy of the run once"):
        load_results(directory)


@pytest.mark.parametrize("reads", [1, 3])
def test_the_disk_line_gives_a_median_and_a_range_only_over_several_reads(tmp_path: Path, reads: int) -> None:
    directory = make_results(tmp_path)
    summary = json.loads((directory / "summary.json").read_text())
    size = summary["checkpoint"]["bytes"]
    summary["repeats"] = reads
    summary["round_orders"] = summary["round_orders"] * reads
    summary["disk_reads"] = [{"before": r, "bytes": size, "seconds": size / (1574e6 + r * 1e6),
                              "bytes_per_s": 1574e6 + r * 1e6, "cpu_seconds": 1.2, "method": "read",
                              "resident_at_start_bytes": 0} for r in range(reads)]
    (directory / "summary.json").write_text(json.dumps(summary))
    line = next(x for x in render_report(load_results(directory)).splitlines() if x.startswith("- **disk**:"))
    if reads == 1:
        assert "a cold sequential read of the" in line and "before the strategies ran): 1574 MB/s, 1.2 CPU-s;" in line
        assert "median" not in line and "1574–1574" not in line and "each round" not in line
    else:
        assert "3 cold sequential reads" in line and "one before each round of strategies): median 1575 MB/s " \
                                                     "(1574–1576), 1.2 CPU-s per read;" in line


def _as_compiled(directory: Path, children_pss_bytes: int | None) -> None:
    """Make the fixture's run one of a compiler whose workers summed 8 GiB of RSS; without ``children_pss_bytes``
    a record of layout 12, from before the PSS was recorded."""
    path = directory / "summary.json"
    data = json.loads(path.read_text())
    for strategy in data["strategies"].values():
        strategy.update(compiler="inductor", compiler_weights="mapped")
        for engine in strategy["engines"]:
            engine.update(compile_s=1.0, artifact_bytes=MIB, rss_before_bytes=engine["host_hwm_bytes"],
                          children_peak_bytes=8 * GIB, children_pss_bytes=children_pss_bytes)
    if children_pss_bytes is None:  # layout 12 holds no key of a later layout
        data = {**at_layout(RunRecord, data, 12), "layout": 12}
    path.write_text(json.dumps(data))


def _engine_table(markdown: str) -> list[dict[str, str]]:
    """The compiler section's per-engine table."""
    section = markdown[markdown.index("Per engine (host rise"):]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split(" | ")), strict=True)) for line in lines[2:]]


def test_the_compiler_processes_column_names_what_was_measured(cpu_dir: Path) -> None:
    _as_compiled(cpu_dir, 700 * MIB)
    markdown = _markdown(cpu_dir)
    rows = _engine_table(markdown)
    assert rows and all(row["compiler processes (summed PSS)"] == "700.0 MiB" for row in rows)
    assert "compiler processes: the largest summed PSS" in markdown


def test_older_records_show_their_compiler_processes_as_summed_rss(cpu_dir: Path) -> None:
    _as_compiled(cpu_dir, None)
    run = load_results(cpu_dir)
    assert all(e.children_pss_bytes is None for r in run.strategies.values() for e in r.engines)
    markdown = render_report(run)
    rows = _engine_table(markdown)
    assert rows and all(row["compiler processes (summed RSS)"] == "8,192.0 MiB" for row in rows)
    assert "summed PSS" not in rows[0]
    assert "once per process, so it overstates what they add" in markdown


_GPU_SPLIT_COLUMNS = ("GPU at start", "GPU peak", "weights on GPU", "allocator peak (reserved)",
                      "allocator peak (allocated)", "compiler's own on GPU")


def _with_gpu_split(directory: Path) -> None:
    """Give the compiled fixture's engines and strategies the GPU split a run on a GPU records (layout 16)."""
    path = directory / "summary.json"
    data = json.loads(path.read_text())
    for strategy in data["strategies"].values():
        strategy["gpu_context_bytes"] = 500 * MIB
        for engine in strategy["engines"]:
            engine.update(gpu_start_bytes=100 * MIB, gpu_peak_bytes=1600 * MIB, gpu_weights_bytes=1000 * MIB,
                          gpu_reserved_peak_bytes=1400 * MIB, gpu_allocated_peak_bytes=1300 * MIB)
    path.write_text(json.dumps(data))


def test_the_gpu_split_is_shown_for_a_run_that_measured_it(cuda_dir: Path) -> None:
    _as_compiled(cuda_dir, 700 * MIB)
    _with_gpu_split(cuda_dir)
    markdown = _markdown(cuda_dir)
    rows = _engine_table(markdown)
    assert rows and all(row["GPU peak"] == "1,600.0 MiB" and row["weights on GPU"] == "1,000.0 MiB"
                        and row["allocator peak (reserved)"] == "1,400.0 MiB"
                        and row["allocator peak (allocated)"] == "1,300.0 MiB"
                        and row["compiler's own on GPU"] == "500.0 MiB" for row in rows)
    assert "compiler's own on GPU = GPU peak − weights on GPU − GPU at start" in markdown
    assert "- **map**: CUDA context 500.0 MiB as the first allocation created it" in markdown


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_run_without_the_gpu_split_shows_none_of_its_columns(tmp_path: Path, device: str) -> None:
    directory = make_results(tmp_path / "results", device=device)
    _as_compiled(directory, 700 * MIB)
    markdown = _markdown(directory)
    rows = _engine_table(markdown)
    assert rows and not set(_GPU_SPLIT_COLUMNS) & set(rows[0])
    assert "CUDA context" not in markdown and "on the GPU (NVML" not in markdown


@pytest.mark.parametrize("directory", OLD_LAYOUTS, ids=run_id)
def test_the_context_speaks_of_prefetch_only_for_a_layout_that_recorded_it(directory: Path, cpu_dir: Path) -> None:
    """A run of a layout before ``prefetch`` was recorded (the compiler's layout 3, the first) says nothing of it,
    rather than "prefetch off", which no record of it says; a run of this layout says what it recorded."""
    def context(results_dir: Path) -> str:
        return next(line for line in _markdown(results_dir).splitlines() if line.startswith("Model **"))

    assert load_results(directory).record.layout < field_since(RunRecord, "prefetch")
    assert "prefetch" not in context(directory)
    assert "prefetch" in context(cpu_dir)
