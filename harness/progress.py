"""What the harness prints while it runs: labelled numbers on stderr, through tqdm.

In a strategy's process:

* :func:`phase_ticker`: during a long step with no steps of its own (a whole checkpoint
  being loaded), a line that says how long it has run and the process's RSS, refreshed
  every second: ``[load] loading for 00:12, RSS 6.10 GiB``;
* :func:`engine_bar`: engines built and their bytes:
  ``[map] 3.20 of 8.71 GiB of engine weights built, engines 5/16 |███   | [00:12<00:20]``.

The parent passes this output through unchanged, so bars update in place.

In the parent:

* :func:`print_progress`: a line of the run's own, ``[harness] <message>``;
* :func:`overall_line`: before each worker run, where the run stands among all of them and
  about how long the rest will take:
  ``run 9 of 28: map, repeat 2 of 3 — 8 done in 6.1 min, about 12 min left``
  (:class:`RunCounter` keeps the count and the clock; :func:`run_label` names the run);
* after each: :func:`result_line`; the reference measurements' :func:`disk_line` and :func:`shared_line`;
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

import psutil
from tqdm import tqdm

from harness.results.disk import DiskRead, SharedDisk
from harness.results.metrics import StrategyMetrics
from harness.units import GIB, KIB, format_gib, format_mb_per_s

__all__ = [
    "EngineBar",
    "RunCounter",
    "byte_bar",
    "disk_line",
    "engine_bar",
    "overall_line",
    "phase_ticker",
    "print_progress",
    "result_line",
    "run_label",
    "shared_line",
]


@contextlib.contextmanager
def phase_ticker(prefix: str, what: str, every_s: float = 1.0) -> Iterator[None]:
    """Show ``[prefix] what for <elapsed>, RSS <GiB>`` until the block ends (then one final line)."""
    bar = tqdm(total=None, desc=f"[{prefix}] {what} for", bar_format="{desc} {elapsed}{postfix}", file=sys.stderr,
               mininterval=every_s, leave=True)
    stop = threading.Event()

    process = psutil.Process()

    def tick() -> None:
        while not stop.wait(every_s):
            bar.set_postfix_str(f"RSS {format_gib(process.memory_info().rss)}", refresh=True)

    thread = threading.Thread(target=tick, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.set_postfix_str(f"RSS {format_gib(process.memory_info().rss)}", refresh=False)
        bar.close()


class EngineBar:
    """A bar of engines built, labelled with the bytes built so far out of the model's."""

    def __init__(self, prefix: str, engines: int, total_bytes: int) -> None:
        self.prefix, self.total_bytes, self.built_bytes = prefix, total_bytes, 0
        self._bar = tqdm(total=engines, desc=self._label(), unit="engine", file=sys.stderr, mininterval=1.0,
                         leave=True, bar_format="{desc}, engines {n_fmt}/{total_fmt} |{bar}| [{elapsed}<{remaining}]")

    def _label(self) -> str:
        return (f"[{self.prefix}] {self.built_bytes / GIB:.2f} of {format_gib(self.total_bytes)} "
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


def run_label(strategy: str, warmups: int, repeats: int, *, warmup: int | None = None, repeat: int = 0) -> str:
    """What one worker run does, of ``warmups`` warm-up rounds and ``repeats`` measured ones: ``map, warm-up 1 of 1``,
    ``map, repeat 2 of 3``, or ``map`` when there is one round (``warmup`` and ``repeat`` count from 0)."""
    if warmup is not None:
        return f"{strategy}, warm-up {warmup + 1} of {warmups}"
    return f"{strategy}, repeat {repeat + 1} of {repeats}" if repeats > 1 else strategy


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


def print_progress(message: str) -> None:
    """``[harness] <message>`` on stderr: a line of the run's own, in the parent."""
    print(f"[harness] {message}", file=sys.stderr, flush=True)


def result_line(name: str, metrics: StrategyMetrics) -> str:
    """``map: ok; build-phase host peak 1.21 GiB, floor 1.20 GiB (+0.1% of the model); ...``."""
    if not metrics.record.ok:
        return f"{name}: FAILED ({metrics.record.error})"
    parts = [f"{name}: ok"]
    if metrics.compared_peak_bytes is not None:
        text = f"{metrics.compared_label} {format_gib(metrics.compared_peak_bytes)}"
        if metrics.floor_bytes is not None and metrics.excess is not None:
            text += f", floor {format_gib(metrics.floor_bytes)} ({metrics.excess * 100:+.1f}% of the model)"
        parts.append(text)
    if metrics.record.host_peak_bytes is not None:
        parts.append(f"whole-run host peak {format_gib(metrics.record.host_peak_bytes)}")
    if metrics.record.wall_s is not None:
        parts.append(f"wall {metrics.record.wall_s:.1f} s")
    return "; ".join(parts)


def shared_line(shared: SharedDisk) -> str:
    """``disk shared: the checkpoint read cold in 3.1 s, ...``."""
    return (f"disk shared: the checkpoint read cold in {shared.read_s:.1f} s, as many bytes written as engine files "
            f"in {shared.write_s:.1f} s, both at once in {shared.both_s:.1f} s ({shared.overlap or 0:.2f} x the "
            f"longer alone; {shared.one_at_a_time or 0:.2f} would be one at a time)")


def disk_line(disk: DiskRead) -> str:
    """``disk: cold sequential read of 1.20 GiB in 0.6 s, ...``."""
    return (f"disk: cold sequential read of {format_gib(disk.bytes)} in {disk.seconds:.1f} s, "
            f"{format_mb_per_s(disk.bytes_per_s)} ({disk.cpu_seconds:.1f} CPU-s)")
