"""Records name files relative to the repository root, as the scenario gives them, and read them back resolved:
a record names no folder of the machine that made it and reads alike in another checkout."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.budget.record import BUDGET_FILE, BUDGET_VERSION, read_budget, write_budget
from harness.fileio.codec import TABLE_STYLE, decode, encode
from harness.plan import Plan
from harness.results.record import LAYOUT_VERSION, CheckpointInfo, RunRecord
from harness.scenario import CheckpointConfig, ModelConfig
from harness.tests.committed import committed_copy
from harness.tests.test_codec import BUDGET, PLAN, RUN, budget_as_earlier

HOME = re.compile(r"(^|[\s'\"(=:])/(home|root|Users)/")
"""A user's home folder inside a longer string (an error message quoting a path, say)."""


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


def _plan_in(root: Path) -> Plan:
    """:data:`PLAN` with every path under ``root``, as :func:`harness.plan.make_plan` makes them from a scenario
    loaded there."""
    checkpoint = root / "data" / "m.safetensors"
    scenario = dataclasses.replace(
        PLAN.scenario, path=root / "scenarios" / "smoke.toml",
        model=dataclasses.replace(PLAN.scenario.model, spec=root / "harness" / "specs" / "pi05.json"),
        checkpoint=CheckpointConfig(checkpoint, seed=3))
    return dataclasses.replace(PLAN, scenario=scenario,
                               checkpoint=dataclasses.replace(PLAN.checkpoint, path=str(checkpoint)),
                               checkpoint_files=(str(checkpoint),),
                               workdir=str(root / "results" / ".smoke.partial" / "engines"))


def test_a_plan_holds_its_paths_relative_to_the_root_and_reads_them_back_in_any_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    monkeypatch.chdir(here)
    plan = _plan_in(here)
    data = json.loads(json.dumps(plan.to_json()))
    assert not [s for s in _strings(data) if str(tmp_path) in s]
    assert data["checkpoint"]["path"] == "data/m.safetensors" and data["checkpoint_files"] == ["data/m.safetensors"]
    assert data["workdir"] == "results/.smoke.partial/engines"
    assert data["scenario"]["path"] == "scenarios/smoke.toml"
    assert data["scenario"]["model"]["spec"] == "harness/specs/pi05.json"
    assert data["scenario"]["checkpoint"]["path"] == "data/m.safetensors"
    assert Plan.from_json(data, "plan.json") == plan  # absolute again, as the worker uses them
    monkeypatch.chdir(there)  # the same record read in another checkout names that checkout's files
    assert Plan.from_json(data, "plan.json") == _plan_in(there)


def test_a_summary_and_a_budget_hold_the_checkpoint_relative_to_the_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    checkpoint = str(tmp_path / "data" / "m.safetensors")
    run = RUN.replace(checkpoint=dataclasses.replace(RUN.checkpoint, path=checkpoint))
    summary = json.loads(json.dumps(run.to_json()))
    assert summary["checkpoint"]["path"] == "data/m.safetensors"
    assert RunRecord.from_json(summary, "summary.json") == run
    budget = dataclasses.replace(BUDGET, checkpoint=checkpoint)
    written = json.loads(write_budget(tmp_path, budget).read_text())
    assert (written["budget"], written["checkpoint"]) == (BUDGET_VERSION, "data/m.safetensors")
    assert read_budget(tmp_path) == budget


def test_a_path_outside_the_root_and_an_earlier_absolute_one_read_as_they_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    outside = tmp_path.parent / "elsewhere" / "m.safetensors"
    data = encode(CheckpointInfo(str(outside), False, 0, 1))
    assert data["path"] == str(outside)
    assert decode(CheckpointInfo, data, source="summary.json", version=LAYOUT_VERSION).path == str(outside)
    budget = dataclasses.replace(BUDGET, checkpoint=str(outside))
    (tmp_path / BUDGET_FILE).write_text(json.dumps({"budget": 1, **budget_as_earlier(budget)}))  # as version 1 wrote it
    assert read_budget(tmp_path) == budget


def test_a_scenario_file_s_paths_are_left_to_its_own_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a TOML scenario's spec resolves beside the scenario first (harness.scenario), so the codec leaves it as given
    monkeypatch.chdir(tmp_path)
    model = decode(ModelConfig, {"source": "spec", "spec": "pi05.json"}, source="s.toml", style=TABLE_STYLE,
                   optional=True)
    assert model.spec == Path("pi05.json")
    assert decode(ModelConfig, encode(model), source="plan.json").spec == tmp_path / "pi05.json"  # a record's


def test_the_committed_records_name_no_folder_of_the_machine_that_ran_them(tmp_path: Path) -> None:
    committed = committed_copy(["results"], tmp_path)
    records = sorted(committed.glob("results/*/*.json"))
    assert records, "no committed record"
    found = [f"{path.relative_to(committed)}: {text}" for path in records
             for text in _strings(json.loads(path.read_text(encoding="utf-8")))
             if os.path.isabs(text) or text.startswith("~") or HOME.search(text)]
    assert found == []

