"""A command run under a kernel memory limit, in a memory cgroup of its own.

The question a budget answers is "does it complete on a host with this much
memory?". The kernel answers it, not a watcher: the command runs in a fresh
memory cgroup whose limit is the budget, with swap off in the group. Page
cache is charged to the group that reads it; under the limit the kernel
reclaims clean file pages (a mapped checkpoint's pages among them) and
OOM-kills only when what is left cannot be reclaimed (anonymous memory, with
no swap to go to).

Where groups are made
    Under the group this process already runs in (``/proc/self/cgroup``), so
    that whatever limit the surrounding container or session sets still holds
    above ours. On cgroup v2 a group that holds processes cannot hand the
    memory controller to children, so when the memory controller is not
    already in this group's ``cgroup.subtree_control`` the groups are made
    beside it, under its parent. The limits of the groups above
    (:meth:`~harness.budget.controller.MemoryController.enclosing`, :mod:`harness.budget.enclosing`) hold
    every group made there: a command OOM-killed while its own group stayed
    below its limit is reported with the enclosing group whose limit it met.

v1 (``/sys/fs/cgroup/memory``) and v2 (``memory.max``), as the budget package sets and reads them
    ===================  ===========================================  ==================================
    what                 v1                                           v2
    ===================  ===========================================  ==================================
    limit                ``memory.limit_in_bytes``                    ``memory.max``
    swap off             ``memory.memsw.limit_in_bytes`` = limit      ``memory.swap.max`` = 0
                         (where swap accounting exists) and
                         ``memory.swappiness`` = 0
    whole group on OOM   (no such knob)                               ``memory.oom.group`` = 1
    peak                 ``memory.max_usage_in_bytes``                ``memory.peak`` (kernel 5.19+)
    OOM kills            ``oom_kill`` in ``memory.oom_control``       ``oom_kill`` in ``memory.events``
                         (kernel 4.13+)
    limit reached        ``memory.failcnt``                           ``max`` in ``memory.events``
    ===================  ===========================================  ==================================

    The peak counts page cache charged to the group: a command that streams a
    file larger than the limit shows a peak at the limit and still completes.
    Seen on Linux 6.18 with v1: an OOM kill adds one to ``oom_kill`` while
    ``under_oom`` is back to 0 by the time the command has exited, and
    ``memory.failcnt`` stayed 0 even then, so the OOM verdict rests on
    ``oom_kill`` alone (``failcnt`` is recorded, not trusted).

How the command joins its group (no race, no ``preexec_fn``)
    The command is started through a small Python wrapper that blocks reading
    a pipe. The parent writes the wrapper's pid into the group's
    ``cgroup.procs``, checks that it arrived, then writes one byte to the
    pipe; only then does the wrapper ``exec`` the command, so every page the
    command touches, and every process it forks, is charged to the group.
    ``preexec_fn`` would do it in the child between fork and exec, but is not
    safe in a parent with threads (the harness runs a stderr pump), and an
    error there surfaces as an opaque ``SubprocessError``; here an error
    joining the group is raised in the parent, naming the file. Before it
    waits, the wrapper sets ``PR_SET_PDEATHSIG`` (see Cleanup) and exits if its
    parent is already gone; a parent that dies while it waits closes the pipe,
    and the wrapper exits without running the command.

Cleanup
    :meth:`MemoryGroup.create` is a context manager: on the way out, however it
    is left (an exception, ``KeyboardInterrupt``, a caught signal raised as
    :class:`~harness.stopping.Interrupted`), every task still in the group
    is killed, the processes it started are reaped, and the directory is
    removed; making the group, starting a process in it and removing it are
    never cut short by a caught signal (:func:`~harness.stopping.deferred`).
    The wrapper asks the kernel to SIGKILL it, and so the command it becomes, when
    the parent dies (``PR_SET_PDEATHSIG``), so a parent killed outright (``SIGKILL``)
    leaves no command running. It leaves its group behind (and anything the command
    started); group names carry the owner's pid and start time,
    and each :meth:`MemoryGroup.create` removes groups with its prefix whose owner
    is gone (killing what is left in them), never those of a live owner.

Without a usable memory cgroup (no controller mounted, not delegated to this
process, no permission, a read-only file system) :class:`~harness.budget.controller.CgroupUnavailable` says
so; nothing falls back to a watcher.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness.budget.controller import (
    GroupReading,
    MemoryController,
    find_controller,
    group_files,
    read_group,
    unavailable,
)
from harness.budget.enclosing import AT_LIMIT_SLACK, Enclosing, limit_reached, read_marks
from harness.measure.coldcache import prepare_cold
from harness.stopping import deferred
from harness.units import MIB, gib_or_mib

__all__ = [
    "DEFAULT_PREFIX",
    "Attempt",
    "MemoryGroup",
    "remove_stale_groups",
    "run_in_group",
]

DEFAULT_PREFIX = "weightmap-bench"

_PROCS = "cgroup.procs"

# The wrapper that waits, inside its group, for the parent's go-ahead before exec. It first
# asks to be SIGKILLed when its parent dies (PR_SET_PDEATHSIG = 1, kept across exec), then
# checks the parent is still the one that started it (it may have died before the request).
# argv: [python, -I, -S, -c, CODE, fd, parent pid, command...]
_WRAPPER = (
    "import os, sys\n"
    "try:\n"
    "    import ctypes, signal\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[2]):\n"
    "    os._exit(125)\n"
    "fd = int(sys.argv[1])\n"
    "if os.read(fd, 1) != b'1':\n"
    "    os._exit(125)\n"
    "os.close(fd)\n"
    "try:\n"
    "    os.execvp(sys.argv[3], sys.argv[3:])\n"
    "except OSError as exc:\n"
    "    sys.stderr.write(f'cannot run {sys.argv[3]!r}: {exc.strerror}\\n')\n"
    "    os._exit(127)\n"
)


# --------------------------------------------------------------------------- owners and stale groups


def _start_ticks(pid: int, *, zombie_is_gone: bool = False) -> int | None:
    """A process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22); None if gone.

    With ``zombie_is_gone``, a process that has exited but not been reaped (state ``Z``) is gone too.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    if zombie_is_gone and fields and fields[0] == "Z":
        return None
    return int(fields[19]) if len(fields) > 19 else None


