"""Warm-up rounds: each strategy run once, and the disk read, before the measured rounds; nothing of them kept."""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from harness import stopping
from harness.plan import Plan
from harness.progress import RunCounter, disk_line, print_progress, run_label
from harness.reference import measure_disk, reference
from harness.watch import Supervisor, watch_here

__all__ = ["warm_up"]


def warm_up(plan: Plan, plan_path: Path, out_dir: Path, command: Callable[[Path, str, Path], Sequence[str]], index: int,
             counter: RunCounter, supervisor: Supervisor = watch_here, jobs: Path | None = None) -> None:
    """One discarded round: the disk read and each strategy once, for what the machine keeps of them.

    A cold guest cache does not reset what lies outside the guest (a virtual disk's host
    cache, memory the host must back again); a warm-up round makes that alike for every
    measured round. Nothing of it is recorded; its files are removed. Each worker runs through ``supervisor`` as a
    measured run's does (a Slurm job's files in ``jobs``, default ``out_dir``).
    """
    where = f"warm-up round {index + 1}/{plan.scenario.run.warmup} (discarded)"
    if plan.scenario.run.cache == "cold":
        disk, error = reference(functools.partial(measure_disk, plan.checkpoint_files, index))
        print_progress(f"{where}: {disk_line(disk) if disk is not None else f'disk: failed ({error})'}")
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        for strategy in plan.scenario.strategies:
            label = run_label(strategy, plan.scenario.run.warmup, plan.scenario.run.repeats, warmup=index)
            print_progress(counter.next(label))
            try:
                outcome = supervisor(plan, command(plan_path, strategy, out_dir), jobs or out_dir,
                                     f"{plan.name}-w{index}-{strategy}")
            except stopping.Interrupted as exc:
                exc.detail += f" ({strategy}, {where})"
                raise
            print_progress(f"{where}: {strategy} {'ran' if outcome.returncode == 0 else 'failed'}")
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
