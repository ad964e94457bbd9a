"""The memory limits above a budget's groups: each enclosing memory cgroup's, and the machine's memory.

A budget's groups are made inside the group the harness runs in (or, on cgroup v2 without delegation,
beside it: :class:`~harness.budget.controller.MemoryController`'s ``parent``). That group and each of its
ancestors may have a limit of its own: a Slurm job, a Kubernetes pod and a systemd slice with
``MemoryMax`` all run their processes so. The kernel charges every page of a budget's group to each
enclosing group too, and reclaims or OOM-kills as soon as *any* of them is at its limit: a group
limited to 23 GiB inside a job limited to 560 MiB completes nothing above 560 MiB, less what the
job's other processes hold.

* :func:`enclosing_groups`: the groups from ``parent`` up to the hierarchy's root whose limit covers
  the groups made in ``parent``, innermost first, each with its limit (``memory.max`` on v2,
  ``memory.limit_in_bytes`` on v1; "max", or v1's page-counter maximum, is no limit). On v1 a
  group whose ``memory.use_hierarchy`` is 0 does not count its children's pages: it and the groups
  above it are left out.
* :func:`effective_limit`: the smallest of those limits and the machine's memory (``MemTotal`` of
  ``/proc/meminfo``): the most a budget's group can ever use, and so the most an "unconstrained"
  run may be given.
* :func:`limit_reached`: after an OOM kill in a budget's group below its own limit, which enclosing
  group's limit was reached, from their counters before and after: on v2 ``max``, ``oom`` or
  ``oom_kill`` in ``memory.events.local`` (events of that group alone: ``memory.events`` counts
  its descendants' too); on v1 ``memory.failcnt`` or ``memory.memsw.failcnt`` (counted at the
  group whose limit failed a charge); then, where neither rose (v1 does not count failures of a
  ``memsw`` limit: measured on Linux 6.18, a 192 MiB ``memsw`` limit above a 1 GiB group left both
  counters at 0 while its child was OOM-killed), a group whose peak reached its limit.

Every path is a parameter (the group's directory, ``/proc/meminfo``), so that a test can hand it a
fake tree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.units import KIB, MIB, gib_or_mib

__all__ = ["AT_LIMIT_SLACK", "EffectiveLimit", "Enclosing", "Marks", "effective_limit", "enclosing_groups",
           "limit_reached", "read_marks"]

MEMINFO = Path("/proc/meminfo")

AT_LIMIT_SLACK = 8 * MIB
"""How close to its limit a group's peak must come to count as having reached it: the kernel charges in
batches (64 pages per CPU, a 2 MiB huge page at once), so a group OOM-killed at its limit can peak a
little below it."""

UNLIMITED_V1 = 1 << 62
"""A v1 limit this large is none: "unlimited" reads as the page counter's maximum, 9223372036854771712 with
4 KiB pages."""


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


@dataclass(frozen=True)
class Enclosing:
    """A memory cgroup whose limit covers a budget's groups: its directory, the file its limit is in and the
    limit in bytes."""

    path: Path
    file: str
    limit_bytes: int

    def describe(self) -> str:
        """``the 560 MiB limit of the enclosing memory cgroup /sys/fs/cgroup/memory/job (memory.limit_in_bytes)``."""
        return f"the {gib_or_mib(self.limit_bytes)} limit of the enclosing memory cgroup {self.path} ({self.file})"


def _limit_file(version: int) -> str:
    return "memory.limit_in_bytes" if version == 1 else "memory.max"


def _limit(version: int, group: Path) -> int | None:
    """The group's limit in bytes; None for none ("max", v1's maximum, no such file, unreadable)."""
    text = _text(group / _limit_file(version))
    if text is None or not text.isdigit():
        return None  # "max" (v2), or no limit file (the v2 root)
    value = int(text)
    return None if version == 1 and value >= UNLIMITED_V1 else value


def enclosing_groups(version: int, parent: Path, mount: Path | None = None) -> list[Enclosing]:
    """The limited groups that cover groups made in ``parent``: ``parent`` and its ancestors up to ``mount`` (the
    hierarchy's root; without it, up to the first directory without the limit file), innermost first."""
    found: list[Enclosing] = []
    group = parent
    while True:
        if not (group / _limit_file(version)).exists() and not (version == 2 and group == mount):
            break
        limit = _limit(version, group)
        if limit is not None:
            found.append(Enclosing(group, _limit_file(version), limit))
        if group == mount or group.parent == group:
            break
        above = group.parent
        if version == 1 and _text(above / "memory.use_hierarchy") == "0":
            break  # the group above does not count this one's pages
        group = above
    return found


def _mem_total(meminfo: Path) -> int:
    text = _text(meminfo) or ""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * KIB
    raise OSError(f"{meminfo}: no MemTotal line")


@dataclass(frozen=True)
class EffectiveLimit:
    """The most a budget's group can use: ``limit_bytes``, set by ``group`` (None: the machine's memory)."""

    limit_bytes: int
    group: Enclosing | None

    def describe(self) -> str:
        """Where the limit comes from, in words (``the machine's memory (MemTotal)``, or the group's)."""
        return "the machine's memory (MemTotal)" if self.group is None else self.group.describe()


def effective_limit(groups: Sequence[Enclosing], meminfo: Path = MEMINFO) -> EffectiveLimit:
    """The smallest of ``groups``' limits and the machine's memory (``MemTotal`` in ``meminfo``); a group's limit
    wins a tie. Raises ``OSError`` where ``meminfo`` has no ``MemTotal``."""
    best = EffectiveLimit(_mem_total(meminfo), None)
    for group in groups:
        if group.limit_bytes <= best.limit_bytes:
            best = EffectiveLimit(group.limit_bytes, group)
    return best


Marks = Mapping[Path, Mapping[str, int]]
"""Each enclosing group's counters that rise when its limit is reached, and its peak, by group."""

_V1_COUNTERS = ("memory.failcnt", "memory.memsw.failcnt")
_V2_EVENTS = ("max", "oom", "oom_kill")


def _number(path: Path) -> int | None:
    text = _text(path)
    return int(text) if text is not None and text.isdigit() else None


def read_marks(version: int, groups: Sequence[Enclosing]) -> dict[Path, dict[str, int]]:
    """What :func:`limit_reached` compares, read now: per group its failure counters (v1) or local events (v2),
    and its peak (``peak``: v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``); a counter the kernel does not
    keep is left out."""
    marks: dict[Path, dict[str, int]] = {}
    for group in groups:
        values: dict[str, int] = {}
        if version == 1:
            for name in _V1_COUNTERS:
                number = _number(group.path / name)
                if number is not None:
                    values[name] = number
            peaks = [p for p in (_number(group.path / "memory.max_usage_in_bytes"),
                                 _number(group.path / "memory.memsw.max_usage_in_bytes")) if p is not None]
            if peaks:
                values["peak"] = max(peaks)
        else:
            for line in (_text(group.path / "memory.events.local") or "").splitlines():
                key, _, value = line.partition(" ")
                if key in _V2_EVENTS and value.strip().isdigit():
                    values[f"local {key}"] = int(value)
            peak = _number(group.path / "memory.peak")
            if peak is not None:
                values["peak"] = peak
        marks[group.path] = values
    return marks


def limit_reached(groups: Sequence[Enclosing], before: Marks, after: Marks,
                  slack: int = AT_LIMIT_SLACK) -> Enclosing | None:
    """The innermost of ``groups`` whose limit was reached between the two :func:`read_marks`: a failure counter
    or local event that rose, else (for all of them) a peak within ``slack`` of the limit; None when none was."""
    for group in groups:
        old, new = before.get(group.path, {}), after.get(group.path, {})
        if any(new[key] > old.get(key, 0) for key in new if key != "peak"):
            return group
    for group in groups:
        peak = after.get(group.path, {}).get("peak")
        if peak is not None and peak >= group.limit_bytes - slack:
            return group
    return None
