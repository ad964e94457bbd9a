"""The run as it starts, before any strategy ran: its record (the plan, this machine, this checkout) and the counter
of its worker runs."""

from __future__ import annotations

import datetime

from harness.measure import machine
from harness.plan import Plan
from harness.progress import RunCounter
from harness.results.record import MachineInfo, RunRecord
from harness.rounds import round_orders
from harness.scenario import RunConfig

__all__ = ["planned_runs", "start_record"]


def planned_runs(run: RunConfig, strategies: int) -> int:
    """How many worker processes a run starts: each strategy once per warm-up round and once per repeat."""
    return strategies * (run.warmup + max(1, run.repeats))


def start_record(plan: Plan) -> tuple[RunRecord, RunCounter]:
    """The run's record before any strategy ran (the plan, this machine, this checkout), and the counter of the
    worker runs it plans (:func:`planned_runs`), its clock started."""
    scenario = plan.scenario
    counter = RunCounter(planned_runs(scenario.run, len(scenario.strategies)))
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
    ), counter
