"""A strategy run several times (``[run] repeats = N``): its runs combined into the one record ``summary.json`` keeps,
and their files.

With more than one repeat each round's files go to ``repeat-<r>/``; the strategy's record is that of its
representative run (:func:`representative`, the median wall time of those that finished), with every run's times
in ``repeats`` (:func:`combine_repeats`), and the representative's samples, events and record are copied to the
top of the results directory (:func:`copy_run_files`), where the report and figures read them. Samples are kept
for the representative runs only (:func:`drop_repeat_samples`).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from harness.fileio.atomic import atomic_file
from harness.results.metrics import resident_at_load
from harness.results.record import RepeatRecord, StrategyRecord, strategy_file
from harness.results.samples import events_file, samples_file

__all__ = ["combine_repeats", "copy_run_files", "drop_repeat_samples", "repeat_dir", "representative"]


def repeat_dir(results: Path, repeat: int) -> Path:
    """Where one repeat's files go in a results directory of more than one repeat."""
    return results / f"repeat-{repeat}"


def _repeat_record(repeat: int, record: StrategyRecord) -> RepeatRecord:
    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds, 3)

    return RepeatRecord(
        repeat=repeat, status=record.status, error=record.error, wall_s=record.wall_s,
        load_s=ms(record.phases.load_s), build_s=ms(record.phases.build_s),
        build_peak_bytes=record.build_peak_bytes,
        resident_at_load_bytes=resident_at_load(record), job_ids=record.job_ids, node=record.node,
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


def copy_run_files(source: Path, target: Path, strategy: str) -> None:
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


def drop_repeat_samples(staging: Path, strategy: str, runs: Sequence[StrategyRecord]) -> None:
    """The samples of each repeat's run; the representative's are at the top of ``staging``."""
    for run in runs:
        (repeat_dir(staging, run.repeat or 0) / samples_file(strategy)).unlink(missing_ok=True)
