"""One strategy, measured in a process of its own.

``python -m harness.worker SCENARIO STRATEGY OUT_DIR`` loads the model with
one strategy, partitions it, builds it engine by engine under the sampler,
and writes ``samples-<strategy>.csv``, ``events-<strategy>.csv`` and
``strategy-<strategy>.json`` into ``OUT_DIR``. The parent (:mod:`harness.run`)
starts one such process per strategy, so that no strategy inherits another's
allocator caches or mapped pages, and turns their files into the summary.

Times are seconds from this process's start. The exit status is 0 when the
strategy ran to the end, 1 when it failed (the reason is in the JSON).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
from tqdm import tqdm

from harness.atomic import write_atomic
from harness.backends import Backend, make_backend, resolve_device
from harness.gpu import GpuMonitor
from harness.metrics import SampleColumns, sampled_peaks
from harness.models import build_model, fill_non_persistent
from harness.partition import Engine, cap_for, model_bytes, partition
from harness.procfs import PeakTracker, read_peak, read_status
from harness.record import (
    EVENT_COLUMNS,
    EngineRecord,
    Phases,
    StrategyRecord,
    events_file,
    samples_file,
    write_strategy_file,
)
from harness.sampler import Sampler
from harness.scenario import Scenario, load_scenario
from harness.strategies import STRATEGIES, Strategy
from weightmap.checkpoint import open_checkpoint


@dataclass
class EventLog:
    """Engine and phase events with their times (seconds from the process start)."""

    t0: float
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, event: str, **values: Any) -> float:
        t = time.monotonic() - self.t0
        self.rows.append({"t_s": round(t, 6), "event": event, **values})
        return t

    def write_csv(self, path: Path) -> None:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=EVENT_COLUMNS, restval="")
        writer.writeheader()
        writer.writerows(self.rows)
        write_atomic(path, text.getvalue())


@dataclass
class _Measured:
    """What one strategy's run has measured so far; :meth:`record` makes it a :class:`StrategyRecord`."""

    status: str = "running"
    error: str | None = None
    device: str = "cpu"
    note: str = ""
    baseline_rss_bytes: int | None = None
    host_at_partitioning_bytes: int | None = None
    load_hwm_bytes: int | None = None
    gpu_baseline_bytes: int | None = None
    phases: dict[str, float] = field(default_factory=dict)
    engine_cap_bytes: int | None = None
    engines: list[EngineRecord] = field(default_factory=list)
    released_bytes: int = 0
    unreleased_bytes: int = 0
    release_note: str = ""
    peak_source: str = "kernel high-water mark"
    samples: int = 0
    mean_interval_ms: float | None = None
    max_gap_ms: float | None = None
    process_wall_s: float | None = None

    def record(self) -> StrategyRecord:
        phases = {k: round(v, 6) for k, v in self.phases.items()}
        return StrategyRecord(
            status=self.status, error=self.error, note=self.note,
            baseline_rss_bytes=self.baseline_rss_bytes,
            host_at_partitioning_bytes=self.host_at_partitioning_bytes,
            load_hwm_bytes=self.load_hwm_bytes, gpu_baseline_bytes=self.gpu_baseline_bytes,
            process_wall_s=None if self.process_wall_s is None else round(self.process_wall_s, 3),
            phases=Phases(**phases), samples=self.samples, mean_interval_ms=self.mean_interval_ms,
            max_gap_ms=self.max_gap_ms, peak_source=self.peak_source, engine_cap_bytes=self.engine_cap_bytes,
            released_bytes=self.released_bytes, unreleased_bytes=self.unreleased_bytes,
            release_note=self.release_note, engines=tuple(self.engines),
        )


def process_start_monotonic() -> float:
    """This process's start on the ``time.monotonic()`` clock."""
    age = time.time() - psutil.Process().create_time()
    return time.monotonic() - max(0.0, age)


