"""Budget mode: each strategy of a scenario swept for the smallest memory limit it completes under.

:func:`run_budget` resolves the scenario into a plan (:func:`harness.plan.make_plan`, which
also makes one-off conversions such as ``torch_mmap``'s ``.pt``), then for each strategy:

The plan is the sweep's single resolution, as for ``harness run``: made (with its read probe, read-ceiling sweep
and prefetch sizing) and written to ``plan.json`` once, before any attempt; every attempt runs under its settings,
which ``budget.json`` states (``speed``) and the report says in the words of the run's report.

1. **unconstrained**: one run of the strategy's worker (:mod:`harness.worker`, the same
   process ``harness run`` measures) in a memory cgroup whose limit is the scenario's
   ``run.memory_limit_gib`` (the machine's memory where it has none), or the effective limit
   where that is lower: the smallest of every enclosing group's limit (the job or container the
   harness runs in) and the machine's memory (:func:`harness.budget.enclosing.effective_limit`);
   no group made below those can use more. The record's ``controller`` line says which it is, and
   an attempt OOM-killed by an enclosing group's limit says so, naming the group. Its group peak
   (page cache charged to the group included) is the sweep's upper bound, the anonymous
   part of its baseline (Python, torch, the model on meta: what no limit can reclaim; the
   rest of its baseline RSS is shared libraries' page cache, charged to whoever read them
   first) the lower bound, and its wall time sets the
   timeout of every later attempt (``timeout_factor`` x, at least ``min_timeout_s``): a
   run that needs longer than that has not completed in any useful sense.
2. **sweep**: :func:`harness.budget.sweep.smallest_limit` between those bounds, to
   ``precision_bytes`` (default: 2% of the model, at least 64 MiB). For ``map`` it adds
   runs at 1.25x, 1.5x and 2x the minimum and at baseline + 2 x the largest engine, for
   the wall-time curve (not for a compiler backend, whose attempts take minutes each). A
   strategy given a limit in ``at`` (``--at STRATEGY=GIB``) is not swept: one attempt
   under that limit says where it stands (status ``at_limit``), for strategies whose
   attempts take minutes (a compiler's).

Only the unconstrained run checks the built model against eager (a compiler backend's check,
in processes of its own, :mod:`harness.engines.compile.check_process`): the constrained attempts
ask whether the same build fits (the worker's ``--no-check``), and a float32 run of eager
would otherwise set the limit. A compiler's own processes (the C++ compiler, the linker) are
the worker's children, in its group.

Every attempt is a fresh process in a fresh group on a cold cache: the checkpoint's files
(and the files the strategy reads instead, such as the ``.pt``) are flushed and dropped
from the page cache just before it starts, so the group is charged for reading them.
After each attempt the groups of this process still present are counted (``groups_left``,
0 unless cleanup failed).

Engines built as files go under the sweep's own staging directory
(:data:`~harness.run.ENGINES`, unless ``workdir`` names the sweep's own directory elsewhere), so
that no other run or sweep shares them; whatever an attempt left there (one killed at its limit
mid-build leaves its engines) is removed once it ends, and the whole directory once the sweep
ends, however it ends (a SIGKILLed sweep's goes with its staging directory, at the next start in
its results root).

Results go to ``results/<name>/`` (default name ``<scenario>-budget``): ``budget.json``
(:mod:`harness.budget.record`), ``attempts.csv`` (one row per attempt) and ``plan.json``,
staged in ``results/.<name>.partial/`` and put in place once every strategy was swept
(:mod:`harness.results.publish`); ``python -m harness budget`` then renders the report and
figure (:mod:`harness.report.budget`) beside it. A sweep that fails or is interrupted removes
its staging directory, unless a strategy was swept to the end there (``budget.json``): then it
is kept until the next run and the error names it and them
(:class:`~harness.results.publish.Staging`).

Without a usable memory cgroup the mode refuses to start (:class:`BudgetUnavailable`), before
anything is written.

From the cgroup check to the last strategy's record, SIGINT, SIGTERM and SIGHUP end the sweep
through its cleanup (:mod:`harness.stopping`, as they end a run): the running attempt's process is
killed, its group removed, the staging directory kept or removed as above, and
:class:`~harness.stopping.RunInterrupted` raised (``python -m harness budget``: one ``error:`` line,
exit status 128 + the signal's number); once publishing began, the sweep ends as it is, published.
Killed outright (SIGKILL), the parent takes its running worker with it, and the next sweep removes
the group it left.
"""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import datetime
import io
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from harness import stopping
from harness.budget.cgroup import DEFAULT_PREFIX, Attempt, MemoryGroup, run_in_group
from harness.budget.controller import CgroupUnavailable, MemoryController, find_controller
from harness.budget.enclosing import EffectiveLimit, effective_limit
from harness.budget.record import (
    AttemptRecord,
    BudgetRecord,
    StrategyBudget,
    goal_limit,
    read_budget,
    write_budget,
)
from harness.budget.remote import RemoteAttempt, RemoteAttempts
from harness.budget.sweep import SweepError, default_precision, smallest_limit
from harness.catalog import HEADLINE_STRATEGY, strategy_label
from harness.errors import HarnessError
from harness.fileio.atomic import write_atomic
from harness.fileio.codec import json_key
from harness.load.strategies import STRATEGIES
from harness.measure import machine
from harness.plan import Plan, make_plan, write_plan
from harness.results.names import budget_name, reserved_problem
from harness.results.publish import Staging, publish
from harness.results.record import PLAN, MachineInfo, RecordError, StrategyRecord, read_strategy_file
from harness.results.samples import read_samples, samples_file
from harness.run import ENGINES, WorkerCommand
from harness.scenario import Limit, Scenario
from harness.scenario_rules import LIMITS
from harness.units import GIB, MIB, PIB, TIB, gib_or_mib
from harness.worker import engine_directory, worker_command

