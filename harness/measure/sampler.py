"""A thread that samples host and GPU memory at a fixed interval, with marks for transitions.

Each sample (a row) holds, in :attr:`Sampler.COLUMNS` order: the time since ``t0`` in
seconds; the process's RSS and its anonymous and file-backed parts (``/proc/self/status``);
the page-cache residency of the given files; the GPU's device-wide use above a baseline
(NVML) and torch's reserved CUDA memory; the current engine index and phase label. Figures
are bytes.

The loop is built to stay cheap while multi-GB models load: one ``pread`` of
``/proc/self/status`` into a preallocated buffer, one residency call, appends of ints to
``array`` columns (no per-row objects are kept). A Python thread needs the GIL between
reads, so samples can arrive late while another thread holds it: :attr:`Sampler.stats`
reports the intervals achieved, and the kernel's high-water mark (:class:`PeakTracker`,
re-exported here) is the exact check on any peak the samples missed.

A sample costs microseconds without files (status read, appends) and adds the residency call
with files (see :mod:`harness.measure.residency`). The intervals hold while the other threads
wait on the kernel; against a thread running Python they stretch by up to
``sys.getswitchinterval()``, and a call that keeps the GIL throughout (torch's CUDA
initialisation, say) leaves one gap as long as the call.
"""

from __future__ import annotations

import csv
import enum
import io
import threading
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.fileio.atomic import write_atomic
from harness.measure.gpu import GpuMonitor, torch_reserved_bytes
from harness.measure.procfs import PeakTracker, StatusReader
from harness.measure.residency import FileResidency
from harness.results.samples import SAMPLE_COLUMNS

__all__ = ["PeakTracker", "Sampler", "SamplerStats"]

_EMPTY = -(2**63)  # an empty cell in an int64 column


class _Unset(enum.Enum):
    UNSET = enum.auto()


_UNSET = _Unset.UNSET

Row = tuple[float, int, int, int, int | None, int | None, int | None, int, str | None]


@dataclass(frozen=True)
class SamplerStats:
    """How regularly the background thread sampled.

    ``samples`` counts every row (background, ``start``/``stop``, ``mark``, ``sample_now``).
    ``mean_interval_ms`` and ``max_gap_ms`` are over the background thread's samples, starting
    from the sample that ``start`` takes: what the thread achieved against its interval.
    Both are 0.0 until the thread has sampled once.
    """

    samples: int
    mean_interval_ms: float
    max_gap_ms: float  # largest gap between consecutive samples