def drop_page_cache(files: list[Path]) -> None:
    """Cold cache: drop the checkpoint's pages from the page cache (no root needed)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def engine_cap(scenario: Scenario, model: torch.nn.Module) -> int:
    """The per-engine byte cap: fixed, or the model's bytes over the number of engines."""
    if scenario.build.engine_cap_mib is not None:
        return int(scenario.build.engine_cap_mib * 2**20)
    assert scenario.build.engines is not None
    return cap_for(model, scenario.build.engines)


def _named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    named: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))
    return named


class Run:
    """The measured run of one strategy; every step records into ``record`` and ``events``."""

    def __init__(self, scenario: Scenario, strategy: str, out: Path, workdir: Path, t0: float) -> None:
        self.scenario, self.strategy, self.out, self.workdir = scenario, strategy, out, workdir
        self.spec: Strategy = STRATEGIES[strategy]
        self.t0 = t0
        self.record = _Measured()
        self.events = EventLog(t0)
        self.peak = PeakTracker()
        self.gpu: GpuMonitor | None = None
        self.sampler: Sampler | None = None
        self.backend: Backend | None = None

    def prepare(self) -> tuple[torch.nn.Module, Path, list[Path]]:
        """Build the model on meta, find the checkpoint, start CUDA and the sampler; take the baseline."""
        scenario = self.scenario
        device = resolve_device(scenario.build.device)
        self.record.device = device
        model = build_model(scenario.model).module
        path = scenario.checkpoint.path
        files = list(open_checkpoint(path).files)
        if scenario.run.cache == "cold":
            drop_page_cache(files)
        if device == "cuda":
            torch.empty(1, device="cuda")  # the CUDA context exists before the baseline
            self.gpu = GpuMonitor.open(torch.cuda.current_device())
        self.sampler = Sampler(
            interval_s=scenario.run.sample_interval_ms / 1000,
            files=files,
            gpu=self.gpu,
            t0=self.t0,
            residency_every=scenario.run.residency_every,
        )
        self.sampler.start()
        self.sampler.rebase_gpu()
        self.record.gpu_baseline_bytes = self.sampler.gpu_baseline_bytes
        self.sampler.mark(phase="baseline")
        self.record.baseline_rss_bytes = read_status().rss_bytes
        return model, path, files

    def _gpu_used(self) -> int | None:
        if self.gpu is None or self.record.gpu_baseline_bytes is None:
            return None
        return self.gpu.used_bytes() - self.record.gpu_baseline_bytes

    def load(self, model: torch.nn.Module, path: Path) -> torch.nn.Module:
        assert self.sampler is not None
        self.record.phases["load_start_s"] = self.events.add("load_start")
        self.sampler.mark(phase="load")
        loaded = self.spec.load(model, path)
        fill_non_persistent(loaded.model)
        self.record.note = loaded.note
        self.record.phases["load_end_s"] = self.events.add("load_end")
        return loaded.model

    def partition(self, model: torch.nn.Module) -> list[Engine]:
        assert self.sampler is not None
        self.sampler.mark(phase="partition")
        cap = engine_cap(self.scenario, model)
        engines = partition(model, cap)
        self.record.engine_cap_bytes = cap
        self.record.host_at_partitioning_bytes = read_status().rss_bytes
        self.record.load_hwm_bytes = read_peak()
        self.record.phases["partition_s"] = self.events.add(
            "partition", weight_bytes=model_bytes(model), rss_bytes=self.record.host_at_partitioning_bytes
        )
        return engines

    def build(self, model: torch.nn.Module, engines: list[Engine]) -> None:
        assert self.sampler is not None
        scenario = self.scenario
        self.backend = make_backend(scenario.build.backend, self.record.device, self.workdir)
        plan = self.spec.release_plan(model, [e.names for e in engines]) if scenario.build.release else None
        hooks = self.spec.hooks(model, scenario.checkpoint.path) if self.spec.hooks else None
        named = _named_tensors(model)
        self.sampler.mark(phase="build")
        progress = tqdm(engines, desc=f"[{self.strategy}] engines", unit="engine", file=sys.stderr,
                        mininterval=1.0, leave=True)
        for engine in progress:
            progress.set_postfix_str(f"{engine.nbytes / 2**30:.2f} GiB", refresh=False)
            self.peak.begin()
            self.sampler.mark(engine=engine.index)
            start = self.events.add("engine_start", engine=engine.index, weight_bytes=engine.nbytes)
            if hooks is not None:
                hooks.before(engine.index, engine.names)
                named = _named_tensors(model)  # the hook may have put new tensors in place
            self.backend.build_engine(engine, {n: named[n] for n in engine.names})
            step = plan.built(engine.index) if plan else None
            if hooks is not None:
                hooks.after(engine.index, engine.names)
            hwm = self.peak.end()
            self.sampler.mark(engine=None)
            released = step.released_bytes if step else 0
            self.record.released_bytes += released
            self.record.unreleased_bytes += step.kept_bytes if step else engine.nbytes
            rss, gpu = read_status().rss_bytes, self._gpu_used()
            end = self.events.add("engine_end", engine=engine.index, weight_bytes=engine.nbytes,
                                  host_hwm_bytes=hwm, released_bytes=released, rss_bytes=rss, gpu_used_bytes=gpu)
            self.record.engines.append(EngineRecord(
                index=engine.index, weight_bytes=engine.nbytes, start_s=round(start, 6), end_s=round(end, 6),
                host_hwm_bytes=hwm, released_bytes=released, rss_after_bytes=rss, gpu_used_bytes=gpu,
                tensors=len(engine.names),
            ))
        if not self.peak.supported:
            self.record.peak_source = "samples only: the kernel refused to reset VmHWM (/proc/self/clear_refs)"
        self.record.release_note = self.spec.release_note(scenario.build.release, self.record.unreleased_bytes)
        self.record.phases["build_end_s"] = self.events.add("build_end")
        self.sampler.mark(phase="done", engine=None)

    def finish(self) -> StrategyRecord:
        """Stop the sampler and write every file, whatever happened before; returns the record."""
        columns = None
        if self.sampler is not None and self.sampler.running:
            try:
                stats = self.sampler.stop()
                self.record.samples, self.record.max_gap_ms = stats.samples, stats.max_gap_ms
                self.record.mean_interval_ms = stats.mean_interval_ms
            except RuntimeError as exc:
                self.record.status = "failed"  # the samples stop where the sampler failed
                self.record.error = "; ".join(filter(None, [self.record.error, str(exc)]))
        if self.sampler is not None:
            self.sampler.write_csv(self.out / samples_file(self.strategy))
            columns = self.sampler.columns()
        self.events.write_csv(self.out / events_file(self.strategy))
        if self.backend is not None:
            self.backend.close()
        self.record.process_wall_s = time.monotonic() - self.t0
        record = self.record.record()
        if columns is not None:
            record = record.replace(**sampled_peaks(record, SampleColumns.of(columns)))
        write_strategy_file(self.out, self.strategy, record)
        return record


def run_strategy(scenario: Scenario, strategy: str, out: Path, workdir: Path, t0: float) -> StrategyRecord:
    """Load, partition and build with one strategy; never raises for a failure of the strategy itself."""
    out.mkdir(parents=True, exist_ok=True)
    run = Run(scenario, strategy, out, workdir, t0)
    try:
        model, path, _ = run.prepare()
        model = run.load(model, path)
        engines = run.partition(model)
        run.build(model, engines)
        run.record.status = "ok"
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        run.record.status = "failed"
        run.record.error = f"{type(exc).__name__}: {exc}"
    return run.finish()


def main(argv: list[str] | None = None) -> int:
    t0 = process_start_monotonic()
    parser = argparse.ArgumentParser(prog="python -m harness.worker", description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("strategy", choices=sorted(STRATEGIES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--workdir", type=Path, default=None, help="where engine files go (default data/engines)")
    args = parser.parse_args(argv)
    sys.setswitchinterval(0.001)  # hand the GIL to the sampler thread often, so its interval holds
    scenario = load_scenario(args.scenario)
    workdir = args.workdir or Path("data") / "engines" / f"{args.out.name}-{args.strategy}"
    record = run_strategy(scenario, args.strategy, args.out, workdir, t0)
    return 0 if record.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