__all__ = ["ATTEMPTS_FILE", "PRECISION_MIB", "TIMEOUT_FACTOR", "BudgetUnavailable", "check_cgroup", "run_budget",
           "swept_strategies"]

ATTEMPTS_FILE = "attempts.csv"
MAP_EXTRA_FACTORS = (1.25, 1.5, 2.0)


class BudgetUnavailable(HarnessError):
    """No memory cgroup this process can make limited groups in: budget mode refuses to run."""


def _progress(message: str) -> None:
    print(f"[budget] {message}", file=sys.stderr, flush=True)


def check_cgroup(controller: MemoryController | None = None) -> MemoryController:
    """The memory controller, proven usable by making and removing one limited group.

    Raises :class:`BudgetUnavailable` with the reason (no controller, not delegated, no
    permission) when it is not.
    """
    try:
        controller = controller or find_controller()
        with MemoryGroup.create(256 * MIB, controller=controller):
            pass
    except CgroupUnavailable as exc:
        raise BudgetUnavailable(f"{exc}; budget mode refuses to run without one") from exc
    return controller


def groups_of_this_process(controller: MemoryController, prefix: str = DEFAULT_PREFIX) -> list[Path]:
    """The memory groups this process made that are still there."""
    mark = f"{prefix}-{os.getpid()}-"
    try:
        return sorted(p for p in controller.parent.iterdir() if p.name.startswith(mark) and p.is_dir())
    except OSError:
        return []


def unconstrained_limit(scenario_bytes: int | None, effective: EffectiveLimit) -> tuple[int, str]:
    """The limit of a strategy's unconstrained run and where it comes from: the scenario's ``memory_limit_gib``
    where it has one and it is not above ``effective``, else ``effective`` (an enclosing group's limit or the
    machine's memory)."""
    if scenario_bytes is not None and scenario_bytes <= effective.limit_bytes:
        return scenario_bytes, "the scenario's run.memory_limit_gib"
    if scenario_bytes is not None:
        return effective.limit_bytes, (f"{effective.describe()}, below the scenario's run.memory_limit_gib of "
                                       f"{gib_or_mib(scenario_bytes)}")
    return effective.limit_bytes, effective.describe()


