"""The record of a budget sweep: ``results/<name>/budget.json``, versioned and read strictly.

One :class:`BudgetRecord` per sweep: the scenario and machine it ran on, the search's
settings, and per strategy a :class:`StrategyBudget` with every attempt
(:class:`AttemptRecord`) in the order it ran. :func:`read_budget` refuses a file of
another :data:`BUDGET_VERSION`, an unknown or missing key, or a value of the wrong type,
naming the file and the key (a :class:`~harness.results.record.RecordError`), so that the
report never shows a figure it misread.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.results.atomic import write_json
from harness.results.record import LAYOUT_VERSION, MachineInfo, RecordError, _Obj, read_json_file

__all__ = ["BUDGET_FILE", "BUDGET_VERSION", "AttemptRecord", "BudgetRecord", "StrategyBudget", "goal_limit",
           "read_budget",
           "write_budget"]

BUDGET_VERSION = 1
"""The layout of ``budget.json`` this code writes and reads."""

BUDGET_FILE = "budget.json"
MIB = 1 << 20

PHASES = ("unconstrained", "upper", "lower", "bisect", "confirm", "tiebreak", "extra")
"""Why an attempt was run: the unconstrained run that sets the bounds, then the sweep's phases."""


@dataclass(frozen=True)
class AttemptRecord:
    """One fresh process under one limit, on a cold cache, as the kernel and the worker saw it.

    ``wall_s``: from the process's release into its group to its exit. ``group_peak_bytes``:
    the group's own high-water mark (page cache charged to it included). ``oom_kills``: the
    OOM kills the group's counters show. ``reason``: why it did not complete (None when it
    did). ``worker_wall_s`` and ``worker_error``: what the worker's own record says, where it
    could write one; ``compile_s``: its load and build, from the start of the load to the end
    of the last engine (the process's wall time less Python's start, torch's import and
    writing the results), None when it did not get there. ``baseline_anon_bytes``: the
    worker's anonymous memory at its baseline (what no limit can reclaim before the load).
    ``groups_left``: memory groups of this run still present after the attempt (0 unless
    cleanup failed).
    """

    phase: str
    limit_bytes: int
    completed: bool
    returncode: int | None
    wall_s: float
    group_peak_bytes: int | None
    oom_kills: int | None
    reason: str | None
    worker_wall_s: float | None
    worker_error: str | None
    compile_s: float | None
    baseline_anon_bytes: int | None
    groups_left: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, source: str, where: str) -> AttemptRecord:
        o = _Obj(data, source, where, set(cls.__dataclass_fields__))
        phase = o.text("phase", null=False)
        if phase not in PHASES:
            raise o.error("phase", f"expected one of {', '.join(PHASES)}, got {phase!r}")
        record = cls(phase=phase, limit_bytes=o.integer("limit_bytes", null=False),
                     completed=o.flag("completed", null=False), returncode=o.integer("returncode"),
                     wall_s=o.number("wall_s", null=False), group_peak_bytes=o.integer("group_peak_bytes"),
                     oom_kills=o.integer("oom_kills"), reason=o.text("reason"),
                     worker_wall_s=o.number("worker_wall_s"), worker_error=o.text("worker_error"),
                     compile_s=o.number("compile_s"), baseline_anon_bytes=o.integer("baseline_anon_bytes"),
                     groups_left=o.integer("groups_left", null=False))
        if record.limit_bytes <= 0:
            raise o.error("limit_bytes", f"expected a positive limit, got {record.limit_bytes}")
        return record