def _name_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(re.escape(prefix) + r"-(\d+)-(\d+)-[0-9a-f]{8}")


def _pids(path: Path) -> list[int]:
    return [int(word) for word in (path / _PROCS).read_text().split()]


def _kill_and_remove(path: Path, timeout_s: float, reap: Iterable[subprocess.Popen[Any]] = ()) -> None:
    """Kill every task in the group until it is empty, reap ``reap``, remove the directory."""
    deadline = time.monotonic() + timeout_s
    children = list(reap)
    while True:
        try:
            pids = _pids(path)
        except FileNotFoundError:
            return  # already gone
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for child in children:
            child.poll()  # reap our own children so that they do not linger as zombies
        if not pids:
            try:
                path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
        if time.monotonic() > deadline:
            raise OSError(errno.EBUSY, f"{path}: tasks {pids} are still in the group after "
                                       f"{timeout_s:.0f} s of SIGKILL; remove it by hand")
        time.sleep(0.01)


def remove_stale_groups(controller: MemoryController, prefix: str = DEFAULT_PREFIX,
                        timeout_s: float = 10.0) -> list[Path]:
    """Remove groups named ``<prefix>-<pid>-<start>-<token>`` whose owner process is gone.

    A group whose owner (same pid, same start time) still runs belongs to a run in
    progress and is left alone; an owner that has exited but was not reaped (a zombie) is
    gone. What is left in a stale group (a benchmark process
    orphaned by a crashed run) is killed first. Returns the groups removed; one that
    cannot be removed is reported with a warning and left.
    """
    pattern, removed = _name_pattern(prefix), []
    try:
        children = sorted(controller.parent.iterdir())
    except OSError:
        return []
    for child in children:
        match = pattern.fullmatch(child.name)
        if match is None or not child.is_dir():
            continue
        owner, started = int(match.group(1)), int(match.group(2))
        if _start_ticks(owner, zombie_is_gone=True) == started:
            continue  # an owner that exited unreaped (its parent stopped, say) owns nothing any more
        try:
            _kill_and_remove(child, timeout_s)
            removed.append(child)
        except OSError as exc:
            warnings.warn(f"cannot remove the stale memory cgroup {child}: {exc}", stacklevel=2)
    return removed


