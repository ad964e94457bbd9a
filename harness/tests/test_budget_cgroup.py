"""Budget runs in a real memory cgroup (skipped, with the reason, where none is writable).

Each test keeps its own memory small: a child allocates at most 300 MiB, and the
page-cache test streams a 512 MiB file through a 128 MiB limit.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.budget.cgroup import MemoryGroup, _start_ticks, remove_stale_groups, run_in_group
from harness.budget.controller import CgroupUnavailable, MemoryController, find_controller, read_group
from harness.budget.enclosing import Enclosing, effective_limit, enclosing_groups, limit_reached, read_marks
from harness.tests.processes import gone_within
from harness.units import GIB, MIB

# One prefix per test process: groups are named in the machine's cgroup tree, which another test run
# beside this one shares; each run removes and counts only its own (a stale group another run made
# for its own test would otherwise be removed, and counted, here).
PREFIX = f"weightmap-bench-test{os.getpid()}"

ALLOCATE_300_MIB = (
    "b = bytearray(300 << 20)\n"
    "b[::4096] = b'\\x01' * (len(b) // 4096)\n"  # touch every page: anonymous, resident
)


def _children(controller: MemoryController) -> set[str]:
    # Only this process's groups (named with its pid): a budget run, or another run of these
    # tests on the same machine, may make and remove groups meanwhile.
    mine = f"{PREFIX}-{os.getpid()}-"
    return {p.name for p in controller.parent.iterdir() if p.is_dir() and p.name.startswith(mine)}


@pytest.fixture
def no_leftovers(controller: MemoryController):
    """Every test leaves the parent's children (with the tests' prefix) as it found them."""
    before = _children(controller)
    yield
    assert _children(controller) == before


def test_anonymous_memory_over_the_limit_is_oom_killed_and_recorded(controller, no_leftovers) -> None:
    attempt = run_in_group([sys.executable, "-c", ALLOCATE_300_MIB], 128 * MIB, 60, controller=controller,
                           name_prefix=PREFIX)
    assert not attempt.completed
    assert attempt.returncode == -9
    assert attempt.oom_kills is not None and attempt.oom_kills >= 1
    assert attempt.reason is not None and "OOM-killed" in attempt.reason and "128 MiB" in attempt.reason
    assert attempt.group_peak_bytes is not None and attempt.group_peak_bytes <= 128 * MIB


def test_under_a_larger_limit_it_completes_with_its_peak(controller, no_leftovers) -> None:
    attempt = run_in_group([sys.executable, "-c", ALLOCATE_300_MIB], 1024 * MIB, 60, controller=controller,
                           name_prefix=PREFIX)
    assert attempt.completed, attempt.reason
    assert attempt.returncode == 0 and attempt.reason is None and attempt.oom_kills == 0
    assert attempt.group_peak_bytes is not None
    assert 300 * MIB <= attempt.group_peak_bytes < 1024 * MIB
    assert attempt.wall_s > 0


def test_clean_page_cache_is_reclaimed_under_the_limit(controller, no_leftovers, tmp_path: Path) -> None:
    data = tmp_path / "big.bin"
    chunk = bytes(range(256)) * 4096  # 1 MiB, not zeros
    with open(data, "wb") as f:
        for _ in range(512):
            f.write(chunk)
    reader = (
        "import sys\n"
        "n = 0\n"
        "with open(sys.argv[1], 'rb', buffering=0) as f:\n"
        "    while block := f.read(1 << 20):\n"
        "        n += len(block)\n"
        "sys.exit(0 if n == 512 << 20 else 3)\n"
    )
    attempt = run_in_group([sys.executable, "-c", reader, str(data)], 128 * MIB, 120, cold_files=[data],
                           controller=controller, name_prefix=PREFIX)
    assert attempt.completed, attempt.reason
    peak = attempt.group_peak_bytes
    assert peak is not None and peak <= 128 * MIB
    # Dropped from the cache first, the file's pages were charged to the group: it filled up to its limit.
    assert peak >= 96 * MIB


def test_the_command_runs_in_its_group_from_its_first_instruction(controller, no_leftovers, tmp_path) -> None:
    out = tmp_path / "cgroup.txt"
    with open(out, "w") as f:
        attempt = run_in_group(["cat", "/proc/self/cgroup"], 64 * MIB, 30, stdout=f, controller=controller,
                               name_prefix=PREFIX)
    assert attempt.completed, attempt.reason
    memory = [line for line in out.read_text().splitlines()
              if "memory" in line.split(":")[1].split(",") or line.startswith("0::")]
    assert memory and f"/{PREFIX}-{os.getpid()}-" in memory[0]


def test_a_timeout_stops_the_command(controller, no_leftovers) -> None:
    attempt = run_in_group(["sleep", "60"], 64 * MIB, 0.5, controller=controller, name_prefix=PREFIX)
    assert not attempt.completed
    assert attempt.reason is not None and "timeout" in attempt.reason
    assert attempt.returncode == -9  # SIGKILL at the timeout: a sleep left to its end exits 0


def test_a_failing_command_is_recorded_with_its_status_and_last_words(controller, no_leftovers) -> None:
    code = "import sys; print('no checkpoint here', file=sys.stderr); sys.exit(3)"
    attempt = run_in_group([sys.executable, "-c", code], 64 * MIB, 30, echo_stderr=False, controller=controller,
                           name_prefix=PREFIX)
    assert not attempt.completed and attempt.returncode == 3
    assert attempt.reason is not None and "status 3" in attempt.reason and "no checkpoint here" in attempt.reason


def test_what_the_command_leaves_running_is_killed(controller, no_leftovers, tmp_path) -> None:
    pid_file = tmp_path / "pid"
    attempt = run_in_group(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; exit 0"], 64 * MIB, 30,
                           controller=controller, name_prefix=PREFIX)
    assert attempt.completed, attempt.reason
    assert gone_within(int(pid_file.read_text()))


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_leaving_the_group_by_an_error_kills_its_tasks_and_removes_it(controller, no_leftovers, error) -> None:
    with pytest.raises(error), MemoryGroup.create(64 * MIB, PREFIX, controller) as group:
        process = group.popen(["sleep", "60"])
        path = group.path
        assert group.pids() == [process.pid]
        raise error("interrupted")
    assert not path.exists()
    assert process.returncode == -9


def test_the_group_has_the_limit_and_no_swap(controller, no_leftovers) -> None:
    with MemoryGroup.create(96 * MIB, PREFIX, controller) as group:
        if controller.version == 1:
            assert int((group.path / "memory.limit_in_bytes").read_text()) == 96 * MIB
            assert int((group.path / "memory.swappiness").read_text()) == 0
            memsw = group.path / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                assert int(memsw.read_text()) == 96 * MIB
        else:
            assert int((group.path / "memory.max").read_text()) == 96 * MIB
            if (group.path / "memory.swap.max").exists():
                assert (group.path / "memory.swap.max").read_text().strip() == "0"


def test_a_stale_group_of_a_dead_owner_is_removed_and_a_live_owners_kept(controller, no_leftovers) -> None:
    owner = subprocess.Popen(["sleep", "30"])
    owner_ticks = _start_ticks(owner.pid)
    owner.kill()
    owner.wait()
    stale = controller.parent / f"{PREFIX}-{owner.pid}-{owner_ticks}-deadbeef"
    live = controller.parent / f"{PREFIX}-{os.getpid()}-{_start_ticks(os.getpid())}-0badcafe"
    stale.mkdir()
    live.mkdir()
    orphan = subprocess.Popen(["sleep", "60"])
    try:
        (stale / "cgroup.procs").write_text(str(orphan.pid))
        with MemoryGroup.create(64 * MIB, PREFIX, controller):
            assert not stale.exists()
            assert live.exists()
        assert orphan.wait(timeout=10) == -9
    finally:
        orphan.kill()
        orphan.wait()
        for path in (stale, live):
            if path.exists():
                path.rmdir()


def test_a_group_whose_owner_exited_unreaped_is_stale(controller, no_leftovers) -> None:
    owner = subprocess.Popen(["true"])  # exits at once; not reaped until wait(): a zombie meanwhile
    deadline = time.monotonic() + 10
    while Path(f"/proc/{owner.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    ticks = _start_ticks(owner.pid)
    assert ticks is not None and _start_ticks(owner.pid, zombie_is_gone=True) is None
    stale = controller.parent / f"{PREFIX}-{owner.pid}-{ticks}-feedface"
    stale.mkdir()
    try:
        assert remove_stale_groups(controller, PREFIX) == [stale]
        assert not stale.exists()
    finally:
        owner.wait()
        if stale.exists():
            stale.rmdir()


def test_remove_stale_groups_leaves_other_names_alone(controller, no_leftovers) -> None:
    other = controller.parent / f"{PREFIX}-not-ours"
    other.mkdir()
    try:
        assert remove_stale_groups(controller, PREFIX) == []
        assert other.exists()
    finally:
        other.rmdir()


# --------------------------------------------------------------------------- without a usable cgroup


def _fake_proc(tmp_path: Path, mountinfo: str, cgroup: str) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(mountinfo)
    (proc / "cgroup").write_text(cgroup)
    return proc


def test_no_memory_controller_is_refused_plainly(tmp_path) -> None:
    proc = _fake_proc(tmp_path, "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw\n", "0::/\n")
    with pytest.raises(CgroupUnavailable, match=r"^budget mode needs a writable memory cgroup: no memory controller"):
        find_controller(proc)


def test_a_directory_that_is_not_a_cgroup_is_refused_and_left_clean(tmp_path) -> None:
    fake = MemoryController(1, tmp_path, tmp_path)
    refused = r"^budget mode needs a writable memory cgroup: .* not a memory cgroup"
    with pytest.raises(CgroupUnavailable, match=refused), MemoryGroup.create(64 * MIB, PREFIX, fake):
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_parent_that_cannot_be_written_is_refused(tmp_path) -> None:
    fake = MemoryController(1, tmp_path / "absent", tmp_path / "absent")
    refused = r"^budget mode needs a writable memory cgroup: cannot create"
    with pytest.raises(CgroupUnavailable, match=refused), MemoryGroup.create(64 * MIB, PREFIX, fake):
        pass


def test_v1_group_found_from_mountinfo_and_proc_cgroup(tmp_path) -> None:
    mount = tmp_path / "memory"
    own = mount / "session" / "abc"
    own.mkdir(parents=True)
    (own / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    proc = _fake_proc(
        tmp_path,
        f"35 31 0:32 / {mount} rw,relatime - cgroup cgroup rw,memory\n"
        f"41 31 0:38 / {tmp_path / 'unified'} rw,relatime - cgroup2 cgroup2 rw\n",
        "5:devices:/\n4:memory:/session/abc\n0::/\n",
    )
    assert find_controller(proc) == MemoryController(1, own, own)


@pytest.mark.parametrize("delegated", [True, False])
def test_v2_groups_go_under_this_group_when_delegated_else_beside_it(tmp_path, delegated) -> None:
    mount = tmp_path / "cg2"
    own = mount / "user.slice" / "run.scope"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("memory\n" if delegated else "\n")
    proc = _fake_proc(tmp_path, f"30 23 0:26 / {mount} rw,nosuid - cgroup2 cgroup2 rw\n", "0::/user.slice/run.scope\n")
    assert find_controller(proc) == MemoryController(2, own, own if delegated else own.parent)


def test_v2_without_the_memory_controller_is_refused(tmp_path) -> None:
    mount = tmp_path / "cg2"
    mount.mkdir()
    (mount / "cgroup.controllers").write_text("cpu io pids\n")
    proc = _fake_proc(tmp_path, f"30 23 0:26 / {mount} rw - cgroup2 cgroup2 rw\n", "0::/\n")
    with pytest.raises(CgroupUnavailable, match="memory controller is not enabled"):
        find_controller(proc)


def test_v2_counters_are_read_from_memory_events_and_peak(tmp_path) -> None:
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n")
    (tmp_path / "memory.peak").write_text("134217728\n")
    reading = read_group(2, tmp_path)
    assert reading.peak_bytes == 128 * MIB and reading.oom_kills == 1
    assert reading.counters["memory.events:max"] == 12


def test_v1_counters_are_read_from_oom_control_and_max_usage(tmp_path) -> None:
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (tmp_path / "memory.max_usage_in_bytes").write_text("4096\n")
    (tmp_path / "memory.failcnt").write_text("7\n")
    reading = read_group(1, tmp_path)
    assert reading.peak_bytes == 4096 and reading.oom_kills == 3 and reading.counters["memory.failcnt"] == 7
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")  # kernels before 4.13
    assert read_group(1, tmp_path).oom_kills is None


def test_a_sweep_of_real_runs_finds_what_the_command_needs(controller, no_leftovers) -> None:
    from harness.budget.sweep import smallest_limit

    def attempt(limit: int):
        return run_in_group([sys.executable, "-c", ALLOCATE_300_MIB], limit, 60, controller=controller,
                            name_prefix=PREFIX)

    sweep = smallest_limit(attempt, 64 * MIB, 1024 * MIB, 32 * MIB, extra_factors=(1.5,))
    assert sweep.largest_failing_bytes is not None
    # 300 MiB of anonymous memory plus the interpreter's own (a few MiB charged to the group).
    assert 300 * MIB < sweep.minimum_bytes <= 300 * MIB + 64 * MIB
    assert sweep.minimum_bytes - sweep.largest_failing_bytes <= 32 * MIB
    failed = [a for a in sweep.attempts if not a.completed]
    assert failed and all(a.oom_kills and "OOM-killed" in (a.reason or "") for a in failed)


# --------------------------------------------------------------------------- limits of the groups above


@contextlib.contextmanager
def _enclosing(controller: MemoryController, limit: int, memsw: bool = False) -> Iterator[MemoryController]:
    """A group under ``controller.parent`` limited to ``limit`` (on v1 with ``memsw``, its memory + swap too), and
    a controller that makes its groups inside it: as a job's or a container's limit encloses the harness's."""
    path = controller.parent / f"{PREFIX}-enclosing"
    path.mkdir()
    try:
        if controller.version == 1:
            (path / "memory.limit_in_bytes").write_text(str(limit))
            if memsw:
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
        else:
            (path / "memory.max").write_text(str(limit))
            (path / "cgroup.subtree_control").write_text("+memory")
        yield MemoryController(controller.version, path, path, controller.mount)
    finally:
        path.rmdir()


