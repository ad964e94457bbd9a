"""The ``copy`` backend: engine builders that copy a partition's weights to where engines live.

Each engine is its partition's tensors copied

* on ``cuda``, into GPU memory (:class:`CopyToDevice`: one device buffer per engine);
* on ``cpu``, into a safetensors file per engine under the scenario's work directory
  (:class:`CopyToFiles`), written, flushed and dropped from the page cache, so that it stands
  for memory that is not the host's and host figures mean the same on both.

Both are :class:`~harness.engines.builder.EngineBuilder` s and split an engine's build in two,
timed apart (the ``pages_s`` and ``copy_s`` columns of its record): first every page of the
partition's weights is read once (:func:`fault_in`: one byte per page, which faults in what is
not resident and waits for the disk for what is not in the page cache), then the weights,
resident now, are copied and the engine flushed. The copy would fault the same pages in
itself; reading them first only separates waiting for pages from copying, and brings in no
page the copy would not (the partition's pages stay until its release, after the build,
either way).
"""

from __future__ import annotations

import mmap
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.backends.columns import CopyColumns
from harness.catalog import is_gpu
from harness.engines.builder import BuildTarget, BuiltEngine, Done, EngineBuilder
from harness.engines.staging import Copier, StagedPair, Stager
from harness.measure.coldcache import write_back_and_drop
from harness.units import MIB
from weightmap import TensorSpec, write_checkpoint

__all__ = ["ALIGN", "CopyToDevice", "CopyToFiles", "FAULT_CHUNK_BYTES", "fault_in", "make_builder", "packed_layout"]

FAULT_CHUNK_BYTES = 16 * MIB
"""Bytes of pages :func:`fault_in` touches between two calls of its ``between``."""

OVERLAP_BYTES = 0
""":attr:`CopyToDevice.overlap_bytes` by default: none of engine ``k + 1``'s pages are faulted in while engine
``k`` is copied. On pi0.5 (16 engines on an H100), ``map`` with the overlap unbounded built at 1.03x of the
model's read at the read ceiling, but its build-phase host peak was 1.80 GiB (results/pi05-h200-peers): the next
engine's pages came in beside the one being copied. With none (results/pi05-h200, another H100) it built at 1.09x,
its host peak 1.63 GiB, one engine and the pinned ring above the baseline. The copy through the pinned ring runs
at about four times a pageable copy's rate (``benchmarks/staged_copy.py``), which leaves the overlap little to
hide."""


