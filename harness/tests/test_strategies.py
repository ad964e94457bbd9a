"""The strategy registry: one entry per strategy, read by scenario validation, the worker and the figures."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.scenario import ScenarioError, load_scenario
from harness.strategies import STRATEGIES, strategy_colour

SCENARIO = """
name = "t"
strategies = [{names}]
[model]
source = "synthetic"
layers = 1
width = 64
heads = 4
vocab = 64
[build]
engines = 1
"""


def write(tmp_path: Path, *names: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(names=", ".join(f'"{n}"' for n in names)))
    return path


def test_scenarios_accept_exactly_the_registered_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ScenarioError, match="unknown strategy 'stream' .known: map, load, load_file"):
        load_scenario(write(tmp_path, "map", "stream"))
    monkeypatch.setitem(STRATEGIES, "stream", dataclasses.replace(STRATEGIES["map"], name="stream"))
    assert load_scenario(write(tmp_path, "map", "stream")).strategies == ("map", "stream")


def test_every_strategy_has_its_own_colour_and_label() -> None:
    colours = [s.colour for s in STRATEGIES.values()]
    assert len(set(colours)) == len(colours)
    assert all(s.label and s.name == name for name, s in STRATEGIES.items())
    assert strategy_colour("map", ["map"]) == STRATEGIES["map"].colour
    # names the registry does not know (results of another version) still get distinct colours
    order = ["map", "old_a", "old_b"]
    assert len({strategy_colour(n, order) for n in order}) == 3


def test_release_note_says_what_happened() -> None:
    assert "madvise" in STRATEGIES["map"].release_note(True, 0)
    assert "resized to 0" in STRATEGIES["load"].release_note(True, 0)
    assert "not resizable" in STRATEGIES["load_file"].release_note(True, 1)
    assert STRATEGIES["map"].release_note(False, 10).startswith("release = false")
