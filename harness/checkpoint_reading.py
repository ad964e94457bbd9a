"""How the strategies that map read the checkpoint: prefetch (its method, readers and request size) and drop-cache,
the scenario's or chosen by measurement.

A scenario may set ``[run] prefetch`` (a method, or ``"off"``) and ``[run] drop_cache`` (true or
false); what it leaves as ``"auto"`` / absent is chosen here, once per run, from a read probe of the
checkpoint (:func:`harness.measure.probe.read_probe`) and what the kernel says of its memory, and
recorded with the reason (:class:`~harness.results.checkpoint_reading.ReadingChoice`). The rules:

* **drop_cache** on when the checkpoint is larger than the memory the kernel reports available
  (keeping it would push other pages out), or when the kernel hands its free memory back to a host
  (:func:`harness.measure.hostmemory.free_page_reporting`): there a page the cache keeps is one the
  build's own writes cannot reuse, and memory taken afresh must be backed by the host again
  (``benchmarks/fresh_memory.py`` times that). Off otherwise, since a page kept costs nothing then
  and a later reader may find it. The read probe's kept and dropped reads are recorded beside it but
  decide nothing.
* **prefetch** off where no engine build reads its weights (engines compiled on the host to run on the
  mapped weights where they lie, :data:`~harness.catalog.BUILT_WITHOUT_READING_WEIGHTS`): warming their
  pages would read the whole checkpoint for nothing, on a thread taking CPU from the compiles. Otherwise
  ``madvise`` one engine ahead unless regions asked for with ``MADV_WILLNEED`` come in at under
  :data:`WILLNEED_FLOOR` of the rate of regions faulted in page by page (the advice then buys little
  reading and costs a thread). Asking ahead pays by overlapping the next engine's reads with this one's
  build, so it need not read as fast as faults.

What each setting bought on the machines measured, ``map`` against ``map_no_prefetch`` (and
``map_keep_cache``, where a run has it) in the same rounds, is in the results' notes (``results/pi05.notes.md``,
``results/pi05-h200.notes.md``, ``results/pi05-compile.notes.md``).

A checkpoint smaller than the probe needs (:func:`~harness.measure.probe.probe_bytes`) is
not probed and its page cache stays small: drop-cache is off and prefetch ``madvise`` (what earlier
layouts ran by default), and the reason says so. A probe that fails (a read error, the file gone) costs
the run nothing: the settings are chosen as for a checkpoint not probed, the reason says the probe
failed, and :attr:`~harness.results.checkpoint_reading.ReadingChoice.probe_error` says why.

**How prefetch asks** (:func:`sized_to_ceiling`): where the run sweeps the disk's read ceiling (reader threads
by request sizes, cold: :func:`sweep_ceiling`, made while the plan is made, before any round), prefetch asks as
the sweep's fastest point read: that many threads at once, in requests of that size, so that the pages an
engine waits for come in as fast as this disk gives them. Without a sweep, or where it failed, it asks with one
thread in weightmap's default requests. So it does too where the checkpoint's largest file is under what the read
probe needs (:func:`~harness.measure.probe.probe_bytes`): each point of the sweep then reads a few MiB in
milliseconds, its fastest point is noise, and two plans of one scenario would ask differently. The sweep is still
made and recorded there as a reference, and ``prefetch_sizing_why`` says why it sized nothing.

All of it is decided once, by :func:`harness.plan.make_plan`: every round of a run, warm-up rounds included, and
every attempt of a budget sweep runs under the settings the plan holds.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from harness.measure.ceiling import BEST_SETTINGS, read_ceiling
from harness.measure.hostmemory import free_page_reporting
from harness.measure.probe import probe_bytes, read_probe
from harness.results.checkpoint_reading import ReadingChoice
from harness.results.disk import CeilingPoint, ReadProbe
from harness.results.metrics import best_ceiling
from harness.scenario import PREFETCH_AUTO, PREFETCH_OFF, RunConfig
from harness.units import MIB, format_gib, format_mb_per_s

__all__ = ["PREFETCH_METHOD", "WILLNEED_FLOOR", "ReadSettings", "choose_reading", "decide", "resolve_reading",
           "sized_to_ceiling", "sweep_ceiling"]

WILLNEED_FLOOR = 0.25
"""``MADV_WILLNEED`` reads under this share of the fault reads' rate turn prefetch off."""
PREFETCH_METHOD = "madvise"
"""The method chosen when prefetch is: the one the probe measures (``benchmarks/prefetch.py``: the
fastest of the three on the machine it was measured on)."""