@pytest.mark.parametrize("memsw", [False, True])
def test_a_kill_by_an_enclosing_groups_limit_names_that_group(controller, no_leftovers, memsw: bool) -> None:
    if memsw and not (controller.parent / "memory.memsw.limit_in_bytes").exists():
        pytest.skip("no memory + swap limit on this controller (v2, or v1 without swap accounting)")
    with _enclosing(controller, 192 * MIB, memsw) as inside:
        attempt = run_in_group([sys.executable, "-c", ALLOCATE_300_MIB], 1024 * MIB, 60, controller=inside,
                               name_prefix=PREFIX)
        enclosing = inside.parent
    assert not attempt.completed and attempt.returncode == -9
    assert attempt.reason is not None
    assert attempt.reason.startswith(f"OOM-killed by the kernel under the 192 MiB limit of the enclosing memory "
                                     f"cgroup {enclosing} (")
    assert "not its own group's 1.00 GiB limit, its group peaking at " in attempt.reason


def test_a_kill_by_the_groups_own_limit_names_none_above(controller, no_leftovers) -> None:
    with _enclosing(controller, 512 * MIB) as inside:
        attempt = run_in_group([sys.executable, "-c", ALLOCATE_300_MIB], 128 * MIB, 60, controller=inside,
                               name_prefix=PREFIX)
    assert attempt.reason is not None and "in its memory cgroup under a 128 MiB limit" in attempt.reason
    assert "enclosing" not in attempt.reason


