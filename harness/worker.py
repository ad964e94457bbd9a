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
picks it up; a failure of the file system is that one line, without a traceback. It is
:data:`OUTSIDE_STATUS` when the record was written but the strategy failed for a reason outside
it, the machine's (:func:`outside`): a file system that refused a write, or its own files (its
engines, its results) removed under it. Such a failure says nothing of the strategy, and the
parent does not publish it as its result.
"""

from __future__ import annotations

import argparse
import csv
import errno
import gc
import io
import os
import resource
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import torch

from harness.catalog import is_gpu
from harness.engines.builder import EngineBuilder
from harness.engines.registry import declared_columns, make_builder
from harness.errors import HarnessError
from harness.fileio.atomic import write_atomic
from harness.load.strategies import STRATEGIES, Strategy, release_without_resizing
from harness.measure.coldcache import prepare_cold, prepare_warm
from harness.measure.gpu import GpuMonitor
from harness.measure.procfs import PeakTracker, read_peak, read_status
from harness.measure.residency import FileResidency
from harness.measure.sampler import Sampler
from harness.models import build_model, fill_non_persistent
from harness.models.checkpoints import checkpoint_specs, describe_specs
from harness.plan import Plan, read_plan
from harness.progress import engine_bar, phase_ticker
from harness.results.metrics import SampleColumns, engine_gpu_peaks, sampled_peaks
from harness.results.record import EngineRecord, Phases, StrategyRecord, write_strategy_file
from harness.results.samples import EVENT_COLUMNS, events_file, samples_file
from weightmap import ReleasePlan

__all__ = ["FAILURE_PREFIX", "OUTSIDE_STATUS", "engine_directory", "measure", "outside", "worker_command"]

FAILURE_PREFIX = "harness worker failed: "
"""Starts the last stderr line of a worker that could not write its record."""

OUTSIDE_STATUS = 3
"""The exit status of a worker whose strategy failed for a reason outside it (:func:`outside`); its record
says why."""

SETTLE_TIMEOUT_S = 30.0
"""How long a cold preparation waits for the machine's writeback to settle before it drops the
checkpoint anyway (a shared machine may never settle; the record says so)."""


def worker_command(plan_path: Path, strategy: str, out: Path) -> list[str]:
    """The command line of one strategy's process."""
    return [sys.executable, "-m", "harness.worker", str(plan_path), strategy, str(out)]


def engine_directory(plan: Plan, strategy: str) -> Path:
    """Where ``strategy``'s process builds its engines: ``<plan.workdir>/<name>-<strategy>``."""
    return Path(plan.workdir) / f"{plan.name}-{strategy}"


@dataclass
class EventLog:
    """Engine and phase events with their times (seconds from the process start)."""

    t0: float
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, event: str, **values: Any) -> float:
        t = time.monotonic() - self.t0
        self.rows.append({"t_s": round(t, 6), "event": event, **values})
        return t

    def write_csv(self, path: Path) -> int:
        """Write the events to ``path`` (atomically) under a header of :data:`EVENT_COLUMNS`; returns how many
        rows it wrote."""
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=EVENT_COLUMNS, restval="")
        writer.writeheader()
        writer.writerows(self.rows)
        write_atomic(path, text.getvalue())
        return len(self.rows)


def process_start_monotonic() -> float:
    """This process's start on the ``time.monotonic()`` clock."""
    age = time.time() - psutil.Process().create_time()
    return time.monotonic() - max(0.0, age)


def _major_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def _reset_allocator_peaks() -> bool:
    """Reset the caching allocator's high-water marks of the current CUDA device; whether CUDA is initialised (the
    peaks are then read by :func:`_allocator_peaks`)."""
    if not torch.cuda.is_initialized():
        return False
    torch.cuda.reset_peak_memory_stats()
    return True


def _allocator_peaks() -> dict[str, int]:
    """The caching allocator's reserved and allocated high-water marks since :func:`_reset_allocator_peaks`, as
    :class:`~harness.results.record.EngineRecord` fields."""
    return {"gpu_reserved_peak_bytes": int(torch.cuda.max_memory_reserved()),
            "gpu_allocated_peak_bytes": int(torch.cuda.max_memory_allocated())}


