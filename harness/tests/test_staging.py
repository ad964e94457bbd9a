"""No staging directory outlives its run for nothing.

A run that fails or is interrupted removes ``results/.<name>.partial/``, unless a strategy finished
there: then it is kept and the one ``error:`` line names it and them. The next run of any name
removes the staging directories of runs that are no longer running (their lock is free) and leaves
a live run's alone. ``results/.gitignore`` keeps these names out of ``git status``.
"""

from __future__ import annotations

import errno
import fcntl
import importlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import OutputError
from harness.results.publish import LOCK, Staging, staging_dir
from harness.results.record import RunRecord
from harness.tests.fixtures import make_results
from harness.tests.terminal import terminal_signals  # noqa: F401 (autouse: each test starts from a terminal's signals)
from harness.tests.test_publish import HANDS_IN_A_RESULT, RECORDS_A_FAILURE, earlier_results, scenario, snapshot
from harness.tests.tiny_scenario import tiny_scenario_text

ROOT = Path(__file__).resolve().parents[2]




def dot_entries(results: Path) -> list[str]:
    return sorted(p.name for p in results.iterdir() if p.name.startswith("."))


def last_error(capsys: pytest.CaptureFixture[str]) -> str:
    """The run's one ``error:`` line (its last line), without the prefix."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0] and "Traceback" not in err, err
    return errors[0][len("error: "):]


def workers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, by_strategy: dict[str, str]) -> None:
    """Each strategy's process runs its code (``sys.argv[1:]``: out directory, strategy, a finished result's
    directory, the results root, -1); a strategy whose code is ``raise`` makes the parent raise instead."""
    source = make_results(tmp_path / "source", name="tiny", failed=None, strategies=("map", "load"))

    def command(plan: Path, strategy: str, out: Path) -> list[str]:
        code = by_strategy[strategy]
        if code == "raise":
            raise OutputError(f"{strategy}: cannot start its process")
        return [sys.executable, "-c", textwrap.dedent(code), str(out), strategy, str(source), str(tmp_path), "-1"]

    monkeypatch.setattr("harness.run.worker_command", command)


def test_a_plan_time_error_leaves_no_staging_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_text(tiny_scenario_text(tmp_path / "absent.safetensors", {"generate = true": "generate = false"}))
    results = tmp_path / "results"
    assert main(["run", str(path), "--results", str(results)]) == 2
    assert "no such file" in last_error(capsys)
    assert dot_entries(results) == []


def test_an_error_after_a_strategy_finished_keeps_its_staging_and_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    workers(monkeypatch, tmp_path, {"map": HANDS_IN_A_RESULT, "load": "raise"})
    assert main(["run", str(scenario(tmp_path, "map", "load")), "--results", str(results)]) == 2
    staging = staging_dir(results, "tiny")
    assert last_error(capsys) == (f"load: cannot start its process; kept {staging} until the next run, for its "
                                  "finished strategies map")
    assert (staging / "strategy-map.json").is_file() and not (staging / "strategy-load.json").exists()
    assert dot_entries(results) == [".tiny.partial"]
    # The next run, of another name, removes it: its run is no longer running.
    workers(monkeypatch, tmp_path, {"map": RECORDS_A_FAILURE})
    assert main(["run", str(scenario(tmp_path, "map")), "--results", str(results), "--name", "other"]) == 1
    assert f"[harness] removed {staging}: left by a run that is no longer running" in capsys.readouterr().err
    assert dot_entries(results) == []
    assert not (results / "other" / LOCK).exists(), "the lock stays out of the published results"


SIGNALS_THE_PARENT = """
import os, signal, sys, time
os.kill(os.getppid(), signal.{signal})
time.sleep(60)
"""


def test_an_interrupt_during_a_strategy_removes_the_staging_when_nothing_finished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    workers(monkeypatch, tmp_path, {"map": SIGNALS_THE_PARENT.format(signal="SIGINT")})
    assert main(["run", str(scenario(tmp_path, "map")), "--results", str(results)]) == 128 + signal.SIGINT
    assert last_error(capsys) == (f"interrupted by SIGINT; the running strategy's process was stopped (map); "
                                  f"{results / 'tiny'} is unchanged")
    assert dot_entries(results) == []


def test_a_keyboard_interrupt_outside_a_worker_removes_the_staging(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(plan: Path, strategy: str, out: Path) -> list[str]:
        raise KeyboardInterrupt

    monkeypatch.setattr("harness.run.worker_command", interrupted)
    results = tmp_path / "results"
    assert main(["run", str(scenario(tmp_path, "map")), "--results", str(results)]) == 128 + signal.SIGINT
    assert last_error(capsys) == f"interrupted by SIGINT; {results / 'tiny'} is unchanged"
    assert dot_entries(results) == []


def test_a_signal_after_a_strategy_finished_keeps_the_staging_and_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    workers(monkeypatch, tmp_path, {"map": HANDS_IN_A_RESULT, "load": SIGNALS_THE_PARENT.format(signal="SIGTERM")})
    assert main(["run", str(scenario(tmp_path, "map", "load")), "--results", str(results)]) == 128 + signal.SIGTERM
    staging = staging_dir(results, "tiny")
    assert last_error(capsys) == (f"interrupted by SIGTERM; the running strategy's process was stopped (load); "
                                  f"{results / 'tiny'} is unchanged; kept {staging} until the next run, for its "
                                  "finished strategies map")
    assert dot_entries(results) == [".tiny.partial"]


HOLDS = """
import fcntl, os, sys
from pathlib import Path
directory = Path(sys.argv[1])
directory.mkdir(parents=True)
fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.write(fd, str(os.getpid()).encode())
print("holding", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def live_run(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """``results/.live.partial``, held as a running run holds its staging directory (its lock and pid)."""
    directory = tmp_path / "results" / ".live.partial"
    holder = subprocess.Popen([sys.executable, "-c", HOLDS, str(directory)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        yield directory, holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_the_next_run_removes_stale_staging_and_leaves_a_live_runs_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, live_run: tuple[Path, int]
) -> None:
    live, pid = live_run
    results = live.parent
    dead = results / ".dead.partial"  # a run killed outright: its lock is there and free
    dead.mkdir()
    (dead / LOCK).write_text("999999\n")
    (dead / "summary.json").write_text("{}")
    (results / ".older.partial").mkdir()  # left before runs locked their staging directory
    (results / ".made.partial.x1y2z3").mkdir()  # made, never renamed into place
    workers(monkeypatch, tmp_path, {"map": RECORDS_A_FAILURE})
    assert main(["run", str(scenario(tmp_path, "map")), "--results", str(results)]) == 1
    assert dot_entries(results) == [".live.partial"]
    assert (live / LOCK).read_text() == str(pid), "a live run's staging directory is untouched"
    err = capsys.readouterr().err
    for name in (".dead.partial", ".older.partial", ".made.partial.x1y2z3"):
        assert f"[harness] removed {results / name}: left by a run that is no longer running" in err
    assert main(["run", str(scenario(tmp_path, "map")), "--results", str(results), "--name", "live"]) == 2
    assert last_error(capsys) == (f"{live}: a run of live is in progress (process {pid}); wait for it to end, "
                                  "or pass --name")
    assert dot_entries(results) == [".live.partial"]


def test_a_staging_lock_is_held_for_the_runs_life(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []

    def probing(plan: Path, strategy: str, out: Path) -> list[str]:
        fd = os.open(out / LOCK, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append(False)
        except BlockingIOError:
            seen.append(True)
        finally:
            os.close(fd)
        return [sys.executable, "-c", textwrap.dedent(RECORDS_A_FAILURE), str(out), strategy]

    monkeypatch.setattr("harness.run.worker_command", probing)
    assert main(["run", str(scenario(tmp_path, "map", "load")), "--results", str(tmp_path / "results")]) == 1
    assert seen == [True, True], "another process (or open file) cannot take the lock while the run goes on"


def test_results_gitignore_ignores_every_staging_name_and_nothing_else(tmp_path: Path) -> None:
    git = shutil.which("git")
    if git is None:
        pytest.skip("no git")
    repo = tmp_path / "repo"
    results = repo / "results"
    results.mkdir(parents=True)
    shutil.copyfile(ROOT / "results" / ".gitignore", results / ".gitignore")
    staging = staging_dir(results, "tiny")
    ignored = [staging / "summary.json", staging / LOCK, staging.with_name(f"{staging.name}.k2j3h4") / LOCK,
               results / ".tiny.old" / "summary.json"]
    kept = [results / "tiny" / "summary.json", results / "tiny.md", results / "tiny.timeline.png",
            results / "tiny.notes.md"]
    for path in ignored + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    subprocess.run([git, "init", "-q", str(repo)], check=True)
    status = subprocess.run([git, "status", "--porcelain", "--untracked-files=all"], cwd=repo, check=True,
                            capture_output=True, text=True).stdout
    assert sorted(line[3:] for line in status.splitlines()) == sorted(
        str(p.relative_to(repo)) for p in [*kept, results / ".gitignore"])
    for path in ignored:
        assert subprocess.run([git, "check-ignore", "-q", str(path)], cwd=repo).returncode == 0, path


STARTS = """
import fcntl, os, sys, time
from pathlib import Path
real_flock = fcntl.flock
def slow_flock(fd, operation):
    time.sleep(0.002)  # a lock slow to take: any gap between making a directory and locking it is wide open
    return real_flock(fd, operation)
fcntl.flock = slow_flock
from harness.results.publish import Staging, publish
results, starts = Path(sys.argv[1]), int(sys.argv[2])
failed = removed = 0
for i in range(starts):
    name = f"p{os.getpid()}-{i}"
    try:
        with Staging(results, name, lambda staging: [], lambda line: None) as staging:
            (staging / "mine").write_text(name)
            time.sleep(0.001)
            if (staging / "mine").read_text() != name:
                removed += 1
            if i % 3 == 0:  # a run that finished: published
                publish(staging, results / name)
            elif i % 3 == 1:  # a run that failed: its staging directory goes
                raise LookupError(name)
            # else a run killed outright: its staging directory is left for the next start to remove
    except LookupError:
        pass
    except Exception as exc:
        failed += 1
        print(f"start {i}: {type(exc).__name__}: {exc}", file=sys.stderr)
print(failed, removed)
"""


def test_starts_racing_in_one_root_never_remove_a_live_staging_directory_or_fail(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    racers = [subprocess.Popen([sys.executable, "-c", STARTS, str(results), "100"], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    outcomes = [racer.communicate(timeout=600) for racer in racers]
    for racer, (out, err) in zip(racers, outcomes, strict=True):
        assert racer.returncode == 0, err
        assert out.split() == ["0", "0"], f"failed starts, live directories removed: {out}{err}"


BUILDS_ENGINES = """
import json, shutil, sys, time
from pathlib import Path
from harness.results.reading import load_results
from harness.results.record import StrategyRecord, write_strategy_file
from harness.results.samples import events_file, samples_file
plan, strategy, out, source, marks = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5:]
engines = Path(json.loads(plan.read_text())["workdir"]) / f"tiny-{strategy}"  # where the worker builds
engines.mkdir(parents=True, exist_ok=True)
engine = engines / "engine-000.safetensors"
engine.write_bytes(b"an engine")
if marks:  # the slow run: say it is building, then wait until the other run is over
    building, done = Path(marks[0]), Path(marks[1])
    building.write_text("")
    deadline = time.monotonic() + 120
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
if not engine.is_file():
    write_strategy_file(out, strategy, StrategyRecord(status="failed", error=f"{engine} was removed under it"))
    sys.exit(1)
shutil.rmtree(engines)  # as the builders' close() does
for name in (samples_file(strategy), events_file(strategy)):
    shutil.copyfile(source / name, out / name)
write_strategy_file(out, strategy, load_results(source).strategies[strategy])
"""


def test_two_runs_of_one_scenario_at_once_build_their_engines_apart_and_leave_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.run import run_scenario
    from harness.scenario import load_scenario

    monkeypatch.chdir(tmp_path)  # where engines went by default: data/engines under the current directory
    source = make_results(tmp_path / "source", name="tiny", failed=None, strategies=("map",))
    building, done = tmp_path / "slow-is-building", tmp_path / "fast-is-done"

    def slow(plan: Path, strategy: str, out: Path) -> list[str]:
        return [sys.executable, "-c", BUILDS_ENGINES, str(plan), strategy, str(out), str(source), str(building),
                str(done)]

    def fast(plan: Path, strategy: str, out: Path) -> list[str]:
        return [sys.executable, "-c", BUILDS_ENGINES, str(plan), strategy, str(out), str(source)]

    path = scenario(tmp_path, "map")
    outcome: dict[str, object] = {}

    def first() -> None:
        try:
            outcome["record"] = run_scenario(load_scenario(path), results=tmp_path / "a", command=slow)
        except BaseException as exc:  # reported by the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=first)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not building.exists() and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert building.exists(), outcome
        second = run_scenario(load_scenario(path), results=tmp_path / "b", command=fast)
    finally:
        done.write_text("")
        thread.join(timeout=180)
    assert "error" not in outcome, outcome
    assert second.strategies["map"].ok
    record = outcome["record"]
    assert isinstance(record, RunRecord), outcome
    assert record.strategies["map"].ok, record.strategies["map"].error
    assert not list(tmp_path.rglob("engine-*")), "no run leaves an engine behind"
    assert dot_entries(tmp_path / "a") == [] and dot_entries(tmp_path / "b") == []


def test_an_interrupted_run_leaves_no_engine_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    source = make_results(tmp_path / "source", name="tiny", failed=None, strategies=("map",))
    code = BUILDS_ENGINES.replace("if marks:", "import os, signal\nos.kill(os.getppid(), signal.SIGTERM)\n"
                                              "time.sleep(60)\nif marks:")

    def command(plan: Path, strategy: str, out: Path) -> list[str]:
        return [sys.executable, "-c", BUILDS_ENGINES if strategy == "map" else code, str(plan), strategy,
                str(out), str(source)]

    monkeypatch.setattr("harness.run.worker_command", command)
    results = tmp_path / "results"
    assert main(["run", str(scenario(tmp_path, "map", "load")), "--results", str(results)]) == 128 + signal.SIGTERM
    staging = staging_dir(results, "tiny")
    assert last_error(capsys).endswith(f"kept {staging} until the next run, for its finished strategies map")
    assert not list(tmp_path.rglob("engine-*")), "the engine load's process was building is gone"
    assert sorted(p.name for p in staging.iterdir()) == sorted(
        [LOCK, "plan.json", "summary.json", "strategy-map.json", "samples-map.csv", "events-map.csv"])


# A signal during a reference measurement (harness.reference.reference): the run stops, nothing is published.


def signals_itself(real: Callable[..., object], signum: int, swallow: bool) -> Callable[..., object]:
    """``real``, a reference measurement, made to send ``signum`` to its own process first; with ``swallow``,
    its own error handling takes what the signal raised and it goes on to measure."""
    def measurement(*args: object, **kwargs: object) -> object:
        try:
            os.kill(os.getpid(), signum)
            time.sleep(10)  # the handler runs at once; this only bounds a wait for it
        except BaseException:
            if not swallow:
                raise
        return real(*args, **kwargs)

    return measurement


REFERENCE_POINTS = {"shared disk": "harness.reference.shared_disk",
                    "read ceiling": "harness.checkpoint_reading.read_ceiling",
                    "disk read": "harness.round_run.measure_disk"}


@pytest.mark.parametrize("swallow", [False, True], ids=["raised", "swallowed"])
@pytest.mark.parametrize("which", sorted(REFERENCE_POINTS))
def test_a_signal_during_a_reference_measurement_stops_the_run_and_publishes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, which: str, swallow: bool
) -> None:
    results = tmp_path / "results"
    earlier_results(results)
    before = snapshot(results)
    module, _, name = REFERENCE_POINTS[which].rpartition(".")
    real = getattr(importlib.import_module(module), name)
    monkeypatch.setattr(REFERENCE_POINTS[which], signals_itself(real, signal.SIGTERM, swallow))
    workers(monkeypatch, tmp_path, {"map": HANDS_IN_A_RESULT, "load": HANDS_IN_A_RESULT})
    assert main(["run", str(scenario(tmp_path, "map", "load")), "--results", str(results)]) == 128 + signal.SIGTERM
    message = last_error(capsys)
    assert message.startswith(f"interrupted by SIGTERM; {results / 'tiny'} is unchanged"), message
    assert snapshot(results, skip=".tiny.partial") == before, "the earlier results, report and figures stay"


# Removing what another process removes at the same time (a run removing its own staging directory as it ends)


def dead_staging(results: Path) -> Path:
    """``results/.dead.partial`` as a run killed outright left it: its lock free, a record, an engine."""
    dead = results / ".dead.partial"
    (dead / "engines").mkdir(parents=True)
    (dead / LOCK).write_text("999999\n")
    (dead / "summary.json").write_text("{}")
    (dead / "engines" / "engine-000.safetensors").write_bytes(b"an engine")
    return dead


def removed_first_by_another(monkeypatch: pytest.MonkeyPatch, names: set[str]) -> None:
    """Each of ``names``, a file or directory, is removed by another process right before this one removes it."""
    for function in ("unlink", "rmdir"):
        real = getattr(os, function)

        def raced(path: str, *args: object, real: Callable[..., None] = real, **kwargs: object) -> None:
            if os.path.basename(path) in names:
                names.discard(os.path.basename(path))
                real(path, *args, **kwargs)
            real(path, *args, **kwargs)

        monkeypatch.setattr(os, function, raced)


def test_a_stale_staging_directory_another_process_removes_meanwhile_is_removed_without_a_complaint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = dead_staging(tmp_path / "results")
    said: list[str] = []
    raced = {"summary.json", "engines"}
    removed_first_by_another(monkeypatch, raced)
    with Staging(tmp_path / "results", "tiny", lambda staging: [], said.append):
        pass
    assert said == [f"removed {dead}: left by a run that is no longer running"]
    assert not os.path.lexists(dead)
    assert raced == set(), "each was removed by the other process first"


def test_a_stale_staging_directory_that_cannot_be_removed_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = dead_staging(tmp_path / "results")
    real = os.unlink

    def refused(path: str, *args: object, **kwargs: object) -> None:
        if os.path.basename(path) == "summary.json":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", refused)
    said: list[str] = []
    with Staging(tmp_path / "results", "tiny", lambda staging: [], said.append):
        pass
    assert said == [f"could not remove {dead}, left by a run that is no longer running (Permission denied)"]
    assert (dead / "summary.json").is_file()