def test_what_the_command_starts_is_in_its_group_and_counted(controller, no_leftovers, tmp_path) -> None:
    out = tmp_path / "child-cgroup.txt"
    # the command writes nothing and allocates nothing: its child writes its cgroup, then touches 300 MiB
    spawn = ("import subprocess, sys\n"
             "child = 'import sys\\nopen(sys.argv[1], \"w\").write(open(\"/proc/self/cgroup\").read())\\n'\n"
             "sys.exit(subprocess.call([sys.executable, '-c', child + sys.argv[2], sys.argv[1]]))\n")
    under = run_in_group([sys.executable, "-c", spawn, str(out), ALLOCATE_300_MIB], 1024 * MIB, 60,
                         controller=controller, name_prefix=PREFIX)
    assert under.completed, under.reason
    assert under.group_peak_bytes is not None and under.group_peak_bytes >= 300 * MIB  # the child's, charged here
    memory = [line for line in out.read_text().splitlines()
              if "memory" in line.split(":")[1].split(",") or line.startswith("0::")]
    assert memory and f"/{PREFIX}-{os.getpid()}-" in memory[0]
    over = run_in_group([sys.executable, "-c", spawn, str(out), ALLOCATE_300_MIB], 128 * MIB, 60,
                        controller=controller, name_prefix=PREFIX)
    assert not over.completed and over.oom_kills and "OOM-killed" in (over.reason or "")


