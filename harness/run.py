"""Running a scenario: the plan once, one supervised process per strategy, the record, then publishing it.

:func:`run_scenario` checks that the results can be written (the root is a writable
directory) before anything else, resolves the scenario into a :class:`~harness.plan.Plan`
(:func:`~harness.plan.make_plan`, which generates the checkpoint where allowed), and runs
``python -m harness.worker`` for each strategy in turn. Each worker is watched from
outside (:func:`watch`): a worker that, together with every process it started (a check
process, a compiler's jobs), holds more than the scenario's memory limit (their summed PSS,
:mod:`harness.measure.proctree`: a page they share counted once), or that outlives its
timeout, is killed with them and recorded as failed, instead of taking the machine down; a
worker dies with the parent (``PR_SET_PDEATHSIG``). SIGINT, SIGTERM or SIGHUP to the parent,
from the start of the run to its publishing, ends it with :class:`~harness.stopping.RunInterrupted`
(:mod:`harness.stopping`, as it ends a budget sweep): at once (a reference measurement included: a
signal is not its failure), or, while a worker runs, once that worker is stopped; nothing is published
and the exit status is 128 + the signal's number.

A run writes into ``results/.<name>.partial/`` and replaces ``results/<name>/`` with it
only once every strategy has been run (:mod:`harness.results.publish`), so an interrupted
run or a full disk leaves the earlier results as they were. ``summary.json`` (a
:class:`~harness.results.record.RunRecord`) is rewritten after each strategy, so the partial
directory always holds what finished. A run that fails or is interrupted removes it, unless
a strategy finished there (:func:`finished_strategies`): then it is kept until the next run and
the error names it and them (:class:`~harness.results.publish.Staging`). Engines built as files
go under it too (:data:`ENGINES`, unless ``workdir`` names the run's own directory elsewhere), so
that no other run shares them; whatever a worker left there is removed once it ends, and the
whole directory once the measurements end, however they end.

This module draws nothing: the caller that wants the report and figures (``python -m harness
run``) passes ``render``, which writes them from the partial directory before anything is
replaced; they go in place with it (:class:`~harness.fileio.atomic.FileBatch`): when they
cannot all be written, the earlier results, report and figures all stay.

The rule for a strategy that fails: one that fails on its own (an error it records, a crash,
the scenario's memory limit or timeout) gets ``"status": "failed"`` with the reason, and the
others still run. One that fails for a reason outside it, the machine's (it could not write its
record, a full disk, its files removed under it, a signal it did not cause and the harness did
not send: :func:`_no_result_of_its_own`), has no result to publish, and its earlier result must
not be replaced by this one: the run stops there and is not published at all; the
:class:`~harness.errors.OutputError` names the strategy, the reason and, with
:class:`~harness.results.publish.Staging`'s note, where the strategies that finished are kept.
A reference measurement that fails (the read probe, :func:`harness.speed.choose_speed`; the
read-ceiling sweep; the cold read before a round; the shared disk) is recorded as failed with its
reason (``read_ceiling_error``, ``disk_read_error``, ``shared_disk_error``, ``speed.probe_error``)
and costs the run nothing. The read probe and the read-ceiling sweep are made with the plan
(:func:`~harness.plan.make_plan`), before any round: ``plan.json`` is written once, and every worker,
warm-up rounds' included, runs under the settings it holds; the record takes them from the plan.

Repeats (``[run] repeats = N``): the strategies run in rounds, each strategy once per
round, each run a fresh worker on a cache prepared again (cold: flushed and dropped), in an
order that changes from round to round (:func:`harness.rounds.round_order`, recorded in
``round_orders``), so that no strategy always runs right after the same other one. With a cold cache each round
starts with a cold sequential read of the checkpoint (:func:`harness.measure.diskread.cold_read_bandwidth`),
recorded in ``disk_reads``: the disk's rate at that time (after one that fails, none is taken). With more
than one repeat, each round's files go to ``repeat-<r>/``; the strategy's record in ``summary.json`` is that of its
representative run, the one whose wall time is the median (of the runs that finished), and its
samples, events and record are copied to the top of the results directory, where the
report and figures read them; ``repeats`` lists every run's times. Samples are kept for
the representative runs only (at the top); every run's events and record stay in its
``repeat-<r>/``.

Before each worker starts, one line says where the run stands among all of them
(:func:`planned_runs` of the plan) and about how long the rest will take
(:class:`harness.progress.RunCounter`).
"""

