"""The run's record as it starts, before any strategy ran: the plan, this machine, this checkout."""

from __future__ import annotations

import datetime

from harness.measure import machine
from harness.plan import Plan
from harness.results.record import MachineInfo, RunRecord
from harness.rounds import round_orders

__all__ = ["start_record"]


def start_record(plan: Plan) -> RunRecord:
    """The run's record before any strategy ran: the plan, this machine, this checkout."""
    scenario = plan.scenario
    return RunRecord(
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
