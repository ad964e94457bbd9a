"""Tests of the reporting side: the reader, floors, figures and the markdown report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from harness.cli import main
from harness.metrics import (
    SampleColumns,
    excess_fraction,
    floor_bytes,
    gpu_floor_bytes,
    host_floor_bytes,
    sampled_peaks,
)
from harness.record import EngineRecord, Phases, RecordError, StrategyRecord
from harness.report import render_all
from harness.report.engines import engines_figure
from harness.report.markdown import NOTES_MARKER, TABLE_COLUMNS, render_report, write_report
from harness.report.peaks import peaks_figure
from harness.report.text import GIB, short_commit
from harness.report.timeline import timeline_figure
from harness.results import load_results
from harness.tests.fixtures import FAILED_REASON, make_results

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


def test_render_all_writes_three_pngs_and_the_report(results_dir: Path) -> None:
    written = render_all(results_dir)
    out = results_dir.parent
    names = ["smoke-timeline.png", "smoke-peaks.png", "smoke-engines.png", "smoke.md"]
    assert [p.name for p in written] == names
    for path in written:
        assert path.parent == out and path.stat().st_size > 0
    for path in written[:3]:
        assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert written[3].read_text(encoding="utf-8").startswith("# smoke")
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_render_all_to_another_directory(cpu_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "elsewhere"
    written = render_all(cpu_dir, out)
    assert all(p.parent == out for p in written)
    assert not (cpu_dir.parent / "smoke.md").exists()


def test_table_has_one_row_per_strategy_and_marked_references(results_dir: Path) -> None:
    markdown = _markdown(results_dir)
    rows = _table(markdown)
    assert list(next(iter(rows.values()))) == list(TABLE_COLUMNS)
    names = list(rows)
    assert names[:3] == ["map", "load", "load_file"]
    assert names[3:] == ["reference: seed run (reference, different setup)"]
    assert rows[names[3]]["host at partitioning"] == "2.23 GiB"
    assert rows[names[3]]["host peak"] == "—"
    assert rows[names[3]]["host + GPU peak"] == "7.07 GiB"


def test_report_figures_equal_the_summary(results_dir: Path) -> None:
    summary = json.loads((results_dir / "summary.json").read_text())
    markdown = _markdown(results_dir)
    assert "rounded to 2 decimals" in markdown
    rows = _table(markdown)
    for name in ("map", "load"):
        s = summary["strategies"][name]
        row = rows[name]
        assert row["host at partitioning"] == _gib(s["host_at_partitioning_bytes"])
        assert row["host peak"] == _gib(s["host_peak_bytes"])
        assert row["anonymous peak"] == _gib(s["anon_peak_bytes"])
        assert row["released"] == _gib(s["released_bytes"])
        assert row["wall time"] == f"{s['wall_s']:.1f} s"
        assert row["status"] == "ok"
        engines = [e["weight_bytes"] for e in sorted(s["engines"], key=lambda e: e["index"])]
        if summary["device"] == "cuda":
            floor = gpu_floor_bytes(s["baseline_rss_bytes"], engines)
            assert row["host + GPU peak"] == _gib(s["host_gpu_peak_bytes"])
            excess = (s["host_gpu_peak_bytes"] - floor) / summary["model"]["bytes"]
        else:
            floor = host_floor_bytes(s["baseline_rss_bytes"], engines)
            peak = max(e["host_hwm_bytes"] for e in s["engines"])
            excess = (peak - floor) / summary["model"]["bytes"]
        assert row["floor"] == _gib(floor)
        assert row["excess over floor (% of model)"] == f"{excess * 100:+.1f}%".replace("-", "−")


def test_failed_strategy_shows_status_and_reason(results_dir: Path) -> None:
    markdown = _markdown(results_dir)
    row = _table(markdown)["load_file"]
    assert row["status"] == f"**FAILED: {FAILED_REASON}**"
    assert row["floor"] == "—" and row["wall time"] == "—"
    assert "partial data" in markdown
    texts = " ".join(_texts(timeline_figure(load_results(results_dir))))
    assert "load_file: FAILED" in texts
    assert "ran out of host memory" in texts


def test_notes_after_marker_survive_rerendering(cpu_dir: Path) -> None:
    report = write_report(load_results(cpu_dir), cpu_dir.parent / "smoke.md")
    fresh = report.read_text(encoding="utf-8")
    assert fresh.rstrip().endswith(NOTES_MARKER)
    notes = "\nThe map strategy's peak comes from engine 0.\n\n| hand | table |\n"
    report.write_text(fresh + notes, encoding="utf-8")
    summary_path = cpu_dir / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["strategies"]["map"]["host_peak_bytes"] = 9 * GIB
    summary_path.write_text(json.dumps(summary))
    again = render_all(cpu_dir)[-1].read_text(encoding="utf-8")
    assert again.startswith("# smoke")
    assert again.endswith(NOTES_MARKER + "\n" + notes)
    assert again.count(NOTES_MARKER) == 1
    assert _table(again)["map"]["host peak"] == "9.00 GiB"


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
    assert _table(markdown)["map"]["host + GPU peak"] == "— (no GPU)"
    assert "no GPU" in markdown


def test_gpu_data_draws_gpu_series(cuda_dir: Path) -> None:
    run = load_results(cuda_dir)
    ticks = [t.get_text() for ax in peaks_figure(run).axes for t in ax.get_xticklabels()]
    assert "host + GPU peak" in ticks
    texts = _texts(timeline_figure(run))
    assert "no GPU" not in texts
    assert "GPU used" in texts and "host + GPU" in texts


def test_timeline_panels_count_from_their_own_load_start(cpu_dir: Path) -> None:
    run = load_results(cpu_dir)
    ax = timeline_figure(run).axes[0]
    spans = [
        float(run.samples[name]["t_s"].max()) - s.phases.load_start_s
        for name, s in run.strategies.items()
        if s.phases.load_start_s is not None
    ]
    low, high = ax.get_xlim()
    assert low <= 0.0 < high
    assert high == pytest.approx(max(spans), rel=0.05)


def test_every_figure_carries_the_footer(cuda_dir: Path) -> None:
    run = load_results(cuda_dir)
    for build in (timeline_figure, peaks_figure, engines_figure):
        footer = " ".join(_texts(build(run)))
        facts = ("16 CPUs", "128 GiB memory", "NVIDIA H200", "backend copy", "cache cold", "torch 2.13.0")
        for fact in facts:
            assert fact in footer, (build.__name__, fact)
        assert "0123456789" in footer and "2025-01-02" in footer


def test_small_text_is_at_least_9pt(cpu_dir: Path) -> None:
    run = load_results(cpu_dir)
    for build in (timeline_figure, peaks_figure, engines_figure):
        fig = build(run)
        sizes = [float(t.get_fontsize()) for t in fig.findobj(Text) if t.get_text()]
        assert min(sizes) >= 9, build.__name__


def test_short_commit_keeps_dirty_marker() -> None:
    assert short_commit("0123456789abcdef0123-dirty", 7) == "0123456-dirty"
    assert short_commit("0123456789abcdef", 7) == "0123456"
    assert short_commit(None) == "not recorded"


def test_plot_command(cpu_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(cpu_dir), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "smoke-peaks.png").is_file()
    assert "smoke.md" in capsys.readouterr().out
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'missing'}: not a results directory (no such directory)\n"
