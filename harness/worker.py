"""One strategy, measured in a process of its own, from a plan the parent resolved.

``python -m harness.worker PLAN STRATEGY OUT_DIR`` reads ``PLAN`` (:mod:`harness.plan`),
rebuilds the model on the meta device from it and checks it is the planned one, loads
it with the strategy (:data:`harness.load.strategies.STRATEGIES`), builds the planned
engines one by one under the sampler, releasing each weight after its last engine,
and writes ``samples-<strategy>.csv``, ``events-<strategy>.csv`` and
``strategy-<strategy>.json`` (a :class:`~harness.results.record.StrategyRecord`, peaks derived
by :func:`harness.results.metrics.sampled_peaks`) into ``OUT_DIR``. The parent
(:mod:`harness.run`) starts one such process per strategy, so that no strategy inherits
another's allocator caches or mapped pages.

Times are seconds from this process's start. The exit status is 0 when the strategy
ran to the end and 1 when it failed: the reason is in the record, or, when not even
the record could be written (a full disk, say), on the last line of stderr,
``error: harness worker failed: <reason>`` (after :data:`FAILURE_PREFIX`), where the parent
picks it up; a failure of the file system is that one line, without a traceback.
"""

from __future__ import annotations

import argparse
import csv
import errno
import gc
import io
import resource
import sys
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import torch

from harness.build.backends import Backend, make_backend, make_compiler_backend
from harness.errors import HarnessError
from harness.load.strategies import STRATEGIES, Strategy, release_without_resizing
from harness.measure.coldcache import CacheReport, prepare_cold, prepare_warm
from harness.measure.gpu import GpuMonitor
from harness.measure.procfs import PeakTracker, mapping_rss, read_peak, read_status
from harness.measure.residency import FileResidency
from harness.measure.sampler import Sampler
from harness.models import build_model, fill_non_persistent
from harness.models.checkpoints import checkpoint_specs, describe_specs
from harness.plan import Plan, read_plan
from harness.progress import engine_bar, phase_ticker
from harness.results.atomic import write_atomic
from harness.results.metrics import SampleColumns, sampled_peaks
from harness.results.record import (
    EVENT_COLUMNS,
    CacheRecord,
    EngineRecord,
    ExportRecord,
    Phases,
    StrategyRecord,
    events_file,
    samples_file,
    write_strategy_file,
)
from weightmap import ReleasePlan

if TYPE_CHECKING:
    from harness.build.compile.backend import CompilerBackend
    from harness.build.compile.entry import Entry

__all__ = ["FAILURE_PREFIX", "measure", "worker_command"]

FAILURE_PREFIX = "harness worker failed: "
"""Starts the last stderr line of a worker that could not write its record."""

SETTLE_TIMEOUT_S = 30.0
"""How long a cold preparation waits for the machine's writeback to settle before it drops the
checkpoint anyway (a shared machine may never settle; the record says so)."""


def worker_command(plan_path: Path, strategy: str, out: Path) -> list[str]:
    """The command line of one strategy's process."""
    return [sys.executable, "-m", "harness.worker", str(plan_path), strategy, str(out)]


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
    compiler: str | None = None
    compiler_weights: str | None = None
    export: ExportRecord | None = None
    max_abs_diff: float | None = None
    check: str | None = None
    cache: CacheRecord | None = None
    prefetch: str | None = None
    drop_cache: bool | None = None
    prefetch_warmed_bytes: int | None = None

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
            compiler=self.compiler, compiler_weights=self.compiler_weights, export=self.export,
            max_abs_diff=self.max_abs_diff, check=self.check,
            cache=self.cache, prefetch=self.prefetch, drop_cache=self.drop_cache,
            prefetch_warmed_bytes=self.prefetch_warmed_bytes,
        )


def process_start_monotonic() -> float:
    """This process's start on the ``time.monotonic()`` clock."""
    age = time.time() - psutil.Process().create_time()
    return time.monotonic() - max(0.0, age)