class Sampler:
    """Samples memory on a daemon thread every ``interval_s`` seconds between ``start`` and ``stop``.

    ``files``: checkpoint files whose page-cache residency is recorded (``resident_bytes``;
    empty cells when there are none). Residency is read on every ``residency_every``-th
    background sample and by ``mark`` and ``sample_now``, and carried forward in between;
    ``start`` and ``stop`` always read it. ``residency_budget`` bounds what reading it may
    cost: its cost grows with the file's cached pages (milliseconds per GiB cached), and read
    at every sample it would take a core from the run it measures. After a read that took
    ``d`` seconds, none is made for ``d / residency_budget`` seconds (default 0.05: at most 5%
    of one core), so a large cached file is read less often rather than slowing the run.
    ``gpu``: a :class:`GpuMonitor`, or None for no GPU columns (empty cells, not zeros).
    ``t0``: the ``time.monotonic()`` origin of ``t_s``,
    e.g. the process's start; default: construction time.

    ``gpu_used_bytes`` is NVML ``used`` minus a baseline: ``used`` at ``start`` until
    :meth:`rebase_gpu` is called (after the CUDA context exists), ``used`` at that call from
    then on. Rows already taken keep the baseline they were taken with.
    ``gpu_reserved_bytes`` is ``torch.cuda.memory_reserved`` of the monitor's device, empty
    until the process initialises CUDA.

    Thread-safety: ``mark``, ``sample_now``, ``rebase_gpu``, ``rows``, ``stats`` and
    ``write_csv`` may be called from any thread while the sampler runs; a lock serialises
    samples. ``interval_s`` must be positive and at most ``threading.TIMEOUT_MAX`` (``ValueError``
    here, not a failure of the thread later; a scenario's ``sample_interval_ms`` is bounded far
    below, :data:`harness.scenario_rules.LIMITS`). A sampler runs once: ``start`` after ``stop`` raises
    ``RuntimeError``. If the
    background thread fails (a reader raised), sampling stops, the rows taken so far are
    kept, and ``stop`` raises ``RuntimeError`` from that error.
    """

    COLUMNS = SAMPLE_COLUMNS

    def __init__(
        self,
        *,
        interval_s: float = 0.01,
        files: Sequence[Path] = (),
        gpu: GpuMonitor | None = None,
        t0: float | None = None,
        residency_every: int = 1,
        residency_budget: float = 0.05,
    ) -> None:
        if not 0 < residency_budget <= 1:
            raise ValueError(f"residency_budget must be in (0, 1], got {residency_budget}")
        if not 0 < interval_s <= threading.TIMEOUT_MAX:  # the thread waits this long: a wait must accept it
            raise ValueError(f"interval_s must be positive and at most {threading.TIMEOUT_MAX:g} s, got {interval_s}")
        if residency_every < 1:
            raise ValueError(f"residency_every must be at least 1, got {residency_every}")
        self.interval_s = float(interval_s)
        self.files = tuple(Path(f) for f in files)
        self.gpu = gpu
        self.t0 = time.monotonic() if t0 is None else float(t0)
        self.residency_every = int(residency_every)
        self.residency_budget = float(residency_budget)
        self.residency_reads = 0
        self.residency_s = 0.0
        self._residency_next = 0.0  # monotonic time before which residency is not read again

        self._status = StatusReader()
        self._residency: FileResidency | None = None
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._error: BaseException | None = None

        self._engine = -1
        self._phase = -1
        self._phase_labels: list[str] = []
        self._phase_ids: dict[str, int] = {}
        self._resident_last = _EMPTY
        self._gpu_baseline = 0
        self._background = 0

        self._t = array("d")
        self._rss = array("q")
        self._anon = array("q")
        self._file = array("q")
        self._resident = array("q")
        self._gpu_used = array("q")
        self._gpu_reserved = array("q")
        self._engines = array("q")
        self._phases = array("q")
        self._background_t = array("d")  # times of the thread's own samples, and start's

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Open the residency readers, take the GPU baseline and one sample on the calling
        thread, then start the daemon thread. Raises ``RuntimeError`` if already started."""
        if self._thread is not None or self._stopped:
            raise RuntimeError("Sampler.start() called twice")
        if self.files:
            self._residency = FileResidency(self.files)
        try:
            with self._lock:
                if self.gpu is not None:
                    self._gpu_baseline = self.gpu.used_bytes()
                t = self._sample_locked(read_residency=True)
                self._background_t.append(t)
        except BaseException:
            if self._residency is not None:
                self._residency.close()
            raise
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> SamplerStats:
        """Stop and join the thread, take a final sample, release the residency readers and
        return :attr:`stats`. Raises ``RuntimeError`` if the thread had failed or the sampler
        never started."""
        if self._thread is None:
            raise RuntimeError("Sampler.stop() before start()")
        if self._stopped:
            return self.stats
        self._stop_event.set()
        self._thread.join()
        try:
            if self._error is None:
                with self._lock:
                    self._sample_locked(read_residency=True)
        finally:
            self._stopped = True
            if self._residency is not None:
                self._residency.close()
            self._status.close()
        if self._error is not None:
            raise RuntimeError(f"the sampler thread failed: {self._error!r}") from self._error
        return self.stats

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._thread is not None and not self._stopped

    # -- marks and explicit samples ------------------------------------------------------

    def mark(self, *, engine: int | None | _Unset = _UNSET, phase: str | None | _Unset = _UNSET) -> None:
        """Set the current engine index and/or phase label, and sample at once if running.

        An argument left out keeps its current value; ``None`` clears it (engine -1, empty
        phase). The sample is taken on the calling thread with the new labels, so every
        transition has a row at its exact time. Before ``start`` and after ``stop`` only the
        labels change.
        """
        with self._lock:
            if engine is not _UNSET:
                self._engine = -1 if engine is None else int(engine)
            if phase is not _UNSET:
                self._phase = -1 if phase is None else self._phase_id(phase)
            if self.running:
                self._sample_locked(read_residency=self._residency_due())

    def sample_now(self) -> None:
        """Take one sample on the calling thread (residency included). Requires ``start``."""
        if not self.running:
            raise RuntimeError("Sampler.sample_now() outside start()/stop()")
        with self._lock:
            self._sample_locked(read_residency=self._residency_due())

    def rebase_gpu(self) -> None:
        """Make NVML ``used`` now the zero of ``gpu_used_bytes`` for later rows. No-op without
        a GPU monitor."""
        if self.gpu is None:
            return
        with self._lock:
            self._gpu_baseline = self.gpu.used_bytes()

    @property
    def gpu_baseline_bytes(self) -> int | None:
        """NVML ``used`` subtracted from later rows; None without a GPU monitor."""
        return None if self.gpu is None else self._gpu_baseline

    # -- results -------------------------------------------------------------------------

    def rows(self) -> list[Row]:
        """All rows so far, in :attr:`COLUMNS` order; None for an empty cell."""
        with self._lock:
            n = len(self._t)
            labels = list(self._phase_labels)
            columns = (self._rss, self._anon, self._file, self._resident, self._gpu_used, self._gpu_reserved)
            rss, anon, file_, resident, gpu_used, gpu_reserved = (c[:n] for c in columns)
            t, engines, phases = self._t[:n], self._engines[:n], self._phases[:n]

        def cell(value: int) -> int | None:
            return None if value == _EMPTY else value

        return [
            (
                t[i],
                rss[i],
                anon[i],
                file_[i],
                cell(resident[i]),
                cell(gpu_used[i]),
                cell(gpu_reserved[i]),
                engines[i],
                labels[phases[i]] if phases[i] >= 0 else None,
            )
            for i in range(n)
        ]

    def write_csv(self, path: Path) -> int:
        """Write the rows to ``path`` (atomically) with a header of :attr:`COLUMNS`; empty cells stay empty.

        Returns how many rows it wrote (the record states it, so that a reader can tell a file cut at a
        row's end from a whole one)."""
        rows = self.rows()
        text = io.StringIO(newline="")
        writer = csv.writer(text)
        writer.writerow(self.COLUMNS)
        writer.writerows(rows)  # csv writes None as an empty cell
        write_atomic(path, text.getvalue())
        return len(rows)

    def columns(self) -> dict[str, np.ndarray]:
        """The numeric columns so far as float64 arrays (NaN for an empty cell), by column name."""
        with self._lock:
            n = len(self._t)
            t = np.frombuffer(self._t, dtype=np.float64)[:n].copy()
            ints = {
                "rss_bytes": self._rss, "anon_bytes": self._anon, "file_bytes": self._file,
                "resident_bytes": self._resident, "gpu_used_bytes": self._gpu_used,
                "gpu_reserved_bytes": self._gpu_reserved, "engine": self._engines,
            }
            raw = {name: np.frombuffer(column, dtype=np.int64)[:n].copy() for name, column in ints.items()}
        out = {"t_s": t}
        for name, values in raw.items():
            floats = values.astype(np.float64)
            floats[values == _EMPTY] = np.nan
            out[name] = floats
        return out

    @property
    def stats(self) -> SamplerStats:
        """Sample count and the background thread's achieved intervals (see :class:`SamplerStats`)."""
        with self._lock:
            samples = len(self._t)
            times = np.frombuffer(self._background_t, dtype=np.float64).copy()
        if times.size < 2:
            return SamplerStats(samples=samples, mean_interval_ms=0.0, max_gap_ms=0.0)
        gaps = np.diff(times) * 1e3
        return SamplerStats(
            samples=samples, mean_interval_ms=float(gaps.mean()), max_gap_ms=float(gaps.max())
        )

    # -- internals -----------------------------------------------------------------------

    def _residency_due(self) -> bool:
        """Whether reading residency now stays within ``residency_budget`` (see the class)."""
        return time.monotonic() >= self._residency_next

    def _phase_id(self, label: str) -> int:
        ident = self._phase_ids.get(label)
        if ident is None:
            ident = self._phase_ids[label] = len(self._phase_labels)
            self._phase_labels.append(str(label))
        return ident

    def _sample_locked(self, *, read_residency: bool) -> float:
        """Take one sample; the caller holds the lock. Returns its ``time.monotonic()``."""
        now = time.monotonic()
        status = self._status.read()
        if self._residency is not None and read_residency:
            self._resident_last = self._residency.resident_bytes()
            cost = time.monotonic() - now
            self.residency_reads += 1
            self.residency_s += cost
            self._residency_next = now + cost / self.residency_budget
        gpu = self.gpu
        if gpu is None:
            used = reserved = _EMPTY
        else:
            used = gpu.used_bytes() - self._gpu_baseline
            torch_reserved = torch_reserved_bytes(gpu.device_index)
            reserved = _EMPTY if torch_reserved is None else torch_reserved
        self._t.append(now - self.t0)
        self._rss.append(status.rss_bytes)
        self._anon.append(status.anon_bytes)
        self._file.append(status.file_bytes)
        self._resident.append(self._resident_last)
        self._gpu_used.append(used)
        self._gpu_reserved.append(reserved)
        self._engines.append(self._engine)
        self._phases.append(self._phase)
        return now

    def _run(self) -> None:
        interval = self.interval_s
        every = self.residency_every
        deadline = self._background_t[0] + interval
        try:
            while True:
                delay = deadline - time.monotonic()
                if delay > 0 and self._stop_event.wait(delay):
                    return
                if self._stop_event.is_set():
                    return
                with self._lock:
                    self._background += 1
                    t = self._sample_locked(read_residency=self._background % every == 0 and self._residency_due())
                    self._background_t.append(t)
                deadline += interval
                if deadline <= t:  # fell behind (GIL, a slow read): resume the cadence from now
                    deadline = t + interval
        except BaseException as exc:  # surfaced by stop()
            self._error = exc