def _released(record: EngineRecord, after: tuple[int, int, int | None] | None) -> EngineRecord:
    """``record`` with what its release measured (released bytes, RSS and GPU ``used`` right after it), where its
    weights were released after its build had ended (a copy that ran behind it); as it is otherwise."""
    if after is None or record.released_bytes is not None:
        return record
    released, rss, gpu = after
    return replace(record, released_bytes=released, rss_after_bytes=rss, gpu_used_bytes=gpu)


def _named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    named: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))
    return named


class StrategyRun:
    """The measured run of one strategy of a plan; every step records into ``record`` and ``events``.

    ``record`` is the :class:`StrategyRecord` being filled: each step replaces what it measured.
    ``builder`` is the plan's engine builder (:func:`harness.engines.registry.make_builder`), made
    before the baseline; every step of the builder is taken for every backend.
    """

    def __init__(self, plan: Plan, strategy: str, out: Path, t0: float) -> None:
        self.plan, self.strategy, self.out, self.t0 = plan, strategy, out, t0
        self.spec: Strategy = STRATEGIES[strategy]
        self.workdir = engine_directory(plan, strategy)
        self.record = StrategyRecord(status="running", engine_cap_bytes=plan.engine_cap_bytes, released_bytes=0,
                                     unreleased_bytes=0, peak_source="kernel high-water mark")
        self.events = EventLog(t0)
        self.peak = PeakTracker()
        self.gpu: GpuMonitor | None = None
        self.sampler: Sampler | None = None
        self.builder: EngineBuilder | None = None

    def _set(self, **values: Any) -> None:
        self.record = self.record.replace(**values)

    def _phase(self, key: str, t: float) -> None:
        self.record = self.record.replace(phases=replace(self.record.phases, **{key: round(t, 6)}))

    @contextmanager
    def phase(self, name: str, doing: str) -> Iterator[dict[str, int | None]]:
        """A measured phase: ``<name>_start`` and ``<name>_end`` events and phase boundaries, the sampler's mark,
        ``doing`` shown while it runs (see :class:`harness.engines.builder.PhaseRecorder`)."""
        assert self.sampler is not None
        self.sampler.mark(phase=name)
        self._phase(f"{name}_start_s", self.events.add(f"{name}_start"))
        end: dict[str, int | None] = {}
        with phase_ticker(self.strategy, doing):
            yield end
        self._phase(f"{name}_end_s", self.events.add(f"{name}_end", **end))

    def doing(self, what: str) -> AbstractContextManager[None]:
        """``what`` shown while the block runs."""
        return phase_ticker(self.strategy, what)

    def prepare(self) -> torch.nn.Module:
        """Rebuild the planned model on meta, make the builder, start CUDA and the sampler; take the baseline."""
        plan = self.plan
        # First: whatever initialises CUDA below (making the builder, say) is the context's.
        before_cuda = self._open_gpu() if is_gpu(plan.device) else None
        model = build_model(plan.scenario.model).module
        built = describe_specs(checkpoint_specs(model))
        if (built["tensors"], built["nbytes"]) != (plan.model.tensors, plan.model.bytes):
            raise RuntimeError(f"the model built here ({built['tensors']} tensors, {built['nbytes']} bytes) "
                               f"is not the planned one ({plan.model.tensors} tensors, {plan.model.bytes} bytes)")
        files = [Path(f) for f in plan.checkpoint_files]
        files += [f for f in self.spec.files_read(Path(plan.checkpoint.path)) if f not in files]
        # Before the baseline: what making the builder loads (a compiler's modules) is loaded as torch is.
        self.builder = make_builder(plan, self.workdir)
        self._set(compiler=self.builder.compiler, compiler_weights=self.builder.weights)
        # Last before the baseline, so that nothing loaded above brings the checkpoint back.
        if plan.scenario.run.cache == "cold":  # flushed, the machine's writeback waited for, then dropped
            self._set(cache=prepare_cold(files, settle=True, timeout_s=SETTLE_TIMEOUT_S).record)
        else:
            self._set(cache=prepare_warm(files).record)
        if is_gpu(plan.device):
            self._start_cuda(before_cuda)
        self.sampler = Sampler(
            interval_s=plan.scenario.run.sample_interval_ms / 1000,
            files=files,
            gpu=self.gpu,
            t0=self.t0,
            residency_every=plan.scenario.run.residency_every,
        )
        self.sampler.start()
        self.sampler.rebase_gpu()
        self._set(gpu_baseline_bytes=self.sampler.gpu_baseline_bytes)
        self.sampler.mark(phase="baseline")
        self._set(baseline_rss_bytes=read_status().rss_bytes)
        return model

    def _open_gpu(self) -> int | None:
        """Open the GPU monitor of the device the CUDA context will be made on (torch's current device: 0 until
        CUDA is initialised), without initialising CUDA; NVML ``used`` now, or None without a monitor."""
        self.gpu = GpuMonitor.open(torch.cuda.current_device() if torch.cuda.is_initialized() else 0)
        return None if self.gpu is None else self.gpu.used_bytes()

    def _start_cuda(self, before: int | None) -> None:
        """Create the CUDA context (before the baseline, which then holds it) and record its bytes: NVML ``used``
        after the first allocation minus ``before`` (read by :meth:`_open_gpu`), less what the caching allocator
        reserved for that allocation."""
        torch.empty(1, device="cuda")  # the CUDA context exists before the baseline
        if self.gpu is not None and before is not None:
            after = self.gpu.used_bytes()
            self._set(gpu_context_bytes=max(0, after - before - torch.cuda.memory_reserved()))

    def _gpu_used(self) -> int | None:
        if self.gpu is None or self.record.gpu_baseline_bytes is None:
            return None
        return self.gpu.used_bytes() - self.record.gpu_baseline_bytes

    def load(self, model: torch.nn.Module) -> torch.nn.Module:
        assert self.sampler is not None
        if self.record.cache is not None:
            with FileResidency([Path(f) for f in self.plan.checkpoint_files]) as residency:
                resident = residency.resident_bytes()
            self._set(cache=replace(self.record.cache, resident_at_load_bytes=resident))
        self._phase("load_start_s", self.events.add("load_start"))
        self.sampler.mark(phase="load")
        with phase_ticker(self.strategy, "loading"):
            loaded = self.spec.load(model, Path(self.plan.checkpoint.path))
            fill_non_persistent(loaded.model)
        self._set(note=loaded.note)
        self._phase("load_end_s", self.events.add("load_end"))
        self._set(load_hwm_bytes=read_peak())  # before anything resets the high-water mark (an export does)
        return loaded.model

    def export(self, model: torch.nn.Module) -> torch.nn.Module:
        """The builder's export phase, where it has one; returns the module whose tensors the engines read."""
        assert self.builder is not None
        module, export = self.builder.export(model, self)
        self._set(export=export)
        return module

    def partition(self, model: torch.nn.Module) -> None:
        """The planned engines must name tensors of ``model`` (and be the builder's own cut, where it cuts the
        model itself); record the host at partitioning and the high-water mark since the load began."""
        assert self.sampler is not None and self.builder is not None
        self.sampler.mark(phase="partition")
        self.builder.partition([e.names for e in self.plan.engines])
        named = self._engine_tensors(model)
        for engine in self.plan.engines:
            unknown = [n for n in engine.names if n not in named]
            if unknown:
                raise KeyError(f"engine {engine.index} reads {unknown[0]!r}, which the loaded model does not have")
        rss = read_status().rss_bytes
        self._set(host_at_partitioning_bytes=rss, load_hwm_bytes=max(self.record.load_hwm_bytes or 0, read_peak()))
        self._phase("partition_s", self.events.add(
            "partition", weight_bytes=self.plan.model.bytes_with_non_persistent_buffers, rss_bytes=rss,
        ))

    def build(self, model: torch.nn.Module) -> None:
        """Build the planned engines in order, releasing each weight after its last engine."""
        assert self.sampler is not None and self.builder is not None
        plan, engines, builder = self.plan, self.plan.engines, self.builder
        plan_release = self._release_plan(model) if plan.scenario.build.release else None
        hooks = (self.spec.hooks(model, Path(plan.checkpoint.path), plan.device, [e.names for e in engines])
                 if self.spec.hooks else None)
        named = self._engine_tensors(model)
        self.sampler.mark(phase="build")
        if plan_release is not None and self._prefetch_method() is not None and engines:
            plan_release.prefetch(0)  # engines 0 and 1 start warming
        bar = engine_bar(self.strategy, len(engines), sum(e.weight_bytes for e in engines))
        released_total = unreleased_total = 0
        records: list[EngineRecord] = []
        after_release: dict[int, tuple[int, int, int | None]] = {}  # engine: released bytes, RSS and GPU after

        def done(index: int) -> None:
            """The builder reads engine ``index``'s tensors no more: release them (in engine order, each once)."""
            nonlocal released_total, unreleased_total
            names = engines[index].names
            step = plan_release.built(index) if plan_release else None
            by_hooks = hooks.after(index, names) if hooks is not None else 0
            released = (step.released_bytes if step else 0) + by_hooks
            released_total += released
            if step is not None:
                unreleased_total += step.kept_bytes
            elif not by_hooks:
                unreleased_total += engines[index].weight_bytes
            after_release[index] = (released, read_status().rss_bytes, self._gpu_used())
            if index != current:  # released during a later engine's build (its copy ran behind it)
                self.events.add("engine_released", engine=index, weight_bytes=engines[index].weight_bytes,
                                released_bytes=released, rss_bytes=after_release[index][1],
                                gpu_used_bytes=after_release[index][2])

        current = -1
        try:
            for engine in engines:
                if hooks is not None:  # the hook brings in this engine's weights: the previous ones are let go first
                    builder.finish(done)
                current = engine.index
                self.peak.begin()
                self.sampler.mark(engine=engine.index)
                faults = _major_faults()
                gpu_start = self._gpu_used()
                allocator = _reset_allocator_peaks() if is_gpu(plan.device) else False
                start = self.events.add("engine_start", engine=engine.index, weight_bytes=engine.weight_bytes)
                if hooks is not None:
                    hooks.before(engine.index, engine.names)
                    named = self._engine_tensors(model)  # the hook may have put new tensors in place
                built = builder.build(engine.index, {n: named[n] for n in engine.names}, done)
                peaks = _allocator_peaks() if allocator else {}
                hwm = self.peak.end()
                self.sampler.mark(engine=None)
                released, rss, gpu = after_release.get(engine.index) or (None, read_status().rss_bytes,
                                                                         self._gpu_used())
                end = self.events.add("engine_end", engine=engine.index, weight_bytes=engine.weight_bytes,
                                      host_hwm_bytes=hwm, released_bytes=released, rss_bytes=rss,
                                      gpu_used_bytes=gpu)
                records.append(EngineRecord(
                    index=engine.index, weight_bytes=engine.weight_bytes, start_s=round(start, 6),
                    end_s=round(end, 6), host_hwm_bytes=hwm, released_bytes=released, rss_after_bytes=rss,
                    gpu_used_bytes=gpu, tensors=len(engine.names), major_faults=_major_faults() - faults,
                    gpu_start_bytes=gpu_start, **peaks,
                ).with_columns(*declared_columns(plan.scenario.build.backend, built.columns)))
                bar.built(engine.weight_bytes)
            current = -1
            builder.finish(done)  # the last engines' copies: their weights released once copied
        finally:
            bar.close()
            records = [_released(r, after_release.get(r.index)) for r in records]
            self._set(engines=tuple(records), released_bytes=released_total, unreleased_bytes=unreleased_total)
            if plan_release is not None:
                stats = plan_release.prefetch_stats
                plan_release.close()  # the thread stopped: its figures are final
                if stats is not None:
                    self._set(prefetch_warmed_bytes=stats.warmed_bytes, prefetch_busy_s=round(stats.busy_s, 6),
                              prefetch_evict_s=round(stats.evict_s, 6))
        # non-persistent buffers are not the checkpoint's weights: keeping them is not failing to release one
        buffers = plan.model.bytes_with_non_persistent_buffers - plan.model.bytes
        if not self.peak.supported:
            self._set(peak_source="samples only: the kernel refused to reset VmHWM (/proc/self/clear_refs)")
        self._set(release_note=builder.release_note(unreleased_total)
                  or self.spec.release_note(plan.scenario.build.release, max(0, unreleased_total - buffers)))
        self._phase("build_end_s", self.events.add("build_end"))
        self.sampler.mark(phase="done", engine=None)

    def check(self) -> None:
        """Compare the built model with eager, where the builder compares them (after the measured phases);
        a mismatch fails the strategy after ``max_abs_diff``, ``check`` and ``check_peak_bytes`` are recorded."""
        assert self.builder is not None
        self.stop_sampling()
        start = round(time.monotonic() - self.t0, 6)

        def ended() -> Phases:
            return replace(self.record.phases, check_start_s=start, check_end_s=round(time.monotonic() - self.t0, 6))

        try:
            checked = self.builder.check(self)
        except Exception:
            self._set(phases=ended())  # a check that failed still took its time
            raise
        if checked is None:
            return
        comparison = checked.comparison
        finite = comparison.max_abs_diff == comparison.max_abs_diff and comparison.max_abs_diff != float("inf")
        self._set(max_abs_diff=comparison.max_abs_diff if finite else None, check=comparison.detail, phases=ended(),
                  check_peak_bytes=checked.peak_bytes)
        comparison.check()

    def stop_sampling(self) -> None:
        """Stop the sampler (what follows is not part of the measured run)."""
        if self.sampler is not None and self.sampler.running:
            try:
                stats = self.sampler.stop()
                self._set(samples=stats.samples, max_gap_ms=stats.max_gap_ms, mean_interval_ms=stats.mean_interval_ms)
            except RuntimeError as exc:  # the samples stop where the sampler failed
                self._set(status="failed", error="; ".join(filter(None, [self.record.error, str(exc)])))

    def _prefetch_method(self) -> str | None:
        """How this strategy warms the next engine's pages: the plan's method where the strategy prefetches and has
        a release plan that can (``None``: it does not). Taken from the plan alone; the record only states it."""
        if self.spec.prefetch_plan is None or not self.spec.prefetches:
            return None
        return self.plan.reading.prefetch

    def _release_plan(self, model: torch.nn.Module) -> ReleasePlan:
        """The strategy's release plan: with prefetch (and drop_cache) where the strategy and the plan ask for it."""
        assert self.builder is not None
        held = set(_named_tensors(model))  # a program's own constants are not the model's to release
        plan, names = self.plan, [[n for n in e.names if n in held] for e in self.plan.engines]
        planner = self.spec.prefetch_plan
        method = self._prefetch_method()
        drop = plan.drop_cache and self.spec.drops_cache
        if planner is not None and (method is not None or drop):
            self._set(prefetch=method, drop_cache=drop)
            return planner(model, names, method, drop, plan.reading.prefetch_readers,  # type: ignore[arg-type]
                           plan.reading.prefetch_request_bytes)
        self._set(drop_cache=False)
        if self.builder.keeps_model_tensors:
            return release_without_resizing(model, names)
        return self.spec.release_plan(model, names)

    def _engine_tensors(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """What engines may read, by name: the model's tensors and the builder's own constants (an exported
        program's: a ``torch.tensor(...)`` in a forward becomes ``lifted_tensor_N``)."""
        assert self.builder is not None
        named = _named_tensors(model)
        named.update({k: v for k, v in self.builder.constants().items() if k not in named})
        return named

    def finish(self) -> StrategyRecord:
        """Stop the sampler and write every file, whatever happened before; returns the record."""
        columns = None
        self.stop_sampling()
        if self.builder is not None:
            self.builder.close()
        if self.sampler is not None:
            self._set(sample_rows=self.sampler.write_csv(self.out / samples_file(self.strategy)))
            columns = self.sampler.columns()
        self._set(event_rows=self.events.write_csv(self.out / events_file(self.strategy)))
        self._set(process_wall_s=round(time.monotonic() - self.t0, 3))
        record = self.record
        if columns is not None:
            record = record.replace(**sampled_peaks(record, SampleColumns.of(columns)))
            record = record.replace(engines=engine_gpu_peaks(record.engines, columns["engine"],
                                                             columns["gpu_used_bytes"]))
        write_strategy_file(self.out, self.strategy, record)
        return record


def measure(plan: Plan, strategy: str, out: Path, t0: float | None = None, *, check: bool = True) -> StrategyRecord:
    """Load and build ``plan`` with ``strategy``, writing its files into ``out``; returns its record.

    A failure of the strategy itself is recorded (``status`` failed, the reason in
    ``error``), not raised. Failing to write the files raises. ``check=False`` leaves out the
    built model's check against eager (budget mode's constrained attempts: whether the build
    fits is the question there, and their unconstrained run checked the same build).
    """
    return _measure(plan, strategy, out, t0, check=check)[0]


def _measure(plan: Plan, strategy: str, out: Path, t0: float | None, *, check: bool) -> tuple[StrategyRecord, bool]:
    """:func:`measure`, and whether the strategy failed for a reason outside it (:func:`outside`)."""
    out.mkdir(parents=True, exist_ok=True)
    run = StrategyRun(plan, strategy, out, time.monotonic() if t0 is None else t0)
    failed_outside = False
    try:
        model = run.prepare()
        model = run.load(model)
        model = run.export(model)
        run.partition(model)
        run.build(model)
        run.stop_sampling()  # what follows is not part of the measured run
        del model  # the check does not need the loaded weights
        gc.collect()
        if check:
            run.check()
        run._set(status="ok")
    except Exception as exc:
        failed_outside = outside(exc, (run.workdir, out))
        if failed_outside or isinstance(exc, HarnessError):  # its reason is enough: no traceback
            print(f"error: {strategy}: {_one_line(exc)}", file=sys.stderr, flush=True)
        else:
            traceback.print_exc(file=sys.stderr)
        run._set(status="failed", error=f"{type(exc).__name__}: {exc}")
    return run.finish(), failed_outside


_FILE_SYSTEM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})
"""A file system that refused a write: no space left, over a quota, read-only, an I/O error."""

