"""Putting results in place: a full disk, a killed run and links never cost the earlier results.

The full-disk cases run on a real file system that fills up: a small tmpfs mounted for the test
(removed after it). Where mounting is not allowed, the same cases run with the write that the
full file system would refuse made to fail with ``ENOSPC`` instead. Strategies are stand-in
processes (a worker that cannot write, one killed by a signal, one that hands in a fabricated
result); one test runs the real worker against the full file system.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import harness.worker
from harness.cli import main
from harness.engines.copy import CopyToFiles
from harness.plan import make_plan, write_plan
from harness.report import render_all
from harness.results.reading import load_results
from harness.results.record import SUMMARY, StrategyRecord, read_strategy_file
from harness.scenario import load_scenario
from harness.tests.fixtures import make_results
from harness.tests.tiny_scenario import tiny_scenario_text
from harness.units import KIB
from harness.worker import OUTSIDE_STATUS

ROOT = Path(__file__).resolve().parents[2]



@dataclass
class SmallFs:
    """A directory on a small file system of its own (``mounted``), or on the test's (not mounted)."""

    path: Path
    mounted: bool

    def fill(self, leave: int) -> None:
        """Take all but about ``leave`` bytes of the file system's free space (only when mounted)."""
        if not self.mounted:
            return
        stat = os.statvfs(self.path)
        take = stat.f_bavail * stat.f_frsize - leave
        with contextlib.suppress(OSError), open(self.path / "filler", "ab") as handle:
            handle.write(b"\0" * max(0, take))


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[SmallFs]:
    """A 16 MiB tmpfs at ``tmp_path / "fs"``, unmounted after the test; the plain directory where mount fails."""
    path = tmp_path / "fs"
    path.mkdir()
    mounted = os.geteuid() == 0 and shutil.which("mount") is not None and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(path)], capture_output=True).returncode == 0
    try:
        yield SmallFs(path, mounted)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=True)


def no_space_for(monkeypatch: pytest.MonkeyPatch, fs: SmallFs, refused: Callable[[str], bool]) -> None:
    """Where ``fs`` is not a real small file system: fail the harness's writes whose temporary name
    ``refused`` picks with ``ENOSPC``, as a full one would."""
    if fs.mounted:
        return
    real = tempfile.mkstemp

    def mkstemp(*args: object, **kwargs: object) -> tuple[int, str]:
        if refused(str(kwargs.get("prefix", ""))):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr("harness.fileio.atomic.tempfile.mkstemp", mkstemp)


