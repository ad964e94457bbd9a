"""A budget sweep ended by a signal leaves no process and no memory cgroup behind.

The end-to-end tests start a real ``python -m harness budget`` parent (through
:func:`harness.cli.main`) whose worker is a stand-in that records its pid and sleeps, and
signal it while that worker runs in its memory cgroup. Skipped, with the reason, where no
memory cgroup is writable. The mechanism itself, shared with a run, is tested in ``test_stopping``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.budget.cgroup import DEFAULT_PREFIX, remove_stale_groups
from harness.budget.controller import MemoryController
from harness.tests.processes import alive, gone_within
from harness.tests.tiny_scenario import tiny_scenario_text

ROOT = Path(__file__).resolve().parents[2]
# The parent: the command line with a stand-in worker. SIGINT and SIGHUP as a terminal leaves them,
# whatever the test runner inherited (a background job starts with SIGINT ignored).
PARENT = """
import pathlib, signal, sys
import harness.budget.mode as mode
from harness.cli import main
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
tmp, behaviour = pathlib.Path(sys.argv[1]), sys.argv[2]
SLEEP = "import os, pathlib, time; pathlib.Path(%r).write_text(str(os.getpid())); time.sleep(120)"
def worker(plan, strategy, out):
    code = SLEEP % str(tmp / "worker.pid") if behaviour == "sleep" else "raise SystemExit(3)"
    return [sys.executable, "-c", code]
mode.worker_command = worker
sys.exit(main(["budget", str(tmp / "s.toml"), "--results", str(tmp / "results")]))
"""


def _groups_of(controller: MemoryController, pid: int) -> list[Path]:
    mark = f"{DEFAULT_PREFIX}-{pid}-"
    return sorted(p for p in controller.parent.iterdir() if p.name.startswith(mark) and p.is_dir())


def _parent(tmp_path: Path, behaviour: str) -> subprocess.Popen[str]:
    (tmp_path / "s.toml").write_text(tiny_scenario_text(tmp_path / "c.safetensors",
                                                           extra="[run]\nmemory_limit_gib = 1.0\n"))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(PARENT), str(tmp_path), behaviour],
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)


@pytest.fixture
def sweep(tmp_path: Path, controller: MemoryController) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A budget parent whose first attempt's worker is running (its pid), in a group of the parent's."""
    parent = _parent(tmp_path, "sleep")
    pid_file = tmp_path / "worker.pid"
    deadline = time.monotonic() + 180
    worker = None
    try:
        while not (pid_file.exists() and pid_file.read_text()):
            assert parent.poll() is None, parent.communicate()[1]
            assert time.monotonic() < deadline, "the worker never started"
            time.sleep(0.1)
        worker = int(pid_file.read_text())
        yield parent, worker
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.communicate()
        if worker is not None and alive(worker):
            os.kill(worker, signal.SIGKILL)  # a regression's orphan: not left for two minutes
        remove_stale_groups(controller)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_caught_signal_stops_the_attempt_removes_its_group_and_says_so(
    sweep: tuple[subprocess.Popen[str], int], controller: MemoryController, signum: signal.Signals
) -> None:
    parent, worker = sweep
    assert _groups_of(controller, parent.pid), "the attempt runs in a memory cgroup named after the parent"
    parent.send_signal(signum)
    _, err = parent.communicate(timeout=60)
    assert parent.returncode == 128 + signum, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"error: interrupted by {signum.name}; every attempt's process was stopped and its "
                                "memory cgroup removed; "), err
    assert "results/tiny-budget is unchanged" in lines[-1]
    assert sum(line.startswith("error:") for line in lines) == 1 and "Traceback" not in err, err
    assert not alive(worker), "the worker outlived its parent"
    assert _groups_of(controller, parent.pid) == [], "the parent left its memory cgroup behind"


def test_a_killed_sweep_takes_its_worker_along_and_the_next_start_removes_its_group(
    sweep: tuple[subprocess.Popen[str], int], controller: MemoryController, tmp_path: Path
) -> None:
    parent, worker = sweep
    parent.kill()
    parent.wait()
    assert gone_within(worker, 10), "the worker outlived its SIGKILLed parent"
    left = _groups_of(controller, parent.pid)
    assert len(left) == 1, "nothing could run to remove the group of a SIGKILLed parent"
    again = _parent(tmp_path, "fail")  # a sweep whose only attempt fails at once
    _, err = again.communicate(timeout=300)
    assert again.returncode == 1, err
    assert not left[0].exists(), "the next start removes the group of the dead run"
    assert _groups_of(controller, again.pid) == []
