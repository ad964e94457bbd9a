"""One round of a run: the disk's cold read before it, then each strategy's worker, supervised, its record read and
its result line said.

A measured round runs the strategies in its order (the record's ``round_orders``), each into the round's directory
(the staging directory, or ``repeat-<r>/`` with repeats: :mod:`harness.results.repeats`); each run's record is read
back, its figures against the model's floor added, its line said, and the strategy's combined record written into
``summary.json`` at once, so that the staging directory always holds what finished. A run with no result of its own
(:func:`harness.watch.no_result_of_its_own`) raises :class:`~harness.errors.OutputError`: such a run is not
published. A warm-up round runs the strategies in the scenario's order into ``warmup-<w>/``, keeps nothing of
them, and its directory is removed however it ends; its cold read is said, not recorded.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness import stopping
from harness.errors import OutputError
from harness.plan import Plan
from harness.progress import RunCounter, disk_line, print_progress, result_line, run_label
from harness.reference import measure_disk, reference
from harness.results.metrics import StrategyMetrics
from harness.results.record import RunRecord, StrategyRecord, read_strategy_file, write_summary
from harness.results.repeats import combine_repeats, copy_run_files, repeat_dir
from harness.run_record import planned_runs
from harness.watch import Supervisor, no_result_of_its_own, strategy_record

__all__ = ["JOBS", "Rounds", "WorkerCommand"]

WorkerCommand = Callable[[Path, str, Path], Sequence[str]]
"""``(plan file, strategy, results directory) -> command line`` of one strategy's process."""

JOBS = "jobs"
"""In the staging directory: each Slurm job's spec, result and output (``supervisor`` a
:class:`~harness.cluster.runs.SlurmRuns`); removed before the results are published."""


@dataclass
class Rounds:
    """What every round of a run shares: the ``plan`` (written at ``plan_path``), the ``staging`` directory,
    the results directory errors name (``out``), how each worker's command line is made (``command``) and how it is
    run and watched (``supervisor``); the ``counter`` of the worker runs the plan makes
    (:func:`harness.run_record.planned_runs`), its clock started when the rounds are; ``runs`` gathers each
    strategy's measured records, round by round, in the scenario's order of strategies."""

    plan: Plan
    plan_path: Path
    staging: Path
    out: Path
    command: WorkerCommand
    supervisor: Supervisor
    counter: RunCounter = field(init=False)
    runs: dict[str, list[StrategyRecord]] = field(init=False)

    def __post_init__(self) -> None:
        scenario = self.plan.scenario
        self.counter = RunCounter(planned_runs(scenario.run, len(scenario.strategies)))
        self.runs = {s: [] for s in scenario.strategies}

    def run_round(self, round_: int, run: RunRecord) -> RunRecord:
        """Round ``round_`` (the warm-up rounds first, counted from 0 with the measured ones after them) of the
        run whose record is ``run``; returns the record with what it measured (see the module docstring)."""
        scenario = self.plan.scenario
        warmups, repeats = scenario.run.warmup, max(1, scenario.run.repeats)
        warm = round_ < warmups
        index = round_ if warm else round_ - warmups  # counts from 0 among rounds of its kind
        where = f"warm-up round {index + 1}/{warmups} (discarded)" if warm else ""
        if scenario.run.cache == "cold" and run.disk_read_error is None:  # after a read that failed, none is taken
            disk, error = reference(functools.partial(measure_disk, self.plan.checkpoint_files, index))
            if warm:  # said, not recorded
                print_progress(f"{where}: {disk_line(disk) if disk is not None else f'disk: failed ({error})'}")
            elif error is None:
                assert disk is not None
                run = run.replace(disk_reads=(*run.disk_reads, disk))
                print_progress(disk_line(disk))
            else:
                run = run.replace(disk_read_error=f"before round {index + 1} of {repeats}: {error}")
                print_progress(f"disk: failed ({run.disk_read_error})")
            if not warm:
                write_summary(self.staging, run)
        # a warm-up round's files go apart and are removed once it ends; its strategies run in the scenario's order
        out_dir = (self.staging / f"warmup-{index}" if warm else self.staging if repeats == 1
                   else repeat_dir(self.staging, index))
        try:
            for strategy in scenario.strategies if warm else run.round_orders[index]:
                label = run_label(strategy, warmups, scenario.run.repeats, warmup=index if warm else None,
                                  repeat=index)
                print_progress(self.counter.next(label))
                out_dir.mkdir(parents=True, exist_ok=True)
                try:
                    outcome = self.supervisor(self.plan, self.command(self.plan_path, strategy, out_dir),
                                              self.staging / JOBS,
                                              f"{self.plan.name}-{'w' if warm else 'r'}{index}-{strategy}")
                except stopping.Interrupted as exc:
                    exc.detail += f" ({strategy}, {where})" if warm else f" ({strategy})"
                    raise
                if warm:  # nothing of it is kept
                    print_progress(f"{where}: {strategy} {'ran' if outcome.returncode == 0 else 'failed'}")
                    continue
                written = read_strategy_file(out_dir, strategy)
                outside = no_result_of_its_own(outcome, written)
                record = strategy_record(outcome, written).replace(repeat=index)
                metrics = StrategyMetrics.of(strategy, record, run)
                record = record.replace(floor_bytes=metrics.floor_bytes,
                                        excess_over_floor=None if metrics.excess is None else round(metrics.excess, 6))
                print_progress(result_line(strategy, metrics))
                self.runs[strategy].append(record)
                combined = combine_repeats(self.runs[strategy])
                run = run.with_strategy(strategy, combined)
                if repeats > 1:
                    copy_run_files(repeat_dir(self.staging, combined.repeat or 0), self.staging, strategy)
                write_summary(self.staging, run)
                if outside is not None:  # not the strategy's result: the earlier one, if any, stays
                    raise OutputError(f"{self.out}: kept as it was, this run is not published: {label} failed for a "
                                      f"reason outside the strategy ({outside})")
        finally:
            if warm:  # however the round ends
                shutil.rmtree(out_dir, ignore_errors=True)
        return run