def _baseline_anon(samples: Path) -> int | None:
    """The worker's largest anonymous memory while at its baseline, from its samples (None without them)."""
    try:
        frame = read_samples(samples)
    except (RecordError, OSError):
        return None
    anon = frame.loc[frame["phase"] == "baseline", "anon_bytes"].dropna()
    return int(anon.max()) if len(anon) else None


class _Strategy:
    """Attempts of one strategy: each a fresh worker in a fresh group (here, or in a Slurm job where ``jobs`` is
    given), its record read back."""

    def __init__(self, plan: Plan, plan_path: Path, strategy: str, staging: Path, controller: MemoryController,
                 command: WorkerCommand, say: Callable[[str], None], jobs: RemoteAttempts | None = None,
                 behind: bool = False) -> None:
        self.plan, self.plan_path, self.strategy = plan, plan_path, strategy
        self.staging, self.controller, self.command, self.say = staging, controller, command, say
        self.jobs, self.behind = jobs, behind
        self.where: list[RemoteAttempt | None] = []
        files = [Path(f) for f in plan.checkpoint_files]
        files += [f for f in STRATEGIES[strategy].files_read(Path(plan.checkpoint.path)) if f not in files]
        self.cold_files = files
        self.timeout_s = plan.scenario.run.timeout_s
        self.runs: list[tuple[Attempt, StrategyRecord | None, int | None, int]] = []

    def attempt(self, limit: int, phase: str = "") -> Attempt:
        with tempfile.TemporaryDirectory(prefix=f".{self.strategy}-", dir=self.staging) as out:
            command = [*self.command(self.plan_path, self.strategy, Path(out))]
            if phase != "unconstrained":  # whether the build fits is the question; the first run checked it
                command.append("--no-check")
            try:
                if self.jobs is None:
                    result = run_in_group(command, limit, self.timeout_s,
                                          cold_files=self.cold_files, echo_stderr=False, controller=self.controller)
                    self.where.append(None)
                else:
                    job = self.jobs.attempt(command, limit, self.timeout_s, self.cold_files, Path(out),
                                            f"{self.strategy}-{len(self.runs)}", behind=self.behind)
                    result = job.attempt
                    self.where.append(job)
            finally:  # what a worker killed mid-build left, before the next attempt builds again; only this
                # strategy's: another's attempt may be building beside it (--executor slurm)
                shutil.rmtree(engine_directory(self.plan, self.strategy), ignore_errors=True)
            try:
                worker = read_strategy_file(Path(out), self.strategy)
            except RecordError:
                worker = None  # killed while writing it
            anon = _baseline_anon(Path(out) / samples_file(self.strategy))
        left = len(groups_of_this_process(self.controller))
        self.runs.append((result, worker, anon, left))
        verdict = (f"completed in {result.wall_s:.1f} s" if result.completed
                   else f"failed after {result.wall_s:.1f} s: {self._reason(result, worker)}")
        ran = self.where[-1]
        where = "" if ran is None else f" (Slurm job {ran.job_ids[-1]} on {ran.node or 'no node'})"
        self.say(f"{self.strategy} {phase or 'attempt'} under {gib_or_mib(limit)}{where}: {verdict}; "
                 f"group peak {gib_or_mib(result.group_peak_bytes)}")
        return result

    @staticmethod
    def _reason(result: Attempt, worker: StrategyRecord | None) -> str | None:
        if result.completed:
            return result.reason  # an OOM kill it survived, if any
        if worker is not None and worker.error and (result.reason or "").startswith("exited with status"):
            return f"{result.reason}; the worker says: {worker.error}"
        return result.reason

    def records(self, phases: Sequence[str]) -> tuple[AttemptRecord, ...]:
        out = []
        for phase, (result, worker, anon, left), job in zip(phases, self.runs, self.where, strict=True):
            load_build_s = None
            if worker is not None and worker.ok and worker.phases.wall_s is not None:
                load_build_s = round(worker.phases.wall_s, 3)
            out.append(AttemptRecord(
                phase=phase, limit_bytes=result.limit_bytes, completed=result.completed,
                returncode=result.returncode, wall_s=round(result.wall_s, 3),
                group_peak_bytes=result.group_peak_bytes, oom_kills=result.oom_kills,
                reason=self._reason(result, worker),
                worker_wall_s=None if worker is None else worker.process_wall_s,
                worker_error=None if worker is None else worker.error, load_build_s=load_build_s,
                baseline_anon_bytes=anon, groups_left=left,
                job_ids=None if job is None else ",".join(job.job_ids), node=None if job is None else job.node,
                limit_enforcer=None if job is None else job.enforcer))
        return tuple(out)


