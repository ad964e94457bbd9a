"""The memory of a process and of every process it started: what a watcher holds to a limit.

A worker starts processes of its own (the built model's check processes, the C++ compiler and
its jobs); a limit held to the worker's RSS alone lets them grow past it unseen. :func:`read_tree`
reads the worker and all its descendants, found through the kernel's ``/proc/<pid>/task/<tid>/children``
lists (psutil's ``children(recursive=True)`` where the kernel has no such file; it scans every
process of the machine, so it is the fallback only).

How the tree's memory is counted
    *Summed RSS* counts a page once per process that maps it: the shared libraries every Python
    process maps (libtorch alone is hundreds of MiB), a checkpoint two processes map, the pages a
    fork shares copy-on-write. It overstates the tree; it is read every poll because it is cheap
    (``/proc/<pid>/statm``: counters, no page-table walk) and never below the truth.

    *Summed PSS* (proportional set size, ``Pss`` of ``/proc/<pid>/smaps_rollup``) divides each page
    among the processes that map it: over a set of processes, a page they share counts once, and a
    page shared with processes outside the tree (the harness's own libraries) counts for the tree's
    share only. That is what the tree costs the machine, and what the limit is held to. Summed USS
    (private pages only) would drop the pages the tree shares within itself, a checkpoint mapped by
    the worker and a child among them, and understate it.

    ``smaps_rollup`` walks the process's page tables (milliseconds per GiB resident), too costly for
    every poll of a process mapping a large checkpoint: :func:`read_tree` reads PSS only when the
    summed RSS passes ``exact_over``, i.e. only where the limit could have been passed.

:func:`kill_tree` ends a process and every process it started (its process group, and each descendant
a reading found, wherever its group).

Linux only; a process that exits while it is read counts as nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.units import KIB

__all__ = ["rss_pss_bytes", "TreeReading", "descendants", "kill_tree", "pss_sum", "read_tree"]

PROC = Path("/proc")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # gone meanwhile, or not ours to read
        return None


def _children(pid: int, proc: Path) -> list[int] | None:
    """The children of ``pid`` from its threads' ``children`` files; None where the kernel keeps none."""
    try:
        tasks = sorted((proc / str(pid) / "task").iterdir(), key=lambda task: int(task.name))
    except OSError:
        return []  # gone
    found: list[int] = []
    for task in tasks:
        text = _read(task / "children")
        if text is None:
            if not (task / "children").exists() and task.exists():
                return None  # no CONFIG_PROC_CHILDREN
            continue
        found += [int(word) for word in text.split()]
    return found


def descendants(pid: int, proc: Path = PROC) -> list[int]:
    """Every process ``pid`` started and they started in turn (not ``pid`` itself), parents before children."""
    out: list[int] = []
    queue = [pid]
    while queue:
        parent = queue.pop(0)
        children = _children(parent, proc)
        if children is None:
            try:
                return [p.pid for p in psutil.Process(pid).children(recursive=True)]
            except psutil.Error:
                return out
        fresh = [c for c in children if c not in out and c != pid]
        out += fresh
        queue += fresh
    return out


def _rss_bytes(pid: int, proc: Path) -> int:
    text = _read(proc / str(pid) / "statm")
    fields = text.split() if text else []
    return int(fields[1]) * _PAGE if len(fields) > 1 else 0


def _pss_bytes(pid: int, proc: Path) -> int:
    text = _read(proc / str(pid) / "smaps_rollup")
    for line in (text or "").splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * KIB
    return 0


def rss_pss_bytes(pid: int, proc: Path = PROC) -> tuple[int, int] | None:
    """A process's RSS and PSS from one read of its ``smaps_rollup`` (so PSS never exceeds RSS, as it could
    from two reads of a growing process); None when it is gone or cannot be read."""
    text = _read(proc / str(pid) / "smaps_rollup")
    values = {}
    for line in (text or "").splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            values[key] = int(rest.split()[0]) * KIB
    if "Rss" not in values or "Pss" not in values:
        return None
    return values["Rss"], values["Pss"]


@dataclass(frozen=True)
class TreeReading:
    """One reading of a process and its descendants.

    ``pids``: the process first, then its descendants; ``rss_bytes``: the process's own RSS;
    ``rss_sum_bytes``: RSS summed over ``pids`` (an upper bound, see the module doc); ``pss_sum_bytes``:
    PSS summed over ``pids``, read only when asked for (None otherwise).
    """

    pids: tuple[int, ...]
    rss_bytes: int
    rss_sum_bytes: int
    pss_sum_bytes: int | None

    @property
    def started(self) -> int:
        """How many processes the first one started (its descendants now)."""
        return len(self.pids) - 1

    def over(self, limit_bytes: int) -> bool:
        """Whether the tree holds more than ``limit_bytes``: its summed PSS where read, else its summed RSS."""
        total = self.pss_sum_bytes if self.pss_sum_bytes is not None else self.rss_sum_bytes
        return total > limit_bytes


def read_tree(pid: int, *, exact_over: int | None = None, proc: Path = PROC) -> TreeReading:
    """``pid`` and its descendants' memory now; their summed PSS too where their summed RSS is above
    ``exact_over`` (never without it). ``proc``: the ``/proc`` to read (a test's fake one)."""
    pids = (pid, *descendants(pid, proc))
    rss = [_rss_bytes(p, proc) for p in pids]
    total = sum(rss)
    pss = pss_sum(pids, proc) if exact_over is not None and total > exact_over else None
    return TreeReading(pids, rss[0], total, pss)


def pss_sum(pids: Iterable[int], proc: Path = PROC) -> int:
    """PSS summed over ``pids`` (a process gone meanwhile counts as nothing)."""
    return sum(_pss_bytes(p, proc) for p in pids)


def kill_tree(pid: int, pids: Iterable[int] = ()) -> None:
    """SIGKILL ``pid``, its process group where it leads one (a process started in a session of its own), and
    ``pids`` (its descendants as a :class:`TreeReading` found them, some of which may have left its group).
    Call it before ``pid`` is reaped, so that its process group is still its own."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
    for other in (pid, *pids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(other, signal.SIGKILL)
