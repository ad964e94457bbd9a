"""Hostile and corrupt results directories: ``plot`` ends each in one line ``error: <file>: <key>: ...``.

Each case fabricates a results directory (:func:`~harness.tests.fixtures.make_results`, or a
copy of a committed budget sweep), breaks one thing in it, and runs ``python -m harness plot``
on it: the exit status is 2, stderr is one line naming the file and the key (or the CSV's row
and column) and what is wrong, and nothing is written, inside the results root or outside it.
Files that could block a reader (FIFOs) are tried in a child process with a timeout, so that a
reader that blocks fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.budget.record import BUDGET_FILE, read_budget
from harness.cli import main
from harness.fileio.files import JsonNestingError, load_bounded_json
from harness.results.record import MAX_ENGINES, SUMMARY
from harness.results.samples import events_file, samples_file
from harness.tests.fixtures import make_results
from harness.units import GIB
from harness.weightspec import NestingError, load_json_bounded

ROOT = Path(__file__).resolve().parents[2]
FIFO = "a named pipe (FIFO), not a regular file; expected a file the harness wrote"
COMMITTED_BUDGETS = sorted(p.parent for p in (ROOT / "results").glob(f"*/{BUDGET_FILE}"))


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (links as their target's path), by path relative to it."""
    return {str(p.relative_to(root)): (os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_symlink() or p.is_file()}


def plot_error(capsys: pytest.CaptureFixture[str], directory: Path) -> str:
    """``plot directory`` must exit 2 with one line ``error: ...`` and nothing else; returns the message."""
    assert main(["plot", str(directory)]) == 2
    out, err = capsys.readouterr()
    assert out == "", out
    assert err.endswith("\n") and len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err[len("error: "):].rstrip("\n")


def plot_in_child(directory: Path) -> subprocess.CompletedProcess[str]:
    """``python -m harness plot directory`` in a child process that may not take more than 120 s."""
    try:
        return subprocess.run([sys.executable, "-m", "harness", "plot", str(directory)], cwd=ROOT, text=True,
                              capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"plot {directory} blocked instead of refusing the file")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return make_results(tmp_path / "results", name="smoke")


def _edit_summary(directory: Path, change: Callable[[dict[str, Any]], object]) -> Path:
    summary = directory / SUMMARY
    data = json.loads(summary.read_text())
    change(data)
    summary.write_text(json.dumps(data))
    return summary


# 1. The name the outputs are written under


@pytest.mark.parametrize("name", ["../elsewhere/owned", "/{tmp}/absolute/owned", "Smoke", "a.b", ""])
def test_a_results_name_that_is_not_a_name_is_refused(tmp_path: Path, run_dir: Path,
                                                       capsys: pytest.CaptureFixture[str], name: str) -> None:
    name = name.format(tmp=str(tmp_path).strip("/"))
    summary = _edit_summary(run_dir, lambda d: d.update(name=name))
    before = _files(tmp_path)
    message = plot_error(capsys, run_dir)
    assert message.startswith(f"{summary}: name: expected letters a-z, digits, '_' or '-' only (it names the report "
                              f"and figures beside the results), got {json.dumps(name)[:40]}")
    assert _files(tmp_path) == before, "nothing may be written, inside the results root or outside it"
    assert not list(tmp_path.rglob("owned*"))


def test_a_strategy_name_that_is_a_path_is_refused(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = _edit_summary(run_dir, lambda d: d.update(
        strategies={("../../x" if k == "map" else k): v for k, v in d["strategies"].items()}))
    message = plot_error(capsys, run_dir)
    assert message.startswith(f"{summary}: strategies.../../x: expected letters a-z, digits, '_' or '-' only")


@pytest.mark.skipif(not COMMITTED_BUDGETS, reason="no committed budget sweep to start from")
def test_a_budget_record_whose_name_is_a_path_is_refused(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "results" / "sweep"
    shutil.copytree(COMMITTED_BUDGETS[0], directory)
    budget = directory / BUDGET_FILE
    data = json.loads(budget.read_text())
    data["name"] = "../../owned"
    budget.write_text(json.dumps(data))
    message = plot_error(capsys, directory)
    assert message.startswith(f"{budget}: name: expected letters a-z, digits, '_' or '-' only")
    assert not list(tmp_path.rglob("owned*"))
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["sweep"]


@pytest.mark.parametrize("directory", COMMITTED_BUDGETS, ids=lambda p: p.name)
def test_committed_budget_records_read(directory: Path) -> None:
    assert read_budget(directory).name == directory.name


@pytest.mark.skipif(not COMMITTED_BUDGETS, reason="no committed budget sweep to start from")
def test_a_budget_whose_unconstrained_run_took_no_time_is_reported_not_divided_by(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "results" / COMMITTED_BUDGETS[0].name
    shutil.copytree(COMMITTED_BUDGETS[0], directory)
    budget = directory / BUDGET_FILE
    data = json.loads(budget.read_text())
    for attempt in data["strategies"]["map"]["attempts"]:
        if attempt["phase"] == "unconstrained":
            attempt["compile_s"] = 0.0
    budget.write_text(json.dumps(data))
    assert main(["plot", str(directory)]) == 0, capsys.readouterr().err
    report = (directory.parent / f"{directory.name}.md").read_text()
    assert "are too short to compare with | cannot tell |" in report


# 2. Files that are not regular files


@pytest.mark.parametrize("which", [SUMMARY, samples_file("map"), events_file("load")])
def test_a_fifo_in_place_of_a_results_file_is_refused_without_blocking(run_dir: Path, which: str) -> None:
    path = run_dir / which
    path.unlink()
    os.mkfifo(path)
    done = plot_in_child(run_dir)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"error: {path}: {FIFO}\n"


def test_a_fifo_in_place_of_the_notes_is_refused_without_blocking(run_dir: Path) -> None:
    notes = run_dir.parent / "smoke.notes.md"
    os.mkfifo(notes)
    done = plot_in_child(run_dir)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"error: {notes}: {FIFO}\n"
    assert not (run_dir.parent / "smoke.md").exists()


def test_a_fifo_in_place_of_a_budget_record_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "results" / "sweep"
    directory.mkdir(parents=True)
    os.mkfifo(directory / BUDGET_FILE)
    done = plot_in_child(directory)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: {directory / BUDGET_FILE}: a named pipe (FIFO), not a regular file")


def test_a_directory_in_place_of_a_results_file_is_refused(run_dir: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    samples = run_dir / samples_file("map")
    samples.unlink()
    samples.mkdir()
    assert plot_error(capsys, run_dir).startswith(f"{samples}: a directory, not a regular file")


def test_a_link_to_a_device_in_place_of_a_results_file_is_refused_without_reading_it(run_dir: Path) -> None:
    samples = run_dir / samples_file("map")
    samples.unlink()
    samples.symlink_to("/dev/zero")
    done = plot_in_child(run_dir)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: {samples}: a character device, not a regular file")


# 3. Numbers a record cannot hold or cannot mean


def _set(path: tuple[str | int, ...], value: object) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        for key in path[:-1]:
            data = data[key]  # type: ignore[index]
        data[path[-1]] = value  # type: ignore[index]

    return change


HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "a 400-digit byte count": (_set(("model", "bytes"), 10**400),
                               "model.bytes: an integer of 401 digits is out of range"),
    "a negative byte count": (_set(("strategies", "map", "host_peak_bytes"), -5 * GIB),
                              "strategies.map.host_peak_bytes: expected a value of at least 0, got -5368709120"),
    "a negative engine weight": (_set(("strategies", "load", "engines", 1, "weight_bytes"), -1),
                                 "strategies.load.engines[1].weight_bytes: expected a value of at least 0, got -1"),
    "a model of 0 bytes": (_set(("model", "bytes"), 0), "model.bytes: a model of 0 bytes"),
    "a model of 2**200 bytes": (_set(("model", "bytes"), 2**200),
                                "model.bytes: an integer of 61 digits is out of range"),
    "a model of 2**60 bytes": (_set(("model", "bytes"), 2**60),
                               "model.bytes: 1152921504606846976 bytes is out of range"),
    "10**12 engines": (_set(("engines",), 10**12), f"engines: expected 1 to {MAX_ENGINES} engines, got 1000000000000"),
    "no engines": (_set(("engines",), 0), f"engines: expected 1 to {MAX_ENGINES} engines, got 0"),
    "an engine beyond the run's": (_set(("strategies", "map", "engines", 0, "index"), 4),
                                   "strategies.map.engines[0].index: engine 4 of a run of 4 engines"),
    "a negative time": (_set(("strategies", "map", "wall_s"), -1.0),
                        "strategies.map.wall_s: expected a value of at least 0, got -1.0"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_number_a_record_cannot_mean_is_refused(run_dir: Path, capsys: pytest.CaptureFixture[str],
                                                  case: str) -> None:
    change, problem = HOSTILE[case]
    summary = _edit_summary(run_dir, change)
    before = _files(run_dir.parent)
    assert plot_error(capsys, run_dir).startswith(f"{summary}: {problem}")
    assert _files(run_dir.parent) == before


def test_an_integer_past_pythons_digit_limit_names_its_key(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = run_dir / SUMMARY
    text = summary.read_text()
    assert '"engines": 4' in text
    summary.write_text(text.replace('"engines": 4', '"engines": ' + "9" * 5000, 1))
    assert plot_error(capsys, run_dir) == (f"{summary}: engines: an integer of 5000 digits is out of range "
                                           "(at most 2**63 - 1 in size)")


@pytest.mark.parametrize("depth", [200_000, 65])
def test_deeply_nested_json_is_refused_before_it_is_parsed(run_dir: Path, capsys: pytest.CaptureFixture[str],
                                                           depth: int) -> None:
    summary = run_dir / SUMMARY
    summary.write_text('{"a": ' + "[" * depth + "]" * depth + "}")
    assert plot_error(capsys, run_dir) == f"{summary}: not a record: nested deeper than 64 levels (line 1)"


def test_one_bounded_json_reader_serves_results_and_weight_specs() -> None:
    text = '{"s": "[[[\\"[[",\n "a": ' + "[" * 20 + "]" * 20 + "}"  # brackets in a string do not count
    assert load_bounded_json(text, limit=21)["s"] == '[[[\"[['
    with pytest.raises(JsonNestingError) as caught:
        load_bounded_json(text, limit=16)
    assert (caught.value.depth, caught.value.limit, caught.value.line) == (21, 16, 2)
    with pytest.raises(NestingError, match="^arrays and objects nest 21 levels deep; at most 16$"):
        load_json_bounded(text)  # the weight spec's reader, with its own limit and wording


def test_nesting_inside_strings_does_not_count(run_dir: Path) -> None:
    summary = _edit_summary(run_dir, lambda d: d.update(description='"[[[' * 100 + "\\" * 3))
    assert main(["plot", str(run_dir)]) == 0
    assert "[[[" in (summary.parent.parent / "smoke.md").read_text()


def test_nan_in_a_summary_is_refused(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = run_dir / SUMMARY
    summary.write_text(summary.read_text().replace('"mean_interval_ms": 10.2', '"mean_interval_ms": NaN', 1))
    message = plot_error(capsys, run_dir)
    assert message == f"{summary}: strategies.map.mean_interval_ms: expected a number or null, got NaN"


# 3. CSVs: every row whole, every measurement finite


def _rewrite_line(path: Path, line: int, edit: Callable[[list[str]], list[str]]) -> None:
    """Rewrite the CSV line ``line`` (1: the header) of ``path`` through ``edit`` of its cells."""
    lines = path.read_text().splitlines(keepends=True)
    ending = lines[line - 1][len(lines[line - 1].rstrip("\r\n")):]
    lines[line - 1] = ",".join(edit(lines[line - 1].rstrip("\r\n").split(","))) + ending
    path.write_text("".join(lines))


def test_a_csv_cut_short_mid_row_is_refused(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = run_dir / samples_file("map")
    data = samples.read_bytes()
    rows = data.count(b"\n")
    samples.write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 30])  # into the last row's fourth number
    assert plot_error(capsys, run_dir) == f"{samples}: row {rows}: the file ends inside a row (it was cut short)"


def test_a_short_row_is_refused(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = run_dir / events_file("map")
    _rewrite_line(events, 3, lambda cells: cells[:4])
    assert plot_error(capsys, run_dir) == f"{events}: row 3: expected 8 fields, got 4 (a short or cut row)"


@pytest.mark.parametrize(("column", "value", "problem"), [
    (1, "nan", "not a finite number ('nan')"),
    (1, "inf", "not a finite number ('inf')"),
    (2, "-Infinity", "not a finite number ('-Infinity')"),
    (0, "NaN", "not a finite number ('NaN')"),
    (0, "", "missing ('')"),
    (3, "-4096", "expected at least 0 ('-4096')"),
    (4, "1e300", "out of range (less than 2**53 expected) ('1e300')"),
    (7, "-2", "expected at least -1 ('-2')"),
])
def test_a_sample_that_is_not_a_finite_measurement_is_refused(run_dir: Path, capsys: pytest.CaptureFixture[str],
                                                              column: int, value: str, problem: str) -> None:
    samples = run_dir / samples_file("map")
    header = samples.read_text().splitlines()[0].split(",")
    _rewrite_line(samples, 40, lambda cells: [value if i == column else c for i, c in enumerate(cells)])
    assert plot_error(capsys, run_dir) == f"{samples}: row 40, column {header[column]}: {problem}"


def test_the_committed_style_of_csv_still_reads(run_dir: Path) -> None:
    """Cells left empty (no GPU, no engine, no phase yet) are missing values, not errors."""
    samples = run_dir / samples_file("map")
    _rewrite_line(samples, 2, lambda cells: [*cells[:5], "", "", "-1", ""])
    assert main(["plot", str(run_dir)]) == 0