StartOf = Callable[[Plan, str, int, int], "int | None"]
"""Where a strategy's bisection starts: its predicted minimum from the plan, the strategy, and its unconstrained
run's baseline RSS and anonymous memory (:func:`harness.predict.recorded.predicted_minimum`, which the command line
hands in); ``None``: from the bounds alone."""


def runs_curve(plan: Plan, strategy: str) -> bool:
    """Whether ``strategy``'s sweep adds the wall-time curve's points once its minimum is found: the headline
    strategy's, unless the backend is a compiler (whose attempts take minutes each). Its chain of attempts is the
    sweep's longest, so through Slurm the other strategies' jobs yield to its jobs (``behind``)."""
    return strategy == HEADLINE_STRATEGY and not plan.compiler


def _sweep_strategy(runner: _Strategy, plan: Plan, unconstrained_limit: int, precision: int,
                    timeout_factor: float, min_timeout_s: float, start_of: StartOf | None = None) -> StrategyBudget:
    strategy = runner.strategy
    first = runner.attempt(unconstrained_limit, "unconstrained")
    worker = runner.runs[0][1]
    release_note = worker.release_note if worker is not None else ""
    baseline = worker.baseline_rss_bytes if worker is not None else None
    anon = runner.runs[0][2]

    def failed(error: str, phases: Sequence[str], **known: int | None) -> StrategyBudget:
        return StrategyBudget(status="failed", error=error, label=strategy_label(strategy), release_note=release_note,
                              baseline_rss_bytes=baseline, baseline_anon_bytes=anon, lower_bytes=known.get("lower"),
                              upper_bytes=known.get("upper"), timeout_s=runner.timeout_s, minimum_bytes=None,
                              largest_failing_bytes=None, at_lower_bound=False, unstable_limits=(),
                              attempts=runner.records(phases))

    if not first.completed:
        return failed(f"does not complete under the unconstrained limit of {gib_or_mib(unconstrained_limit)}: "
                      f"{runner.records(['unconstrained'])[0].reason}", ["unconstrained"])
    peak = first.group_peak_bytes
    upper = unconstrained_limit if peak is None else min(unconstrained_limit, math.ceil(peak / MIB) * MIB + MIB)
    lower = max(MIB, (anon or 64 * MIB) // MIB * MIB)
    runner.timeout_s = round(max(min_timeout_s, timeout_factor * first.wall_s), 1)
    if lower >= upper:
        return failed(f"the baseline's anonymous memory ({gib_or_mib(anon)}) is not below the unconstrained group peak "
                      f"({gib_or_mib(peak)}): nothing to sweep", ["unconstrained"], lower=lower, upper=upper)
    extra_factors: Sequence[float] = ()
    extra_limits: Sequence[int] = ()
    if runs_curve(plan, strategy):
        extra_factors = MAP_EXTRA_FACTORS
        extra_limits = () if baseline is None else (goal_limit(baseline, plan.largest_engine_bytes),)
    start = None  # the bisection brackets the minimum predicted from the plan and this baseline first
    if start_of is not None and baseline is not None and anon is not None:
        start = start_of(plan, strategy, baseline, anon)
    try:
        sweep = smallest_limit(lambda limit: runner.attempt(limit), lower, upper, precision, start=start,
                               extra_factors=extra_factors, extra_limits=extra_limits, max_attempts=40)
    except SweepError as exc:
        phases = ["unconstrained", *(p.phase for p in exc.points)]
        return failed(str(exc), phases, lower=lower, upper=upper)
    phases = ["unconstrained", *(p.phase for p in sweep.points)]
    runner.say(f"{strategy}: {sweep.describe()}")
    return StrategyBudget(status="ok", error=None, label=strategy_label(strategy), release_note=release_note,
                          baseline_rss_bytes=baseline, baseline_anon_bytes=anon, lower_bytes=lower, upper_bytes=upper,
                          timeout_s=runner.timeout_s, minimum_bytes=sweep.minimum_bytes,
                          largest_failing_bytes=sweep.largest_failing_bytes, at_lower_bound=sweep.at_lower_bound,
                          unstable_limits=sweep.unstable_limits, attempts=runner.records(phases))


def _run_at_limit(runner: _Strategy, unconstrained_limit: int, limit: int, timeout_factor: float,
                  min_timeout_s: float) -> StrategyBudget:
    """The strategy run once unconstrained (its check, its bounds, its timeout) and once under ``limit``."""
    strategy = runner.strategy
    first = runner.attempt(unconstrained_limit, "unconstrained")
    worker = runner.runs[0][1]
    common = dict(label=strategy_label(strategy), release_note=worker.release_note if worker is not None else "",
                  baseline_rss_bytes=worker.baseline_rss_bytes if worker is not None else None,
                  baseline_anon_bytes=runner.runs[0][2], lower_bytes=None, upper_bytes=None, minimum_bytes=None,
                  largest_failing_bytes=None, at_lower_bound=False, unstable_limits=())
    if not first.completed:
        return StrategyBudget(status="failed", error=(
            f"does not complete under the unconstrained limit of {gib_or_mib(unconstrained_limit)}: "
            f"{runner.records(['unconstrained'])[0].reason}"), timeout_s=runner.timeout_s,
            attempts=runner.records(["unconstrained"]), **common)  # type: ignore[arg-type]
    runner.timeout_s = round(max(min_timeout_s, timeout_factor * first.wall_s), 1)
    runner.attempt(limit, "at")
    return StrategyBudget(status="at_limit", error=None, timeout_s=runner.timeout_s,
                          attempts=runner.records(["unconstrained", "at"]), **common)  # type: ignore[arg-type]


def write_attempts_csv(directory: Path, record: BudgetRecord) -> Path:
    """``attempts.csv``: one row per attempt of every strategy, in the order they ran."""
    fields = ["strategy", "run", *(json_key(f) for f in dataclasses.fields(AttemptRecord))]
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields)
    writer.writeheader()
    for name, strategy in record.strategies.items():
        for i, attempt in enumerate(strategy.attempts):
            writer.writerow({"strategy": name, "run": i, **attempt.to_json()})
    path = Path(directory) / ATTEMPTS_FILE
    write_atomic(path, text.getvalue())
    return path


