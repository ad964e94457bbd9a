"""A results directory read back for the reporters: its record, samples, events and metrics.

:func:`load_results` is the only reader of a results directory. The table, the figures
and the notes all take the :class:`Results` it returns and never open a file themselves;
every figure they show comes from :attr:`Results.metrics` (:mod:`harness.results.metrics`) or,
for the curves, from the samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.fileio.files import read_json_file
from harness.results.metrics import (
    DiskMetrics,
    SampleColumns,
    StrategyMetrics,
    compared_label,
    disk_metrics,
    engines_accumulate,
    engines_built_without_resident_weights,
    engines_hold_compiler_memory,
    run_metrics,
)
from harness.results.record import SUMMARY, RecordError, RunRecord, StrategyRecord
from harness.results.samples import empty_events, empty_samples, events_file, read_events, read_samples, samples_file

__all__ = ["Results", "load_results"]


@dataclass
class Results:
    """One results directory: the run's record, each strategy's samples, events and metrics."""

    directory: Path
    record: RunRecord
    samples: dict[str, pd.DataFrame] = field(repr=False)
    events: dict[str, pd.DataFrame] = field(repr=False)
    metrics: dict[str, StrategyMetrics]

    @property
    def name(self) -> str:
        """The results' name (``results/<name>/``)."""
        return self.record.name

    @property
    def strategies(self) -> dict[str, StrategyRecord]:
        """Each strategy's record, in the order they ran."""
        return self.record.strategies

    @property
    def on_gpu(self) -> bool:
        """Whether engines were built on a GPU."""
        return self.record.on_gpu

    @property
    def engines_accumulate(self) -> bool:
        """Whether the run's engines had to stay in GPU memory (on a GPU, unless they hold their weights)."""
        return any(engines_accumulate(self.on_gpu, r.compiler_weights) for r in self.strategies.values())

    @property
    def engines_built_without_resident_weights(self) -> bool:
        """Whether the run's engines were built with no weight resident (``mapped`` or streamed ``packaged`` on
        the host; floor: the baseline)."""
        return any(engines_built_without_resident_weights(self.on_gpu, r.compiler_weights)
                   for r in self.strategies.values())

    @property
    def engines_hold_compiler_memory(self) -> bool:
        """Whether the run's engines record what their compiler held beside their weights (OpenVINO's; floor:
        baseline + max over k of engine k + that)."""
        return any(engines_hold_compiler_memory(self.on_gpu, r.engines) for r in self.strategies.values())

    @property
    def compared_label(self) -> str:
        """What the floor is compared with in this run (``build-phase host peak`` without a GPU)."""
        return compared_label(self.on_gpu)

    @property
    def disk(self) -> DiskMetrics | None:
        """The run's cold sequential reads of the checkpoint (None where it made none)."""
        return disk_metrics(self.record.disk_reads)

    @property
    def gpu_measured(self) -> bool:
        """Whether any strategy has GPU figures; without them, figures and table say "no GPU"."""
        return any(m.gpu_measured for m in self.metrics.values())


def load_results(directory: str | Path) -> Results:
    """Read ``directory``; raises :class:`~harness.results.record.RecordError` naming the file and key that are wrong.

    A strategy that failed before writing its samples or events reads with empty frames;
    a finished one must have both files, each with as many rows as its record states (layout 11).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise RecordError(f"{directory}: not a results directory (no such directory)")
    summary = directory / SUMMARY
    record = RunRecord.from_json(read_json_file(summary), str(summary))
    samples: dict[str, pd.DataFrame] = {}
    events: dict[str, pd.DataFrame] = {}
    for name, strategy in record.strategies.items():
        for path, reader, rows, empty, into in (
            (directory / samples_file(name), read_samples, strategy.sample_rows, empty_samples, samples),
            (directory / events_file(name), read_events, strategy.event_rows, empty_events, events),
        ):
            if path.exists():
                into[name] = reader(path, rows)
            elif strategy.ok:
                raise RecordError(f"{path}: missing, but strategy {name!r} finished")
            else:
                into[name] = empty()
    columns = {name: SampleColumns.of(frame) for name, frame in samples.items()}
    return Results(directory, record, samples, events, run_metrics(record, columns))