def fault_in(tensors: Iterable[torch.Tensor], between: Callable[[], None] | None = None,
             chunk_bytes: int = FAULT_CHUNK_BYTES) -> int:
    """Read one byte of every page of each CPU tensor's bytes; returns the pages touched.

    Only the bytes the tensor views are touched (not the rest of a storage it shares, which
    for some loaders is the whole file). Non-contiguous and non-CPU tensors are skipped:
    their copy faults their pages in itself. ``between`` is called after every ``chunk_bytes``
    of a tensor's pages (a builder takes back a finished copy there, so that its pages are
    released while these come in).
    """
    page = mmap.PAGESIZE
    step = max(page, chunk_bytes // page * page)
    touched = 0
    sink = 0
    for t in tensors:
        if t.device.type != "cpu" or t.numel() == 0 or not t.is_contiguous():
            continue
        flat = t.detach().reshape(-1).view(torch.uint8)
        first = (-flat.data_ptr()) % page  # the first page boundary inside the tensor
        for start in range(first, max(first, flat.numel()), step):
            picks = flat[start: start + step: page]
            sink += int(picks.sum())
            touched += picks.numel()
            if between is not None:
                between()
        sink += int(flat[0]) + int(flat[-1])  # the first and last pages, whatever the offset
        touched += 1
    del sink
    return touched


def _distinct(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One name per tensor object (tied names would otherwise be copied twice)."""
    first: set[int] = set()
    out = {}
    for name, t in tensors.items():
        if id(t) not in first:
            first.add(id(t))
            out[name] = t
    return out


def _split(started: float, paged: float) -> CopyColumns:
    """The ``pages_s`` and ``copy_s`` columns of a build that faulted its pages in from ``started`` to ``paged``
    and copied them until now."""
    return CopyColumns(pages_s=round(paged - started, 6), copy_s=round(time.perf_counter() - paged, 6))


ALIGN = 256  # bytes; every tensor in an engine buffer starts on this boundary


def packed_layout(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, int], int]:
    """Offsets of each tensor in one engine buffer, each aligned to :data:`ALIGN`, and the total size."""
    offsets, size = {}, 0
    for name, t in tensors.items():
        offsets[name] = size
        size += -(-(t.numel() * t.element_size()) // ALIGN) * ALIGN
    return offsets, size


StagerFactory = Callable[[str], Stager]
"""Makes the staging ring of a device (:class:`harness.engines.pinned.PinnedRing` on a CUDA one)."""


def _pinned_ring(device: str) -> Stager:
    from harness.engines.pinned import PinnedRing  # CUDA's side, made only where there is a GPU

    return PinnedRing(device)


def _staged(t: torch.Tensor) -> bool:
    """Whether ``t`` is copied through the staging ring: its bytes are on the host, in one run (a tensor already
    on the device, or a non-contiguous one, is copied as it is, on the building thread)."""
    return t.device.type == "cpu" and t.is_contiguous() and t.numel() > 0


@dataclass
class CopyToDevice(EngineBuilder):
    """``copy`` on a GPU: each engine is one device buffer holding its partition's tensors.

    One allocation per engine, as an engine blob is, rather than one per tensor: the
    caching allocator rounds every allocation up (small tensors share 2 MiB segments,
    large ones are rounded to 2 MiB), which for pi0.5's 813 tensors added 0.22 GiB
    (2.5% of the model) of GPU memory that no engine needs. ``engines`` holds each
    engine's views into its buffer, by name.

    With ``staging`` (the default on a CUDA device: :class:`~harness.engines.pinned.PinnedRing`, two
    pinned host buffers of :data:`~harness.engines.staging.CHUNK_BYTES`), engine ``k``'s host tensors are
    copied by a :class:`~harness.engines.staging.Copier` on a thread of its own, through the ring, and
    :meth:`build` returns once it has handed them over. ``k``'s copy is taken back (``done(k)``: the
    worker releases ``k``'s weights then, never while they are copied) at the start of engine ``k + 1``'s
    build: before any of ``k + 1``'s pages are faulted in, or, with ``overlap_bytes``, once that many of
    them are (taken back earlier where it finished earlier, checked after every
    :data:`FAULT_CHUNK_BYTES`). Pages faulted in while ``k`` is still copied are held beside ``k``'s:
    ``overlap_bytes`` is how far the host peak may rise for the overlap, so the default,
    :data:`OVERLAP_BYTES`, is none (the disk still reads ahead meanwhile where prefetch asks it to: into
    the page cache, not into the process). One engine is in flight at a time; the last one is waited for by
    :meth:`finish`. Tensors already on the device, and non-contiguous ones, are copied on the building
    thread. Without ``staging`` (another device), every tensor is copied on the building thread and the
    build returns with its engine copied.

    The two columns: ``pages_s``, waiting for the previous engine's copy (by default; with
    ``overlap_bytes`` it runs meanwhile), then faulting the partition's pages in; ``copy_s``, the
    building thread's time after that until the build returns: waiting for an overlapping previous
    copy to finish, allocating, copying what is not staged and handing the rest to the copier (without
    staging, the whole copy). The part of a staged copy that overlaps the
    next engine's pages is in neither; the last engine's wait is in the build phase, after its record.
    """

    device: str = "cuda"
    name: str = "copy"
    engines: list[dict[str, torch.Tensor]] = field(default_factory=list)
    staging: StagerFactory | None = None
    overlap_bytes: int = OVERLAP_BYTES

    def __post_init__(self) -> None:
        if self.staging is None and is_gpu(self.device):
            self.staging = _pinned_ring
        self._copier: Copier | None = None

    def build_engine(self, index: int, tensors: dict[str, torch.Tensor]) -> BuiltEngine:
        """Engine ``index`` copied before it returns (what :meth:`build` does, with ``done`` ignored and the copy
        waited for)."""
        built = self.build(index, tensors, lambda i: None)
        self.finish(lambda i: None)
        return built

    def build(self, index: int, tensors: dict[str, torch.Tensor], done: Done) -> BuiltEngine:
        distinct = _distinct(tensors)
        copier = self._copier_for()
        started = time.perf_counter()
        if self.overlap_bytes <= 0:
            self.finish(done)  # the previous engine: copied and released before this one's pages come in
        fault_in(distinct.values(), between=None if copier is None else self._overlapping(done))
        paged = time.perf_counter()
        self.finish(done)  # the previous engine: copied and released before this one's copy starts
        offsets, size = packed_layout(distinct)
        buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        copies, staged = {}, []
        for name, t in distinct.items():
            nbytes = t.numel() * t.element_size()
            span = buffer[offsets[name]: offsets[name] + nbytes]
            view = span.view(t.dtype).view(t.shape)
            if copier is not None and _staged(t):
                staged.append(StagedPair(name, t.detach().reshape(-1).view(torch.uint8), span))
            else:
                view.copy_(t.detach())
            copies[name] = view
        if buffer.is_cuda:  # what was copied here (the staged copies run on a stream of their own)
            torch.cuda.current_stream(buffer.device).synchronize()
        self.engines.append(copies)
        if copier is not None and staged:
            copier.submit(index, staged)
        else:
            done(index)
        return BuiltEngine(nbytes=size, columns=(_split(started, paged),))

    def finish(self, done: Done) -> None:
        """Wait for the engine in flight on the copier, if any, and report it ``done``; a failed copy raises
        :class:`~harness.engines.staging.CopyFailed` naming the engine and the tensor."""
        if self._copier is not None:
            finished = self._copier.wait()
            if finished is not None:
                done(finished)

    def _overlapping(self, done: Done) -> Callable[[], None]:
        """What :func:`fault_in` calls after each chunk of this engine's pages: take back the previous engine's
        copy if it is finished, and wait for it once more than ``overlap_bytes`` of these pages are in."""
        allowed, seen = self.overlap_bytes // FAULT_CHUNK_BYTES, 0

        def between() -> None:
            nonlocal seen
            seen += 1
            if seen > allowed:
                self.finish(done)
            else:
                self._take(done)
        return between

    def _take(self, done: Done) -> None:
        """Report the engine in flight ``done`` if its copy is finished (called while pages come in)."""
        if self._copier is not None:
            finished = self._copier.poll()
            if finished is not None:
                done(finished)

    @property
    def copier(self) -> Copier | None:
        """The copier of the staged copies (None: none made yet, or no staging)."""
        return self._copier

    def _copier_for(self) -> Copier | None:
        if self.staging is None:
            return None
        if self._copier is None:
            self._copier = Copier(self.staging(self.device), self.device)
        return self._copier

    def close(self) -> None:
        """Stop the copier (its thread joined, its ring freed), then free the engines."""
        copier, self._copier = self._copier, None
        try:
            if copier is not None:
                copier.close()
        finally:
            self.engines.clear()


@dataclass
class CopyToFiles(EngineBuilder):
    """``copy`` without a GPU: each engine is a file (``workdir/engine-NNN.safetensors``), written and
    dropped from host memory; :meth:`close` removes ``workdir``."""

    workdir: Path
    device: str = "cpu"
    name: str = "copy"

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)

    def build_engine(self, index: int, tensors: dict[str, torch.Tensor]) -> BuiltEngine:
        distinct = _distinct(tensors)
        started = time.perf_counter()
        fault_in(distinct.values())
        paged = time.perf_counter()
        path = self.workdir / f"engine-{index:03d}.safetensors"
        specs = [TensorSpec(n, t.dtype, tuple(t.shape)) for n, t in distinct.items()]
        header = write_checkpoint(path, specs, lambda spec: distinct[spec.name].detach())
        write_back_and_drop(path)
        columns = _split(started, paged)
        return BuiltEngine(nbytes=sum(e.nbytes for e in header.tensors.values()), artifact=path, columns=(columns,))

    def close(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


def make_builder(plan: BuildTarget, workdir: Path) -> EngineBuilder:
    """The ``copy`` backend's builder for ``plan``: into GPU memory on a GPU, else into files under ``workdir``."""
    return CopyToDevice() if is_gpu(plan.device) else CopyToFiles(workdir)
