"""The README's table of the compilers side by side quotes committed results: every cell must be what they say.

Each row names the results directories of its smoke run and its pi0.5-sized run; a cell is the
build-phase host peak of ``map`` or ``load`` with its excess over that run's floor, as the run's
own report prints them (:func:`harness.report.table.strategy_cells`), or, where the directory is
not committed, ``not run yet`` or ``cannot: <why>`` (a setting that cannot build that model).

The results are read as committed (``HEAD``, :func:`harness.tests.committed.committed_copy`), not as the
working tree holds them: a ``bench-*`` target rewrites ``results/``, and some figures take one of known
values from run to run (``load``'s build-phase peak on pi0.5, 50 MiB apart), so a rerun must not turn this
test red before it is committed. Once a rerun that moved a figure is committed, this test fails until the
README says what the results say.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from harness.backends import BACKENDS
from harness.fileio.files import read_json_file
from harness.report.table import strategy_cells
from harness.results.reading import load_results
from harness.results.record import SUMMARY, RunRecord
from harness.tests.committed import ROOT, committed_copy, committed_paths
from harness.tests.fixtures import make_results
from harness.units import MIB

README = ROOT / "README.md"
HEADER = "| engines built by | each engine holds | floor (host) |"
STRATEGIES = ("map", "load")
NOT_RUN = "not run yet"
CANNOT = "cannot: "


def _table() -> list[list[str]]:
    """The table's rows below its header and separator, each a list of its cells."""
    lines = README.read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(HEADER)]
    assert len(starts) == 1, f"README.md: expected one table starting {HEADER!r}, found {len(starts)}"
    rows = []
    for line in lines[starts[0] + 2:]:
        if not line.startswith("| "):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def _runs(row: list[str]) -> tuple[str, str]:
    """The results names a row quotes: its smoke run's and its pi0.5-sized run's."""
    smoke, pi05 = re.findall(r"`([a-z0-9_-]+)`", row[0].split(" (", 1)[1])
    return smoke, pi05


def _cell(directory: Path, strategy: str) -> str:
    if not directory.is_dir():
        return NOT_RUN
    cells = strategy_cells(load_results(directory))[strategy]
    return f"{cells['build-phase host peak']} ({cells['excess over floor (% of model)']})"


def expected_cells(row: list[str], results: Path) -> list[str]:
    """What the row's four figures should read from the results under ``results`` (a results root)."""
    smoke, pi05 = _runs(row)
    expected = [_cell(results / run, strategy) for run in (smoke, pi05) for strategy in STRATEGIES]
    return [cell if want == NOT_RUN and cell.startswith(CANNOT) else want
            for cell, want in zip(row[3:], expected, strict=True)]


def committed_results(names: list[str], into: Path, root: Path = ROOT) -> Path:
    """The results root holding ``results/<name>`` of each of ``names`` as committed (see the module)."""
    return committed_copy([f"results/{name}" for name in names], into, root) / "results"


ROWS = _table()


@pytest.fixture(scope="module")
def committed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    names = sorted({name for row in ROWS for name in _runs(row)})
    return committed_results(names, tmp_path_factory.mktemp("committed"))


def _row_name(backend: str, weights: str | None) -> str:
    """The row of a setting: the backend's title, with the weight setting where the backend builds several
    (``AOTInductor, `mapped```)."""
    spec = BACKENDS[backend]
    return f"{spec.title}, `{weights}`" if len(spec.weights) > 1 else spec.title


def registered_settings() -> set[str]:
    """The rows the table may have, from the backend registry: every setting of every backend that builds engines."""
    rows: set[str] = set()
    for name, spec in BACKENDS.items():
        if spec.factory is None:  # no builder in this version: nothing of it to measure
            continue
        rows.update(_row_name(name, weights) for weights in spec.weights or (None,))
    return rows


def measured_settings(results: Path) -> set[str]:
    """The rows the table must have: every setting that a run under ``results`` (a results root) measured, read from
    each ``summary.json``: its backend, and the weight setting each of its strategies built with."""
    rows: set[str] = set()
    for path in sorted(results.glob(f"*/{SUMMARY}")):
        record = RunRecord.from_json(read_json_file(path), str(path))
        weights: set[str | None] = {s.compiler_weights for s in record.strategies.values()} - {None}
        rows.update(_row_name(record.backend, w) for w in weights or {None})
    return rows


@pytest.fixture(scope="module")
def committed_settings(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    into = tmp_path_factory.mktemp("summaries")
    return measured_settings(committed_copy(committed_paths(f"results/*/{SUMMARY}"), into) / "results")


def test_the_table_names_every_setting_with_two_runs(committed_settings: set[str]) -> None:
    names = [row[0].split(" (")[0] for row in ROWS]
    assert len(names) == len(set(names)), names
    missing = committed_settings - set(names)
    assert not missing, f"README.md: the compilers' table has no row for {sorted(missing)}, measured in results/"
    unknown = set(names) - registered_settings()
    assert not unknown, f"README.md: the compilers' table names {sorted(unknown)}, which no registered backend builds"
    for row in ROWS:
        assert len(row) == 7, row
        assert len(re.findall(r"`([a-z0-9_-]+)`", row[0].split(" (", 1)[1])) == 2, row[0]


def test_the_settings_measured_are_read_from_each_record(tmp_path: Path) -> None:
    make_results(tmp_path / "results", name="copy-run")
    compiled = make_results(tmp_path / "results", name="compile-run", failed="load_file")
    summary = compiled / SUMMARY
    data = json.loads(summary.read_text())
    data["backend"] = "inductor"
    for name, strategy in data["strategies"].items():  # one that failed built nothing
        strategy.update(compiler="inductor", compiler_weights=None if name == "load_file" else "packaged")
    summary.write_text(json.dumps(data))
    assert measured_settings(tmp_path / "results") == {"copy", "AOTInductor, `packaged`"}


@pytest.mark.parametrize("row", ROWS, ids=[row[0].split(" (")[0] for row in ROWS])
def test_each_cell_is_what_the_committed_results_say(row: list[str], committed: Path) -> None:
    expected = expected_cells(row, committed)
    assert row[3:] == expected, f"README.md: the row {row[0]!r} should read {expected} (from the committed results/)"


def _git(repo: Path, *args: str) -> None:
    import subprocess

    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                   check=True, capture_output=True, timeout=60)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_rerun_not_yet_committed_leaves_the_check_on_the_committed_figures(tmp_path: Path) -> None:
    # a checkout whose committed smoke run is the real one; a rerun then draws load's other known build-phase peak
    repo = tmp_path / "checkout"
    shutil.copytree(ROOT / "results" / "smoke", repo / "results" / "smoke")
    _git(repo, "init", "-q")
    _git(repo, "add", "results")
    _git(repo, "commit", "-q", "-m", "smoke")
    row = ["copy (`smoke`, `pi05`)", "", "", "", "", NOT_RUN, NOT_RUN]
    before = expected_cells(row, committed_results(["smoke", "pi05"], tmp_path / "before", repo))
    summary = repo / "results" / "smoke" / SUMMARY
    data = json.loads(summary.read_text())
    data["strategies"]["load"]["build_peak_bytes"] += 50 * MIB
    summary.write_text(json.dumps(data, indent=1))
    assert expected_cells(row, repo / "results") != before  # the working tree's figure moved
    after = expected_cells(row, committed_results(["smoke", "pi05"], tmp_path / "after", repo))
    assert after == before and after[2:] == [NOT_RUN, NOT_RUN]  # pi05 was never committed there
