"""The record of a budget sweep: ``results/<name>/budget.json``, versioned and read strictly.

One :class:`BudgetRecord` per sweep: the scenario and machine it ran on, the search's
settings, and per strategy a :class:`StrategyBudget` with every attempt
(:class:`AttemptRecord`) in the order it ran. :func:`read_budget` refuses a file of
a version it does not read (:data:`BUDGET_VERSION`), an unknown or missing key, or a value of the wrong type,
naming the file and the key (a :class:`~harness.results.record.RecordError`), so that the
report never shows a figure it misread. The records are read and written by
:mod:`harness.fileio.codec` from their fields; the rules of one field stand next to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from harness.catalog import HEADLINE_STRATEGY
from harness.fileio.atomic import write_json
from harness.fileio.codec import Record, RecordError, decode, encode
from harness.fileio.files import read_json_file
from harness.results.checkpoint_reading import ReadingChoice
from harness.results.record import LAYOUT_VERSION, MachineInfo, results_name_problem
from harness.units import MIB

__all__ = ["BUDGET_FILE", "BUDGET_VERSION", "AttemptRecord", "BudgetRecord", "StrategyBudget", "goal_limit",
           "read_budget",
           "write_budget"]

BUDGET_VERSION = 4
"""The version of ``budget.json``'s own keys (:class:`BudgetRecord`'s fields), written under its ``"budget"`` key; this
code reads every version from 1 to this one. It counts apart from the results layout: the results records a budget
record holds (:class:`~harness.results.record.MachineInfo`, :class:`~harness.results.checkpoint_reading.ReadingChoice`)
are read at the results layout (:data:`~harness.results.record.LAYOUT_VERSION` numbers, their fields' ``since`` and
``absent_until``) that its ``"layout"`` key states. Version 2 writes ``checkpoint`` relative to the repository root
where inside it (:mod:`harness.fileio.paths`); version 1 wrote it absolute, which reads as it is, so the two differ in
nothing else. Version 3 adds ``speed`` (the plan's prefetch and drop-cache settings, which every attempt ran under) and
the ``"layout"`` key; versions 1 and 2 read with ``speed`` ``None`` (not recorded), and their records (a
:class:`~harness.results.record.MachineInfo`, whose keys no layout changed) at :data:`EARLIER_LAYOUT`. Version 4 names
``speed`` ``reading``; version 3's ``speed`` reads as it."""

EARLIER_LAYOUT = 17
"""The results layout that budget versions 1 and 2, which state none, are read at: the last one they were written
under."""

BUDGET_FILE = "budget.json"

PHASES = ("unconstrained", "upper", "predicted", "bracket", "lower", "bisect", "confirm", "tiebreak", "extra", "at")
"""Why an attempt was run: the unconstrained run that sets the bounds, then the sweep's phases
(:class:`~harness.budget.sweep.SweepPoint`; ``predicted`` and ``bracket`` only in sweeps that started from the
predicted minimum); ``at``: the one run of a strategy run at one given limit instead of swept."""


def _phase(phase: str) -> str | None:
    return None if phase in PHASES else f"expected one of {', '.join(PHASES)}, got {phase!r}"


def _positive_limit(limit: int) -> str | None:
    return None if limit > 0 else f"expected a positive limit, got {limit}"


STATUSES = ("ok", "failed", "at_limit")
"""A strategy's outcome: swept to its minimum (``ok``), no answer (``failed``, with the reason), or run at one
given limit instead of swept (``at_limit``: the unconstrained run and one attempt at that limit)."""


def _status(status: str) -> str | None:
    return None if status in STATUSES else f"expected one of {', '.join(STATUSES)}, got {status!r}"


def _some_strategy(strategies: dict[str, Any]) -> str | None:
    return None if strategies else "expected an object with at least one strategy"


@dataclass(frozen=True)
class AttemptRecord(Record):
    """One fresh process under one limit, on a cold cache, as the kernel and the worker saw it.

    ``wall_s``: from the process's release into its group to its exit. ``group_peak_bytes``:
    the group's own high-water mark (page cache charged to it included). ``oom_kills``: the
    OOM kills the group's counters show. ``reason``: why it did not complete (None when it
    did). ``worker_wall_s`` and ``worker_error``: what the worker's own record says, where it
    could write one; ``load_build_s`` (key ``compile_s``): its load and build, from the start of the load to the
    end of the last engine (the process's wall time less Python's start, torch's import and
    writing the results), None when it did not get there. ``baseline_anon_bytes``: the
    worker's anonymous memory at its baseline (what no limit can reclaim before the load).
    ``groups_left``: memory groups of this run still present after the attempt (0 unless
    cleanup failed). For an attempt run as a Slurm job (``--executor slurm``, :mod:`harness.cluster`):
    ``job_ids``, the ids of the jobs submitted for it, comma-separated (more than one where the cluster lost a
    job and it was submitted again; the last one counts), ``node`` where that one ran and ``limit_enforcer``, which
    limit bounded it (Slurm's job cgroup, or the harness's own group inside the job where Slurm does not constrain
    memory); all None for an attempt run here, and when reading layouts 1 to 19.
    """

    phase: str = field(metadata={"check": _phase})
    limit_bytes: int = field(metadata={"check": _positive_limit})
    completed: bool
    returncode: int | None = field(metadata={"signed": True})
    wall_s: float
    group_peak_bytes: int | None
    oom_kills: int | None
    reason: str | None
    worker_wall_s: float | None
    worker_error: str | None
    load_build_s: float | None = field(metadata={"key": "compile_s"})
    baseline_anon_bytes: int | None
    groups_left: int
    job_ids: str | None = field(default=None, metadata={"since": 20})
    node: str | None = field(default=None, metadata={"since": 20})
    limit_enforcer: str | None = field(default=None, metadata={"since": 20})


@dataclass(frozen=True)
class StrategyBudget(Record):
    """One strategy's sweep.

    ``minimum_bytes``: the smallest limit at which it completed (None when the sweep could
    not answer, ``error`` says why, and for a strategy run at one limit instead of swept,
    ``status`` ``at_limit``, whose answer is :attr:`at_limit`). ``largest_failing_bytes``: the largest at which it did
    not (None with ``at_lower_bound``). ``baseline_rss_bytes`` and ``baseline_anon_bytes``: the
    unconstrained run's baseline (the anonymous part is the sweep's lower bound).
    ``release_note``: what the strategy did with its weights after each engine, from the
    unconstrained run's record.
    """

    status: str = field(metadata={"check": _status})
    error: str | None
    label: str
    release_note: str
    baseline_rss_bytes: int | None
    baseline_anon_bytes: int | None
    lower_bytes: int | None
    upper_bytes: int | None
    timeout_s: float | None
    minimum_bytes: int | None
    largest_failing_bytes: int | None
    at_lower_bound: bool
    unstable_limits: tuple[int, ...]
    attempts: tuple[AttemptRecord, ...]

    @property
    def ok(self) -> bool:
        """Whether the strategy was swept to its minimum, or run at its one limit, as asked."""
        return self.status in ("ok", "at_limit")

    @property
    def at_limit(self) -> AttemptRecord | None:
        """The one attempt of a strategy run at one given limit instead of swept (None otherwise)."""
        return next((a for a in self.attempts if a.phase == "at"), None) if self.status == "at_limit" else None

    @property
    def unconstrained(self) -> AttemptRecord | None:
        """The run without a binding limit whose group peak set the sweep's upper bound."""
        return next((a for a in self.attempts if a.phase == "unconstrained"), None)


@dataclass(frozen=True)
class BudgetRecord:
    """A whole budget sweep; see the module docstring. ``budget.json`` holds its fields after
    ``"budget"`` (:data:`BUDGET_VERSION`) and ``"layout"`` (the results layout of the records it holds).
    ``reading``: the prefetch and drop-cache settings of the strategies that map, as the sweep's plan resolved them
    (:func:`harness.plan.make_plan`); every attempt ran under them (``None`` in records of versions 1 and 2)."""

    name: str = field(metadata={"check": results_name_problem})
    scenario: str
    description: str
    created: str
    commit: str | None
    machine: MachineInfo
    versions: dict[str, str | None]
    model_name: str
    model_bytes: int
    checkpoint: str = field(metadata={"path": True})
    engines: int
    largest_engine_bytes: int
    backend: str
    device: str
    controller: str
    precision_bytes: int
    unconstrained_limit_bytes: int
    timeout_factor: float
    min_timeout_s: float
    sweep_wall_s: float
    strategies: dict[str, StrategyBudget] = field(default_factory=dict, metadata={"check": _some_strategy})
    reading: ReadingChoice | None = None

    def with_strategy(self, name: str, strategy: StrategyBudget, sweep_wall_s: float) -> BudgetRecord:
        from dataclasses import replace

        return replace(self, strategies={**self.strategies, name: strategy}, sweep_wall_s=round(sweep_wall_s, 3))

    def goal_limit_bytes(self, strategy: str = HEADLINE_STRATEGY) -> int | None:
        """Baseline RSS + 2 x the largest engine (:func:`goal_limit`): the limit ``map`` should complete under."""
        s = self.strategies.get(strategy)
        if s is None or s.baseline_rss_bytes is None:
            return None
        return goal_limit(s.baseline_rss_bytes, self.largest_engine_bytes)


def goal_limit(baseline_rss_bytes: int, largest_engine_bytes: int) -> int:
    """Baseline RSS (rounded down to a MiB) + 2 x the largest engine, rounded up to a MiB (limits are whole MiB)."""
    return -(-(baseline_rss_bytes // MIB * MIB + 2 * largest_engine_bytes) // MIB) * MIB


def write_budget(directory: Path, record: BudgetRecord) -> Path:
    """Write ``budget.json`` into ``directory`` (atomically)."""
    return write_json(Path(directory) / BUDGET_FILE,
                      {"budget": BUDGET_VERSION, "layout": LAYOUT_VERSION, **encode(record)})


def read_budget(directory: Path) -> BudgetRecord:
    """The budget record of a results directory; :class:`~harness.results.record.RecordError` when it is not one."""
    path = Path(directory) / BUDGET_FILE
    data = read_json_file(path)
    layout = EARLIER_LAYOUT
    if isinstance(data, dict):
        version = data.get("budget")
        if not _whole(version) or not 1 <= version <= BUDGET_VERSION:
            raise RecordError(f"{path}: budget: this harness reads budget records of versions 1 to {BUDGET_VERSION}, "
                              f"got {version!r}")
        if version >= 3:
            stated = data.get("layout")
            if not _whole(stated) or not 1 <= stated <= LAYOUT_VERSION:
                raise RecordError(f"{path}: layout: this harness reads records of layouts 1 to {LAYOUT_VERSION}, "
                                  f"got {stated!r}")
            layout = stated
        data = {key: value for key, value in data.items() if key not in ("budget", "layout")}
        if version < 3:  # no settings recorded
            data["reading"] = None
        elif version == 3:  # the settings under their earlier name
            data["reading"] = data.pop("speed", None)
    return decode(BudgetRecord, data, source=str(path), version=layout)


def _whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
