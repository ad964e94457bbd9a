"""``python -m harness compare BASE NEW``: memory deltas against the noise, time ratios with intervals, exit status."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.report.comparison import comparison_markdown
from harness.results.comparison import MEMORY_TOLERANCE, Regression, compare_results
from harness.results.reading import load_results
from harness.results.record import SUMMARY
from harness.results.spread import median_spread
from harness.tests.recorded import RECORDED, run_id

RESULTS = Path(__file__).resolve().parents[2] / "results"


def _copy(tmp_path: Path, source: str, name: str, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A copy of ``results/<source>`` named ``name``, its ``summary.json`` changed by ``edit``."""
    directory = tmp_path / name
    shutil.copytree(RESULTS / source, directory)
    summary = json.loads((directory / SUMMARY).read_text())
    summary["name"] = name
    if edit is not None:
        edit(summary)
    (directory / SUMMARY).write_text(json.dumps(summary))
    return directory


def _slower(factor: float) -> Callable[[dict[str, Any]], None]:
    """Every strategy's walls and builds, in every round, ``factor`` times longer."""

    def edit(summary: dict[str, Any]) -> None:
        for strategy in summary["strategies"].values():
            strategy["wall_s"] *= factor
            for repeat in strategy["repeats"]:
                repeat["wall_s"] *= factor
                repeat["build_s"] *= factor
    return edit


def _rounds(spread: float) -> Callable[[dict[str, Any]], None]:
    """Every strategy's rounds set around its wall, evenly from ``1 - spread`` to ``1 + spread`` times it (the
    build 0.9 of each), so that a test does not depend on how much the committed rounds happened to vary."""

    def edit(summary: dict[str, Any]) -> None:
        for strategy in summary["strategies"].values():
            n = len(strategy["repeats"])
            for i, repeat in enumerate(strategy["repeats"]):
                factor = 1.0 + spread * (2 * i / (n - 1) - 1) if n > 1 else 1.0
                repeat["wall_s"] = strategy["wall_s"] * factor
                repeat["build_s"] = 0.9 * strategy["wall_s"] * factor
    return edit


def _same_peaks(summary: dict[str, Any]) -> None:
    """Every round's build-phase peak set to its strategy's, so that the noise is the fixed tolerance."""
    for strategy in summary["strategies"].values():
        for repeat in strategy["repeats"]:
            repeat["build_peak_bytes"] = strategy["build_peak_bytes"]


