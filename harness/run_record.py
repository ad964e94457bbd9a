"""The run as it starts, before any strategy ran: its plan written (``plan.json``, which every worker reads) and its
record (the plan, this machine, this checkout); how many worker runs it plans."""

from __future__ import annotations

import datetime
from pathlib import Path

from harness.measure import machine
from harness.plan import Plan, write_plan
from harness.results.record import PLAN, MachineInfo, RunRecord
from harness.rounds import round_orders
from harness.scenario import RunConfig

__all__ = ["planned_runs", "start_record"]


def planned_runs(run: RunConfig, strategies: int) -> int:
    """How many worker processes a run starts: each strategy once per warm-up round and once per repeat."""
    return strategies * (run.warmup + max(1, run.repeats))


def start_record(plan: Plan, staging: Path) -> tuple[Path, RunRecord]:
    """``plan`` written into ``staging`` (``plan.json``, atomically; its path returned), and the run's record before
    any strategy ran (the plan, this machine, this checkout)."""
    plan_path = write_plan(staging / PLAN, plan)
    scenario = plan.scenario
    return plan_path, RunRecord(
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
        reading=plan.reading,
        read_ceiling=plan.read_ceiling,
        read_ceiling_error=plan.read_ceiling_error,
        round_orders=round_orders(scenario.strategies, max(1, scenario.run.repeats)),
    )