V1_MAX = "9223372036854771712\n"


def _meminfo(tmp_path: Path, gib: int) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {gib << 20} kB\nMemFree:        1024 kB\n")
    return path


def _tree(mount: Path, limits: dict[str, str], name: str) -> None:
    """``mount/<path>`` directories, each with ``name`` holding its limit."""
    for relative, limit in limits.items():
        group = mount / relative if relative else mount
        group.mkdir(parents=True, exist_ok=True)
        (group / name).write_text(limit)


def test_v1_effective_limit_is_the_smallest_of_the_groups_above_and_the_machine(tmp_path) -> None:
    mount = tmp_path / "memory"
    _tree(mount, {"": V1_MAX, "slurm": V1_MAX, "slurm/uid_0": str(2 * GIB), "slurm/uid_0/job_7": str(560 * MIB)},
          "memory.limit_in_bytes")
    proc = _fake_proc(tmp_path, f"35 31 0:32 / {mount} rw,relatime - cgroup cgroup rw,memory\n",
                      "4:memory:/slurm/uid_0/job_7\n0::/\n")
    controller = find_controller(proc)
    job, uid = mount / "slurm/uid_0/job_7", mount / "slurm/uid_0"
    assert [(g.path, g.limit_bytes) for g in controller.enclosing()] == [(job, 560 * MIB), (uid, 2 * GIB)]
    effective = effective_limit(controller.enclosing(), _meminfo(tmp_path, 24))
    assert effective.limit_bytes == 560 * MIB
    assert effective.describe() == f"the 560 MiB limit of the enclosing memory cgroup {job} (memory.limit_in_bytes)"
    unlimited = effective_limit(enclosing_groups(1, mount, mount), _meminfo(tmp_path, 24))
    assert (unlimited.limit_bytes, unlimited.describe()) == (24 * GIB, "the machine's memory (MemTotal)")
    assert effective_limit(controller.enclosing(), _meminfo(tmp_path, 1)).limit_bytes == 560 * MIB
    assert effective_limit(controller.enclosing(), _meminfo(tmp_path, 0)).group is None  # less memory than any