def _then(*edits: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def edit(summary: dict[str, Any]) -> None:
        for one in edits:
            one(summary)
    return edit


def _peak_up(strategy: str, fraction: float) -> Callable[[dict[str, Any]], None]:
    """Strategy's build-phase peak up by ``fraction`` of the model."""

    def edit(summary: dict[str, Any]) -> None:
        summary["strategies"][strategy]["build_peak_bytes"] += int(fraction * summary["model"]["bytes"])
    return edit


def _run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["compare", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_run_compared_with_itself_moved_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, RESULTS / "pi05", RESULTS / "pi05", "--fail-on-regression", "0")
    assert (code, err) == (0, "")
    assert "Nothing moved beyond the noise." in out
    assert "# pi05 (BASE) vs pi05 (NEW)" in out
    time_rows = [line for line in out.splitlines() if line.startswith("| map") and " s: " in line]
    assert len(time_rows) == 3 and all(line.count("1.00×") == 3 for line in time_rows)
    # the method behind the intervals: the range up to eight rounds, order statistics inside it from nine on
    rounds = len(json.loads((RESULTS / "pi05" / SUMMARY).read_text())["strategies"]["map"]["repeats"])
    ranges = median_spread([float(r) for r in range(rounds)]).k == 1
    assert ("with no change it excludes 1 by chance with probability" if ranges else
            f"{rounds} rounds (order statistics), which cover the median with probability") in out


def test_slower_walls_are_flagged_and_fail_the_threshold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _copy(tmp_path, "smoke", "smoke", _rounds(0.1))
    new = _copy(tmp_path, "smoke", "smoke-slow", _then(_rounds(0.1), _slower(2.0)))
    comparison = compare_results(load_results(base), load_results(new))
    for strategy in comparison.strategies:
        wall, load = strategy.time("wall"), strategy.time("load")
        assert wall.ratio is not None and wall.ratio.value == pytest.approx(2.0, rel=1e-3)
        assert wall.flagged and wall.regression, strategy.name
        assert not load.flagged, strategy.name  # loads were left as they were
    assert {r.figure for r in comparison.regressions()} == {"wall", "build"}
    code, out, err = _run(capsys, base, new, "--fail-on-regression", "50")
    assert code == 1
    assert "▲" in out and "regression: map: wall +100.0% of BASE" in err
    assert _run(capsys, base, new, "--fail-on-regression", "150")[0] == 0  # 100% slower is below 150%
    assert _run(capsys, base, new)[0] == 0  # without the flag: report only


def test_walls_within_the_rounds_spread_are_not_flagged(tmp_path: Path) -> None:
    base = _copy(tmp_path, "smoke", "smoke", _rounds(0.1))
    new = _copy(tmp_path, "smoke", "smoke-same", _then(_rounds(0.1), _slower(1.05)))
    comparison = compare_results(load_results(base), load_results(new))
    assert not any(s.time("wall").flagged for s in comparison.strategies)


def _loads(seconds: float) -> Callable[[dict[str, Any]], None]:
    """Every strategy's load phase set to ``seconds`` and up, a millisecond more each round."""

    def edit(summary: dict[str, Any]) -> None:
        for strategy in summary["strategies"].values():
            for i, repeat in enumerate(strategy["repeats"]):
                repeat["load_s"] = seconds + 0.001 * i
    return edit


def test_a_phase_of_milliseconds_is_not_flagged_however_its_ratio_moves(tmp_path: Path) -> None:
    base = _copy(tmp_path, "smoke", "smoke", _then(_rounds(0.1), _loads(0.02)))
    tiny = _copy(tmp_path, "smoke", "smoke-tiny", _then(_rounds(0.1), _loads(0.04)))
    comparison = compare_results(load_results(base), load_results(tiny))
    for strategy in comparison.strategies:
        load = strategy.time("load")
        assert load.ratio is not None and load.ratio.outside_noise, strategy.name  # twice as long, clear of noise
        assert not load.flagged and not load.regression, strategy.name  # but 20 ms is no change to wait for
    longer = _copy(tmp_path, "smoke", "smoke-longer", _then(_rounds(0.1), _loads(0.2)))
    comparison = compare_results(load_results(base), load_results(longer))
    assert all(s.time("load").regression for s in comparison.strategies)


def test_memory_beyond_the_tolerance_is_flagged_and_within_it_is_not(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    base_dir = _copy(tmp_path, "smoke", "smoke", _same_peaks)
    base = load_results(base_dir)
    within_dir = _copy(tmp_path, "smoke", "within", _then(_same_peaks, _peak_up("map", 0.6 * MEMORY_TOLERANCE)))
    within = compare_results(base, load_results(within_dir))
    beyond_dir = _copy(tmp_path, "smoke", "beyond", _then(_same_peaks, _peak_up("map", 3 * MEMORY_TOLERANCE)))
    beyond = compare_results(base, load_results(beyond_dir))
    within_peak, beyond_peak = within.strategies[0].memory[0], beyond.strategies[0].memory[0]
    assert within_peak.label == beyond_peak.label == "build-phase host peak"
    assert within_peak.delta_bytes and within_peak.delta_bytes > 0 and not within_peak.flagged
    assert beyond_peak.flagged and beyond_peak.regression
    assert within.flagged() == 0
    assert "map: build-phase host peak +1.5% of the model" in [r.describe() for r in beyond.regressions()]
    assert _run(capsys, base_dir, beyond_dir, "--fail-on-regression", "1")[0] == 1
    assert _run(capsys, base_dir, beyond_dir, "--fail-on-regression", "2")[0] == 0


def test_rounds_that_spread_wider_than_the_tolerance_are_the_noise(tmp_path: Path) -> None:
    def spread_rounds(summary: dict[str, Any]) -> None:
        _peak_up("map", 3 * MEMORY_TOLERANCE)(summary)
        rounds = summary["strategies"]["map"]["repeats"]
        # the highest round higher still: the rounds now spread over 5% of the model, whichever round was lowest
        highest = max(rounds, key=lambda r: r["build_peak_bytes"])
        highest["build_peak_bytes"] += int(0.05 * summary["model"]["bytes"])

    comparison = compare_results(load_results(RESULTS / "smoke"), load_results(_copy(tmp_path, "smoke", "wide",
                                                                                      spread_rounds)))
    map_ = comparison.strategies[0]
    assert map_.noise_bytes > 0.05 * map_.memory[0].model_bytes
    assert "spread" in map_.noise_source and not map_.memory[0].flagged


def test_a_strategy_failing_in_new_or_missing_from_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def edit(summary: dict[str, Any]) -> None:
        summary["strategies"]["load"].update(status="failed", error="MemoryError: engine 2")
        for repeat in summary["strategies"]["load"]["repeats"]:
            repeat.update(status="failed", error="MemoryError: engine 2")
        del summary["strategies"]["stream"]

    new = _copy(tmp_path, "smoke", "smoke-failed", edit)
    code, out, err = _run(capsys, RESULTS / "smoke", new, "--fail-on-regression", "1000")
    assert code == 1
    assert "load: finished in BASE, failed in NEW" in err
    assert "Only in BASE, not compared: stream." in out


def test_different_scenarios_need_leave(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, RESULTS / "pi05", RESULTS / "pi05-trim")
    assert (code, out) == (2, "")
    assert err.startswith("error: ") and err.count("\n") == 1
    assert f"pi05-trim/{SUMMARY}: scenario: 'pi05-trim'" in err and "--scenario" in err
    code, out, err = _run(capsys, RESULTS / "pi05", RESULTS / "pi05-trim", "--scenario", "--out", tmp_path)
    assert code == 0
    report = (tmp_path / "pi05-vs-pi05-trim.md").read_text()
    assert "Different scenarios: BASE ran 'pi05', NEW ran 'pi05-trim'." in report
    trimmed = set(load_results(RESULTS / "pi05-trim").strategies)
    only_base = [name for name in load_results(RESULTS / "pi05").strategies if name not in trimmed]
    assert only_base, "the committed pi05 run has strategies pi05-trim lacks"
    assert f"Only in BASE, not compared: {', '.join(only_base)}." in report
    assert (tmp_path / "pi05-vs-pi05-trim.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.splitlines() == [str(tmp_path / "pi05-vs-pi05-trim.png"), str(tmp_path / "pi05-vs-pi05-trim.md")]


@pytest.mark.parametrize("case", ["missing", "budget", "corrupt", "threshold"])
def test_bad_input_is_one_error_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    smoke = RESULTS / "smoke"
    cases: dict[str, list[str | Path]] = {
        "missing": [tmp_path / "nowhere", smoke],
        "budget": [smoke, RESULTS / "smoke-budget"],
        "corrupt": [smoke, tmp_path / "corrupt"],
        "threshold": [smoke, smoke, "--fail-on-regression", "-1"],
    }
    args = cases[case]
    if case == "corrupt":
        (tmp_path / "corrupt").mkdir()
        (tmp_path / "corrupt" / SUMMARY).write_text("{not json")
    code, out, err = _run(capsys, *args)
    assert (code, out) == (2, "")
    assert err.startswith("error: ") and err.count("\n") == 1
    expected = {"missing": "nowhere: not a results directory", "budget": f"smoke-budget/{SUMMARY}: not found",
                "corrupt": f"corrupt/{SUMMARY}: not valid JSON", "threshold": "--fail-on-regression -1"}[case]
    assert expected in err


def test_every_old_layout_stays_covered() -> None:
    layouts = {json.loads((d / SUMMARY).read_text()).get("layout", 1) for d in RECORDED}
    assert {1, 3, 4} <= layouts


@pytest.mark.parametrize("directory", RECORDED, ids=run_id)
def test_every_recorded_run_compares_with_itself(directory: Path) -> None:
    run = load_results(directory)
    comparison = compare_results(run, run)
    assert [s.name for s in comparison.strategies] == list(run.strategies)
    failed = [name for name, record in run.strategies.items() if not record.ok]  # no figure shows it did not regress
    assert comparison.flagged() == 0
    assert comparison.regressions() == [Regression(name, "failed", float("inf")) for name in failed]
    for strategy in comparison.strategies:
        for time in strategy.times:
            assert time.ratio is None or time.ratio.value == 1.0
        assert all(d.delta_bytes in (0, None) for d in strategy.memory)
    failures = ", ".join(f"{name}: failed in NEW, as in BASE" for name in failed)
    said = f"Nothing moved beyond the noise; regressions: {failures}" if failed else "Nothing moved beyond the noise."
    assert said in comparison_markdown(comparison)


def _drop(strategy: str) -> Callable[[dict[str, Any]], None]:
    def edit(summary: dict[str, Any]) -> None:
        del summary["strategies"][strategy]
    return edit


def _fail(strategy: str) -> Callable[[dict[str, Any]], None]:
    def edit(summary: dict[str, Any]) -> None:
        summary["strategies"][strategy].update(status="failed", error="MemoryError: engine 2")
        for repeat in summary["strategies"][strategy]["repeats"]:
            repeat.update(status="failed", error="MemoryError: engine 2")
    return edit


def test_a_strategy_missing_from_new_is_a_regression_at_any_threshold(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    new = _copy(tmp_path, "smoke", "smoke-fewer", _drop("stream"))
    code, out, err = _run(capsys, RESULTS / "smoke", new, "--fail-on-regression", "0")
    assert code == 1
    assert "regression: stream: ran in BASE, missing from NEW (more than 0%)" in err
    assert "regressions: stream: ran in BASE, missing from NEW." in out
    # a strategy NEW ran that BASE did not is no regression
    assert _run(capsys, new, RESULTS / "smoke", "--fail-on-regression", "0")[0] == 0


def test_a_strategy_failed_in_new_is_a_regression_even_where_it_failed_in_base(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _copy(tmp_path, "smoke", "smoke-failed", _fail("load"))
    new = _copy(tmp_path, "smoke", "smoke-failed-again", _fail("load"))
    code, _, err = _run(capsys, base, new, "--fail-on-regression", "0")
    assert code == 1
    assert "regression: load: failed in NEW, as in BASE (more than 0%)" in err
    assert _run(capsys, new, RESULTS / "smoke", "--fail-on-regression", "0")[0] == 0  # failed in BASE only


def test_a_single_round_comparison_says_it_cannot_mark_times(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    base = _copy(tmp_path, "smoke-compile", "once")
    new = _copy(tmp_path, "smoke-compile", "once-slower", _slower(3.0))
    comparison = compare_results(load_results(base), load_results(new))
    assert comparison.untimed() == [s.name for s in comparison.strategies]
    assert not any(t.flagged for s in comparison.strategies for t in s.times)  # three times as slow, unmarked
    code, out, err = _run(capsys, base, new, "--fail-on-regression", "0")
    assert code == 0
    assert ("- Time regressions cannot be marked for any strategy: one round in BASE or in NEW gives a time no "
            "interval") in out
    assert err.startswith("note: Time regressions cannot be marked for any strategy")
    many = compare_results(load_results(RESULTS / "smoke"), load_results(RESULTS / "smoke"))
    assert many.untimed() == [] and "cannot be marked" not in comparison_markdown(many)


def test_a_delta_that_shows_as_zero_has_no_sign(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def lower(summary: dict[str, Any]) -> None:
        summary["strategies"]["map"]["build_peak_bytes"] -= 1000  # far below 0.005 GiB and 0.05% of the model

    new = _copy(tmp_path, "smoke", "smoke-lower", _then(_same_peaks, lower))
    _, out, _ = _run(capsys, _copy(tmp_path, "smoke", "smoke-same", _same_peaks), new)
    row = next(line for line in out.splitlines() if line.startswith("| map") and " GiB, " in line)
    assert "−0.0" not in row and "-0.0" not in row
    assert re.fullmatch(r"0\.0+ GiB, 0\.0%", row.split("|")[2].strip())


@pytest.mark.parametrize(("base", "new", "shown"), [
    (18.0, 19.2, "18.0 → 19.2 s"),
    (0.023, 0.02, "0.023 → 0.020 s"),
    (10.0, 20.0, "10 → 20 s"),
    (95.0, 1250.0, "95 → 1250 s"),
])
def test_the_two_medians_of_a_time_have_the_same_decimals(base: float, new: float, shown: str) -> None:
    from harness.report.comparison import _time_cell
    from harness.results.comparison import TimeRatio
    from harness.results.spread import ratio_of_medians

    assert _time_cell(TimeRatio("wall", ratio_of_medians([base], [new]))).startswith(f"{shown}: ")


def test_memory_only_fails_on_memory_each_figure_on_a_line_and_never_on_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.units import MIB

    base = _copy(tmp_path, "smoke", "smoke", _then(_same_peaks, _rounds(0.1)))
    slower = _copy(tmp_path, "smoke", "smoke-slower", _then(_same_peaks, _rounds(0.1), _slower(2.0)))
    code, _, err = _run(capsys, base, slower, "--fail-on-regression", "0", "--memory-only")
    assert code == 0 and "regression:" not in err
    assert err.startswith("note: not gated (--memory-only): ") and "slow-downs of time beyond the noise" in err
    assert _run(capsys, base, slower, "--fail-on-regression", "0")[0] == 1  # without it, times fail

    heavier = _copy(tmp_path, "smoke", "smoke-heavier",
                    _then(_same_peaks, _rounds(0.1), _slower(2.0), _peak_up("map", 3 * MEMORY_TOLERANCE)))
    code, _, err = _run(capsys, base, heavier, "--fail-on-regression", "0", "--memory-only")
    assert code == 1
    lines = [line for line in err.splitlines() if line.startswith("regression: ")]
    named = [line.split(" (more than")[0] for line in lines]
    assert named == ["regression: map: build-phase host peak +1.5% of the model",
                     "regression: map: excess over floor +1.5% of the model"]
    before, after = (load_results(d).strategies["map"].build_peak_bytes for d in (base, heavier))
    assert before is not None and after is not None
    assert lines[0].endswith(f"(more than 0%): {before / MIB:.1f} MiB in BASE, {after / MIB:.1f} MiB in NEW, "
                             f"noise {MEMORY_TOLERANCE * load_results(base).record.model.bytes / MIB:.1f} MiB")

    failed = _copy(tmp_path, "smoke", "smoke-failed", _then(_same_peaks, _rounds(0.1), _fail("load")))
    code, _, err = _run(capsys, base, failed, "--fail-on-regression", "0", "--memory-only")
    assert code == 1 and "regression: load: finished in BASE, failed in NEW" in err  # no figure shows it did not


def _baseline_up(fraction: float) -> Callable[[dict[str, Any]], None]:
    """Every strategy's baseline up by ``fraction`` of the model, and with it every figure that holds it (the
    build-phase and whole-run host peaks, in every round): the harness's own imports grown, the loader not."""

    def edit(summary: dict[str, Any]) -> None:
        rise = int(fraction * summary["model"]["bytes"])
        for strategy in summary["strategies"].values():
            for key in ("baseline_rss_bytes", "build_peak_bytes", "host_peak_bytes"):
                strategy[key] += rise
            for repeat in strategy["repeats"]:
                repeat["build_peak_bytes"] += rise
    return edit


def test_a_peak_that_rose_with_the_baseline_is_no_regression(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    base = _copy(tmp_path, "smoke", "smoke", _same_peaks)
    grown = _copy(tmp_path, "smoke", "smoke-grown", _then(_same_peaks, _baseline_up(3 * MEMORY_TOLERANCE)))
    comparison = compare_results(load_results(base), load_results(grown))
    peak = comparison.strategies[0].memory[0]
    assert peak.label == "build-phase host peak" and peak.flagged and not peak.regression
    assert comparison.regressions() == []
    code, _, err = _run(capsys, base, grown, "--fail-on-regression", "0", "--memory-only")
    assert code == 0 and "regression:" not in err

    heavier = _copy(tmp_path, "smoke", "smoke-heavier",
                    _then(_same_peaks, _baseline_up(3 * MEMORY_TOLERANCE), _peak_up("map", 3 * MEMORY_TOLERANCE)))
    code, _, err = _run(capsys, base, heavier, "--fail-on-regression", "0", "--memory-only")
    lines = [line for line in err.splitlines() if line.startswith("regression: ")]
    assert code == 1 and len(lines) == 2
    assert lines[0].startswith("regression: map: build-phase host peak +1.5% of the model beyond the floor's rise")
    assert "of it the floor's rise" in lines[0]
    assert lines[1].startswith("regression: map: excess over floor +1.5% of the model (")


def test_memory_only_needs_a_threshold(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, RESULTS / "smoke", RESULTS / "smoke", "--memory-only")
    assert (code, out) == (2, "")
    assert err.startswith("error: --memory-only: ") and "--fail-on-regression" in err and err.count("\n") == 1


def _anon_stairs(directory: Path, strategy: str, step: int, stairs: int) -> int:
    """``strategy``'s anonymous samples in ``directory`` made a staircase: flat until the load starts, then up by
    ``step`` a sample for ``stairs`` samples, then flat (its largest rise between two samples: ``step``); returns
    the top."""
    import pandas as pd

    from harness.results.samples import samples_file

    path = directory / samples_file(strategy)
    frame = pd.read_csv(path)
    start = json.loads((directory / SUMMARY).read_text())["strategies"][strategy]["phases"]["load_start_s"]
    after = (frame["t_s"] > start).cumsum().clip(upper=stairs)
    floor = int(frame["anon_bytes"].iloc[0])
    frame["anon_bytes"] = floor + step * after
    frame.to_csv(path, index=False)
    return floor + step * stairs


@pytest.mark.parametrize(("rise", "flagged"), [(0.5, False), (1.5, True)])
def test_a_sampled_peak_is_held_to_the_largest_rise_between_samples(tmp_path: Path, rise: float,
                                                                    flagged: bool) -> None:
    from harness.results.comparison import SAMPLED

    model = load_results(RESULTS / "smoke").record.model.bytes
    step = int(10 * MEMORY_TOLERANCE * model)  # ten times the fixed tolerance: a peak missed by up to this
    directories = {}
    for name, extra in (("smoke", 0), ("smoke-anon", int(rise * step))):
        directory = _copy(tmp_path, "smoke", name, _same_peaks)
        top = _anon_stairs(directory, "load", step, stairs=4)
        summary = json.loads((directory / SUMMARY).read_text())
        summary["strategies"]["load"]["anon_peak_bytes"] = top + extra
        (directory / SUMMARY).write_text(json.dumps(summary))
        directories[name] = directory
    comparison = compare_results(load_results(directories["smoke"]), load_results(directories["smoke-anon"]))
    load = next(s for s in comparison.strategies if s.name == "load")
    (anon,) = [d for d in load.memory if d.label in SAMPLED]
    assert anon.delta_bytes == int(rise * step)
    assert anon.noise_bytes == step and load.noise_bytes < step  # its own noise, wider than the strategy's
    assert anon.flagged is flagged and anon.regression is flagged
