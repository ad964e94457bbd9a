"""A scenario written back as TOML (:mod:`harness.scenario_file`) reads back to the same scenario."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.scenario import Scenario, load_scenario, parse_scenario
from harness.scenario_file import SCENARIO_FILE, write_scenario_file

ROOT = Path(__file__).resolve().parents[2]


def round_trip(scenario: Scenario, directory: Path) -> Scenario:
    path = write_scenario_file(scenario, directory)
    assert path == directory / SCENARIO_FILE
    return load_scenario(path)


@pytest.mark.parametrize("file", sorted((ROOT / "scenarios").glob("*.toml")), ids=lambda p: p.stem)
def test_every_committed_scenario_reads_back_to_itself(file: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the root its paths resolve against
    scenario = load_scenario(file)
    again = round_trip(scenario, tmp_path)
    assert dataclasses.replace(again, path=scenario.path) == scenario


def test_a_user_model_from_flags_reads_back_with_its_compiler_settings(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = {"name": "mine", "strategies": ["map", "load"],
            "model": {"source": "factory", "factory": "pkg.mod:build", "inputs": "pkg.mod:inputs"},
            "checkpoint": {"path": "w.safetensors"},
            "build": {"engine_cap_mib": 1.5, "backend": "inductor", "weights": "packaged"},
            "run": {"repeats": 3, "memory_limit_gib": 2.0}}
    scenario = parse_scenario(data, shown="the command line", base=tmp_path)
    (tmp_path / "results" / "mine").mkdir(parents=True)
    again = round_trip(scenario, tmp_path / "results" / "mine")
    assert scenario.path is None and dataclasses.replace(again, path=None) == scenario
    assert again.checkpoint.generate is False and again.build.tokens == 16
