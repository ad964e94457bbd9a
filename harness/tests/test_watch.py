"""The watcher of a run's worker (harness.watch.watch) holds the worker and every process it started to the
limit, counted by harness.measure.proctree; each test keeps its processes to a few hundred MiB."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from harness.measure.proctree import descendants, pss_sum, read_tree
from harness.tests.processes import gone_within
from harness.units import KIB, MIB
from harness.watch import watch

# The worker starts a child that writes its pid and touches 300 MiB, then waits for it; the worker itself
# stays small.
HUNGRY_CHILD = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import os, sys, time\\n"
    "open(sys.argv[1], \"w\").write(str(os.getpid()))\\n"
    "b = bytearray(300 << 20)\\n"
    "b[::4096] = bytes(len(b) // 4096)\\n"
    "time.sleep(20)\\n', sys.argv[1]])\n"
    "sys.exit(child.wait())\n"
)


def test_what_the_worker_starts_counts_toward_the_limit_and_is_stopped_with_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    outcome = watch([sys.executable, "-c", HUNGRY_CHILD, str(pid_file)], 150 * MIB, 60)
    assert outcome.stopped_by_harness
    assert outcome.reason is not None and outcome.reason.startswith(
        "stopped by the harness: the worker and the 1 process it started held ")
    assert "(PSS summed), past the scenario's memory limit of 0.15 GiB" in outcome.reason
    assert outcome.peak_rss_bytes < 150 * MIB  # the worker's own RSS never came near it
    assert gone_within(int(pid_file.read_text()))


def test_a_timeout_stops_what_the_worker_started_too(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    code = "import subprocess, sys, time; c = subprocess.Popen(['sleep', '60']); " \
           "open(sys.argv[1], 'w').write(str(c.pid)); time.sleep(60)"
    outcome = watch([sys.executable, "-c", code, str(pid_file)], None, 1.0)
    assert outcome.reason is not None and "timeout of 1 s" in outcome.reason
    assert gone_within(int(pid_file.read_text()))


# The worker touches 200 MiB, then forks three children that share it copy-on-write and wait: summed RSS is
# about 800 MiB, the memory the four hold about 200 MiB.
SHARED_PAGES = (
    "import os, sys, time\n"
    "b = bytearray(200 << 20)\n"
    "b[::4096] = b'\\x01' * (len(b) // 4096)\n"
    "children = []\n"
    "for _ in range(3):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        time.sleep(3)\n"
    "        os._exit(0)\n"
    "    children.append(pid)\n"
    "for pid in children:\n"
    "    os.waitpid(pid, 0)\n"
)


def test_pages_the_worker_shares_with_its_children_count_once(tmp_path: Path) -> None:
    outcome = watch([sys.executable, "-c", SHARED_PAGES], 450 * MIB, 60)
    assert outcome.reason is None and outcome.returncode == 0


def test_a_tree_is_read_with_its_children_and_their_shared_pages_split() -> None:
    import subprocess

    ready = "import os, sys, time\nb = bytearray(64 << 20)\nb[::4096] = b'\\x01' * (len(b) // 4096)\n" \
            "pid = os.fork()\nos.write(1, b'ready\\n')\ntime.sleep(30)\n"
    process = subprocess.Popen([sys.executable, "-c", ready], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert [process.stdout.readline() for _ in range(2)] == ["ready\n"] * 2
        reading = read_tree(process.pid, exact_over=0)
        assert reading.pids[0] == process.pid and reading.started == 1
        assert reading.rss_sum_bytes >= 2 * 64 * MIB  # both map the 64 MiB
        assert reading.pss_sum_bytes is not None and reading.pss_sum_bytes < reading.rss_sum_bytes - 48 * MIB
        assert read_tree(process.pid, exact_over=reading.rss_sum_bytes * 2).pss_sum_bytes is None  # not asked
    finally:
        for pid in descendants(process.pid):
            os.kill(pid, 9)
        process.kill()
        process.wait()


def _fake_proc(root: Path, tree: dict[int, list[int]], pss_kib: dict[int, int]) -> Path:
    """A /proc with ``tree`` (pid -> children, found through two threads each) and each pid's Pss."""
    for pid, children in tree.items():
        tasks = root / str(pid) / "task"
        for tid, half in ((pid, children[: len(children) // 2]), (pid + 1000, children[len(children) // 2:])):
            (tasks / str(tid)).mkdir(parents=True)
            (tasks / str(tid) / "children").write_text("".join(f"{c} " for c in half))
        (root / str(pid) / "statm").write_text("100 25 5 1 0 20 0\n")
        (root / str(pid) / "smaps_rollup").write_text(f"00400000-7fff [rollup]\nRss: 100 kB\nPss: {pss_kib[pid]} kB\n")
    return root


def test_descendants_and_pss_are_read_from_proc(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {10: [11, 12], 11: [13], 12: [], 13: []}, {10: 4, 11: 8, 12: 16, 13: 32})
    assert descendants(10, proc) == [11, 12, 13]
    assert pss_sum([10, 11, 12, 13], proc) == 60 * KIB
    reading = read_tree(10, exact_over=0, proc=proc)
    assert reading.pids == (10, 11, 12, 13) and reading.pss_sum_bytes == 60 * KIB
    assert reading.rss_sum_bytes == 4 * 25 * os.sysconf("SC_PAGE_SIZE")
    assert reading.over(59 * KIB) and not reading.over(60 * KIB)


@pytest.mark.parametrize("gone", [True, False])
def test_a_process_gone_while_read_counts_as_nothing(tmp_path: Path, gone: bool) -> None:
    proc = _fake_proc(tmp_path, {10: [11], 11: []}, {10: 4, 11: 8})
    if gone:
        for name in ("statm", "smaps_rollup", "task/11/children", "task/1011/children"):
            (proc / "11" / name).unlink()
    assert pss_sum([10, 11], proc) == (4 if gone else 12) * KIB


@pytest.mark.parametrize("killed_by_oom", [True, False])
def test_a_worker_the_kernel_kills_for_memory_has_a_result_of_its_own(
    monkeypatch: pytest.MonkeyPatch, killed_by_oom: bool
) -> None:
    import harness.watch as watch_module

    counts = iter([89, 90 if killed_by_oom else 89])
    monkeypatch.setattr(watch_module, "oom_kills", lambda: next(counts))
    outcome = watch([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                    limit_bytes=None, timeout_s=60)
    assert outcome.returncode == -9 and outcome.out_of_memory is killed_by_oom
    outside = watch_module.no_result_of_its_own(outcome, None)
    if killed_by_oom:
        assert outside is None and outcome.reason is not None and "out-of-memory killer" in outcome.reason
    else:
        assert outside == "killed by signal 9"  # a SIGKILL from elsewhere: not the strategy's result


def test_oom_kills_reads_the_kernel_counter(tmp_path: Path) -> None:
    from harness.watch import oom_kills

    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 5\noom_kill 7\n")
    assert oom_kills(vmstat) == 7
    vmstat.write_text("nr_free_pages 5\n")
    assert oom_kills(vmstat) is None