def test_v1_a_group_above_without_hierarchy_does_not_enclose(tmp_path) -> None:
    mount = tmp_path / "memory"
    _tree(mount, {"": V1_MAX, "top": str(256 * MIB), "top/job": V1_MAX}, "memory.limit_in_bytes")
    (mount / "top" / "memory.use_hierarchy").write_text("0\n")
    assert enclosing_groups(1, mount / "top" / "job", mount) == []
    (mount / "top" / "memory.use_hierarchy").write_text("1\n")
    assert [g.limit_bytes for g in enclosing_groups(1, mount / "top" / "job", mount)] == [256 * MIB]


@pytest.mark.parametrize("delegated", [True, False])
def test_v2_effective_limit_counts_the_groups_that_enclose_the_ones_made(tmp_path, delegated: bool) -> None:
    mount = tmp_path / "cg2"
    _tree(mount, {"kubepods.slice": str(3 * GIB), "kubepods.slice/pod": "max\n",
                  "kubepods.slice/pod/container": str(700 * MIB)}, "memory.max")
    own = mount / "kubepods.slice/pod/container"
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text("memory\n" if delegated else "\n")
    proc = _fake_proc(tmp_path, f"30 23 0:26 / {mount} rw,nosuid - cgroup2 cgroup2 rw\n",
                      "0::/kubepods.slice/pod/container\n")
    controller = find_controller(proc)
    # delegated, groups are made in the container's group and its limit holds them; else they are its siblings
    expected = [own, mount / "kubepods.slice"] if delegated else [mount / "kubepods.slice"]
    assert [g.path for g in controller.enclosing()] == expected
    effective = effective_limit(controller.enclosing(), _meminfo(tmp_path, 24))
    assert effective.limit_bytes == (700 * MIB if delegated else 3 * GIB)


def test_the_limit_reached_is_read_from_the_counters_then_the_peaks(tmp_path) -> None:
    inner, outer = tmp_path / "job", tmp_path
    groups = [Enclosing(inner, "memory.max", 512 * MIB), Enclosing(outer, "memory.max", GIB)]
    (inner / "memory.events.local").parent.mkdir()
    (inner / "memory.events.local").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    (outer / "memory.events.local").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (inner / "memory.peak").write_text(f"{512 * MIB}\n")  # at its limit, but long before
    before = read_marks(2, groups)
    (outer / "memory.events.local").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n")
    assert limit_reached(groups, before, read_marks(2, groups)) == groups[1]  # the counters say the outer
    assert limit_reached(groups, before, before) == groups[0]  # no counter rose: the peak at its limit
    (inner / "memory.peak").write_text(f"{100 * MIB}\n")
    assert limit_reached(groups, read_marks(2, groups), read_marks(2, groups)) is None
    v1 = [Enclosing(inner, "memory.limit_in_bytes", 512 * MIB)]
    (inner / "memory.failcnt").write_text("0\n")
    (inner / "memory.max_usage_in_bytes").write_text(f"{10 * MIB}\n")
    before = read_marks(1, v1)
    (inner / "memory.failcnt").write_text("4\n")
    assert limit_reached(v1, before, read_marks(1, v1)) == v1[0]
