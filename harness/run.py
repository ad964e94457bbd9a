"""Running a scenario: one process per strategy, then the summary and the figures.

The parent prepares what all strategies share (the model description and the
generated checkpoint), starts ``python -m harness.worker`` for each strategy in
turn, watches its memory from outside (a strategy whose RSS passes the
scenario's limit is killed and recorded as failed, instead of taking the
machine down), and writes ``summary.json`` (to a temporary name, then
renamed) and the figures. A strategy that crashes, is killed or times out
gets ``"status": "failed"`` with the reason; the others still run.
"""

from __future__ import annotations

import collections
import datetime
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

from harness import machine
from harness.backends import check_backend, resolve_device
from harness.checkpoints import checkpoint_specs, describe_specs, ensure_checkpoint
from harness.metrics import StrategyMetrics
from harness.models import build_model
from harness.partition import cap_for, model_bytes, partition
from harness.record import (
    CheckpointInfo,
    MachineInfo,
    ModelInfo,
    Reference,
    RunRecord,
    StrategyRecord,
    events_file,
    read_strategy_file,
    samples_file,
    strategy_file,
    write_summary,
)
from harness.scenario import Scenario, load_scenario

WorkerCommand = Callable[[Scenario, str, Path], Sequence[str]]


def worker_command(scenario: Scenario, strategy: str, out: Path) -> list[str]:
    """The command line of one strategy's process."""
    return [sys.executable, "-m", "harness.worker", str(scenario.path), strategy, str(out)]


@dataclass
class Outcome:
    """How a strategy's process ended, as seen from outside."""

    returncode: int | None
    reason: str | None  # why it failed, when the parent knows better than the worker
    peak_rss_bytes: int


def _pump(stream: IO[str], tail: collections.deque[str]) -> None:
    """Pass the worker's stderr (its progress) through, keeping the last lines for the record."""
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        tail.append(line.rstrip())


def watch(command: Sequence[str], limit_bytes: int | None, timeout_s: float, poll_s: float = 0.05) -> Outcome:
    """Run ``command``, killing it when its RSS passes ``limit_bytes`` or it outlives ``timeout_s``."""
    process = subprocess.Popen(list(command), stderr=subprocess.PIPE, text=True, bufsize=1)
    tail: collections.deque[str] = collections.deque(maxlen=20)
    assert process.stderr is not None
    pump = threading.Thread(target=_pump, args=(process.stderr, tail), daemon=True)
    pump.start()
    handle = psutil.Process(process.pid)
    started, peak, reason = time.monotonic(), 0, None
    while process.poll() is None:
        try:
            rss = handle.memory_info().rss
        except psutil.Error:
            rss = 0
        peak = max(peak, rss)
        if limit_bytes is not None and rss > limit_bytes:
            reason = (f"stopped by the harness: RSS {rss / 2**30:.2f} GiB passed the scenario's memory limit "
                      f"of {limit_bytes / 2**30:.2f} GiB")
            process.kill()
        elif time.monotonic() - started > timeout_s:
            reason = f"stopped by the harness: still running after the scenario's timeout of {timeout_s:.0f} s"
            process.kill()
        time.sleep(poll_s)
    pump.join(timeout=5)
    code = process.returncode
    if reason is None and code is not None and code < 0:
        reason = f"killed by signal {-code}" + (" (out of memory?)" if -code == 9 else "")
    if reason is None and code not in (0, 1):
        reason = f"exited with status {code}: " + " | ".join(list(tail)[-3:])
    return Outcome(code, reason, peak)


