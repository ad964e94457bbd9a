"""What reads scenarios, results and reports imports no torch; the harness's modules lie in layers (:data:`LAYERS`)
that no import goes up, with no cycle; the README and :mod:`harness` list the same layers.

Each module is imported in a fresh interpreter (a test process has torch loaded already), with
the repository root on the path, and ``torch`` must not be in ``sys.modules`` afterwards.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.tests.fixtures import make_results

ROOT = Path(__file__).resolve().parents[2]

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "units", "catalog", "backends", "stopping"),
    ("fileio",),
    ("results",),
    ("measure", "progress"),
    ("scenario", "scenario_rules", "scenario_cluster", "scenario_file", "cli_scenario", "weightspec"),
    ("models", "load"),
    ("engines",),
    ("checkpoint_reading", "plan"),
    ("worker", "watch", "reference", "rounds", "run_record", "round_run", "run"),
    ("budget", "predict", "cluster"),
    ("report",),
    ("cli", "schema", "bench_map", "__main__"),
)
"""The modules and packages of ``harness/`` in layers, from the bottom up: each imports only from its own layer
or those below it. The README's layer list and :mod:`harness`'s docstring name the same layers in this order."""

TORCH_FREE = (
    "harness.catalog",
    "harness.backends",
    "harness.scenario",
    "harness.scenario_rules",
    "harness.weightspec",
    "harness.fileio",
    "harness.fileio.atomic",
    "harness.fileio.codec",
    "harness.fileio.files",
    "harness.fileio.paths",
    "harness.results.record",
    "harness.results.samples",
    "harness.results.disk",
    "harness.results.metrics",
    "harness.results.reading",
    "harness.results.checkpoint_reading",
    "harness.results.spread",
    "harness.results.comparison",
    "harness.results.publish",
    "harness.report",
    "harness.report.budget",
    "harness.report.comparison",
    "harness.stopping",
    "harness.cli",
    "harness.cli_scenario",
    "harness.scenario_file",
    "harness.schema",
)


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_without_torch(module: str) -> None:
    done = _python(f"import sys, {module}; print('torch' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", f"import {module} imports torch"


def test_plot_runs_without_torch(tmp_path: Path) -> None:
    directory = make_results(tmp_path / "results", name="tiny")
    code = ("import sys; from harness.cli import main; code = main(['plot', sys.argv[1]]); "
            "print('torch' in sys.modules); sys.exit(code)")
    done = _python(code, str(directory))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False", "python -m harness plot imports torch"
    assert (tmp_path / "results" / "tiny.md").is_file()


def _imports(path: Path) -> set[str]:
    """The harness modules ``path`` imports, at its top level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {name for name in found if name.split(".")[0] == "harness"}


def _graph() -> dict[str, set[str]]:
    modules = {}
    for path in (ROOT / "harness").rglob("*.py"):
        if "tests" in path.relative_to(ROOT).parts:
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def test_no_import_cycle_between_harness_modules() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                package_edge = name.startswith(dep + ".")  # a submodule importing its own package's __init__
                if not package_edge:
                    cycle = stack[stack.index(dep):] + [dep]
                    raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_nothing_below_the_command_line_imports_the_report() -> None:
    graph = _graph()
    importers = sorted(name for name, deps in graph.items()
                       if any(d == "harness.report" or d.startswith("harness.report.") for d in deps)
                       and not name.startswith("harness.report") and name != "harness.cli")
    assert importers == [], f"modules that call up into harness.report: {importers}"


def _unit(module: str) -> str:
    """The module or package directly under ``harness`` that ``module`` belongs to (``harness.fileio.codec``:
    ``results``)."""
    return module.split(".")[1]


def _layer_of() -> dict[str, int]:
    return {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def test_every_module_lies_in_one_layer() -> None:
    listed = [unit for layer in LAYERS for unit in layer]
    assert len(listed) == len(set(listed)), f"named in two layers: {sorted({u for u in listed if listed.count(u) > 1})}"
    units = {_unit(name) for name in _graph() if name != "harness"}
    assert units - set(listed) == set(), f"modules in no layer of LAYERS: {sorted(units - set(listed))}"
    assert set(listed) - units == set(), f"LAYERS names what harness/ does not hold: {sorted(set(listed) - units)}"


def test_no_import_goes_up_a_layer() -> None:
    layer = _layer_of()
    up = sorted(f"{name} (layer {layer[_unit(name)] + 1}, {_unit(name)}) imports {dep} (layer {layer[_unit(dep)] + 1}, "
                f"{_unit(dep)})"
                for name, deps in _graph().items() if name != "harness"
                for dep in deps if dep != "harness" and layer[_unit(dep)] > layer[_unit(name)])
    assert up == [], "imports that go up a layer of LAYERS:\n" + "\n".join(up)


def _names(text: str) -> tuple[str, ...]:
    """The modules and packages a layer's entry names, in order: ``catalog.py`` and ``measure/`` as ``catalog`` and
    ``measure``."""
    return tuple(re.sub(r"(\.py|/)$", "", name) for name in re.findall(r"`([\w.]+(?:\.py|/))`", text))


def readme_layers(readme: str) -> list[tuple[str, ...]]:
    """The layers the README's list names: one bullet per layer, its modules before the first colon."""
    start = readme.index("The folders and modules of `harness/`, in layers from the bottom up")
    end = readme.index("A scenario goes one way", start)
    return [_names(line[2:].split(":", 1)[0]) for line in readme[start:end].splitlines() if line.startswith("- ")]


def docstring_layers(docstring: str) -> list[tuple[str, ...]]:
    """The layers :mod:`harness`'s docstring names: one unindented line of names per layer."""
    start = docstring.index("in layers from the bottom up")
    return [tuple(re.findall(r"``([\w]+)``", line)) for line in docstring[start:].splitlines()
            if line.startswith("``")]


def test_the_readme_lists_the_layers() -> None:
    assert readme_layers((ROOT / "README.md").read_text(encoding="utf-8")) == list(LAYERS)


def test_the_package_docstring_lists_the_layers() -> None:
    import harness

    assert docstring_layers(harness.__doc__ or "") == list(LAYERS)