def snapshot(root: Path, skip: str = "\0") -> dict[str, bytes]:
    """Every file and link under ``root`` (a link as its target), except under names starting with ``skip``."""
    return {str(p.relative_to(root)): (os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
            for p in sorted(root.rglob("*")) if (p.is_symlink() or p.is_file())
            and not str(p.relative_to(root)).startswith(skip)}


def scenario(tmp_path: Path, *strategies: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(tiny_scenario_text(tmp_path / "c.safetensors", {
        'strategies = ["map"]': "strategies = [" + ", ".join(f'"{s}"' for s in strategies) + "]",
        "engines = 2": "engines = 4",
    }))
    return path


def stand_in(monkeypatch: pytest.MonkeyPatch, code: str, *extra: str) -> None:
    """Every strategy's process runs ``code`` with ``sys.argv[1:]`` = out directory, strategy, ``extra``."""
    def command(plan: Path, strategy: str, out: Path) -> list[str]:
        return [sys.executable, "-c", textwrap.dedent(code), str(out), strategy, *extra]

    monkeypatch.setattr("harness.run.worker_command", command)


def run_ending_in_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the command line; it must exit 2 and end with one line ``error: ...`` of its own; returns it.

    Before it come progress lines and the stand-in workers' own one-line reports.
    """
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert err.endswith("\n") and lines[-1].startswith("error: "), err
    assert "Traceback" not in err, err
    assert all(line.startswith(("[harness] ", "generating ", "error: harness worker failed: "))
               for line in lines[:-1] if line.strip()), err
    return lines[-1][len("error: "):]


def earlier_results(results: Path) -> Path:
    """Good results of ``tiny`` with their report and figures, as an earlier run left them."""
    directory = make_results(results, name="tiny", failed=None, strategies=("map", "load"), references=False)
    render_all(directory)
    return directory


# A full disk


CANNOT_WRITE = """
import errno, os, sys, tempfile
from pathlib import Path
from harness.fileio.atomic import write_atomic
from harness.worker import FAILURE_PREFIX
out, strategy, full = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
if not full:  # no small file system to fill: its write fails as a full one's would
    def mkstemp(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    tempfile.mkstemp = mkstemp
try:
    write_atomic(out / f"samples-{strategy}.csv", b"0" * 4_000_000)
except Exception as exc:
    print("error: " + FAILURE_PREFIX + f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(1)
"""


def test_a_run_whose_strategies_all_ran_out_of_space_keeps_the_earlier_results(
    tmp_path: Path, small_fs: SmallFs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = small_fs.path / "results"
    earlier_results(results)
    before = snapshot(results)
    small_fs.fill(leave=512 * KIB)  # the parent's plan and summary fit; a strategy's samples do not
    stand_in(monkeypatch, CANNOT_WRITE, str(int(small_fs.mounted)))
    message = run_ending_in_error(capsys, "run", str(scenario(tmp_path, "map", "load")), "--results", str(results))
    staging = results / ".tiny.partial"
    assert message == (f"{results / 'tiny'}: kept as it was, this run is not published: map failed for a reason "
                       f"outside the strategy (OutputError: {staging / 'samples-map.csv'}: cannot write (No space left "
                       "on device); any earlier file there is unchanged)")
    assert snapshot(results) == before, "the earlier results, report and figures stay"
    assert not os.path.lexists(staging), "nothing finished: the staging directory goes"


def test_a_strategy_that_ran_out_of_space_keeps_its_earlier_result_whatever_the_others_did(
    tmp_path: Path, small_fs: SmallFs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk is full only while map's process runs: load finishes, map cannot write. map's earlier samples,
    events and record stay, and nothing of this run is published over them."""
    results = small_fs.path / "results"
    earlier_results(results)
    before = snapshot(results)
    source = make_results(tmp_path / "source", name="tiny", failed=None, strategies=("map", "load"))

    def command(plan: Path, strategy: str, out: Path) -> list[str]:
        if strategy == "load":
            return [sys.executable, "-c", textwrap.dedent(HANDS_IN_A_RESULT), str(out), strategy, str(source),
                    str(small_fs.path), "-1"]
        small_fs.fill(leave=512 * KIB)  # full while map runs
        return [sys.executable, "-c", textwrap.dedent(CANNOT_WRITE), str(out), strategy, str(int(small_fs.mounted))]

    monkeypatch.setattr("harness.run.worker_command", command)
    message = run_ending_in_error(capsys, "run", str(scenario(tmp_path, "load", "map")), "--results", str(results))
    staging = results / ".tiny.partial"
    assert message == (f"{results / 'tiny'}: kept as it was, this run is not published: map failed for a reason "
                       f"outside the strategy (OutputError: {staging / 'samples-map.csv'}: cannot write (No space left "
                       f"on device); any earlier file there is unchanged); kept {staging} until the next run, for its "
                       "finished strategies load")
    assert snapshot(results, skip=".tiny.partial") == before, "map's earlier samples, events and record stay"
    assert (staging / "strategy-load.json").is_file()


def test_a_run_whose_strategy_was_killed_by_a_signal_it_did_not_cause_keeps_the_earlier_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    earlier_results(results)
    before = snapshot(results)
    stand_in(monkeypatch, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    message = run_ending_in_error(capsys, "run", str(scenario(tmp_path, "map", "load")), "--results", str(results))
    assert message == (f"{results / 'tiny'}: kept as it was, this run is not published: map failed for a reason "
                       "outside the strategy (killed by signal 9)")
    assert snapshot(results) == before, "nothing finished: the staging directory goes"


RECORDS_AN_OUTSIDE_FAILURE = """
import sys
from pathlib import Path
from harness.results.record import StrategyRecord, write_strategy_file
from harness.worker import OUTSIDE_STATUS
error = "FileNotFoundError: [Errno 2] No such file or directory: 'engines/tiny-map/engine-001.safetensors'"
write_strategy_file(Path(sys.argv[1]), sys.argv[2], StrategyRecord(status="failed", error=error))
sys.exit(OUTSIDE_STATUS)
"""


def test_a_strategy_whose_recorded_failure_was_the_machines_keeps_the_earlier_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    earlier_results(results)
    before = snapshot(results)
    stand_in(monkeypatch, RECORDS_AN_OUTSIDE_FAILURE)
    message = run_ending_in_error(capsys, "run", str(scenario(tmp_path, "map")), "--results", str(results))
    assert message == (f"{results / 'tiny'}: kept as it was, this run is not published: map failed for a reason "
                       "outside the strategy (FileNotFoundError: [Errno 2] No such file or directory: "
                       "'engines/tiny-map/engine-001.safetensors')")
    assert snapshot(results) == before


def test_a_strategy_that_crashes_is_a_result_and_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    earlier_results(results)
    stand_in(monkeypatch, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert main(["run", str(scenario(tmp_path, "map")), "--results", str(results)]) == 1
    record = json.loads((results / "tiny" / SUMMARY).read_text())
    assert record["strategies"]["map"]["error"] == "killed by signal 11"


RECORDS_A_FAILURE = """
import sys
from pathlib import Path
from harness.results.record import StrategyRecord, write_strategy_file
write_strategy_file(Path(sys.argv[1]), sys.argv[2], StrategyRecord(status="failed", error="stand-in: no weights"))
sys.exit(1)
"""


def test_a_strategy_that_recorded_its_own_failure_is_a_result_and_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    earlier_results(results)
    stand_in(monkeypatch, RECORDS_A_FAILURE)
    assert main(["run", str(scenario(tmp_path, "map")), "--results", str(results)]) == 1
    record = json.loads((results / "tiny" / SUMMARY).read_text())
    assert record["strategies"]["map"]["error"] == "stand-in: no weights"
    assert "stand-in: no weights" in (results / "tiny.md").read_text()
    assert sorted(p.name for p in results.iterdir() if p.name.startswith(".")) == []


HANDS_IN_A_RESULT = """
import os, shutil, sys
from pathlib import Path
from harness.results.record import write_strategy_file
from harness.results.samples import events_file, samples_file
from harness.results.reading import load_results
out, strategy, source, fs = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
leave = int(sys.argv[5])
for name in (samples_file(strategy), events_file(strategy)):
    shutil.copyfile(source / name, out / name)
write_strategy_file(out, strategy, load_results(source).strategies[strategy])
if leave >= 0:
    stat = os.statvfs(fs)
    with open(fs / "filler", "ab") as handle:
        handle.write(b"\\0" * max(0, stat.f_bavail * stat.f_frsize - leave))
"""


def test_a_run_that_runs_out_of_space_for_its_figures_keeps_the_earlier_results(
    tmp_path: Path, small_fs: SmallFs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = small_fs.path / "results"
    earlier_results(results)
    before = snapshot(results)
    source = make_results(tmp_path / "source", name="tiny", failed=None, strategies=("map", "load"))
    leave = 160 * KIB if small_fs.mounted else -1  # the summary fits; the figures do not, all of them
    stand_in(monkeypatch, HANDS_IN_A_RESULT, str(source), str(small_fs.path), str(leave))
    no_space_for(monkeypatch, small_fs, lambda prefix: prefix.startswith(".tiny.timeline.png"))
    message = run_ending_in_error(capsys, "run", str(scenario(tmp_path, "map", "load")), "--results", str(results))
    assert "cannot write (No space left on device)" in message
    staging = results / ".tiny.partial"
    assert message.endswith(f"{results / 'tiny'} is unchanged; kept {staging} until the next run, for its finished "
                            "strategies map, load")
    assert snapshot(results, skip=".tiny.partial") == before, "the earlier results, report and figures stay"
    assert {p.name for p in staging.iterdir()} >= {"strategy-map.json", "strategy-load.json", SUMMARY}
    assert not [p for p in results.iterdir() if p.name.endswith(".tmp")], "no temporary file is left"


REFERENCE_FAILURES = {
    # what fails: (where it is made to, the record's key, the start of the reason, the report's line)
    "shared disk": ("harness.measure.shared_disk.write_files", "shared_disk_error", "time 1 of 3: OSError: ",
                    "- **disk shared by reads and engine writes**: the measurement failed (time 1 of 3: OSError: "),
    "read ceiling": ("harness.measure.ceiling._point", "read_ceiling_error", "OSError: ",
                     "- **disk ceiling**: not measured, the sweep failed (OSError: "),
    "read probe": ("harness.checkpoint_reading.read_probe", "probe_error", "OSError: ",
                   "  - read probe at the run's start: failed (OSError: "),
    "disk read": ("harness.reference.cold_read_bandwidth", "disk_read_error", "before round 1 of 1: OSError: ",
                  "- **disk**: the cold sequential read of the checkpoint failed (before round 1 of 1: OSError: "),
}


@pytest.mark.parametrize("which", sorted(REFERENCE_FAILURES))
def test_a_reference_measurement_that_fails_is_recorded_and_the_run_is_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    target, key, reason, line = REFERENCE_FAILURES[which]

    def no_space(*args: object, **kwargs: object) -> object:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(target, no_space)
    results = tmp_path / "results"
    source = make_results(tmp_path / "source", name="tiny", failed=None, strategies=("map", "load"))
    stand_in(monkeypatch, HANDS_IN_A_RESULT, str(source), str(tmp_path), "-1")
    assert main(["run", str(scenario(tmp_path, "map", "load")), "--results", str(results)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    record = load_results(results / "tiny").record  # read back by the codec
    error = getattr(record.reading if key == "probe_error" else record, key)
    assert error is not None and error.startswith(reason) and error.endswith("No space left on device"), error
    report = (results / "tiny.md").read_text()
    assert line in report and f"({error})" in report
    assert all(s.ok for s in record.strategies.values())
    assert sorted(p.name for p in results.iterdir() if p.name.startswith(".")) == []


def test_after_a_disk_read_that_fails_none_is_taken_and_the_reads_before_it_stand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import harness.reference

    real = harness.reference.cold_read_bandwidth
    calls: list[int] = []  # the disk read before each round: the second fails

    def fails_second(*args: Any, **kwargs: Any) -> Any:
        calls.append(len(calls))
        if len(calls) == 2:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(*args, **kwargs)

    monkeypatch.setattr("harness.reference.cold_read_bandwidth", fails_second)
    results = tmp_path / "results"
    source = make_results(tmp_path / "source", name="tiny", failed=None, strategies=("map",))
    stand_in(monkeypatch, HANDS_IN_A_RESULT, str(source), str(tmp_path), "-1")
    path = tmp_path / "s.toml"
    path.write_text(tiny_scenario_text(tmp_path / "c.safetensors", {"engines = 2": "engines = 4"},
                                       extra="[run]\nrepeats = 3\n"))
    assert main(["run", str(path), "--results", str(results)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    record = load_results(results / "tiny").record
    assert len(calls) == 2, "no read after the one that failed"
    assert [d.before for d in record.disk_reads] == [0]
    assert record.disk_read_error == f"before round 2 of 3: OSError: [Errno {errno.EIO}] {os.strerror(errno.EIO)}"
    report = (results / "tiny.md").read_text()
    assert "checkpoint (`read()` into a reused buffer, before the first round): " in report
    assert (f"- **disk**: the cold sequential read of the checkpoint failed ({record.disk_read_error}); no more were "
            "taken after it.") in report
    assert record.strategies["map"].ok and len(record.strategies["map"].repeats) == 3


def test_a_plot_that_runs_out_of_space_leaves_every_earlier_figure_and_the_report(
    small_fs: SmallFs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = small_fs.path / "results"
    directory = earlier_results(results)
    summary = directory / SUMMARY
    data = json.loads(summary.read_text())
    data["model"]["name"] = "another-model"  # in every figure's title or footer, and in the report
    summary.write_text(json.dumps(data))
    before = snapshot(results)
    small_fs.fill(leave=200 * KIB)  # the first figure fits, the rest do not
    no_space_for(monkeypatch, small_fs, lambda prefix: prefix.startswith(".tiny.timeline.png"))
    assert main(["plot", str(directory)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and "cannot write (No space left on device)" in err, err
    assert err.endswith("; the earlier report and figures are unchanged\n"), err
    assert snapshot(results) == before
    (small_fs.path / "filler").unlink(missing_ok=True)
    monkeypatch.undo()
    assert main(["plot", str(directory)]) == 0, "with space again, it renders"
    assert "another-model" in (results / "tiny.md").read_text()


def test_a_worker_that_runs_out_of_space_says_so_in_one_line(
    tmp_path: Path, small_fs: SmallFs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = make_plan(load_scenario(scenario(tmp_path, "map")), name="tiny", workdir=tmp_path / "engines")
    plan_path = write_plan(tmp_path / "plan.json", plan)
    out = small_fs.path / "out"
    out.mkdir()
    small_fs.fill(leave=0)
    no_space_for(monkeypatch, small_fs, lambda prefix: prefix.startswith(".samples-map.csv"))
    monkeypatch.setattr(sys, "setswitchinterval", lambda interval: None)
    assert harness.worker.main([str(plan_path), "map", str(out)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert errors == [f"error: harness worker failed: OutputError: {out / 'samples-map.csv'}: cannot write (No space "
                      "left on device); any earlier file there is unchanged"], err
    assert read_strategy_file(out, "map") is None


def test_a_strategy_that_runs_out_of_space_is_recorded_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = make_plan(load_scenario(scenario(tmp_path, "map")), name="tiny", workdir=tmp_path / "engines")

    def no_space(self: object, model: object) -> object:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "engines" / "engine-0"))

    monkeypatch.setattr(harness.worker.StrategyRun, "load", no_space)
    record = harness.worker.measure(plan, "map", tmp_path / "out")
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    reason = f"OSError: [Errno {errno.ENOSPC}] No space left on device: '{tmp_path / 'engines' / 'engine-0'}'"
    assert [line for line in err.splitlines() if "error" in line.lower()] == [f"error: map: {reason}"], err
    assert record.status == "failed" and record.error == reason
    assert isinstance(read_strategy_file(tmp_path / "out", "map"), StrategyRecord)


def test_a_worker_whose_engines_are_removed_under_it_says_the_failure_was_the_machines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = make_plan(load_scenario(scenario(tmp_path, "map")), name="tiny", workdir=tmp_path / "engines")
    plan_path = write_plan(tmp_path / "plan.json", plan)
    build = CopyToFiles.build_engine

    def removed_under_it(self: CopyToFiles, index: int, tensors: dict[str, object]) -> object:
        if index == 1:
            shutil.rmtree(self.workdir)  # as another process did
        return build(self, index, tensors)  # type: ignore[arg-type]

    monkeypatch.setattr(CopyToFiles, "build_engine", removed_under_it)
    monkeypatch.setattr(sys, "setswitchinterval", lambda interval: None)
    assert harness.worker.main([str(plan_path), "map", str(tmp_path / "out")]) == OUTSIDE_STATUS
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    record = read_strategy_file(tmp_path / "out", "map")
    engine = tmp_path / "engines" / "tiny-map" / "engine-001.safetensors"
    assert record is not None and record.status == "failed" and str(engine) in (record.error or ""), record


def test_a_worker_whose_own_code_fails_is_a_result_of_the_strategy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = make_plan(load_scenario(scenario(tmp_path, "map")), name="tiny", workdir=tmp_path / "engines")
    plan_path = write_plan(tmp_path / "plan.json", plan)

    def missing_elsewhere(self: object, model: object) -> object:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(tmp_path / "not-its-own"))

    monkeypatch.setattr(harness.worker.StrategyRun, "load", missing_elsewhere)
    monkeypatch.setattr(sys, "setswitchinterval", lambda interval: None)
    assert harness.worker.main([str(plan_path), "map", str(tmp_path / "out")]) == 1
    assert "Traceback" in capsys.readouterr().err
    record = read_strategy_file(tmp_path / "out", "map")
    assert record is not None and record.status == "failed" and "not-its-own" in (record.error or "")


# Links


def test_results_that_are_a_link_are_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = earlier_results(tmp_path / "elsewhere")
    kept = snapshot(elsewhere.parent)
    results = tmp_path / "results"
    results.mkdir()
    (results / "tiny").symlink_to(elsewhere)
    stand_in(monkeypatch, RECORDS_A_FAILURE)
    message = run_ending_in_error(capsys, "run", str(scenario(tmp_path, "map")), "--results", str(results))
    assert message == (f"{results / 'tiny'}: a symbolic link (to {elsewhere}); the results are replaced as a whole "
                       "and never through a link: remove the link, or pass --name or --results")
    assert not (tmp_path / "c.safetensors").exists(), "nothing may run before the results are checked"
    assert sorted(p.name for p in results.iterdir()) == ["tiny"] and (results / "tiny").is_symlink()
    assert snapshot(elsewhere.parent) == kept


def test_results_that_are_a_file_are_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "tiny").write_text("not results")
    stand_in(monkeypatch, RECORDS_A_FAILURE)
    message = run_ending_in_error(capsys, "run", str(scenario(tmp_path, "map")), "--results", str(results))
    assert message == (f"{results / 'tiny'}: not a directory, so it cannot hold results; remove it, or pass --name "
                       "or --results")
    assert not (tmp_path / "c.safetensors").exists()
    assert (results / "tiny").read_text() == "not results"


def test_leftover_links_at_the_staging_and_old_names_are_removed_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    earlier_results(results)
    precious = {name: tmp_path / "precious" / name for name in ("staging", "old")}
    for path in precious.values():
        path.mkdir(parents=True)
        (path / "keep.txt").write_text("mine")
    (results / ".tiny.partial").symlink_to(precious["staging"])
    (results / ".tiny.old").symlink_to(precious["old"])
    stand_in(monkeypatch, RECORDS_A_FAILURE)
    for _ in range(2):  # and again: nothing is left behind that breaks the next run
        assert main(["run", str(scenario(tmp_path, "map")), "--results", str(results)]) == 1
        record = json.loads((results / "tiny" / SUMMARY).read_text())
        assert list(record["strategies"]) == ["map"], "the new run is in place"
        assert sorted(p.name for p in results.iterdir() if p.name.startswith(".")) == []
        assert not (results / "tiny").is_symlink()
    for path in precious.values():
        assert sorted(p.name for p in path.iterdir()) == ["keep.txt"] and (path / "keep.txt").read_text() == "mine"


def test_a_link_made_at_the_results_name_during_a_run_is_not_followed_at_publish(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    elsewhere = earlier_results(tmp_path / "elsewhere")
    kept = snapshot(elsewhere.parent)
    code = f"import os; os.path.lexists({str(results / 'tiny')!r}) or os.symlink({str(elsewhere)!r}, " \
           f"{str(results / 'tiny')!r})\n" + RECORDS_A_FAILURE
    stand_in(monkeypatch, code)
    message = run_ending_in_error(capsys, "run", str(scenario(tmp_path, "map")), "--results", str(results))
    assert message.startswith(f"{results / 'tiny'}: a symbolic link (to {elsewhere}); ")
    assert message.endswith("remove the link, or pass --name or --results"), "nothing finished, nothing kept"
    assert snapshot(elsewhere.parent) == kept
    assert (results / "tiny").is_symlink() and not (results / ".tiny.old").exists()
    assert sorted(p.name for p in results.iterdir()) == ["tiny"]