from __future__ import annotations

import collections
import datetime
import functools
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
from typing import IO, TypeVar

from harness import stopping
from harness.errors import HarnessError, OutputError
from harness.fileio.atomic import FileBatch, atomic_file
from harness.measure import machine
from harness.measure.diskread import cold_read_bandwidth
from harness.measure.shared_disk import shared_disk
from harness.plan import Plan, make_plan, write_plan
from harness.progress import RunCounter
from harness.results.disk import DiskRead, SharedDisk
from harness.results.metrics import StrategyMetrics, resident_at_load
from harness.results.names import reserved_problem
from harness.results.publish import Staging, publish
from harness.results.record import (
    PLAN,
    MachineInfo,
    RepeatRecord,
    RunRecord,
    StrategyRecord,
    read_strategy_file,
    strategy_file,
    write_summary,
)
from harness.results.samples import events_file, samples_file
from harness.rounds import round_orders
from harness.scenario import RunConfig, Scenario
from harness.stopping import die_with_parent
from harness.units import GIB, format_mb_per_s
from harness.worker import FAILURE_PREFIX, OUTSIDE_STATUS, worker_command

__all__ = ["Render", "WorkerCommand", "finished_strategies", "planned_runs", "run_label", "run_scenario", "watch"]

WorkerCommand = Callable[[Path, str, Path], Sequence[str]]
"""``(plan file, strategy, results directory) -> command line`` of one strategy's process."""

Render = Callable[[Path, Path, FileBatch], object]
"""``(staged results directory, where it will be published, batch)``: writes a finished run's report and
figures into ``batch``, which goes in place together with the results (``python -m harness run`` passes
:func:`harness.report.render_staged`)."""

T = TypeVar("T")

ENGINES = "engines"
"""In the staging directory: where the run's engines built as files go (unless ``workdir`` names another);
removed before the results are published."""


@dataclass
class Outcome:
    """How a strategy's process ended, as seen from outside."""

    returncode: int | None
    reason: str | None  # why it failed, when the parent knows better than the worker
    peak_rss_bytes: int
    worker_error: str | None = None  # the worker's own last word, when it could not write its record
    stopped_by_harness: bool = False  # killed for the scenario's memory limit or timeout: a result of its own
    out_of_memory: bool = False  # killed by the kernel's out-of-memory killer: its memory, a result of its own


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
                   f"{held / GIB:.2f} GiB (PSS summed)" if tree.started else f"the worker held {held / GIB:.2f} GiB "
                   "(PSS)")
            reason = f"stopped by the harness: {who}, past the scenario's memory limit of {limit_bytes / GIB:.2f} GiB"
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
                  f"peaked at {peak / GIB:.2f} GiB)")
    if reason is None and code is not None and code < 0:
        reason = f"killed by signal {-code}"
    if reason is None and code not in (0, 1, OUTSIDE_STATUS):
        reason = f"exited with status {code}: " + " | ".join(list(tail)[-3:])
    return Outcome(code, reason, peak, worker_error, stopped_by_harness, out_of_memory)


def _progress(message: str) -> None:
    print(f"[harness] {message}", file=sys.stderr, flush=True)


def planned_runs(run: RunConfig, strategies: int) -> int:
    """How many worker processes a run starts: each strategy once per warm-up round and once per repeat."""
    return strategies * (run.warmup + max(1, run.repeats))


def run_label(strategy: str, run: RunConfig, *, warmup: int | None = None, repeat: int = 0) -> str:
    """What one worker run does: ``map, warm-up 1 of 1``, ``map, repeat 2 of 3``, or ``map`` when there is
    one round (``warmup`` and ``repeat`` count from 0)."""
    if warmup is not None:
        return f"{strategy}, warm-up {warmup + 1} of {run.warmup}"
    return f"{strategy}, repeat {repeat + 1} of {run.repeats}" if run.repeats > 1 else strategy


def finished_strategies(staging: Path, strategies: Sequence[str]) -> list[str]:
    """The ``strategies`` whose record in ``staging`` (``strategy-<s>.json``; with repeats, the representative
    run's, copied there) says they finished; a record that cannot be read is not finished."""
    done = []
    for strategy in strategies:
        try:
            record = read_strategy_file(staging, strategy)
        except HarnessError:
            record = None
        if record is not None and record.ok:
            done.append(strategy)
    return done