# --------------------------------------------------------------------------- the group


def _write(path: Path, value: str) -> None:
    """``value`` written in place to a group's control file (a kernel interface, not a file on disk: no
    temporary file and rename, as the harness's other files get, :mod:`harness.fileio.atomic`)."""
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as exc:
        raise unavailable(f"cannot write {value!r} to {path}: {exc.strerror}") from exc


class MemoryGroup:
    """A memory cgroup of this process's making, with a limit and swap off. Use :meth:`create`."""

    def __init__(self, controller: MemoryController, path: Path, limit_bytes: int, swap_note: str) -> None:
        self.controller = controller
        self.path = path
        self.limit_bytes = limit_bytes
        self.swap_note = swap_note
        """How swap was turned off in the group (a line for the results)."""
        self._children: list[subprocess.Popen[Any]] = []

    @classmethod
    @contextlib.contextmanager
    def create(cls, limit_bytes: int, name_prefix: str = DEFAULT_PREFIX,
               controller: MemoryController | None = None) -> Iterator[MemoryGroup]:
        """Make a uniquely named group with ``limit_bytes`` and swap off; remove it on the way out.

        Stale groups with the same prefix are removed first (see :func:`remove_stale_groups`).
        Raises :class:`~harness.budget.controller.CgroupUnavailable` when the group cannot be made or limited.
        """
        if limit_bytes < 4096:
            raise ValueError(f"a memory limit of {limit_bytes} bytes is below one page")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name_prefix):
            raise ValueError(f"group name prefix {name_prefix!r} must be letters, digits, '_', '.' or '-'")
        controller = controller or find_controller()
        group: MemoryGroup | None = None
        try:
            with deferred():  # a caught signal waits until the group is made and will be removed
                remove_stale_groups(controller, name_prefix)
                group = cls._make(controller, limit_bytes, name_prefix)
            yield group
        finally:
            if group is not None:
                with deferred():
                    group.remove()

    @classmethod
    def _make(cls, controller: MemoryController, limit_bytes: int, prefix: str) -> MemoryGroup:
        pid = os.getpid()
        path = controller.parent / f"{prefix}-{pid}-{_start_ticks(pid) or 0}-{secrets.token_hex(4)}"
        try:
            path.mkdir()
        except OSError as exc:
            raise unavailable(f"cannot create {path}: {exc.strerror}") from exc
        try:
            files = group_files(controller.version)
            if not (path / files.limit).exists():
                raise unavailable(f"{controller.parent} is not a memory cgroup: the new directory {path.name} "
                                   f"has no {files.limit}")
            _write(path / files.limit, str(limit_bytes))
            if controller.version == 1:
                notes = []
                if (path / "memory.memsw.limit_in_bytes").exists():
                    _write(path / "memory.memsw.limit_in_bytes", str(limit_bytes))
                    notes.append("memory.memsw.limit_in_bytes = limit")
                _write(path / "memory.swappiness", "0")
                notes.append("memory.swappiness = 0")
                swap_note = ", ".join(notes)
            else:
                swap_note = "no swap accounting in this kernel: swap not limited"
                if (path / "memory.swap.max").exists():
                    _write(path / "memory.swap.max", "0")
                    swap_note = "memory.swap.max = 0"
                if (path / "memory.oom.group").exists():
                    _write(path / "memory.oom.group", "1")
        except BaseException:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise
        return cls(controller, path, limit_bytes, swap_note)

    def popen(self, command: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``command`` inside the group (see the module's docstring for how it joins).

        ``kwargs`` go to :class:`subprocess.Popen`. The process is in the group before the
        command's first instruction; it is killed and reaped when the group is removed.
        """
        if not command:
            raise ValueError("empty command")
        read_fd, write_fd = os.pipe()
        pass_fds = tuple(kwargs.pop("pass_fds", ())) + (read_fd,)
        argv = [sys.executable, "-I", "-S", "-c", _WRAPPER, str(read_fd), str(os.getpid()), *command]
        with deferred():  # a caught signal waits until the process is in the group and in _children
            try:
                process = subprocess.Popen(argv, pass_fds=pass_fds, **kwargs)
            except BaseException:
                os.close(read_fd)
                os.close(write_fd)
                raise
            os.close(read_fd)
            self._children.append(process)
            try:
                self._join(process.pid)
                os.write(write_fd, b"1")
            except BaseException:
                process.kill()
                process.wait()
                raise
            finally:
                os.close(write_fd)
        return process

    def _join(self, pid: int) -> None:
        procs = self.path / _PROCS
        _write(procs, str(pid))
        if pid not in _pids(self.path):
            raise unavailable(f"wrote pid {pid} to {procs}, but it is not listed there")

    def pids(self) -> list[int]:
        """The processes in the group now ([] once it is gone)."""
        try:
            return _pids(self.path)
        except FileNotFoundError:
            return []

    def read(self) -> GroupReading:
        """The group's peak and OOM counters as the kernel has them now."""
        return read_group(self.controller.version, self.path)

    def kill(self) -> None:
        """SIGKILL every process in the group (the group stays)."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, timeout_s: float = 10.0) -> None:
        """Kill what is left in the group, reap the processes it started, remove the directory."""
        _kill_and_remove(self.path, timeout_s, self._children)
        for child in self._children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=timeout_s)


# --------------------------------------------------------------------------- one attempt


@dataclass(frozen=True)
class Attempt:
    """One run of a command under one memory limit.

    ``completed`` is True when the command exited with status 0 before the timeout.
    ``reason`` says why it did not (an OOM kill seen in the group's counters, a signal,
    a status, the timeout), or notes an OOM kill the command survived. ``group_peak_bytes``
    and ``oom_kills`` are the kernel's figures for the group (None where it keeps none);
    ``counters`` holds every counter read.
    """

    limit_bytes: int
    completed: bool
    returncode: int | None
    wall_s: float
    group_peak_bytes: int | None
    oom_kills: int | None
    reason: str | None
    counters: Mapping[str, int] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """A flat record for a CSV or a data frame."""
        return {"limit_bytes": self.limit_bytes, "completed": self.completed, "returncode": self.returncode,
                "wall_s": round(self.wall_s, 3), "group_peak_bytes": self.group_peak_bytes,
                "oom_kills": self.oom_kills, "reason": self.reason or ""}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _reason(limit: int, returncode: int | None, timed_out: bool, timeout_s: float,
            reading: GroupReading, tail: Sequence[str], above: Enclosing | None = None) -> str | None:
    """Why the command did not complete (or the OOM kill it survived); ``above``: the enclosing group whose limit
    was reached meanwhile, where the group itself stayed below its own (see :func:`run_in_group`)."""
    where = f"under a {gib_or_mib(limit)} limit"
    kills = reading.oom_kills or 0
    peak = reading.peak_bytes
    if above is not None:  # not its own limit: say whose, and how far below its own the group stayed
        peaked = "" if peak is None else f", its group peaking at {gib_or_mib(peak)}"
        where = f"under {above.describe()}, not its own group's {gib_or_mib(limit)} limit{peaked}"
    if timed_out:
        return f"stopped after the timeout of {timeout_s:.0f} s under a {gib_or_mib(limit)} limit"
    if kills:
        if returncode == 0:
            return f"completed, but the kernel OOM-killed {kills} process(es) in its group {where}"
        if above is not None:
            return f"OOM-killed by the kernel {where} ({kills} OOM kill(s) in the group's counters)"
        return f"OOM-killed by the kernel in its memory cgroup {where} ({kills} OOM kill(s) in the group's counters)"
    if returncode is not None and returncode < 0:
        text = f"killed by {_signal_name(-returncode)} {where}"
        if reading.oom_kills is None and peak is not None and peak >= limit - MIB:
            text += ", with the group at its limit (this kernel does not count OOM kills: out of memory?)"
        return text
    if returncode:
        last = " | ".join(line for line in list(tail)[-3:] if line)
        return f"exited with status {returncode} {where}" + (f": {last}" if last else "")
    return None


def _pump(stream: IO[str], tail: collections.deque[str], echo: bool) -> None:
    for line in stream:
        if echo:
            sys.stderr.write(line)
            sys.stderr.flush()
        tail.append(line.rstrip())


def run_in_group(command: Sequence[str], limit_bytes: int, timeout_s: float, *,
                 env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
                 cold_files: Iterable[str | os.PathLike[str]] = (), echo_stderr: bool = True,
                 stdout: int | IO[Any] | None = None, name_prefix: str = DEFAULT_PREFIX,
                 controller: MemoryController | None = None) -> Attempt:
    """Run ``command`` once in a fresh memory group limited to ``limit_bytes``; never leaves the group behind.

    ``cold_files`` are dropped from the page cache just before the start (see
    :func:`harness.measure.coldcache.prepare_cold`), so that the group is charged for
    reading them. The command's stderr is passed through (``echo_stderr``) and its last
    lines kept for the reason of a failure. ``wall_s`` runs from the command's release
    into its group to its exit. Raises :class:`~harness.budget.controller.CgroupUnavailable` when no group can be
    made; a failure of the command itself is an :class:`Attempt` with ``completed=False``.

    A command killed while its group stayed below its own limit (its peak more than
    :data:`~harness.budget.enclosing.AT_LIMIT_SLACK` under it) was killed for another limit: the
    reason names the enclosing group whose limit was reached during the run
    (:func:`~harness.budget.enclosing.limit_reached`), where one was.
    """
    tail: collections.deque[str] = collections.deque(maxlen=20)
    with MemoryGroup.create(limit_bytes, name_prefix, controller) as group:
        cold = list(cold_files)
        if cold:
            prepare_cold(cold, settle=False)
        enclosing = group.controller.enclosing()
        marks = read_marks(group.controller.version, enclosing)
        process = group.popen(list(command), env=None if env is None else dict(env), cwd=cwd, stdout=stdout,
                              stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)
        started = time.monotonic()
        assert process.stderr is not None
        pump = threading.Thread(target=_pump, args=(process.stderr, tail, echo_stderr), daemon=True)
        pump.start()
        timed_out = False
        try:
            returncode: int | None = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            group.kill()
            returncode = process.wait()
        wall_s = time.monotonic() - started
        group.kill()  # anything the command left running
        pump.join(timeout=5)
        reading = group.read()
        above = None
        killed = bool(reading.oom_kills) or (returncode == -signal.SIGKILL and not timed_out)  # the OOM killer's
        if killed and (reading.peak_bytes is None or reading.peak_bytes < limit_bytes - AT_LIMIT_SLACK):
            above = limit_reached(enclosing, marks, read_marks(group.controller.version, enclosing))
    reason = _reason(limit_bytes, returncode, timed_out, timeout_s, reading, tail, above)
    return Attempt(limit_bytes=limit_bytes, completed=returncode == 0 and not timed_out, returncode=returncode,
                   wall_s=wall_s, group_peak_bytes=reading.peak_bytes, oom_kills=reading.oom_kills,
                   reason=reason, counters=reading.counters)
