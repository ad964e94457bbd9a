"""A :class:`~harness.scenario.Scenario` written back as a scenario file that
:func:`~harness.scenario.load_scenario` reads to the same scenario (``path`` aside).

``python -m harness run --model ...`` builds its scenario from flags; it publishes it with the results as
``scenario.toml`` (:data:`SCENARIO_FILE`), so that ``python -m harness run results/<name>/scenario.toml`` reruns it
as it is. Every setting is written, defaults included, except those a file leaves out to mean them (``None``), and
those its source or backend does not take (the loader refuses them). Paths are relative to the repository root where
inside it, else absolute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomlkit

from harness.fileio.atomic import write_atomic
from harness.scenario import Scenario

__all__ = ["SCENARIO_FILE", "scenario_toml", "write_scenario_file"]

SCENARIO_FILE = "scenario.toml"
"""The name of the scenario a command-line run publishes beside its results."""

_COMPILER_ONLY = ("weights", "tokens")
"""Build settings the loader refuses for a backend that is no compiler."""


def _present(table: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in table.items() if v is not None}


def scenario_toml(scenario: Scenario) -> str:
    """``scenario`` as the text of a scenario file (see the module docstring)."""
    data = scenario.to_dict()
    model = {k: v for k, v in data["model"].items() if k != "key"}
    build = _present(data["build"])
    if not scenario.build.compiler:
        build = {k: v for k, v in build.items() if k not in _COMPILER_ONLY}
    document = {
        "name": data["name"],
        "description": data["description"],
        "strategies": data["strategies"],
        "model": _present(model),
        "checkpoint": _present(data["checkpoint"]),
        "build": build,
        "run": _present(data["run"]),
    }
    if data["references"]:
        document["reference"] = [_present(r) for r in data["references"]]
    return tomlkit.dumps(document)


def write_scenario_file(scenario: Scenario, directory: Path) -> Path:
    """Write :func:`scenario_toml` of ``scenario`` as ``directory/scenario.toml``; returns the path."""
    return write_atomic(directory / SCENARIO_FILE, scenario_toml(scenario))
