"""A strategy's worker watched from outside, and what its end means for the run.

:func:`watch` runs a command and holds it, together with every process it started (a check process, a
compiler's jobs), to a memory limit (their summed PSS, :mod:`harness.measure.proctree`: a page they share
counted once) and a timeout, killing them all past either; the worker dies with the parent
(``PR_SET_PDEATHSIG``). :func:`watch_worker` watches one strategy's worker under the plan's limits.
:func:`strategy_record` is the record a run keeps of how it ended, and :func:`no_result_of_its_own` says
when it ended for a cause outside the strategy (the machine's), so that it has no result to publish.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from harness import stopping
from harness.plan import Plan
from harness.results.record import StrategyRecord
from harness.stopping import die_with_parent
from harness.units import format_gib
from harness.worker import FAILURE_PREFIX, OUTSIDE_STATUS

__all__ = ["SELF_INFLICTED", "Outcome", "Supervisor", "no_result_of_its_own", "oom_kills", "strategy_record", "watch",
           "watch_here", "watch_worker"]


@dataclass
class Outcome:
    """How a strategy's process ended, as seen from outside."""

    returncode: int | None
    reason: str | None  # why it failed, when the parent knows better than the worker
    peak_rss_bytes: int
    worker_error: str | None = None  # the worker's own last word, when it could not write its record
    stopped_by_harness: bool = False  # killed for the scenario's memory limit or timeout: a result of its own
    out_of_memory: bool = False  # killed by the kernel's out-of-memory killer: its memory, a result of its own
    stopped_by_cluster: bool = False  # its Slurm job ended for its memory or time, or was cancelled: its result
    job_ids: tuple[str, ...] = ()  # the Slurm jobs it ran as (the last one counts; earlier ones were lost); () here
    node: str | None = None  # the node its last job ran on
    limit_enforcer: str | None = None  # which limit bounded its job, where the scenario sets one


def oom_kills(vmstat: Path = Path("/proc/vmstat")) -> int | None:
    """How many processes the kernel's out-of-memory killer has killed since boot (None where not told)."""
    try:
        for line in vmstat.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def _pump(stream: IO[bytes], tail: collections.deque[str]) -> None:
    """Pass the worker's stderr through byte for byte (bars update in place), keeping its last lines."""
    pending = b""
    fd = stream.fileno()
    while chunk := os.read(fd, 65536):
        sys.stderr.buffer.write(chunk)
        sys.stderr.buffer.flush()
        pending += chunk
        *lines, pending = re.split(rb"[\r\n]", pending)
        tail.extend(line.decode("utf-8", "replace") for line in lines if line.strip())
    if pending.strip():
        tail.append(pending.decode("utf-8", "replace"))