def cache_record(report: CacheReport) -> CacheRecord:
    """What the results keep of a page-cache preparation (the residency at load start is added later)."""
    return CacheRecord(
        state=report.state, method=report.method,
        flushed=any(f.flushes > 0 for f in report.files), settled=report.settled,
        dropped=report.state == "cold", resident_before_bytes=sum(f.resident_bytes_before for f in report.files),
        resident_after_bytes=report.resident_bytes, resident_at_load_bytes=None, total_bytes=report.total_bytes,
        seconds=report.seconds, notes=tuple(report.notes),
    )


def _major_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def _import_compiler() -> None:
    """Load the compiler's modules before the baseline, as torch itself is.

    A function of its own: importing ``torch.<submodule>`` inside a function that also
    uses ``torch`` would make ``torch`` a local name of that function.
    """
    import torch._inductor.codecache  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    import torch._inductor.graph  # noqa: F401
    import torch._inductor.lowering  # noqa: F401
    import torch.export  # noqa: F401


def _named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    named: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))
    return named


class Measurement:
    """The measured run of one strategy of a plan; every step records into ``record`` and ``events``."""

    def __init__(self, plan: Plan, strategy: str, out: Path, t0: float) -> None:
        self.plan, self.strategy, self.out, self.t0 = plan, strategy, out, t0
        self.spec: Strategy = STRATEGIES[strategy]
        self.workdir = Path(plan.workdir) / f"{plan.name}-{strategy}"
        self.record = _Measured(engine_cap_bytes=plan.engine_cap_bytes)
        self.events = EventLog(t0)
        self.peak = PeakTracker()
        self.gpu: GpuMonitor | None = None
        self.sampler: Sampler | None = None
        self.backend: Backend | None = None
        self.compiled: CompilerBackend | None = None
        self.entry: Entry | None = None

    def prepare(self) -> torch.nn.Module:
        """Rebuild the planned model on meta, start CUDA and the sampler; take the baseline."""
        plan = self.plan
        model = build_model(plan.model_config).module
        built = describe_specs(checkpoint_specs(model))
        if (built["tensors"], built["nbytes"]) != (plan.model.tensors, plan.model.bytes):
            raise RuntimeError(f"the model built here ({built['tensors']} tensors, {built['nbytes']} bytes) "
                               f"is not the planned one ({plan.model.tensors} tensors, {plan.model.bytes} bytes)")
        files = [Path(f) for f in plan.checkpoint_files]
        files += [f for f in self.spec.files_read(Path(plan.checkpoint.path)) if f not in files]
        if plan.compiler:
            _import_compiler()
        # Last before the baseline, so that nothing loaded above brings the checkpoint back.
        if plan.cache == "cold":  # flushed, the machine's writeback waited for, then dropped
            self.record.cache = cache_record(prepare_cold(files, settle=True, timeout_s=SETTLE_TIMEOUT_S))
        else:
            self.record.cache = cache_record(prepare_warm(files))
        if plan.device == "cuda":
            torch.empty(1, device="cuda")  # the CUDA context exists before the baseline
            self.gpu = GpuMonitor.open(torch.cuda.current_device())
        self.sampler = Sampler(
            interval_s=plan.sample_interval_ms / 1000,
            files=files,
            gpu=self.gpu,
            t0=self.t0,
            residency_every=plan.residency_every,
        )
        self.sampler.start()
        self.sampler.rebase_gpu()
        self.record.gpu_baseline_bytes = self.sampler.gpu_baseline_bytes
        self.sampler.mark(phase="baseline")
        self.record.baseline_rss_bytes = read_status().rss_bytes
        return model

    def _gpu_used(self) -> int | None:
        if self.gpu is None or self.record.gpu_baseline_bytes is None:
            return None
        return self.gpu.used_bytes() - self.record.gpu_baseline_bytes

    def load(self, model: torch.nn.Module) -> torch.nn.Module:
        assert self.sampler is not None
        if self.record.cache is not None:
            with FileResidency([Path(f) for f in self.plan.checkpoint_files]) as residency:
                resident = residency.resident_bytes()
            self.record.cache = replace(self.record.cache, resident_at_load_bytes=resident)
        self.record.phases["load_start_s"] = self.events.add("load_start")
        self.sampler.mark(phase="load")
        with phase_ticker(self.strategy, "loading"):
            loaded = self.spec.load(model, Path(self.plan.checkpoint.path))
            fill_non_persistent(loaded.model)
        self.record.note = loaded.note
        self.record.phases["load_end_s"] = self.events.add("load_end")
        return loaded.model

    def export(self, model: torch.nn.Module) -> torch.nn.Module:
        """Compiler backends: export the loaded model (its entry) as a phase of its own; returns the entry."""
        from harness.build.compile.entry import export_entry

        assert self.sampler is not None
        plan = self.plan
        self.record.load_hwm_bytes = read_peak()  # export resets the high-water mark: read the load's first
        self.compiled = make_compiler_backend(
            plan.backend, plan.device, self.workdir, weights=plan.weights or "mapped",
            count=plan.engine_count, cap_bytes=None if plan.engine_count is not None else plan.engine_cap_bytes,
        )
        self.record.compiler, self.record.compiler_weights = self.compiled.name, self.compiled.weights
        self.entry = export_entry(plan.model_config, model, tokens=plan.tokens or 16, seed=plan.checkpoint.seed)
        self.sampler.mark(phase="export")
        self.record.phases["export_start_s"] = self.events.add("export_start")
        with phase_ticker(self.strategy, "exporting"):
            result = self.compiled.export(self.entry.module, self.entry.args, self.entry.kwargs,
                                          [Path(f) for f in plan.checkpoint_files])
        self.record.phases["export_end_s"] = self.events.add("export_end", rss_bytes=result.rss_after_bytes)
        before, after = result.residency_before_bytes, result.residency_after_bytes
        self.record.export = ExportRecord(
            seconds=round(result.seconds, 3), nodes=result.nodes, pages_read_bytes=result.pages_read_bytes,
            residency_read_bytes=None if before is None or after is None else after - before,
            rss_before_bytes=result.rss_before_bytes, rss_after_bytes=result.rss_after_bytes,
            hwm_bytes=result.hwm_bytes, anon_delta_bytes=result.anon_after_bytes - result.anon_before_bytes,
            not_shared=len(result.not_shared),
        )
        if result.hwm_bytes is not None and self.record.load_hwm_bytes is not None:
            self.record.load_hwm_bytes = max(self.record.load_hwm_bytes, result.hwm_bytes)
        return self.entry.module

    def partition(self, model: torch.nn.Module) -> None:
        """The planned engines must name tensors of the loaded model; record the host at partitioning.

        For a compiler backend ``model`` is the exported entry, and its graph partitions must
        be the planned ones.
        """
        from harness.build.compile.planning import same_partitions

        assert self.sampler is not None
        self.sampler.mark(phase="partition")
        if self.compiled is not None:
            why = same_partitions([e.names for e in self.plan.engines], self.compiled.partition())
            if why is not None:
                raise RuntimeError(f"the graph partitions of the loaded model are not the planned ones: {why}")
        named = self._engine_tensors(model)
        for engine in self.plan.engines:
            unknown = [n for n in engine.names if n not in named]
            if unknown:
                raise KeyError(f"engine {engine.index} reads {unknown[0]!r}, which the loaded model does not have")
        self.record.host_at_partitioning_bytes = read_status().rss_bytes
        if self.compiled is None:
            self.record.load_hwm_bytes = read_peak()
        self.record.phases["partition_s"] = self.events.add(
            "partition", weight_bytes=self.plan.model.bytes_with_non_persistent_buffers,
            rss_bytes=self.record.host_at_partitioning_bytes,
        )

    def build(self, model: torch.nn.Module) -> None:
        assert self.sampler is not None
        plan, engines = self.plan, self.plan.engines
        builder: Backend | CompilerBackend
        if self.compiled is not None:
            builder = self.compiled
        else:
            builder = self.backend = make_backend(plan.backend, plan.device, self.workdir)
        plan_release = self._release_plan(model) if plan.release else None
        hooks = self.spec.hooks(model, Path(plan.checkpoint.path)) if self.spec.hooks else None
        named = self._engine_tensors(model)
        self.sampler.mark(phase="build")
        if plan_release is not None and self.record.prefetch is not None and engines:
            plan_release.prefetch(0)  # engines 0 and 1 start warming
        bar = engine_bar(self.strategy, len(engines), sum(e.weight_bytes for e in engines))
        try:
            for engine in engines:
                self.peak.begin()
                self.sampler.mark(engine=engine.index)
                faults = _major_faults()
                start = self.events.add("engine_start", engine=engine.index, weight_bytes=engine.weight_bytes)
                if hooks is not None:
                    hooks.before(engine.index, engine.names)
                    named = self._engine_tensors(model)  # the hook may have put new tensors in place
                builder.build_engine(engine.index, {n: named[n] for n in engine.names})
                split = getattr(builder, "last_split", None)
                step = plan_release.built(engine.index) if plan_release else None
                by_hooks = hooks.after(engine.index, engine.names) if hooks is not None else 0
                hwm = self.peak.end()
                self.sampler.mark(engine=None)
                released = (step.released_bytes if step else 0) + by_hooks
                self.record.released_bytes += released
                if step is not None:
                    self.record.unreleased_bytes += step.kept_bytes
                elif not by_hooks:
                    self.record.unreleased_bytes += engine.weight_bytes
                rss, gpu = read_status().rss_bytes, self._gpu_used()
                end = self.events.add("engine_end", engine=engine.index, weight_bytes=engine.weight_bytes,
                                      host_hwm_bytes=hwm, released_bytes=released, rss_bytes=rss,
                                      gpu_used_bytes=gpu)
                compiled = self.compiled.details(engine.index) if self.compiled is not None else None
                self.record.engines.append(EngineRecord(
                    index=engine.index, weight_bytes=engine.weight_bytes, start_s=round(start, 6),
                    end_s=round(end, 6), host_hwm_bytes=hwm, released_bytes=released, rss_after_bytes=rss,
                    gpu_used_bytes=gpu, tensors=len(engine.names),
                    compile_s=None if compiled is None else round(compiled.compile_s, 3),
                    artifact_bytes=None if compiled is None else compiled.artifact_bytes,
                    rss_before_bytes=None if compiled is None else compiled.rss_before_bytes,
                    children_peak_bytes=None if compiled is None else compiled.children_peak_bytes,
                    cache_bytes=None if compiled is None else compiled.cache_bytes,
                    pages_s=None if split is None else round(split.pages_s, 6),
                    copy_s=None if split is None else round(split.copy_s, 6),
                    major_faults=_major_faults() - faults,
                ))
                bar.built(engine.weight_bytes)
        finally:
            bar.close()
            if plan_release is not None:
                stats = plan_release.prefetch_stats
                self.record.prefetch_warmed_bytes = None if stats is None else stats.warmed_bytes
                plan_release.close()
        if not self.peak.supported:
            self.record.peak_source = "samples only: the kernel refused to reset VmHWM (/proc/self/clear_refs)"
        self.record.release_note = self.spec.release_note(plan.release, self.record.unreleased_bytes)
        if self._keeps_own_tensors and self.record.unreleased_bytes:
            self.record.release_note = ("the engines run on the model's own tensors (weights = \"mapped\"): "
                                        "mapped pages are dropped after each engine, other memory is kept for "
                                        "the engines to run on")
        self.record.phases["build_end_s"] = self.events.add("build_end")
        self.sampler.mark(phase="done", engine=None)

    def built_outputs(self) -> Any:
        """Compiler backends: the built model's output on the example inputs (after the measured phases)."""
        assert self.compiled is not None and self.entry is not None
        self.stop_sampling()
        with phase_ticker(self.strategy, "running the built model"):
            return self.compiled.run_built(self.entry.args, self.entry.kwargs)

    def check(self, built: Any) -> None:
        """Compare the built model's output with eager's, on a freshly mapped model; a mismatch fails the strategy.

        The loaded model may have been released engine by engine, so eager runs on a new
        mapping of the checkpoint (released pages are read again from the file).
        """
        from harness.build.compile.compare import compare_outputs, upcast_reference
        from harness.build.compile.entry import export_entry
        from weightmap import map_weights

        assert self.compiled is not None
        plan = self.plan
        self.compiled.drop_program()
        self.entry = None  # nothing of the loaded model is kept
        gc.collect()
        reference = build_model(plan.model_config).module
        map_weights(reference, Path(plan.checkpoint.path), strict=True, allow_meta_buffers=True).close()
        fill_non_persistent(reference)
        eager = export_entry(plan.model_config, reference, tokens=plan.tokens or 16, seed=plan.checkpoint.seed)
        module, args, kwargs = eager.module, eager.args, eager.kwargs
        if plan.device == "cuda":  # eager runs where the engines ran
            from torch.utils import _pytree as pytree

            def move(value: Any) -> Any:
                return value.to(self.compiled.device) if isinstance(value, torch.Tensor) else value  # type: ignore[union-attr]

            module = module.to(self.compiled.device)
            args, kwargs = pytree.tree_map(move, (args, kwargs))
        with phase_ticker(self.strategy, "running eager"), torch.no_grad():
            want = module(*args, **kwargs)
        comparison = compare_outputs(built, want)
        if not comparison.ok:  # a bfloat16 model: judge both against a float32 run of eager
            with phase_ticker(self.strategy, "running eager in float32"):
                reference, why = upcast_reference(module, args, kwargs, free_bytes=self._free_bytes())
            if reference is not None:
                comparison = compare_outputs(built, want, reference)
            else:
                comparison = replace(comparison, detail=f"{comparison.detail}; {why}")
        finite = comparison.max_abs_diff == comparison.max_abs_diff and comparison.max_abs_diff != float("inf")
        self.record.max_abs_diff = comparison.max_abs_diff if finite else None
        self.record.check = comparison.detail
        comparison.check()

    def _free_bytes(self) -> int:
        """Memory free for new tensors where eager runs: the GPU's free bytes, or the host's
        available memory, no more than the scenario's limit leaves above the current RSS less
        the checkpoint's mapped pages."""
        if self.plan.device.startswith("cuda"):
            return int(torch.cuda.mem_get_info(torch.device(self.compiled.device))[0])  # type: ignore[union-attr]
        free = int(psutil.virtual_memory().available)
        limit = self.plan.memory_limit_bytes
        if limit is not None:  # the checkpoint's mapped pages leave RSS as the copies are made
            mapped = sum(mapping_rss(f) for f in self.plan.checkpoint_files)
            free = min(free, limit - (read_status().rss_bytes - mapped))
        return free

    def stop_sampling(self) -> None:
        """Stop the sampler (what follows is not part of the measured run)."""
        if self.sampler is not None and self.sampler.running:
            try:
                stats = self.sampler.stop()
                self.record.samples, self.record.max_gap_ms = stats.samples, stats.max_gap_ms
                self.record.mean_interval_ms = stats.mean_interval_ms
            except RuntimeError as exc:
                self.record.status = "failed"  # the samples stop where the sampler failed
                self.record.error = "; ".join(filter(None, [self.record.error, str(exc)]))

    def _release_plan(self, model: torch.nn.Module) -> ReleasePlan:
        """The strategy's release plan: with prefetch (and drop_cache) where the strategy and the plan ask for it."""
        held = set(_named_tensors(model))  # a program's own constants are not the model's to release
        plan, names = self.plan, [[n for n in e.names if n in held] for e in self.plan.engines]
        planner = self.spec.prefetch_plan
        method = plan.prefetch if self.spec.prefetches else None
        drop = plan.drop_cache and self.spec.drops_cache
        if planner is not None and (method is not None or drop):
            self.record.prefetch, self.record.drop_cache = method, drop
            return planner(model, names, method, drop)  # type: ignore[arg-type]
        self.record.drop_cache = False
        if self._keeps_own_tensors:
            return release_without_resizing(model, names)
        return self.spec.release_plan(model, names)

    def _engine_tensors(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """What engines may read, by name: the model's tensors and, for a compiler backend, the constants its
        exported program made (a ``torch.tensor(...)`` in a forward becomes ``lifted_tensor_N``)."""
        named = _named_tensors(model)
        if self.compiled is not None:
            named.update({k: v for k, v in self.compiled.constants().items() if k not in named})
        return named

    @property
    def _keeps_own_tensors(self) -> bool:
        """Whether the engines run on the model's own tensors, which must be kept: only mapped pages are dropped."""
        return self.compiled is not None and self.compiled.weights == "mapped"

    def finish(self) -> StrategyRecord:
        """Stop the sampler and write every file, whatever happened before; returns the record."""
        columns = None
        self.stop_sampling()
        if self.backend is not None:
            self.backend.close()
        if self.compiled is not None:
            self.compiled.close()
        if self.sampler is not None:
            self.sampler.write_csv(self.out / samples_file(self.strategy))
            columns = self.sampler.columns()
        self.events.write_csv(self.out / events_file(self.strategy))
        self.record.process_wall_s = time.monotonic() - self.t0
        record = self.record.record()
        if columns is not None:
            record = record.replace(**sampled_peaks(record, SampleColumns.of(columns)))
        write_strategy_file(self.out, self.strategy, record)
        return record


def measure(plan: Plan, strategy: str, out: Path, t0: float | None = None) -> StrategyRecord:
    """Load and build ``plan`` with ``strategy``, writing its files into ``out``; returns its record.

    A failure of the strategy itself is recorded (``status`` failed, the reason in
    ``error``), not raised. Failing to write the files raises.
    """
    out.mkdir(parents=True, exist_ok=True)
    run = Measurement(plan, strategy, out, time.monotonic() if t0 is None else t0)
    try:
        model = run.prepare()
        model = run.load(model)
        if run.plan.compiler:
            model = run.export(model)
        run.partition(model)
        run.build(model)
        if run.plan.compiler:
            built = run.built_outputs()
            del model  # the engines and the check no longer need the loaded weights
            gc.collect()
            run.check(built)
        run.record.status = "ok"
    except Exception as exc:
        if _outside(exc):  # the machine's fault (a full disk, say), not the strategy's: its reason is enough
            print(f"error: {strategy}: {_one_line(exc)}", file=sys.stderr, flush=True)
        else:
            traceback.print_exc(file=sys.stderr)
        run.record.status = "failed"
        run.record.error = f"{type(exc).__name__}: {exc}"
    return run.finish()


_FILE_SYSTEM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})
"""A file system that refused a write: no space left, over a quota, read-only, an I/O error."""


def _outside(exc: BaseException) -> bool:
    """Whether ``exc`` comes from outside the code, so that its message says all there is: a file system
    that refused a write (:data:`_FILE_SYSTEM_ERRNOS`), or an error the harness reports as the user's
    (:class:`~harness.errors.HarnessError`, such as a write that failed for one of those reasons)."""
    return isinstance(exc, HarnessError) or (isinstance(exc, OSError) and exc.errno in _FILE_SYSTEM_ERRNOS)


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def main(argv: list[str] | None = None) -> int:
    t0 = process_start_monotonic()
    parser = argparse.ArgumentParser(prog="python -m harness.worker", description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("strategy", choices=sorted(STRATEGIES))
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    sys.setswitchinterval(0.001)  # hand the GIL to the sampler thread often, so its interval holds
    try:
        record = measure(read_plan(args.plan), args.strategy, args.out, t0)
    except Exception as exc:  # the record itself could not be written: tell the parent why, in one line
        if not _outside(exc):
            traceback.print_exc(file=sys.stderr)
        print("error: " + FAILURE_PREFIX + _one_line(exc), file=sys.stderr, flush=True)
        return 1
    return 0 if record.ok else 1


if __name__ == "__main__":
    sys.exit(main())
