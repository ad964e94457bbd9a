"""The memory of the processes a compiler starts (the C++ compiler, the assembler, the linker).

The kernel's high-water mark (``VmHWM``) covers this process only, and
``getrusage(RUSAGE_CHILDREN).ru_maxrss`` does not help either: a child that forked from a
large process and then exec'd the compiler reports the parent's RSS at fork as its own
peak. :class:`ChildPeak` samples instead: a thread reads the memory of every descendant
process (RSS and PSS from one read of its ``/proc/<pid>/smaps_rollup``,
:func:`harness.measure.proctree.rss_pss_bytes`, so that its PSS never exceeds its RSS) every
``interval_s`` and keeps the largest sums and the largest single process seen. A child that
lives shorter than the interval can be missed.

Summed RSS counts every page a descendant maps, so pages several processes share (the shared
libraries, the interpreter's pages a forked worker shares with its parent) count once per
process: a pool of compile workers that import torch sums to gigabytes they do not add. Summed
PSS (each shared page split among the processes that map it) counts each such page once across
them, and only a share of those they map with this process: what the descendants add to the
machine's memory.
"""

from __future__ import annotations

import contextlib
import threading
from types import TracebackType

import psutil

from harness.measure.proctree import rss_pss_bytes

__all__ = ["ChildPeak"]


class ChildPeak:
    """Peak memory of this process's descendants over a ``with`` block, sampled on a thread.

    ``pss_peak_bytes``: the largest sum of their PSS at one sample (what they add, shared pages
    split among the processes that map them); ``peak_bytes``: the largest sum of their RSS (each
    shared page counted once per process that maps it). ``largest_bytes`` and ``largest_name``:
    the largest single process seen, by RSS, and its executable's name. ``samples``: how many
    samples were taken.
    """

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.pss_peak_bytes = 0
        self.largest_bytes = 0
        self.largest_name = ""
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._me = psutil.Process()

    def _sample(self) -> None:
        total = pss = 0
        for child in self._me.children(recursive=True):
            memory = rss_pss_bytes(child.pid)
            if memory is None:  # gone, or not readable
                continue
            rss, child_pss = memory
            if rss > self.largest_bytes:
                with contextlib.suppress(psutil.Error):
                    self.largest_bytes, self.largest_name = rss, child.name()
            total += rss
            pss += child_pss
        self.peak_bytes = max(self.peak_bytes, total)
        self.pss_peak_bytes = max(self.pss_peak_bytes, pss)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> ChildPeak:
        self._thread = threading.Thread(target=self._run, name="child-peak", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