_GONE_ERRNOS = frozenset({errno.ENOENT, errno.ESTALE})
"""A file or directory that is no longer there."""


def _under(path: str | bytes | os.PathLike[str] | None, directories: Sequence[Path]) -> bool:
    if path is None:
        return False
    absolute = Path(os.path.abspath(os.fsdecode(path)))
    return any(absolute.is_relative_to(os.path.abspath(d)) for d in directories)


def outside(exc: BaseException, own: Sequence[Path] = ()) -> bool:
    """Whether ``exc`` is the machine's failure, not the strategy's: a file system that refused a write
    (:data:`_FILE_SYSTEM_ERRNOS`, also when the harness reports it as an
    :class:`~harness.errors.OutputError`), or a file or directory under ``own`` (the strategy's engine and
    results directories) removed under it; ``exc`` or any error it was raised from."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and (cause.errno in _FILE_SYSTEM_ERRNOS or (
                cause.errno in _GONE_ERRNOS and (_under(cause.filename, own) or _under(cause.filename2, own)))):
            return True
        cause = cause.__cause__
    return False


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def main(argv: list[str] | None = None) -> int:
    t0 = process_start_monotonic()
    parser = argparse.ArgumentParser(prog="python -m harness.worker", description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("strategy", choices=sorted(STRATEGIES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="build without checking the built model against eager (budget mode's constrained "
                             "attempts)")
    args = parser.parse_args(argv)
    sys.setswitchinterval(0.001)  # hand the GIL to the sampler thread often, so its interval holds
    try:
        record, failed_outside = _measure(read_plan(args.plan), args.strategy, args.out, t0, check=args.check)
    except Exception as exc:  # the record itself could not be written: tell the parent why, in one line
        if not (outside(exc) or isinstance(exc, HarnessError)):
            traceback.print_exc(file=sys.stderr)
        print("error: " + FAILURE_PREFIX + _one_line(exc), file=sys.stderr, flush=True)
        return 1
    if failed_outside:
        return OUTSIDE_STATUS
    return 0 if record.ok else 1


if __name__ == "__main__":
    sys.exit(main())