def _run_record(plan: Plan) -> RunRecord:
    """The run's record before any strategy ran: the plan, this machine, this checkout."""
    scenario = plan.scenario
    return RunRecord(
        scenario=scenario.name,
        name=plan.name,
        description=scenario.description,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        commit=machine.commit(),
        machine=MachineInfo(**machine.machine()),
        versions=machine.versions(),
        model=plan.model,
        checkpoint=plan.checkpoint,
        engines=len(plan.engines),
        engine_cap_bytes=plan.engine_cap_bytes,
        largest_engine_bytes=plan.largest_engine_bytes,
        backend=scenario.build.backend,
        device=plan.device,
        cache=scenario.run.cache,
        release=scenario.build.release,
        memory_limit_bytes=plan.memory_limit_bytes,
        references=scenario.references,
        scenario_config=scenario.to_dict(),
        strategies={},
        repeats=scenario.run.repeats,
        speed=plan.speed,
        read_ceiling=plan.read_ceiling,
        read_ceiling_error=plan.read_ceiling_error,
        round_orders=round_orders(scenario.strategies, max(1, scenario.run.repeats)),
    )


DISK_SETTLE_TIMEOUT_S = 30.0
"""How long the disk read waits for the machine's writeback to settle (see :mod:`harness.measure.coldcache`)."""


def measure_disk(plan: Plan, before: int) -> DiskRead:
    """A cold sequential read of the plan's checkpoint files, as the run's record keeps it."""
    read = cold_read_bandwidth([Path(f) for f in plan.checkpoint_files], timeout_s=DISK_SETTLE_TIMEOUT_S)
    # the rate is derived from the time as recorded, so that the two stored figures agree; the time keeps
    # microseconds, as a millisecond is a percent of a small checkpoint's read
    seconds = round(read.seconds, 6)
    return DiskRead(before=before, bytes=read.bytes, seconds=seconds,
                    bytes_per_s=round(read.bytes / seconds, 1) if seconds > 0 else 0.0,
                    cpu_seconds=read.cpu_seconds, method=read.method,
                    resident_at_start_bytes=read.cache.record.resident_after_bytes)


def _repeat_record(repeat: int, record: StrategyRecord) -> RepeatRecord:
    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds, 3)

    return RepeatRecord(
        repeat=repeat, status=record.status, error=record.error, wall_s=record.wall_s,
        load_s=ms(record.phases.load_s), build_s=ms(record.phases.build_s),
        build_peak_bytes=record.build_peak_bytes,
        resident_at_load_bytes=resident_at_load(record),
    )


