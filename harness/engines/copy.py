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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.backends.columns import CopyColumns
from harness.catalog import is_gpu
from harness.engines.builder import BuildTarget, BuiltEngine, EngineBuilder
from harness.measure.coldcache import write_back_and_drop
from weightmap import TensorSpec, write_checkpoint

__all__ = ["ALIGN", "CopyToDevice", "CopyToFiles", "fault_in", "make_builder", "packed_layout"]


def fault_in(tensors: Iterable[torch.Tensor]) -> int:
    """Read one byte of every page of each CPU tensor's bytes; returns the pages touched.

    Only the bytes the tensor views are touched (not the rest of a storage it shares, which
    for some loaders is the whole file). Non-contiguous and non-CPU tensors are skipped:
    their copy faults their pages in itself.
    """
    page = mmap.PAGESIZE
    touched = 0
    sink = 0
    for t in tensors:
        if t.device.type != "cpu" or t.numel() == 0 or not t.is_contiguous():
            continue
        flat = t.detach().reshape(-1).view(torch.uint8)
        first = (-flat.data_ptr()) % page  # the first page boundary inside the tensor
        picks = flat[first::page]
        sink += int(picks.sum()) + int(flat[0]) + int(flat[-1])  # the first and last pages, whatever the offset
        touched += picks.numel() + 1
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


@dataclass
class CopyToDevice(EngineBuilder):
    """``copy`` on a GPU: each engine is one device buffer holding its partition's tensors.

    One allocation per engine, as an engine blob is, rather than one per tensor: the
    caching allocator rounds every allocation up (small tensors share 2 MiB segments,
    large ones are rounded to 2 MiB), which for pi0.5's 813 tensors added 0.22 GiB
    (2.5% of the model) of GPU memory that no engine needs. ``engines`` holds each
    engine's views into its buffer, by name.
    """

    device: str = "cuda"
    name: str = "copy"
    engines: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def build_engine(self, index: int, tensors: dict[str, torch.Tensor]) -> BuiltEngine:
        distinct = _distinct(tensors)
        started = time.perf_counter()
        fault_in(distinct.values())
        paged = time.perf_counter()
        offsets, size = packed_layout(distinct)
        buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        copies = {}
        for name, t in distinct.items():
            nbytes = t.numel() * t.element_size()
            view = buffer[offsets[name]: offsets[name] + nbytes].view(t.dtype).view(t.shape)
            view.copy_(t.detach())
            copies[name] = view
        if buffer.is_cuda:
            torch.cuda.synchronize(buffer.device)
        self.engines.append(copies)
        return BuiltEngine(nbytes=size, columns=(_split(started, paged),))

    def close(self) -> None:
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