def _unprobed(probe_error: str | None) -> str:
    """Why there is no probe: the checkpoint is too small for one, or the probe failed."""
    if probe_error is not None:
        return "the default where the read probe failed"
    return f"the default for a checkpoint under {format_gib(probe_bytes(), 1)}, which is not probed"


def _drop_cache(probe: ReadProbe | None, checkpoint_bytes: int, available: int | None,
                reporting: str | None, probe_error: str | None = None) -> tuple[bool, str]:
    if available is not None and checkpoint_bytes > available:
        return True, (f"chosen: the checkpoint ({format_gib(checkpoint_bytes)}) is larger than the memory "
                      f"available ({format_gib(available)})")
    if probe is None:
        return False, f"chosen: off, {_unprobed(probe_error)}"
    if reporting is not None:
        return True, (f"chosen: this kernel reports its free pages to the host ({reporting} negotiated free page "
                      "reporting), so a page the cache keeps leaves the build memory the host must back again")
    return False, ("chosen: off: this kernel reports no free pages to a host, so a page kept costs nothing "
                   "and a later reader may find it")


def _prefetch(probe: ReadProbe | None, builds_read_weights: bool,
              probe_error: str | None = None) -> tuple[str | None, str]:
    if not builds_read_weights:
        return None, ("chosen: off: the engines are compiled to run on the mapped weights where they lie, so no "
                      "build reads them and warming their pages would read the checkpoint for nothing")
    if probe is None:
        return PREFETCH_METHOD, f"chosen: `{PREFETCH_METHOD}`, {_unprobed(probe_error)}"
    faulted, willneed = probe.faulted_bytes_per_s, probe.willneed_bytes_per_s
    if faulted > 0 and willneed < WILLNEED_FLOOR * faulted:
        return None, (f"chosen: off: regions asked for ahead came in at {format_mb_per_s(willneed)}, under "
                      f"{WILLNEED_FLOOR:.2f}x the {format_mb_per_s(faulted)} of regions faulted in")
    return PREFETCH_METHOD, (f"chosen: `{PREFETCH_METHOD}`: regions asked for ahead came in at "
                             f"{willneed / faulted if faulted else 0:.2f}x the rate of regions faulted in "
                             f"({format_mb_per_s(willneed)} vs {format_mb_per_s(faulted)}), over the "
                             f"{WILLNEED_FLOOR:.2f}x that would turn it off")


def decide(run: RunConfig, probe: ReadProbe | None, checkpoint_bytes: int, available: int | None,
           reporting: str | None = None, builds_read_weights: bool = True,
           probe_error: str | None = None) -> ReadingChoice:
    """The settings for ``run`` given the probe's figures (or why the probe failed, ``probe_error``), the
    balloon device that reports this kernel's free pages to its host (``reporting``, or ``None``) and whether
    the engine builds read their weights; all are ignored for settings the scenario made."""
    if run.prefetch == PREFETCH_AUTO:
        prefetch, prefetch_why = _prefetch(probe, builds_read_weights, probe_error)
    else:
        prefetch = None if run.prefetch == PREFETCH_OFF else run.prefetch
        prefetch_why = "set by the scenario"
    if run.drop_cache is None:
        drop, drop_why = _drop_cache(probe, checkpoint_bytes, available, reporting, probe_error)
    else:
        drop, drop_why = run.drop_cache, "set by the scenario"
    return ReadingChoice(prefetch=prefetch, drop_cache=drop, prefetch_why=prefetch_why, drop_cache_why=drop_why,
                       probe=probe, probe_error=probe_error)


