"""The memory controller found and a memory group's counters read, under cgroup v1 or v2.

:func:`find_controller` finds, from ``/proc/self/mountinfo`` and ``/proc/self/cgroup``, the memory controller
this process can make groups with and where they go (:class:`MemoryController`); :func:`read_group` reads what
the kernel counted for one group (:class:`GroupReading`), with the files of each version
(:mod:`harness.budget.cgroup`'s table). Without a usable controller :class:`CgroupUnavailable` says what is
missing. :mod:`harness.budget.cgroup` makes the groups and runs commands in them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.budget.enclosing import Enclosing, enclosing_groups

__all__ = [
    "CgroupUnavailable",
    "GroupFiles",
    "GroupReading",
    "MemoryController",
    "Mount",
    "find_controller",
    "group_files",
    "parse_mountinfo",
    "parse_proc_cgroup",
    "read_group",
    "unavailable",
]


class CgroupUnavailable(RuntimeError):
    """No writable memory cgroup for budget runs; the message says what is missing."""


def unavailable(why: str) -> CgroupUnavailable:
    """The :class:`CgroupUnavailable` that says budget mode needs a writable memory cgroup, and ``why``."""
    return CgroupUnavailable(f"budget mode needs a writable memory cgroup: {why}")


# --------------------------------------------------------------------------- finding the controller


@dataclass(frozen=True)
class Mount:
    """One line of ``/proc/self/mountinfo``: where, which subtree, which file system, its options."""

    point: Path
    root: str
    fstype: str
    options: frozenset[str]


def _unescape(field_: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a ``/proc/<pid>/mountinfo`` text (malformed lines are skipped)."""
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 6 or len(rest) < 2:
            continue
        options = set(fields[5].split(","))
        if len(rest) >= 3:
            options.update(rest[2].split(","))
        mounts.append(Mount(Path(_unescape(fields[4])), _unescape(fields[3]), rest[0], frozenset(options)))
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` as controller -> path; the v2 entry (``0::/path``) is under ``""``."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            paths[""] = path
        for name in controllers.split(","):
            if name:
                paths[name] = path
    return paths


@dataclass(frozen=True)
class MemoryController:
    """The memory controller this process can make groups with.

    ``version`` is 1 or 2; ``own`` is the group this process runs in; ``parent`` is the
    directory new groups are made in (``own`` itself, or on v2 possibly its parent); ``mount``
    is the hierarchy's root directory (None where unknown: :meth:`enclosing` then walks up to
    the first directory that is no memory group).
    """

    version: int
    own: Path
    parent: Path
    mount: Path | None = field(default=None, compare=False)

    def describe(self) -> str:
        """One line for the results: which controller and where the groups go."""
        return f"cgroup v{self.version} memory controller; groups made under {self.parent}"

    def enclosing(self) -> list[Enclosing]:
        """The limited groups above the groups made here, innermost first (:func:`~harness.budget.enclosing.
        enclosing_groups`): ``parent`` and its ancestors. On v2 without delegation ``own`` is a sibling of the
        groups made, and its limit does not cover them."""
        return enclosing_groups(self.version, self.parent, self.mount)


def _group_dir(mount: Mount, path: str) -> Path:
    """The directory of cgroup ``path`` (as ``/proc/self/cgroup`` names it) under ``mount``."""
    root = mount.root.rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return mount.point / path.lstrip("/")


def _read_words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def find_controller(proc: Path = Path("/proc/self")) -> MemoryController:
    """Find the memory controller from ``proc``'s ``mountinfo`` and ``cgroup``.

    A v1 ``memory`` hierarchy wins over a cgroup2 mount (hybrid machines mount both,
    and then the memory controller lives on v1). Raises :class:`CgroupUnavailable`
    when neither has it or this process's group cannot be found.
    """
    try:
        mounts = parse_mountinfo((proc / "mountinfo").read_text())
        paths = parse_proc_cgroup((proc / "cgroup").read_text())
    except OSError as exc:
        raise unavailable(f"cannot read {exc.filename} ({exc.strerror}); is this Linux?") from exc
    v1 = [m for m in mounts if m.fstype == "cgroup" and "memory" in m.options]
    if v1:
        mount = v1[0]
        if "memory" not in paths:
            raise unavailable(f"a v1 memory hierarchy is mounted at {mount.point}, "
                               f"but {proc / 'cgroup'} names no memory group for this process")
        own = _group_dir(mount, paths["memory"])
        if not (own / "memory.limit_in_bytes").is_file():
            raise unavailable(f"this process's memory group {own} is not visible under {mount.point} "
                               "(no memory.limit_in_bytes there)")
        return MemoryController(1, own, own, mount.point)
    v2 = [m for m in mounts if m.fstype == "cgroup2"]
    if not v2:
        raise unavailable("no memory controller is mounted: no cgroup v1 'memory' hierarchy and no cgroup2 "
                           f"file system in {proc / 'mountinfo'}")
    if "" not in paths:
        raise unavailable(f"a cgroup2 file system is mounted at {v2[0].point}, but {proc / 'cgroup'} "
                           "has no '0::' line for this process")
    own = _group_dir(v2[0], paths[""])
    if "memory" not in _read_words(own / "cgroup.controllers"):
        raise unavailable(f"the memory controller is not enabled for this process's group {own} "
                           "(not in its cgroup.controllers); delegate it (e.g. systemd-run --scope -p "
                           "Delegate=yes) or run in a container with its own cgroup")
    if "memory" in _read_words(own / "cgroup.subtree_control"):
        return MemoryController(2, own, own, v2[0].point)
    # A group with processes in it cannot enable controllers for children: make siblings.
    return MemoryController(2, own, own.parent, v2[0].point)


# --------------------------------------------------------------------------- files per version


@dataclass(frozen=True)
class GroupFiles:
    """The files of a memory group that hold its limit and its peak."""

    limit: str
    peak: str


_V1 = GroupFiles(limit="memory.limit_in_bytes", peak="memory.max_usage_in_bytes")
_V2 = GroupFiles(limit="memory.max", peak="memory.peak")


def group_files(version: int) -> GroupFiles:
    """The names of a group's limit and peak files under cgroup ``version`` (1 or 2)."""
    return _V1 if version == 1 else _V2


def _keyed(path: Path) -> dict[str, int]:
    """A ``key value`` per line file (``memory.oom_control``, ``memory.events``); {} if absent."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            values[parts[0]] = int(parts[1])
    return values


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class GroupReading:
    """What the kernel counted for one group.

    ``peak_bytes``: the group's own high-water mark (page cache included), None where the
    kernel keeps none (v2 before 5.19). ``oom_kills``: processes the OOM killer killed in
    the group, None where the kernel does not count them (v1 before 4.13). ``counters``:
    every counter read, by file and key, for the record.
    """

    peak_bytes: int | None
    oom_kills: int | None
    counters: dict[str, int]


def read_group(version: int, path: Path) -> GroupReading:
    """What the kernel counted for the group at ``path`` under cgroup ``version`` (1 or 2); files it lacks are
    left out of ``counters``."""
    counters: dict[str, int] = {}
    if version == 1:
        for key, value in _keyed(path / "memory.oom_control").items():
            counters[f"memory.oom_control:{key}"] = value
        for name in ("memory.failcnt", "memory.memsw.failcnt", "memory.max_usage_in_bytes",
                     "memory.memsw.max_usage_in_bytes"):
            number = _number(path / name)
            if number is not None:
                counters[name] = number
        kills = counters.get("memory.oom_control:oom_kill")
    else:
        for key, value in _keyed(path / "memory.events").items():
            counters[f"memory.events:{key}"] = value
        peak = _number(path / "memory.peak")
        if peak is not None:
            counters["memory.peak"] = peak
        kills = counters.get("memory.events:oom_kill")
    return GroupReading(counters.get(group_files(version).peak), kills, counters)