@dataclass(frozen=True)
class StrategyBudget:
    """One strategy's sweep.

    ``minimum_bytes``: the smallest limit at which it completed (None when the sweep could
    not answer; ``error`` says why). ``largest_failing_bytes``: the largest at which it did
    not (None with ``at_lower_bound``). ``baseline_rss_bytes`` and ``baseline_anon_bytes``: the
    unconstrained run's baseline (the anonymous part is the sweep's lower bound).
    ``release_note``: what the strategy did with its weights after each engine, from the
    unconstrained run's record.
    """

    status: str
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
        return self.status == "ok"

    @property
    def unconstrained(self) -> AttemptRecord | None:
        """The run without a binding limit whose group peak set the sweep's upper bound."""
        return next((a for a in self.attempts if a.phase == "unconstrained"), None)

    @property
    def minimum_attempt(self) -> AttemptRecord | None:
        """The first run that completed at the minimum."""
        return next((a for a in self.attempts if a.limit_bytes == self.minimum_bytes and a.completed
                     and a.phase != "unconstrained"), None)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["unstable_limits"] = list(self.unstable_limits)
        data["attempts"] = [a.to_json() for a in self.attempts]
        return data

    @classmethod
    def from_json(cls, data: Any, source: str, where: str) -> StrategyBudget:
        o = _Obj(data, source, where, set(cls.__dataclass_fields__))
        status = o.text("status", null=False)
        if status not in ("ok", "failed"):
            raise o.error("status", f"expected 'ok' or 'failed', got {status!r}")
        unstable = o.items("unstable_limits")
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in unstable):
            raise o.error("unstable_limits", "expected a list of integers")
        return cls(status=status, error=o.text("error"), label=o.text("label", null=False),
                   release_note=o.text("release_note", null=False),
                   baseline_rss_bytes=o.integer("baseline_rss_bytes"),
                   baseline_anon_bytes=o.integer("baseline_anon_bytes"), lower_bytes=o.integer("lower_bytes"),
                   upper_bytes=o.integer("upper_bytes"), timeout_s=o.number("timeout_s"),
                   minimum_bytes=o.integer("minimum_bytes"),
                   largest_failing_bytes=o.integer("largest_failing_bytes"),
                   at_lower_bound=o.flag("at_lower_bound", null=False), unstable_limits=tuple(unstable),
                   attempts=tuple(AttemptRecord.from_json(a, source, f"{o.path('attempts')}[{i}]")
                                  for i, a in enumerate(o.items("attempts"))))


@dataclass(frozen=True)
class BudgetRecord:
    """A whole budget sweep; see the module docstring."""

    name: str
    scenario: str
    description: str
    created: str
    commit: str | None
    machine: MachineInfo
    versions: dict[str, str | None]
    model_name: str
    model_bytes: int
    checkpoint: str
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
    strategies: dict[str, StrategyBudget] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"budget": BUDGET_VERSION}
        for key in self.__dataclass_fields__:
            value = getattr(self, key)
            if key == "machine":
                value = value.to_json()
            elif key == "strategies":
                value = {name: s.to_json() for name, s in value.items()}
            data[key] = value
        return data

    @classmethod
    def from_json(cls, data: Any, source: str) -> BudgetRecord:
        o = _Obj(data, source, "", {"budget", *cls.__dataclass_fields__})
        version = o.raw("budget")
        if version != BUDGET_VERSION or isinstance(version, bool):
            raise o.error("budget", f"this harness reads budget records of version {BUDGET_VERSION}, "
                                    f"got {version!r}")
        versions = o.raw("versions")
        if not isinstance(versions, dict) or not all(v is None or isinstance(v, str) for v in versions.values()):
            raise o.error("versions", "expected an object of version strings")
        strategies = o.raw("strategies")
        if not isinstance(strategies, dict) or not strategies:
            raise o.error("strategies", "expected an object with at least one strategy")
        return cls(
            name=o.text("name", null=False), scenario=o.text("scenario", null=False),
            description=o.text("description", null=False), created=o.text("created", null=False),
            commit=o.text("commit"), machine=MachineInfo.from_json(o.raw("machine"), source, "machine", LAYOUT_VERSION),
            versions=dict(versions), model_name=o.text("model_name", null=False),
            model_bytes=o.integer("model_bytes", null=False), checkpoint=o.text("checkpoint", null=False),
            engines=o.integer("engines", null=False),
            largest_engine_bytes=o.integer("largest_engine_bytes", null=False),
            backend=o.text("backend", null=False), device=o.text("device", null=False),
            controller=o.text("controller", null=False), precision_bytes=o.integer("precision_bytes", null=False),
            unconstrained_limit_bytes=o.integer("unconstrained_limit_bytes", null=False),
            timeout_factor=o.number("timeout_factor", null=False), min_timeout_s=o.number("min_timeout_s", null=False),
            sweep_wall_s=o.number("sweep_wall_s", null=False),
            strategies={name: StrategyBudget.from_json(s, source, f"strategies.{name}")
                        for name, s in strategies.items()},
        )

    def with_strategy(self, name: str, strategy: StrategyBudget, sweep_wall_s: float) -> BudgetRecord:
        from dataclasses import replace

        return replace(self, strategies={**self.strategies, name: strategy}, sweep_wall_s=round(sweep_wall_s, 3))

    def goal_limit_bytes(self, strategy: str = "map") -> int | None:
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
    return write_json(Path(directory) / BUDGET_FILE, record.to_json())


def read_budget(directory: Path) -> BudgetRecord:
    """The budget record of a results directory; :class:`~harness.results.record.RecordError` when it is not one."""
    path = Path(directory) / BUDGET_FILE
    data = read_json_file(path)
    try:
        return BudgetRecord.from_json(data, str(path))
    except RecordError:
        raise
    except (TypeError, ValueError) as exc:
        raise RecordError(f"{path}: not a budget record ({exc})") from exc
