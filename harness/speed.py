"""The prefetch and drop-cache settings of the strategies that map: the scenario's, or chosen by measurement.

A scenario may set ``[run] prefetch`` (a method, or ``"off"``) and ``[run] drop_cache`` (true or
false); what it leaves as ``"auto"`` / absent is chosen here, once per run, from a read probe of the
checkpoint (:func:`harness.measure.probe.read_probe`), and recorded with the reason
(:class:`~harness.results.record.SpeedChoice`). The rules, each a question the probe answers:

* **drop_cache** on when reads that drop their pages behind them run at least :data:`DROP_GAIN`
  times as fast as the last of the reads that keep theirs (the page cache's growth costs time
  here: on this project's VM, fresh pages the host had to back), or when the checkpoint is larger
  than the memory the kernel reports available (keeping it would push other pages out); off
  otherwise, since a page kept costs nothing then and a later reader may find it.
* **prefetch** ``madvise`` one engine ahead unless regions asked for with ``MADV_WILLNEED`` come
  in at under :data:`WILLNEED_FLOOR` of the rate of regions faulted in page by page (the advice
  then buys little reading and costs a thread). Asking ahead pays by overlapping the next
  engine's reads with this one's build, so it need not read as fast as faults: on the 2-core VM
  the advised regions came in at 0.4 to 0.8 of the fault rate and prefetch still cut ``map``'s
  wall (``map`` against ``map_no_prefetch`` in ``results/pi05``).

A checkpoint smaller than the probe needs (:func:`~harness.measure.probe.probe_bytes`, 2.4 GiB) is
not probed: drop-cache is off and prefetch ``madvise`` (what earlier layouts ran by default), and
the reason says so.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import psutil

from harness.measure.probe import probe_bytes, read_probe
from harness.results.record import ReadProbe, SpeedChoice
from harness.scenario import PREFETCH_AUTO, PREFETCH_OFF, RunConfig

__all__ = ["DROP_GAIN", "PREFETCH_METHOD", "WILLNEED_FLOOR", "choose_speed", "decide"]

DROP_GAIN = 1.05
"""Dropped-behind reads must be this much faster than kept ones for drop-cache to be chosen (5%: above
the probe's own noise of a few percent between regions, measured on the 2-core VM)."""
WILLNEED_FLOOR = 0.25
"""``MADV_WILLNEED`` reads under this share of the fault reads' rate turn prefetch off."""
PREFETCH_METHOD = "madvise"
"""The method chosen when prefetch is: the one the probe measures (``benchmarks/prefetch.py``: the
fastest of the three on the machine it was measured on)."""


def _mb(rate: float) -> str:
    return f"{rate / 1e6:.0f} MB/s"


def _drop_cache(probe: ReadProbe | None, checkpoint_bytes: int, available: int | None) -> tuple[bool, str]:
    if available is not None and checkpoint_bytes > available:
        return True, (f"chosen: the checkpoint ({checkpoint_bytes / 2**30:.2f} GiB) is larger than the memory "
                      f"available ({available / 2**30:.2f} GiB)")
    if probe is None:
        return False, (f"chosen: off, the default for a checkpoint under {probe_bytes() / 2**30:.1f} GiB, "
                       "which is not probed")
    kept, dropped = probe.kept_bytes_per_s, probe.dropped_bytes_per_s
    if kept > 0 and dropped >= DROP_GAIN * kept:
        return True, (f"chosen: reads dropping their pages behind them ran {dropped / kept:.2f}x as fast as "
                      f"the last reads keeping them ({_mb(dropped)} vs {_mb(kept)})")
    return False, (f"chosen: keeping read pages cost no read time (the last kept reads {_mb(kept)}, dropped "
                   f"behind {_mb(dropped)}: under the {DROP_GAIN:.2f}x that would choose dropping)")


def _prefetch(probe: ReadProbe | None) -> tuple[str | None, str]:
    if probe is None:
        return PREFETCH_METHOD, (f"chosen: `{PREFETCH_METHOD}`, the default for a checkpoint under "
                                 f"{probe_bytes() / 2**30:.1f} GiB, which is not probed")
    faulted, willneed = probe.faulted_bytes_per_s, probe.willneed_bytes_per_s
    if faulted > 0 and willneed < WILLNEED_FLOOR * faulted:
        return None, (f"chosen: off: regions asked for ahead came in at {_mb(willneed)}, under "
                      f"{WILLNEED_FLOOR:.2f}x the {_mb(faulted)} of regions faulted in")
    return PREFETCH_METHOD, (f"chosen: `{PREFETCH_METHOD}`: regions asked for ahead came in at "
                             f"{willneed / faulted if faulted else 0:.2f}x the rate of regions faulted in "
                             f"({_mb(willneed)} vs {_mb(faulted)}), over the {WILLNEED_FLOOR:.2f}x that "
                             "would turn it off")


def decide(run: RunConfig, probe: ReadProbe | None, checkpoint_bytes: int, available: int | None) -> SpeedChoice:
    """The settings for ``run`` given the probe's figures (``probe`` is ignored for settings the scenario made)."""
    if run.prefetch == PREFETCH_AUTO:
        prefetch, prefetch_why = _prefetch(probe)
    else:
        prefetch = None if run.prefetch == PREFETCH_OFF else run.prefetch
        prefetch_why = "set by the scenario"
    if run.drop_cache is None:
        drop, drop_why = _drop_cache(probe, checkpoint_bytes, available)
    else:
        drop, drop_why = run.drop_cache, "set by the scenario"
    return SpeedChoice(prefetch=prefetch, drop_cache=drop, prefetch_why=prefetch_why, drop_cache_why=drop_why,
                       probe=probe)


def choose_speed(run: RunConfig, files: Sequence[str | os.PathLike[str]]) -> SpeedChoice:
    """The run's settings: the scenario's where it made them, the rest chosen from a probe of ``files``
    (:func:`decide`); the probe runs only where something is left to choose."""
    needs_probe = run.prefetch == PREFETCH_AUTO or run.drop_cache is None
    probe = read_probe(files) if needs_probe else None
    checkpoint_bytes = sum(os.stat(f).st_size for f in files)
    return decide(run, probe, checkpoint_bytes, psutil.virtual_memory().available)
