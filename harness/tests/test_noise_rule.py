"""One noise rule for times, :func:`harness.results.spread.time_moved`: ``harness compare`` marks a time with it
and the notes check of a re-rendered report leaves out the times it calls noise; both must say the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.report import notes as notes_module
from harness.results import spread
from harness.results.comparison import Comparison, compare_results
from harness.results.reading import Results, load_results
from harness.results.record import SUMMARY

RESULTS = Path(__file__).resolve().parents[2] / "results"


def _walls(tmp_path: Path, name: str, median_s: float, spread_fraction: float) -> Results:
    """A copy of ``results/smoke`` whose every strategy's rounds take ``median_s`` seconds at the median, evenly
    from ``1 - spread_fraction`` to ``1 + spread_fraction`` times it (builds 0.9 of each round, loads 0.05 s)."""
    directory = tmp_path / name
    shutil.copytree(RESULTS / "smoke", directory)
    summary: dict[str, Any] = json.loads((directory / SUMMARY).read_text())
    summary["name"] = name
    for strategy in summary["strategies"].values():
        n = len(strategy["repeats"])
        for i, repeat in enumerate(strategy["repeats"]):
            wall = median_s * (1.0 + spread_fraction * (2 * i / (n - 1) - 1))
            repeat.update(wall_s=wall, build_s=0.9 * wall, load_s=0.05)
        strategy["wall_s"] = median_s
    (directory / SUMMARY).write_text(json.dumps(summary))
    return load_results(directory)


def _compare_marks(base: Results, new: Results) -> dict[str, bool]:
    comparison: Comparison = compare_results(base, new)
    return {s.name: s.time("wall").flagged for s in comparison.strategies}


def _notes_list(base: Results, new: Results) -> dict[str, bool]:
    """Whether the notes check, stamped with BASE's table, lists NEW's wall time as changed, per strategy."""
    notes = notes_module.Notes(Path("smoke.notes.md"), "", notes_module._figures(base))
    changed = {c.strategy for c in notes_module.figure_changes(notes, new) if c.figure == "wall time"}
    return {name: name in changed for name in new.metrics}


# (BASE median, NEW median, spread of the rounds either side): NEW's rounds inside BASE's, overlapping them,
# clear of them either way, and clear of them by exactly the resolution (0.6 s against 0.7 s: a float
# difference of 0.0999...).
CASES = [(10.0, 10.0, 0.1), (10.0, 10.5, 0.1), (10.0, 11.5, 0.1), (10.0, 13.0, 0.1), (10.0, 7.0, 0.1),
         (0.6, 0.7, 0.0)]


@pytest.mark.parametrize(("base_s", "new_s", "rounds_spread"), CASES)
def test_compare_and_the_notes_check_call_the_same_times_noise(tmp_path: Path, base_s: float, new_s: float,
                                                               rounds_spread: float) -> None:
    base = _walls(tmp_path, "smoke", base_s, rounds_spread)
    new = _walls(tmp_path, "smoke-new", new_s, rounds_spread)
    marked, listed = _compare_marks(base, new), _notes_list(base, new)
    assert marked == listed
    moved = spread.time_moved(*(spread.median_spread(spread.strategy_rounds(run.metrics["map"]).wall_s)
                                for run in (base, new)))
    assert set(marked.values()) == {moved}  # every strategy moved alike, as the rule says


@pytest.mark.parametrize("verdict", [True, False])
def test_both_take_their_verdict_from_the_one_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   verdict: bool) -> None:
    # the rule forced one way: what each reports follows it, whatever the rounds say (moved: 10 s against 13 s;
    # inside: 10 s against 10.5 s)
    calls: list[tuple[float, float]] = []

    def rule(base: spread.MedianSpread, new: spread.MedianSpread) -> bool:
        calls.append((base.median, new.median))
        return verdict

    base = _walls(tmp_path, "smoke", 10.0, 0.1)
    new = _walls(tmp_path, "smoke-new", 10.5 if verdict else 13.0, 0.1)
    monkeypatch.setattr(spread, "time_moved", rule)
    marked = _compare_marks(base, new)
    compared = len(calls)
    listed = _notes_list(base, new)
    assert compared and len(calls) > compared, "compare and the notes check both ask the rule"
    assert set(marked.values()) == set(listed.values()) == {verdict}


def _map_peak(tmp_path: Path, name: str, peak_bytes: int) -> Results:
    """A copy of ``results/smoke`` whose ``map`` has build-phase host peak ``peak_bytes`` in every round."""
    directory = tmp_path / name
    shutil.copytree(RESULTS / "smoke", directory)
    summary: dict[str, Any] = json.loads((directory / SUMMARY).read_text())
    summary["name"] = name
    summary["strategies"]["map"]["build_peak_bytes"] = peak_bytes
    for repeat in summary["strategies"]["map"]["repeats"]:
        repeat["build_peak_bytes"] = peak_bytes
    (directory / SUMMARY).write_text(json.dumps(summary))
    return load_results(directory)


@pytest.mark.parametrize(("tolerances", "moved"), [(0.9, False), (3.0, True)])
def test_compare_and_the_notes_check_call_the_same_memory_noise(tmp_path: Path, tolerances: float,
                                                                moved: bool) -> None:
    from harness.results.comparison import MEMORY_TOLERANCE
    from harness.results.labels import BUILD_HOST_PEAK
    from harness.units import GIB

    base = _map_peak(tmp_path, "smoke", int(0.3332 * GIB))  # the table prints 0.333 GiB
    step = tolerances * MEMORY_TOLERANCE * base.record.model.bytes
    new = _map_peak(tmp_path, "smoke-new", int(0.3332 * GIB + step))  # 0.9: 0.334 GiB, 1.0 MiB up as printed
    (peak,) = [d for d in compare_results(base, new).strategies[0].memory if d.label == BUILD_HOST_PEAK]
    notes = notes_module.Notes(Path("smoke.notes.md"), "", notes_module._figures(base))
    listed = any(c.strategy == "map" and c.figure == BUILD_HOST_PEAK for c in notes_module.figure_changes(notes, new))
    assert notes_module._figures(base)["map"][BUILD_HOST_PEAK] != notes_module._figures(new)["map"][BUILD_HOST_PEAK]
    assert peak.flagged is listed is moved