def _failure(exc: BaseException) -> str:
    """Why a reference measurement failed, on one line."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def choose_reading(run: RunConfig, files: Sequence[str | os.PathLike[str]],
                 builds_read_weights: bool = True) -> ReadingChoice:
    """The run's settings: the scenario's where it made them, the rest chosen from a probe of ``files``
    (:func:`decide`); the probe runs only where something is left to choose, and one that fails is recorded
    (``probe_error``), not raised. ``builds_read_weights``: whether the engine builds read the weights (false
    for engines compiled to run on the mapped weights in place)."""
    needs_probe = run.drop_cache is None or (run.prefetch == PREFETCH_AUTO and builds_read_weights)
    probe, probe_error = None, None
    if needs_probe:
        try:
            probe = read_probe(files)
        except Exception as exc:  # a reference measurement: recorded as failed, it never costs the run
            probe_error = _failure(exc)
    checkpoint_bytes = sum(os.stat(f).st_size for f in files)
    reporting = free_page_reporting() if run.drop_cache is None else None
    return decide(run, probe, checkpoint_bytes, psutil.virtual_memory().available, reporting, builds_read_weights,
                  probe_error)


def sized_to_ceiling(choice: ReadingChoice, points: Sequence[CeilingPoint], file_bytes: int) -> ReadingChoice:
    """``choice`` with prefetch asking as the read-ceiling sweep's fastest setting read (its reader threads and
    request size; :func:`~harness.results.metrics.best_ceiling`: by the median of its reads), and why; unchanged
    where prefetch is off or the sweep read nothing. ``file_bytes``: the size of
    the checkpoint's largest file (the one the read probe reads); under :func:`probe_bytes` the points are not used
    (``choice``'s reader and requests are kept, whatever they read) and ``prefetch_sizing_why`` says so."""
    best = best_ceiling(points)
    if choice.prefetch is None or best is None:
        return choice
    if file_bytes < probe_bytes():
        return dataclasses.replace(
            choice, prefetch_sizing_why=(f"not sized to the read-ceiling sweep: the checkpoint's largest file "
                                 f"({format_gib(file_bytes)}) is under the {format_gib(probe_bytes(), 1)} the read "
                                 "probe needs, and a sweep of it reads too little to tell its points apart"))
    return dataclasses.replace(
        choice, prefetch_readers=best.threads, prefetch_request_bytes=best.request_bytes,
        prefetch_sizing_why=(f"the read-ceiling sweep's fastest setting ({best.threads} reader(s) of "
                             f"{best.request_bytes // MIB} MiB, {format_mb_per_s(best.bytes_per_s)})"))


def sweep_ceiling(files: Sequence[str | os.PathLike[str]]) -> tuple[tuple[CeilingPoint, ...], str | None]:
    """The disk's read-ceiling sweep over ``files`` (:func:`harness.measure.ceiling.read_ceiling`, its
    :data:`~harness.measure.ceiling.BEST_SETTINGS` fastest settings read again), and why it
    failed (``None`` where it did not; then no points). A failure is recorded, never raised: it costs the run
    nothing (a signal that stops the run is no failure: the run's own handling raises it once the plan is made)."""
    try:
        return read_ceiling([os.fspath(f) for f in files], best_settings=BEST_SETTINGS), None
    except Exception as exc:  # a reference measurement: recorded as failed, it never costs the run
        return (), _failure(exc)


@dataclass(frozen=True)
class ReadSettings:
    """How the strategies that map read the checkpoint, as a plan resolves it (:func:`resolve_reading`): ``choice``
    sized to the read-ceiling sweep's ``ceiling`` points (empty where none was made), or why the sweep failed,
    ``ceiling_error``."""

    choice: ReadingChoice
    ceiling: tuple[CeilingPoint, ...]
    ceiling_error: str | None


def resolve_reading(run: RunConfig, files: Sequence[str | os.PathLike[str]], builds_read_weights: bool,
                    say: Callable[[str], object]) -> ReadSettings:
    """The read probe where a setting is left to it (:func:`choose_reading`), the read-ceiling sweep where ``run`` asks
    for one (a cold cache and ``read_ceiling`` on: :func:`sweep_ceiling`) and prefetch sized to it
    (:func:`sized_to_ceiling`), each said to ``say`` as made. Neither measurement's failure costs the run."""
    choice = choose_reading(run, files, builds_read_weights)
    if choice.probe_error is not None:
        say(f"read probe: failed ({choice.probe_error})")
    if choice.probe is not None or choice.probe_error is not None:
        say(f"read probe: prefetch {choice.prefetch or 'off'} ({choice.prefetch_why}); "
            f"drop_cache {'on' if choice.drop_cache else 'off'} ({choice.drop_cache_why})")
    points: tuple[CeilingPoint, ...] = ()
    error = None
    if run.cache == "cold" and run.read_ceiling:
        say("the disk's read ceiling: a cold read sweep over reader threads and request sizes")
        points, error = sweep_ceiling(files)
        say(_ceiling_line(points, error))
    sized = sized_to_ceiling(choice, points, max((os.stat(f).st_size for f in files), default=0))
    if sized != choice:
        say(f"prefetch asks with {sized.prefetch_readers} reader(s) of {sized.prefetch_request_bytes // MIB} MiB "
            f"({sized.prefetch_sizing_why})")
    return ReadSettings(sized, points, error)


def _ceiling_line(points: Sequence[CeilingPoint], error: str | None) -> str:
    best = best_ceiling(points)
    if error is not None:
        return f"disk ceiling: failed ({error})"
    if best is None:
        return "disk ceiling: nothing was read"
    return (f"disk ceiling: {format_mb_per_s(best.bytes_per_s)} with {best.threads} reader(s) of "
            f"{best.request_bytes // MIB} MiB requests (best of {len(points)} points)")
