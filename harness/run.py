"""Running a scenario: the plan once, one supervised process per strategy, the record, then publishing it.

:func:`run_scenario` checks that the results can be written (the root is a writable
directory) before anything else, resolves the scenario into a :class:`~harness.plan.Plan`
(:func:`~harness.plan.make_plan`, which generates the checkpoint where allowed), and runs
``python -m harness.worker`` for each strategy in turn. Each worker is watched from
outside (:func:`harness.watch.watch`): a worker that, together with every process it started (a check
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
not send: :func:`harness.watch.no_result_of_its_own`), has no result to publish, and its earlier result must
not be replaced by this one: the run stops there and is not published at all; the
:class:`~harness.errors.OutputError` names the strategy, the reason and, with
:class:`~harness.results.publish.Staging`'s note, where the strategies that finished are kept.
A reference measurement that fails (the read probe, :func:`harness.checkpoint_reading.choose_reading`; the
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
than one repeat, each round's files go to ``repeat-<r>/`` (:mod:`harness.results.repeats`); the strategy's
record in ``summary.json`` is that of its representative run, the one whose wall time is the median (of the runs
that finished), and its samples, events and record are copied to the top of the results directory, where the
report and figures read them; ``repeats`` lists every run's times. Samples are kept for
the representative runs only (at the top); every run's events and record stay in its
``repeat-<r>/``.

Warm-up rounds (``[run] warmup = N``) come first, as rounds of the same loop whose results are not kept: a
cold guest cache does not reset what lies outside the guest (a virtual disk's host cache, memory the host must
back again), and a warm-up round makes that alike for every measured round. Each takes the cold read (said, not
recorded) and runs each strategy once, in the scenario's order, into ``warmup-<w>/``, removed however the round
ends; its workers are named ``<name>-w<w>-<strategy>`` (a measured run's ``<name>-r<r>-<strategy>``).

Each worker is run through the ``supervisor`` :func:`run_scenario` is given: a process here watched as above
(:func:`harness.watch.watch_here`), or a Slurm job (:class:`harness.cluster.runs.SlurmRuns`, ``run --executor
slurm``) whose end means the same for the run; either way one at a time, in the rounds' order, so that no two
measurements share a machine.

Before each worker starts, one line says where the run stands among all of them
(:func:`harness.run_record.planned_runs` of the plan) and about how long the rest will take
(:class:`harness.progress.RunCounter`).
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from harness import stopping
from harness.errors import HarnessError, OutputError
from harness.fileio.atomic import FileBatch
from harness.plan import Plan, make_plan
from harness.progress import print_progress
from harness.reference import measure_shared_disk
from harness.results.names import reserved_problem
from harness.results.publish import Staging, publish
from harness.results.record import RunRecord, read_strategy_file
from harness.results.repeats import drop_repeat_samples
from harness.round_run import JOBS, Rounds, WorkerCommand
from harness.run_record import start_record
from harness.scenario import Scenario
from harness.units import format_gib
from harness.watch import Supervisor, watch_here
from harness.worker import worker_command

__all__ = ["Render", "WorkerCommand", "finished_strategies", "run_scenario"]

Render = Callable[[Path, Path, FileBatch], object]
"""``(staged results directory, where it will be published, batch)``: writes a finished run's report and
figures into ``batch``, which goes in place together with the results (``python -m harness run`` passes
:func:`harness.report.render_staged`)."""

ENGINES = "engines"
"""In the staging directory: where the run's engines built as files go (unless ``workdir`` names another);
removed before the results are published."""


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


def run_scenario(
    scenario: Scenario,
    *,
    name: str | None = None,
    results: Path = Path("results"),
    command: WorkerCommand | None = None,
    render: Render | None = None,
    workdir: Path | None = None,
    supervisor: Supervisor = watch_here,
) -> RunRecord:
    """Run every strategy of ``scenario`` into ``results/<name>/``; returns the record.

    ``command`` makes each worker's command line (default :func:`harness.worker.worker_command`).
    ``render``, when given, writes the report and figures from the staged results before they are
    published, into a batch that goes in place with them: when it fails (a full disk), the earlier
    results, report and figures all stay, and :class:`~harness.errors.OutputError` says where this
    run's files are. Without it, no report or figure is written.
    ``workdir``: where engines built as files go, a directory of this run's own, removed when the run
    ends (default: ``engines/`` in the staging directory). ``supervisor`` runs each worker and watches it to its end
    (default: a process here, :func:`harness.watch.watch_here`; each a Slurm job:
    :meth:`harness.cluster.runs.SlurmRuns.watch`), one at a time. Raises :class:`~harness.errors.HarnessError`
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
    finished = functools.partial(finished_strategies, strategies=scenario.strategies)
    stage = Staging(results, name, finished, print_progress)
    try:
        with stopping.raising(), stage as staging:
            engines = workdir or staging / ENGINES
            try:
                plan = make_plan(scenario, name=name, workdir=engines, progress=print_progress)
                stopping.check()  # one caught where a measurement's own error handling took what it raised
                record = _measure(plan, staging, command, out, supervisor)
            finally:
                shutil.rmtree(engines, ignore_errors=True)  # the run's own: gone however the run ends
                shutil.rmtree(staging / JOBS, ignore_errors=True)
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


def _measure(plan: Plan, staging: Path, command: WorkerCommand, out: Path, supervisor: Supervisor) -> RunRecord:
    """Every warm-up round and measured run of the plan, into ``staging`` (:class:`harness.round_run.Rounds`), then
    the disk shared by reads and writes (:func:`harness.reference.measure_shared_disk`); raises
    :class:`~harness.errors.OutputError` as soon as a measured run has no result of its own
    (:func:`harness.watch.no_result_of_its_own`): such a run is not published."""
    plan_path, run = start_record(plan, staging)
    scenario = plan.scenario
    print_progress(f"{len(plan.engines)} engines, the largest {format_gib(plan.largest_engine_bytes)}, "
                   f"on {plan.device} ({scenario.build.backend} backend); results go to {out}")
    rounds = Rounds(plan, plan_path, staging, out, command, supervisor)
    for round_ in range(scenario.run.warmup + max(1, scenario.run.repeats)):  # the warm-up rounds first
        run = rounds.run_round(round_, run)
    if scenario.run.cache == "cold" and scenario.run.shared_disk and plan.writes_weights_to_files:
        # after the rounds: its writes would slow whatever ran next, beyond what a cold cache resets
        run = measure_shared_disk(run, staging, plan.checkpoint_files, plan.workdir, plan.largest_engine_bytes)
    if scenario.run.repeats > 1:
        for strategy, done in rounds.runs.items():
            drop_repeat_samples(staging, strategy, done)
    return run
