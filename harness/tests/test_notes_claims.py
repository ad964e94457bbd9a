"""Hand-written notes never state a timing claim that a rerun could contradict unnoticed."""

from __future__ import annotations

from pathlib import Path

import pytest

import harness.report.notes as notes_module
from harness.report.notes import UNCHECKABLE, Notes, check_notes, read_notes, uncheckable_claims

RESULTS = Path(__file__).resolve().parents[2] / "results"


def _walls(**walls: float) -> dict[str, dict[str, str]]:
    return {name: {"wall time": f"{seconds:.1f} s", "runs": f"9: {seconds - 5:.1f}–{seconds + 5:.1f} s (±50%)"}
            for name, seconds in walls.items()}


@pytest.fixture
def cells_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notes_module, "_figures", lambda cells: cells)  # the table's cells, given directly


@pytest.mark.usefixtures("cells_given")
def test_a_sentence_ordering_two_strategies_is_stale_once_their_medians_swap() -> None:
    text = ("The two intervals overlap, with `map_no_prefetch`'s median the lower. "
            "`map` holds the floor. `load` is slower than both.")
    notes = Notes(Path("n.md"), text, _walls(map=12.2, map_no_prefetch=11.5, load=27.2))
    assert check_notes(notes, _walls(map=12.2, map_no_prefetch=11.5, load=27.0)) == []  # type: ignore[arg-type]
    stale = check_notes(notes, _walls(map=13.1, map_no_prefetch=15.1, load=27.0))  # type: ignore[arg-type]
    assert stale == ["The two intervals overlap, with `map_no_prefetch`'s median the lower."]


@pytest.mark.usefixtures("cells_given")
def test_claims_about_single_rounds_or_another_run_are_flagged_whatever_changed() -> None:
    text = ("`map` ran first twice (rounds 1 and 9, both above its median). "
            "In the run before this one its median was above `map`'s. "
            "Its pages are dropped after the last engine.")
    notes = Notes(Path("n.md"), text, _walls(map=12.2))
    stale = check_notes(notes, _walls(map=12.2))  # type: ignore[arg-type]
    assert stale == [f"{UNCHECKABLE}: `map` ran first twice (rounds 1 and 9, both above its median).",
                     f"{UNCHECKABLE}: In the run before this one its median was above `map`'s."]


def test_no_longer_orders_nothing() -> None:
    assert uncheckable_claims("In the earlier run the check no longer met the model in round 2.") == []


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.notes.md")), ids=lambda p: p.name)
def test_committed_notes_make_no_timing_claim_a_rerun_cannot_check(path: Path) -> None:
    notes = read_notes(path)
    assert notes is not None
    assert uncheckable_claims(notes.text) == []