def representative(runs: Sequence[StrategyRecord]) -> StrategyRecord:
    """The run whose wall time is the median of those that finished (the lower middle for an even count);
    the last run when none finished. Each run's ``repeat`` says which it was."""
    finished = sorted((r for r in runs if r.ok and r.wall_s is not None), key=lambda r: (r.wall_s, r.repeat))
    if not finished:
        return runs[-1]
    return finished[(len(finished) - 1) // 2]


def combine_repeats(runs: Sequence[StrategyRecord]) -> StrategyRecord:
    """The record ``summary.json`` keeps of a strategy run several times: its representative run's,
    with every run's times in ``repeats``."""
    chosen = representative(runs)
    return chosen.replace(repeats=tuple(_repeat_record(r.repeat or 0, r) for r in runs))


def _watch_worker(plan: Plan, command: Sequence[str]) -> Outcome:
    """One strategy's worker, watched under the plan's memory limit and timeout (:func:`watch`); whatever it
    left in the run's engine directory (a worker killed mid-build leaves its engines) is removed after it."""
    try:
        return watch(command, plan.memory_limit_bytes, plan.scenario.run.timeout_s)
    finally:
        shutil.rmtree(plan.workdir, ignore_errors=True)


def _warm_up(plan: Plan, plan_path: Path, out_dir: Path, command: WorkerCommand, index: int,
             counter: RunCounter) -> None:
    """One discarded round: the disk read and each strategy once, for what the machine keeps of them.

    A cold guest cache does not reset what lies outside the guest (a virtual disk's host
    cache, memory the host must back again); a warm-up round makes that alike for every
    measured round. Nothing of it is recorded; its files are removed.
    """
    where = f"warm-up round {index + 1}/{plan.scenario.run.warmup} (discarded)"
    if plan.scenario.run.cache == "cold":
        disk, error = _reference(functools.partial(measure_disk, plan, index))
        _progress(f"{where}: {_disk_line(disk) if disk is not None else f'disk: failed ({error})'}")
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        for strategy in plan.scenario.strategies:
            _progress(counter.next(run_label(strategy, plan.scenario.run, warmup=index)))
            try:
                outcome = _watch_worker(plan, command(plan_path, strategy, out_dir))
            except stopping.Interrupted as exc:
                exc.detail += f" ({strategy}, {where})"
                raise
            _progress(f"{where}: {strategy} {'ran' if outcome.returncode == 0 else 'failed'}")
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _copy_run_files(source: Path, target: Path, strategy: str) -> None:
    """A run's samples, events and record copied from ``source`` to ``target`` (each with the atomic writer);
    one ``source`` lacks is removed from ``target``."""
    for name in (samples_file(strategy), events_file(strategy), strategy_file(strategy)):
        if (source / name).exists():
            with open(source / name, "rb") as original, atomic_file(target / name) as copy:
                shutil.copyfileobj(original, copy)
        elif (target / name).exists():
            (target / name).unlink()


def _drop_repeat_samples(staging: Path, strategy: str, runs: Sequence[StrategyRecord]) -> None:
    """The samples of each repeat's run; the representative's are at the top of ``staging``."""
    for r in runs:
        (staging / f"repeat-{r.repeat}" / samples_file(strategy)).unlink(missing_ok=True)


def _result_line(name: str, metrics: StrategyMetrics) -> str:
    """``map: ok; build-phase host peak 1.21 GiB, floor 1.20 GiB (+0.1% of the model); ...``."""
    if not metrics.record.ok:
        return f"{name}: FAILED ({metrics.record.error})"
    parts = [f"{name}: ok"]
    if metrics.compared_peak_bytes is not None:
        text = f"{metrics.compared_label} {metrics.compared_peak_bytes / GIB:.2f} GiB"
        if metrics.floor_bytes is not None and metrics.excess is not None:
            text += f", floor {metrics.floor_bytes / GIB:.2f} GiB ({metrics.excess * 100:+.1f}% of the model)"
        parts.append(text)
    if metrics.record.host_peak_bytes is not None:
        parts.append(f"whole-run host peak {metrics.record.host_peak_bytes / GIB:.2f} GiB")
    if metrics.record.wall_s is not None:
        parts.append(f"wall {metrics.record.wall_s:.1f} s")
    return "; ".join(parts)


SHARED_DISK_TIMES = 3
"""How many times a cold run whose engines are files measures the disk read and written at once, after its
last round (:mod:`harness.measure.shared_disk`)."""


def _shared_line(shared: SharedDisk) -> str:
    return (f"disk shared: the checkpoint read cold in {shared.read_s:.1f} s, as many bytes written as engine files "
            f"in {shared.write_s:.1f} s, both at once in {shared.both_s:.1f} s ({shared.overlap or 0:.2f} x the "
            f"longer alone; {shared.one_at_a_time or 0:.2f} would be one at a time)")


def _disk_line(disk: DiskRead) -> str:
    return (f"disk: cold sequential read of {disk.bytes / GIB:.2f} GiB in {disk.seconds:.1f} s, "
            f"{format_mb_per_s(disk.bytes_per_s)} ({disk.cpu_seconds:.1f} CPU-s)")


SELF_INFLICTED = frozenset({signal.SIGSEGV, signal.SIGFPE, signal.SIGILL, signal.SIGABRT, signal.SIGSYS,
                            signal.SIGTRAP})
"""Signals a process's own code brings on itself (a bad access, an abort): a crash of the strategy, its result.
Any other signal that kills a worker (SIGKILL, SIGTERM, SIGBUS of a file truncated under it, ...) comes
from outside it, unless the harness sent it for the scenario's memory limit or timeout."""


def _no_result_of_its_own(outcome: Outcome, written: StrategyRecord | None) -> str | None:
    """Why a strategy's process left no result of its own, for a cause outside the strategy: it could not
    write its record (a full disk, say), it recorded a failure that was the machine's (exit status
    :data:`~harness.worker.OUTSIDE_STATUS`: a full disk, its files removed under it), or a signal it did
    not cause and the harness did not send killed it. ``None`` when it has a result: it finished, or
    recorded why it failed, or crashed, or the harness stopped it for its memory or time, or the kernel's
    out-of-memory killer killed it (the count in ``/proc/vmstat`` rose while it ran)."""
    code = outcome.returncode
    if outcome.stopped_by_harness or outcome.out_of_memory or (code is not None and code < 0
                                                                and -code in SELF_INFLICTED):
        return None
    if written is None:
        return outcome.worker_error or outcome.reason or f"no record written (exit status {code})"
    if code == OUTSIDE_STATUS:
        return written.error or f"exit status {code}"
    if code is not None and code < 0:
        return outcome.reason
    return None


def _strategy_record(outcome: Outcome, written: StrategyRecord | None) -> StrategyRecord:
    if written is None:
        reason = outcome.reason or outcome.worker_error or f"no record written (exit status {outcome.returncode})"
        written = StrategyRecord(status="failed", error=reason)
    elif outcome.reason:
        written = written.replace(status="failed", error=outcome.reason)
    return written.replace(watched_peak_rss_bytes=outcome.peak_rss_bytes)


def run_scenario(
    scenario: Scenario,
    *,
    name: str | None = None,
    results: Path = Path("results"),
    command: WorkerCommand | None = None,
    render: Render | None = None,
    workdir: Path | None = None,
) -> RunRecord:
    """Run every strategy of ``scenario`` into ``results/<name>/``; returns the record.

    ``command`` makes each worker's command line (default :func:`harness.worker.worker_command`).
    ``render``, when given, writes the report and figures from the staged results before they are
    published, into a batch that goes in place with them: when it fails (a full disk), the earlier
    results, report and figures all stay, and :class:`~harness.errors.OutputError` says where this
    run's files are. Without it, no report or figure is written.
    ``workdir``: where engines built as files go, a directory of this run's own, removed when the run
    ends (default: ``engines/`` in the staging directory). Raises :class:`~harness.errors.HarnessError`
    for what a user can fix (a name the harness derives from others, :func:`harness.results.names.reserved_problem`;
    see :func:`~harness.results.publish.check_results_root` and :func:`~harness.plan.make_plan`), before any
    strategy runs, :class:`~harness.stopping.RunInterrupted`
    on SIGINT, SIGTERM or SIGHUP, and
    :class:`~harness.errors.OutputError` when a strategy failed for a reason outside it (see the module
    docstring: nothing is published). On any error the staging directory goes, unless a strategy
    finished there (:class:`~harness.results.publish.Staging`).
    """
    given, name = name, scenario.name if name is None else name
    problem = reserved_problem(name)
    if problem is not None:
        raise HarnessError(f"{'--name' if given is not None else 'scenario name'}: {problem}; choose another")
    command = command or worker_command
    results = Path(results)
    out = results / name
    stage = Staging(results, name, functools.partial(finished_strategies, strategies=scenario.strategies), _progress)
    try:
        with stopping.raising(), stage as staging:
            engines = workdir or staging / ENGINES
            try:
                plan = make_plan(scenario, name=name, workdir=engines, progress=_progress)
                stopping.check()  # one caught where a measurement's own error handling took what it raised
                record = _measure(plan, staging, command, out)
            finally:
                shutil.rmtree(engines, ignore_errors=True)  # the run's own: gone however the run ends
            with FileBatch("the earlier report and figures are unchanged") as figures:
                if render is not None:  # before anything is replaced: the results and figures go in place together
                    try:
                        render(staging, out, figures)
                    except HarnessError as exc:
                        raise OutputError(f"{exc}; {out} is unchanged") from exc
                stopping.finishing()  # one caught before is raised; from here on the run ends as it is, published
                publish(staging, out)
                figures.commit()
    except stopping.Interrupted as exc:
        raise exc.error(f"{out} is unchanged{stage.note}") from None
    return record


def _measure(plan: Plan, staging: Path, command: WorkerCommand, out: Path) -> RunRecord:
    """Every warm-up round and measured run of the plan, into ``staging``, and the reference measurements
    (:func:`_reference`); raises :class:`~harness.errors.OutputError` as soon as a measured run has no
    result of its own (:func:`_no_result_of_its_own`): such a run is not published."""
    plan_path = write_plan(staging / PLAN, plan)
    scenario = plan.scenario
    _progress(f"{len(plan.engines)} engines, the largest {plan.largest_engine_bytes / GIB:.2f} GiB, "
              f"on {plan.device} ({scenario.build.backend} backend); results go to {out}")
    run = _run_record(plan)
    repeats = max(1, scenario.run.repeats)
    runs: dict[str, list[StrategyRecord]] = {s: [] for s in scenario.strategies}
    counter = RunCounter(planned_runs(scenario.run, len(scenario.strategies)))
    for warm in range(scenario.run.warmup):
        _warm_up(plan, plan_path, staging / f"warmup-{warm}", command, warm, counter)
    for repeat in range(repeats):
        if scenario.run.cache == "cold" and run.disk_read_error is None:  # after a read that failed, none is taken
            disk, error = _reference(functools.partial(measure_disk, plan, repeat))
            if error is None:
                assert disk is not None
                run = run.replace(disk_reads=(*run.disk_reads, disk))
                _progress(_disk_line(disk))
            else:
                run = run.replace(disk_read_error=f"before round {repeat + 1} of {repeats}: {error}")
                _progress(f"disk: failed ({run.disk_read_error})")
            write_summary(staging, run)
        out_dir = staging if repeats == 1 else staging / f"repeat-{repeat}"
        for strategy in run.round_orders[repeat]:
            _progress(counter.next(run_label(strategy, scenario.run, repeat=repeat)))
            out_dir.mkdir(parents=True, exist_ok=True)
            try:
                outcome = _watch_worker(plan, command(plan_path, strategy, out_dir))
            except stopping.Interrupted as exc:
                exc.detail += f" ({strategy})"
                raise
            written = read_strategy_file(out_dir, strategy)
            outside = _no_result_of_its_own(outcome, written)
            record = _strategy_record(outcome, written).replace(repeat=repeat)
            metrics = StrategyMetrics.of(strategy, record, run)
            record = record.replace(floor_bytes=metrics.floor_bytes,
                                    excess_over_floor=None if metrics.excess is None else round(metrics.excess, 6))
            runs[strategy].append(record)
            combined = combine_repeats(runs[strategy])
            if repeats > 1:
                _copy_run_files(staging / f"repeat-{combined.repeat}", staging, strategy)
            run = run.with_strategy(strategy, combined)
            write_summary(staging, run)
            _progress(_result_line(strategy, metrics))
            if outside is not None:  # not the strategy's result: the earlier one, if any, stays
                raise OutputError(f"{out}: kept as it was, this run is not published: "
                                  f"{run_label(strategy, scenario.run, repeat=repeat)} failed for a reason outside "
                                  f"the strategy ({outside})")
    if scenario.run.cache == "cold" and scenario.run.shared_disk and plan.writes_weights_to_files:
        # after the rounds: its writes would slow whatever ran next, beyond what a cold cache resets
        for time_ in range(SHARED_DISK_TIMES):
            _progress(f"the disk read and written at once, {time_ + 1} of {SHARED_DISK_TIMES}")
            shared, error = _reference(
                lambda: shared_disk(plan.checkpoint_files, plan.workdir, plan.largest_engine_bytes))
            if error is not None:  # the times measured before it stand; no more are taken
                run = run.replace(shared_disk_error=f"time {time_ + 1} of {SHARED_DISK_TIMES}: {error}")
                write_summary(staging, run)
                _progress(f"disk shared: failed ({run.shared_disk_error})")
                break
            assert shared is not None
            run = run.replace(shared_disk=(*run.shared_disk, shared))
            write_summary(staging, run)
            _progress(_shared_line(shared))
    if repeats > 1:
        for strategy, done in runs.items():
            _drop_repeat_samples(staging, strategy, done)
    return run


def _reference(measurement: Callable[[], T]) -> tuple[T | None, str | None]:
    """A reference measurement's result, or ``None`` and why it failed: it is recorded as failed, with its
    reason, and never costs the run (a disk that fills up, a file gone under it).

    A signal is no failure of the measurement: :class:`~harness.stopping.Interrupted` goes through, and a
    signal caught while it ran is raised after it (:func:`harness.stopping.check`), even where the
    measurement's own code swallowed what it raised.
    """
    try:
        result: T | None = measurement()
        error = None
    except Exception as exc:
        result, error = None, " ".join(f"{type(exc).__name__}: {exc}".split())
    stopping.check()
    return result, error
