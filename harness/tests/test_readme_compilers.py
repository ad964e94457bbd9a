"""The README's table of the compilers side by side quotes committed results: every cell must be what they say.

Each row names the results directories of its smoke run and its pi0.5-sized run; a cell is the
build-phase host peak of ``map`` or ``load`` with its excess over that run's floor, as the run's
own report prints them (:func:`harness.report.table.strategy_cells`), or, where the directory is
not committed, ``not run yet`` or ``cannot: <why>`` (a setting that cannot build that model). A
rerun that moves a figure fails this test until the README says what the results say.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.report.table import strategy_cells
from harness.results.reading import load_results

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RESULTS = ROOT / "results"
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


def _cell(directory: Path, strategy: str) -> str:
    if not directory.is_dir():
        return NOT_RUN
    cells = strategy_cells(load_results(directory))[strategy]
    return f"{cells['build-phase host peak']} ({cells['excess over floor (% of model)']})"


ROWS = _table()


def test_the_table_names_every_setting_with_two_runs() -> None:
    names = [row[0] for row in ROWS]
    assert [n.split(" (")[0] for n in names] == ["copy", "AOTInductor, `mapped`", "AOTInductor, `packaged`",
                                                 "AOTInductor, `packaged_compiler`", "OpenVINO",
                                                 "IREE, `mapped`", "IREE, `packaged_compiler`"]
    for row in ROWS:
        assert len(row) == 7, row
        assert len(re.findall(r"`([a-z0-9_-]+)`", row[0].split(" (", 1)[1])) == 2, row[0]


@pytest.mark.parametrize("row", ROWS, ids=[row[0].split(" (")[0] for row in ROWS])
def test_each_cell_is_what_the_committed_results_say(row: list[str]) -> None:
    smoke, pi05 = re.findall(r"`([a-z0-9_-]+)`", row[0].split(" (", 1)[1])
    expected = [_cell(RESULTS / run, strategy) for run in (smoke, pi05) for strategy in STRATEGIES]
    expected = [cell if want == NOT_RUN and cell.startswith(CANNOT) else want
                for cell, want in zip(row[3:], expected, strict=True)]
    assert row[3:] == expected, f"README.md: the row {row[0]!r} should read {expected} (from results/)"
