"""What the harness prints while it runs: labelled numbers on stderr, through tqdm.

In a strategy's process:

* :func:`phase_ticker`: during a long step with no steps of its own (a whole checkpoint
  being loaded), a line that says how long it has run and the process's RSS, refreshed
  every second: ``[load] loading for 00:12, RSS 6.10 GiB``;
* :func:`engine_bar`: engines built and their bytes:
  ``[map] 3.20 of 8.71 GiB of engine weights built, engines 5/16 |███   | [00:12<00:20]``.

The parent passes this output through unchanged, so bars update in place.

In the parent:

* :func:`overall_line`: before each worker run, where the run stands among all of them and
  about how long the rest will take:
  ``run 9 of 28: map, repeat 2 of 3 — 8 done in 6.1 min, about 12 min left``
  (:class:`RunCounter` keeps the count and the clock);
* :func:`byte_bar`: a one-off file being written (a generated checkpoint, a ``.pt``
  conversion), in bytes: ``[harness] converting to pi05.safetensors.pt: 42%|███ | 3.1G/7.4G``.
  Shown on a terminal only: the parent's stderr is the user's, and a log file gets no bar.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

from tqdm import tqdm

from harness.measure.procfs import read_status
from harness.units import GIB, KIB

__all__ = ["EngineBar", "RunCounter", "byte_bar", "engine_bar", "overall_line", "phase_ticker"]



@contextlib.contextmanager
def phase_ticker(prefix: str, what: str, every_s: float = 1.0) -> Iterator[None]:
    """Show ``[prefix] what for <elapsed>, RSS <GiB>`` until the block ends (then one final line)."""
    bar = tqdm(total=None, desc=f"[{prefix}] {what} for", bar_format="{desc} {elapsed}{postfix}", file=sys.stderr,
               mininterval=every_s, leave=True)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every_s):
            bar.set_postfix_str(f"RSS {read_status().rss_bytes / GIB:.2f} GiB", refresh=True)

    thread = threading.Thread(target=tick, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.set_postfix_str(f"RSS {read_status().rss_bytes / GIB:.2f} GiB", refresh=False)
        bar.close()


class EngineBar:
    """A bar of engines built, labelled with the bytes built so far out of the model's."""

    def __init__(self, prefix: str, engines: int, total_bytes: int) -> None:
        self.prefix, self.total_bytes, self.built_bytes = prefix, total_bytes, 0
        self._bar = tqdm(total=engines, desc=self._label(), unit="engine", file=sys.stderr, mininterval=1.0,
                         leave=True, bar_format="{desc}, engines {n_fmt}/{total_fmt} |{bar}| [{elapsed}<{remaining}]")

    def _label(self) -> str:
        return (f"[{self.prefix}] {self.built_bytes / GIB:.2f} of {self.total_bytes / GIB:.2f} GiB "
                "of engine weights built")

    def built(self, nbytes: int) -> None:
        """One more engine of ``nbytes`` is built."""
        self.built_bytes += nbytes
        self._bar.set_description_str(self._label(), refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def engine_bar(prefix: str, engines: int, total_bytes: int) -> EngineBar:
    """An :class:`EngineBar` for ``engines`` engines reading ``total_bytes`` in all."""
    return EngineBar(prefix, engines, total_bytes)


def _duration(seconds: float, minute_digits: int) -> str:
    """``45 s`` under a minute and a half, else minutes to ``minute_digits`` decimals (``6.1 min``)."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.{minute_digits}f} min"


def overall_line(index: int, total: int, what: str, elapsed_s: float | None) -> str:
    """``run <index> of <total>: <what>``, then, once a run is done, how many in how long and the time left.

    ``index`` counts from 1; the runs before it are done, in ``elapsed_s`` seconds (since the first
    started). The estimate is the mean time of a run done so far times the runs left, this one
    included; before the first run is done there is none.
    """
    line = f"run {index} of {total}: {what}"
    done = index - 1
    if done < 1 or elapsed_s is None:
        return line
    left_s = elapsed_s / done * (total - done)
    return f"{line} — {done} done in {_duration(elapsed_s, 1)}, about {_duration(left_s, 0)} left"


class RunCounter:
    """Numbers a run's worker processes, of ``total`` planned, and times them (``clock``, in seconds)."""

    def __init__(self, total: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.clock = total, clock
        self.started = 0
        self._first: float | None = None

    def next(self, what: str) -> str:
        """The :func:`overall_line` of the run that starts now (every earlier one has ended)."""
        now = self.clock()
        if self._first is None:
            self._first = now
        self.started += 1
        return overall_line(self.started, self.total, what, now - self._first)


def byte_bar(what: str, total: int, enabled: bool = True) -> tqdm:  # type: ignore[type-arg]
    """A bar of bytes written out of ``total``, ``[harness] <what>``, on stderr when it is a terminal
    (tqdm's ``disable=None``); never with ``enabled`` False."""
    return tqdm(total=total, desc=f"[harness] {what}", unit="B", unit_scale=True, unit_divisor=KIB,
                file=sys.stderr, mininterval=1.0, leave=True, disable=None if enabled else True)
