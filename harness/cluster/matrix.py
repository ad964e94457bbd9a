"""A matrix of sweeps or runs: several scenarios, or one over several engine counts, each into its own results
directory, and one summary linking them all (``python -m harness sweep SCENARIO... [--engines N,...] [--mode run]
[--executor slurm]``).

:func:`variants` makes the scenarios of the matrix: each scenario as it is, or, with ``engines``, one copy per
engine count named ``<scenario>-e<N>``. The command line runs each as ``harness budget`` does, or with ``--mode run``
as ``harness run`` does (through Slurm with ``--executor slurm``), and :func:`write_summary` writes
``<results>/<name>.sweep.md``: one row per scenario with its results directory (a relative link), its status and,
per strategy, the smallest limit found (a run: its build-phase host peak), or the error that ended it. A scenario
that fails is a row saying why, never a missing one; the others still run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from harness.budget.record import BudgetRecord
from harness.fileio.atomic import write_atomic
from harness.results.record import RunRecord
from harness.scenario import Scenario
from harness.units import gib_or_mib

__all__ = ["MatrixRow", "summary_path", "variants", "write_summary"]


@dataclasses.dataclass(frozen=True)
class MatrixRow:
    """One scenario of the matrix: its name, its results directory and its record, or the error that ended it."""

    scenario: str
    directory: Path | None
    record: BudgetRecord | RunRecord | None
    error: str | None = None


def variants(scenarios: Sequence[Scenario], engines: Sequence[int] = ()) -> list[Scenario]:
    """Each scenario, or with ``engines`` one copy of each per engine count, named ``<name>-e<N>``."""
    if not engines:
        return list(scenarios)
    return [dataclasses.replace(s, name=f"{s.name}-e{n}", build=dataclasses.replace(s.build, engines=n))
            for s in scenarios for n in engines]


def summary_path(results: Path, name: str) -> Path:
    """``<results>/<name>.sweep.md``."""
    return Path(results) / f"{name}.sweep.md"


def _cell(record: BudgetRecord | RunRecord, strategy: str) -> str:
    """A strategy's cell: a budget sweep's smallest limit, a run's build-phase host peak, else its status."""
    got = record.strategies.get(strategy)
    if got is None:
        return ""
    found = got.minimum_bytes if isinstance(record, BudgetRecord) else got.build_peak_bytes  # type: ignore[union-attr]
    return gib_or_mib(found) if found and got.ok else got.status


def write_summary(results: Path, name: str, rows: Sequence[MatrixRow], executor: str, mode: str = "budget") -> Path:
    """Write the matrix's summary (see the module docstring) of ``mode`` (``budget`` sweeps or ``run`` runs);
    returns its path."""
    path = summary_path(results, name)
    strategies = list(dict.fromkeys(s for r in rows if r.record for s in r.record.strategies))
    what = "budget sweeps" if mode == "budget" else "runs (per strategy, its build-phase host peak)"
    lines = [f"# Sweep {name}", "", f"{len(rows)} {what}, executor {executor}; each row links its results.", "",
             "| scenario | results | status | " + " | ".join(strategies) + " |",
             "| --- | --- | --- | " + " | ".join("---:" for _ in strategies) + " |"]
    for row in rows:
        link = "-" if row.directory is None else f"[{row.directory.name}]({row.directory.name}/)"
        if row.record is None:
            lines.append(f"| {row.scenario} | {link} | failed: {row.error} | " + " | ".join("" for _ in strategies)
                         + " |")
            continue
        cells = [_cell(row.record, s) for s in strategies]
        ok = all(s.ok for s in row.record.strategies.values())
        lines.append(f"| {row.scenario} | {link} | {'ok' if ok else 'some failed'} | " + " | ".join(cells) + " |")
    write_atomic(path, "\n".join(lines) + "\n")
    return path