PRECISION_MIB = Limit(1, TIB // MIB, unit="MiB", note="1 TiB")
"""The range of ``--precision-mib``: no finer than the sweep's 1 MiB granularity."""
AT_LIMIT_GIB = Limit(MIB / GIB, PIB // GIB, unit="GiB", note="1 MiB to 1 PiB")
"""The range of ``--at``'s limits: at least 1 MiB."""
TIMEOUT_FACTOR = Limit(1, 1000, low_open=True)
"""The range of ``--timeout-factor``: an attempt must be given longer than the unconstrained run took."""


def _check_settings(precision_bytes: int | None, timeout_factor: float, min_timeout_s: float) -> None:
    """Refuse settings outside their range before anything runs (``ValueError``; the command line
    says it in its own terms first)."""
    if precision_bytes is not None and not PRECISION_MIB.accepts(precision_bytes / MIB):
        raise ValueError(f"precision_bytes {precision_bytes}: {PRECISION_MIB.expected()} when in MiB")
    if not TIMEOUT_FACTOR.accepts(timeout_factor):
        raise ValueError(f"timeout_factor {timeout_factor}: {TIMEOUT_FACTOR.expected()}")
    if not LIMITS["run.timeout_s"].accepts(min_timeout_s):
        raise ValueError(f"min_timeout_s {min_timeout_s}: {LIMITS['run.timeout_s'].expected()}")


def swept_strategies(staging: Path) -> list[str]:
    """The strategies swept to the end (``ok``) in the ``budget.json`` staged in ``staging``; none when it
    cannot be read."""
    try:
        record = read_budget(staging)
    except (HarnessError, OSError):
        return []
    return [name for name, strategy in record.strategies.items() if strategy.ok]


def run_budget(scenario: Scenario, *, name: str | None = None, results: Path = Path("results"),
               precision_bytes: int | None = None, timeout_factor: float = 4.0, min_timeout_s: float = 60.0,
               command: WorkerCommand | None = None, workdir: Path | None = None,
               controller: MemoryController | None = None, at: Mapping[str, int] | None = None,
               progress: Callable[[str], None] = _progress, jobs: RemoteAttempts | None = None,
               start_of: StartOf | None = None) -> BudgetRecord:
    """Sweep every strategy of ``scenario`` for its smallest memory limit into ``results/<name>/``; returns the
    record. It draws nothing: the report and figure are :func:`harness.report.budget.render_budget`'s
    (``python -m harness budget`` renders them after this returns).

    See the module docstring. Raises ``ValueError`` for ``precision_bytes``, ``timeout_factor``
    or ``min_timeout_s`` out of range, :class:`BudgetUnavailable` without a usable memory
    cgroup and the :func:`~harness.run.run_scenario` errors for the results root and the plan,
    all before any strategy runs. SIGINT, SIGTERM or SIGHUP (in the main thread) stop the
    running attempt, remove its group and raise :class:`~harness.stopping.RunInterrupted`
    (:mod:`harness.stopping`). ``at``: strategies run at one limit (bytes) instead of swept:
    the unconstrained run and one attempt under that limit (a sweep of a strategy whose attempts
    take minutes costs hours); a name the scenario does not run, or a limit below 1 MiB, is a
    ``ValueError``. ``workdir``: where engines built as files go, a directory of this sweep's own, emptied
    after each attempt and removed when the sweep ends (default: ``engines/`` in the staging directory).
    ``jobs``: run each attempt as a Slurm job whose ``--mem`` is its limit (:mod:`harness.cluster`), the strategies'
    sweeps at once (one after another for a compiler backend, whose attempts were not tried side by side);
    an interrupted sweep cancels every job it submitted, by id.
    """
    _check_settings(precision_bytes, timeout_factor, min_timeout_s)
    at = dict(at or {})
    unknown = sorted(set(at) - set(scenario.strategies))
    if unknown:
        raise ValueError(f"at: {unknown[0]!r} is not a strategy of scenario {scenario.name!r} "
                         f"({', '.join(scenario.strategies)})")
    small = sorted(name for name, limit in at.items() if limit < MIB)
    if small:
        raise ValueError(f"at: {small[0]}: a limit of at least 1 MiB, got {at[small[0]]} bytes")
    name = budget_name(scenario.name) if name is None else name
    problem = reserved_problem(name, sweep=True)
    if problem is not None:
        raise HarnessError(f"--name: {problem}; choose another")
    results = Path(results)
    stage = Staging(results, name, swept_strategies, progress)
    try:
        with stopping.raising():
            controller = check_cgroup(controller)
            with stage as staging:
                engines = workdir or staging / ENGINES
                try:
                    record = _sweep_all(scenario, name, results, precision_bytes, timeout_factor, min_timeout_s,
                                        command, engines, controller, progress, staging, at, jobs, start_of)
                except BaseException:
                    if jobs is not None:
                        cancelled = jobs.stop()
                        if cancelled:
                            progress(f"cancelled Slurm jobs {', '.join(cancelled)}")
                    raise
                finally:
                    shutil.rmtree(engines, ignore_errors=True)  # the sweep's own: gone however the sweep ends
                progress(f"sweep done in {record.sweep_wall_s / 60:.1f} min")
                stopping.finishing()  # one caught before is raised; from here on the sweep ends as it is, published
                publish(staging, results / name)
    except stopping.Interrupted as exc:
        raise exc.error(f"every attempt's process was stopped and its memory cgroup removed; {results / name} is "
                        f"unchanged{stage.note}") from None
    return record


def _sweep_all(scenario: Scenario, name: str, results: Path, precision_bytes: int | None, timeout_factor: float,
               min_timeout_s: float, command: WorkerCommand | None, workdir: Path,
               controller: MemoryController, progress: Callable[[str], None], staging: Path,
               at: Mapping[str, int], jobs: RemoteAttempts | None = None,
               start_of: StartOf | None = None) -> BudgetRecord:
    """Everything up to the record of the last strategy, staged in ``staging``, engines under ``workdir``."""
    plan = make_plan(scenario, name=name, workdir=workdir, progress=progress)
    plan_path = write_plan(staging / PLAN, plan)
    unconstrained, source = unconstrained_limit(plan.memory_limit_bytes, effective_limit(controller.enclosing()))
    precision = precision_bytes or default_precision(plan.model.bytes)
    progress(f"{controller.describe()}; {len(plan.scenario.strategies)} strategies, precision {gib_or_mib(precision)}, "
             f"unconstrained limit {gib_or_mib(unconstrained)} ({source}); results go to {results / name}")
    record = BudgetRecord(
        name=name, scenario=scenario.name, description=scenario.description,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), commit=machine.commit(),
        machine=MachineInfo(**machine.machine()), versions=machine.versions(), model_name=plan.model.name,
        model_bytes=plan.model.bytes, checkpoint=plan.checkpoint.path, engines=len(plan.engines),
        largest_engine_bytes=plan.largest_engine_bytes, backend=plan.scenario.build.backend, device=plan.device,
        controller=(f"{controller.describe()}; unconstrained limit: {source}"
                    + ("" if jobs is None else f"; {jobs.describe()}")),
        precision_bytes=precision,
        unconstrained_limit_bytes=unconstrained,
        timeout_factor=timeout_factor, min_timeout_s=min_timeout_s, sweep_wall_s=0.0, reading=plan.reading)
    started = time.monotonic()

    longest = {s for s in plan.scenario.strategies if s not in at and runs_curve(plan, s)}

    def sweep(strategy: str) -> StrategyBudget:
        runner = _Strategy(plan, plan_path, strategy, staging, controller, command or worker_command, progress, jobs,
                           behind=bool(longest) and strategy not in longest)
        if strategy in at:
            return _run_at_limit(runner, unconstrained, at[strategy], timeout_factor, min_timeout_s)
        return _sweep_strategy(runner, plan, unconstrained, precision, timeout_factor, min_timeout_s, start_of)

    strategies = plan.scenario.strategies
    if jobs is None or plan.compiler or len(strategies) == 1:
        results_of: Iterable[StrategyBudget] = (sweep(s) for s in strategies)
        pool = None
    else:  # each strategy's bisection waits on its own jobs; Slurm runs them side by side
        pool = concurrent.futures.ThreadPoolExecutor(len(strategies), thread_name_prefix="budget")
        futures = [pool.submit(sweep, s) for s in strategies]
        results_of = (f.result() for f in futures)
    try:
        for strategy, swept in zip(strategies, results_of, strict=True):  # recorded in the scenario's order
            record = record.with_strategy(strategy, swept, time.monotonic() - started)
            write_budget(staging, record)
            write_attempts_csv(staging, record)
    finally:
        if pool is not None:
            if jobs is not None and any(not f.done() for f in futures):
                cancelled = jobs.stop()  # the waiting threads end once their jobs are cancelled
                if cancelled:
                    progress(f"cancelled Slurm jobs {', '.join(cancelled)}")
            pool.shutdown(wait=True, cancel_futures=True)
    return record