def _stop_process(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def watch(
    command: Sequence[str],
    limit_bytes: int | None,
    timeout_s: float,
    poll_s: float = 0.05,
) -> Outcome:
    """Run ``command``, killing it and every process it started when together they hold more than
    ``limit_bytes``, or when it outlives ``timeout_s``.

    What they hold is their summed PSS (:mod:`harness.measure.proctree`: each page shared among them counted
    once), read where their summed RSS passes the limit; ``peak_rss_bytes`` is the command's own largest
    RSS. Within :func:`harness.stopping.raising`, a signal caught while it runs ends the process, then raises
    :class:`~harness.stopping.Interrupted` (``the running strategy's process was stopped``).
    """
    with stopping.deferred():
        return _watch(command, limit_bytes, timeout_s, poll_s)


def _watch(command: Sequence[str], limit_bytes: int | None, timeout_s: float, poll_s: float) -> Outcome:
    from harness.measure.proctree import kill_tree, read_tree

    process = subprocess.Popen(list(command), stderr=subprocess.PIPE, preexec_fn=die_with_parent,  # noqa: PLW1509
                               start_new_session=True)
    tail: collections.deque[str] = collections.deque(maxlen=40)
    assert process.stderr is not None
    pump = threading.Thread(target=_pump, args=(process.stderr, tail), daemon=True)
    pump.start()
    kills_before = oom_kills()
    started, peak, reason = time.monotonic(), 0, None
    while process.poll() is None:
        signum = stopping.pending()
        if signum is not None:
            _stop_process(process)
            pump.join(timeout=5)
            raise stopping.Interrupted(signum, "the running strategy's process was stopped")
        tree = read_tree(process.pid, exact_over=limit_bytes)
        peak = max(peak, tree.rss_bytes)
        if limit_bytes is not None and tree.over(limit_bytes):
            held = tree.pss_sum_bytes if tree.pss_sum_bytes is not None else tree.rss_sum_bytes
            who = (f"the worker and the {tree.started} process{'es' if tree.started > 1 else ''} it started held "
                   f"{format_gib(held)} (PSS summed)" if tree.started else f"the worker held {format_gib(held)} "
                   "(PSS)")
            reason = f"stopped by the harness: {who}, past the scenario's memory limit of {format_gib(limit_bytes)}"
            kill_tree(process.pid, tree.pids[1:])
        elif time.monotonic() - started > timeout_s:
            reason = f"stopped by the harness: still running after the scenario's timeout of {timeout_s:.0f} s"
            kill_tree(process.pid, tree.pids[1:])
        time.sleep(poll_s)
    pump.join(timeout=5)
    code = process.returncode
    stopped_by_harness = reason is not None
    worker_error = next((line.split(FAILURE_PREFIX, 1)[1] for line in reversed(tail) if FAILURE_PREFIX in line),
                        None)
    kills_after = oom_kills() if code == -signal.SIGKILL else None
    out_of_memory = kills_before is not None and kills_after is not None and kills_after > kills_before
    if reason is None and out_of_memory:
        reason = (f"killed by the kernel's out-of-memory killer (the machine ran out of memory; the worker's RSS "
                  f"peaked at {format_gib(peak)})")
    if reason is None and code is not None and code < 0:
        reason = f"killed by signal {-code}"
    if reason is None and code not in (0, 1, OUTSIDE_STATUS):
        reason = f"exited with status {code}: " + " | ".join(list(tail)[-3:])
    return Outcome(code, reason, peak, worker_error, stopped_by_harness, out_of_memory)


Supervisor = Callable[[Plan, Sequence[str], Path, str], Outcome]
"""``(plan, worker's command, directory for a job's files, the run's name) -> how the worker ended``: one worker run
and watched to its end (:func:`watch_here`, or as a Slurm job: :class:`harness.cluster.runs.SlurmRuns`); whatever
it left in the plan's engine directory is removed after it."""


def watch_here(plan: Plan, command: Sequence[str], files: Path, name: str) -> Outcome:
    """The worker as a process of this machine (:func:`watch_worker`); ``files`` and ``name`` serve a job only."""
    return watch_worker(plan, command)


def watch_worker(plan: Plan, command: Sequence[str]) -> Outcome:
    """One strategy's worker, watched under the plan's memory limit and timeout (:func:`watch`); whatever it
    left in the run's engine directory (a worker killed mid-build leaves its engines) is removed after it."""
    try:
        return watch(command, plan.memory_limit_bytes, plan.scenario.run.timeout_s)
    finally:
        shutil.rmtree(plan.workdir, ignore_errors=True)


SELF_INFLICTED = frozenset({signal.SIGSEGV, signal.SIGFPE, signal.SIGILL, signal.SIGABRT, signal.SIGSYS,
                            signal.SIGTRAP})
"""Signals a process's own code brings on itself (a bad access, an abort): a crash of the strategy, its result.
Any other signal that kills a worker (SIGKILL, SIGTERM, SIGBUS of a file truncated under it, ...) comes
from outside it, unless the harness sent it for the scenario's memory limit or timeout."""


def no_result_of_its_own(outcome: Outcome, written: StrategyRecord | None) -> str | None:
    """Why a strategy's process left no result of its own, for a cause outside the strategy: it could not
    write its record (a full disk, say), it recorded a failure that was the machine's (exit status
    :data:`~harness.worker.OUTSIDE_STATUS`: a full disk, its files removed under it), or a signal it did
    not cause and the harness did not send killed it. ``None`` when it has a result: it finished, or
    recorded why it failed, or crashed, or the harness stopped it for its memory or time, or the kernel's
    out-of-memory killer killed it (the count in ``/proc/vmstat`` rose while it ran)."""
    code = outcome.returncode
    if outcome.stopped_by_harness or outcome.stopped_by_cluster or outcome.out_of_memory or (
            code is not None and code < 0 and -code in SELF_INFLICTED):
        return None
    if written is None:
        return outcome.worker_error or outcome.reason or f"no record written (exit status {code})"
    if code == OUTSIDE_STATUS:
        return written.error or f"exit status {code}"
    if code is not None and code < 0:
        return outcome.reason
    return None


def strategy_record(outcome: Outcome, written: StrategyRecord | None) -> StrategyRecord:
    """The record a run keeps of a strategy's process: the one it wrote (``written``; ``None`` when it wrote
    none), failed with the parent's reason where the parent knows better, and the largest RSS seen from outside."""
    if written is None:
        reason = outcome.reason or outcome.worker_error or f"no record written (exit status {outcome.returncode})"
        written = StrategyRecord(status="failed", error=reason)
    elif outcome.reason:
        written = written.replace(status="failed", error=outcome.reason)
    return written.replace(watched_peak_rss_bytes=outcome.peak_rss_bytes, job_ids=",".join(outcome.job_ids) or None,
                           node=outcome.node, limit_enforcer=outcome.limit_enforcer)
