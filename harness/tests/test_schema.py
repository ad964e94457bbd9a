"""``python -m harness schema``: the scenario keys and the layout history read from the fields, and the docstrings
of :mod:`harness.scenario` and :mod:`harness.results.record` checked against them."""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import harness.results.layouts as layouts
import harness.scenario as scenario
from harness.backends import BACKENDS
from harness.budget.record import StrategyBudget
from harness.cli import main
from harness.fileio.codec import decode, field_since
from harness.results.reading import load_results
from harness.results.record import LAYOUT_VERSION, RecordError, RunRecord
from harness.schema import (
    LOADER_DEFAULTS,
    at_layout,
    layout_history,
    record_keys,
    scenario_keys,
    scenario_schema,
    toml_text,
)

ROOT = Path(__file__).resolve().parents[2]


def _schema_block(docstring: str) -> list[str]:
    """The literal block of ``docstring``'s Schema section less the lines indented under a key (what it means)."""
    start = docstring.index("\n\n", docstring.index("\nSchema: ")) + 2
    lines = docstring[start:].splitlines()
    block = lines[:next((i for i, line in enumerate(lines) if line and not line.startswith("    ")), len(lines))]
    return [line[4:] for line in block if line and not re.match(r" {8}\S", line)]


def test_the_scenario_docstring_quotes_the_listing_of_its_keys() -> None:
    # every line as listed, a registry's choices named by the registry (they change with what is registered)
    quoted, listed = _schema_block(scenario.__doc__ or ""), scenario_schema(registered=False).splitlines()
    differ = difflib.unified_diff(quoted, listed, "harness/scenario.py", "python -m harness schema scenario",
                                  lineterm="", n=0)
    assert quoted == listed, ("harness/scenario.py's Schema block differs from the listing; copy its lines in "
                              "(indented by 4, each key's meaning indented by 8 under it):\n" + "\n".join(differ))


_REGISTERED = """
import json
from harness.backends import BACKENDS, BackendSpec

# registered before the scenario reads the registry
BACKENDS["registered_here"] = BackendSpec("registered_here", "Registered here", None, ())

import harness.scenario as scenario
from harness.schema import scenario_schema
from harness.tests.test_schema import _schema_block

print(json.dumps({"quoted": _schema_block(scenario.__doc__ or "") == scenario_schema(registered=False).splitlines(),
                  "listed": " ".join(scenario_schema().split())}))
"""


def test_a_backend_registered_is_listed_by_the_command_and_needs_no_docstring_edit() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _REGISTERED], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["quoted"], "registering a backend made harness/scenario.py's Schema block differ from the listing"
    choices = " | ".join(f'"{name}"' for name in (*BACKENDS, "registered_here"))  # every one, the new one last
    assert f'build.backend {choices} ["copy"]' in seen["listed"], seen["listed"]


def test_the_listing_names_every_key_the_loader_reads_and_its_default(tmp_path: Path) -> None:
    file = tmp_path / "s.toml"
    file.write_text('name = "s"\n[model]\nlayers = 1\nwidth = 16\nvocab = 8\n[build]\nengines = 1\n'
                    '[[reference]]\nlabel = "elsewhere"\n', encoding="utf-8")
    loaded = scenario.load_scenario(file)
    given = {"name", "model.layers", "model.width", "model.vocab", "build.engines", "reference.label"}
    values = {k: getattr(loaded, k) for k in scenario.TOP_KEYS}
    for table, cls in scenario.TABLES.items():
        obj = loaded.references[0] if table == "reference" else getattr(loaded, table)
        values.update({f"{table}.{f.name}": getattr(obj, f.name) for f in dataclasses.fields(cls)})
    keys = {k.key: k.default for k in scenario_keys()}
    assert set(keys) == set(values)
    for key, default in keys.items():
        if key in LOADER_DEFAULTS:
            cls = scenario.TABLES[key.split(".")[0]]
            field = next(f for f in dataclasses.fields(cls) if f.name == key.split(".")[1])
            assert field.default is dataclasses.MISSING or values[key] != field.default, \
                f"{key}: the loader reads its field's default; list it as such"
        elif key not in given:
            assert toml_text(values[key]) == default, key
    assert toml_text(values["checkpoint.path"]) == f'"{scenario.default_checkpoint_for(loaded.model)}"'
    assert values["checkpoint.generate"] is True


def _entries(docstring: str) -> dict[int, str]:
    """The numbered entries of the versions list of :mod:`harness.results.layouts`' docstring, by number."""
    start = docstring.index("\n1. ")
    end = docstring.index("\nA later version adds keys")
    parts = re.split(r"^(\d+)\. ", docstring[start:end], flags=re.M)
    return {int(number): text for number, text in zip(parts[1::2], parts[2::2], strict=True)}