def _progress(message: str) -> None:
    print(f"[harness] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Prepared:
    """What every strategy of a scenario shares: the model, its checkpoint and its engines."""

    model: ModelInfo
    checkpoint: CheckpointInfo
    engines: int
    engine_cap_bytes: int
    largest_engine_bytes: int


def prepare(scenario: Scenario) -> Prepared:
    """Check the backend, describe the model and make sure its checkpoint exists."""
    check_backend(scenario.build.backend)
    info = build_model(scenario.model)
    _progress(f"model {info.name} ({info.source}); {info.source_note}".rstrip("; "))
    path, generated = ensure_checkpoint(info.module, scenario.checkpoint.path, scenario.checkpoint.seed)
    _progress(("generated " if generated else "reusing ") + str(path))
    checkpoint = describe_specs(checkpoint_specs(info.module))  # persistent tensors, a tied one once
    if scenario.build.engine_cap_mib is not None:
        cap = int(scenario.build.engine_cap_mib * 2**20)
    else:
        assert scenario.build.engines is not None
        cap = cap_for(info.module, scenario.build.engines)
    engines = partition(info.module, cap)
    return Prepared(
        model=ModelInfo(name=info.name, source=info.source, source_note=info.source_note,
                        tensors=checkpoint["tensors"], bytes=checkpoint["nbytes"],
                        bytes_with_non_persistent_buffers=model_bytes(info.module)),
        checkpoint=CheckpointInfo(path=str(path), generated=generated, seed=scenario.checkpoint.seed,
                                  bytes=path.stat().st_size),
        engines=len(engines),
        engine_cap_bytes=cap,
        largest_engine_bytes=max(e.nbytes for e in engines),
    )


def _failed(reason: str) -> StrategyRecord:
    """The record of a strategy whose process left none (killed before it could write one)."""
    return StrategyRecord(status="failed", error=reason)


def run_scenario(
    scenario: Scenario,
    *,
    name: str | None = None,
    results: Path = Path("results"),
    command: WorkerCommand = worker_command,
    plots: bool = True,
) -> RunRecord:
    """Run every strategy of ``scenario`` and write ``results/<name>/`` and the figures; returns the record."""
    name = name or scenario.name
    out = results / name
    out.mkdir(parents=True, exist_ok=True)
    prepared = prepare(scenario)
    device = resolve_device(scenario.build.device)
    limit = int(scenario.run.memory_limit_gib * 2**30) if scenario.run.memory_limit_gib else None
    run = RunRecord(
        scenario=scenario.name,
        name=name,
        description=scenario.description,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        commit=machine.commit(),
        machine=MachineInfo(**machine.machine()),
        versions=machine.versions(),
        model=prepared.model,
        checkpoint=prepared.checkpoint,
        engines=prepared.engines,
        engine_cap_bytes=prepared.engine_cap_bytes,
        largest_engine_bytes=prepared.largest_engine_bytes,
        backend=scenario.build.backend,
        device=device,
        cache=scenario.run.cache,
        release=scenario.build.release,
        sample_interval_ms=scenario.run.sample_interval_ms,
        memory_limit_bytes=limit,
        references=tuple(Reference(**r.__dict__) for r in scenario.references),
        scenario_config=scenario.to_dict(),
        strategies={},
    )
    for i, strategy in enumerate(scenario.strategies, 1):
        _progress(f"strategy {i}/{len(scenario.strategies)}: {strategy}")
        for stale in (strategy_file(strategy), samples_file(strategy), events_file(strategy)):
            (out / stale).unlink(missing_ok=True)
        outcome = watch(command(scenario, strategy, out), limit, scenario.run.timeout_s)
        record = read_strategy_file(out, strategy)
        if record is None:
            record = _failed(outcome.reason or f"no record written (exit status {outcome.returncode})")
        elif outcome.reason:
            record = record.replace(status="failed", error=outcome.reason)
        record = record.replace(watched_peak_rss_bytes=outcome.peak_rss_bytes)
        metrics = StrategyMetrics.of(strategy, record, run)
        record = record.replace(floor_bytes=metrics.floor_bytes,
                                excess_over_floor=None if metrics.excess is None else round(metrics.excess, 6))
        run = run.with_strategy(strategy, record)
        _progress(f"{strategy}: {record.status}" + (f" ({record.error})" if record.error else ""))
        write_summary(out, run)  # partial results survive an interrupted run
    if plots:
        from harness.plots import render_all

        for path in render_all(out):
            _progress(f"wrote {path}")
    return run


def main_run(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m harness run SCENARIO [--name NAME] [--results DIR]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m harness run", description="Run a scenario.")
    parser.add_argument("scenario", type=Path, help="a scenario file, e.g. scenarios/smoke.toml")
    parser.add_argument("--name", help="name of the results (default: the scenario's name)")
    parser.add_argument("--results", type=Path, default=Path("results"), help="results root (default: results)")
    args = parser.parse_args(argv)
    scenario = load_scenario(args.scenario)
    run = run_scenario(scenario, name=args.name, results=args.results)
    failed = [s for s, e in run.strategies.items() if not e.ok]
    return 1 if failed else 0