def _leaf(path: str) -> str:
    """The key's own name: ``strategies.*.engines[].compile_s``: ``compile_s``."""
    return re.sub(r"\[\]$", "", path.rsplit(".", 1)[-1])


def test_the_record_docstring_has_one_entry_per_layout() -> None:
    assert list(_entries(layouts.__doc__ or "")) == list(range(1, LAYOUT_VERSION + 1))


@pytest.mark.parametrize("version", range(2, LAYOUT_VERSION + 1))
def test_each_layout_entry_names_the_keys_its_version_added_and_none_a_later_one_did(version: int) -> None:
    text = _entries(layouts.__doc__ or "")[version]
    named = {word for quoted in re.findall(r"``([\w.]+)``", text) for word in quoted.split(".")}
    keys = list(record_keys())
    added = [k.path for k in keys if k.since == version and k.field.metadata.get("since") == version]
    required = [k.path for k in keys if k.absent_until and k.absent_until == version - 1]
    dropped = [k.path for k in keys if k.until == version - 1]
    missing = [path for path in added + dropped if _leaf(path) not in named]
    missing += [path for path in required if not {_leaf(path), _leaf(path.rsplit(".", 1)[0])} & named]
    assert missing == [], f"layout {version}'s entry does not name {missing}"
    first: dict[str, int] = {}
    for k in [*keys, *record_keys(StrategyBudget)]:  # a budget attempt's keys are versioned by the layout too
        first[_leaf(k.path)] = min(first.get(_leaf(k.path), k.since), k.since)
    later = sorted(name for name in named if first.get(name, 1) > version)
    assert later == [], f"layout {version}'s entry names keys of later layouts: {later}"
    for earlier in re.findall(r"versions 1 to (\d+)", text):
        assert int(earlier) == version - 1, f"layout {version}'s entry speaks of versions 1 to {earlier}"


def test_the_history_lists_each_layout_and_the_keys_it_added() -> None:
    history = layout_history()
    assert [int(v) for v in re.findall(r"^Layout (\d+)", history, flags=re.M)] == list(range(1, LAYOUT_VERSION + 1))
    assert "Layout 15 adds: disk_read_error\n" in history
    assert "Layout 9 adds: round_orders\n" in history
    assert ("Layout 18 adds no key.\n    and drops, holding each value once elsewhere: sample_interval_ms, "
            "prefetch\n") in history
    assert re.search(r"Layout 12 adds: read_ceiling_error, shared_disk_error\n.*always writes.*: speed\.probe_error",
                     history)
    assert "strategies.*.engines[].convert_s" in history.split("Layout 14")[1].split("Layout 15")[0]


def test_python_m_harness_schema_prints_both_listings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    both = capsys.readouterr().out
    assert scenario_schema() in both and layout_history() in both
    assert both.index(scenario_schema()) < both.index(layout_history())
    assert main(["schema", "layouts"]) == 0
    assert scenario_schema() not in capsys.readouterr().out


@pytest.mark.parametrize("version", range(1, LAYOUT_VERSION + 1))
def test_a_record_as_each_layout_wrote_it_reads_at_that_layout(version: int) -> None:
    directory = Path(__file__).resolve().parents[2] / "results" / "smoke-openvino"
    data = json.loads(json.dumps(load_results(directory).record.to_json()))  # written at this layout: every key
    assert data["layout"] == LAYOUT_VERSION
    older = at_layout(RunRecord, data, version)
    assert ("layout" in older) == (version >= 2)
    run = decode(RunRecord, older, source="summary.json", version=version)
    assert run.disk_read_error is None and (version >= 14 or all(
        e.convert_s is None for s in run.strategies.values() for e in s.engines))
    current = decode(RunRecord, data, source="summary.json", version=LAYOUT_VERSION)
    assert run.sample_interval_ms == current.sample_interval_ms  # held once, read alike at every layout
    assert run.prefetch == (current.prefetch if version >= field_since(RunRecord, "prefetch") else None)
    later = any(k.since > version for k in record_keys())  # a later layout's keys are unknown at this one
    dropped = any(k.until is not None and k.until >= version for k in record_keys())  # and those it dropped missing
    if later or dropped:
        with pytest.raises(RecordError, match="|".join(["unknown key"] * later + ["missing key"] * dropped)):
            decode(RunRecord, data, source="summary.json", version=version)
    else:  # no layout since this one added a key (a later one changed how values are written): it reads alike
        current = decode(RunRecord, data, source="summary.json", version=LAYOUT_VERSION)
        assert decode(RunRecord, data, source="summary.json", version=version) == current.replace(layout=version)
