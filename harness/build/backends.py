"""Engine builders: what "building an engine" does with a partition's weights.

``copy`` is the portable builder. Each engine is its partition's tensors
copied to where engines live:

* on ``cuda``, GPU memory (a pageable host-to-device copy per tensor);
* on ``cpu``, a safetensors file per engine under the scenario's work
  directory, written, flushed and dropped from the page cache, so that it
  stands for memory that is not the host's and host figures mean the same on
  both. The built model maps the engine files back.

The built model is a module that runs the original model's forward with
every tensor taken from the engines, so its output can be checked against the
eager model.

``inductor`` is a real compiler (:mod:`harness.build.compile`): the worker exports the loaded
model, cuts its graph into partitions and builds each with AOTInductor
(:class:`harness.build.compile.backend.CompilerBackend`), made by :func:`make_compiler_backend`.

Both copy builders split an engine's build in two, timed apart (:class:`BuildSplit`,
``last_split``): first every page of the partition's weights is read once
(:func:`fault_in`: one byte per page, which faults in what is not resident and waits
for the disk for what is not in the page cache), then the weights, resident now, are
copied and the engine flushed. The copy would fault the same pages in itself; reading
them first only separates waiting for pages from copying, and brings in no page the
copy would not (the partition's pages stay until its release, after the build, either
way).

``tensorrt`` is only available where ``torch_tensorrt`` imports; asking for it
elsewhere fails fast, before anything runs.
"""

from __future__ import annotations

import mmap
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from harness.errors import HarnessError
from weightmap.format import TensorSpec, write_checkpoint

if TYPE_CHECKING:
    from harness.build.compile.backend import CompilerBackend


class BackendUnavailable(HarnessError, RuntimeError):
    """The scenario asks for a backend or device this machine cannot provide."""


@dataclass(frozen=True)
class BuildSplit:
    """One engine's build, timed in two parts: ``pages_s`` reading every page of its weights
    once (:func:`fault_in`), ``copy_s`` copying them to the engine and flushing it."""

    pages_s: float
    copy_s: float


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


class Backend(Protocol):
    """Builds engines one at a time and assembles the built model."""

    name: str
    device: str

    def build_engine(self, index: int, tensors: dict[str, torch.Tensor]) -> int:
        """Build engine ``index`` (engines come in build order) from the tensors it reads; returns its bytes."""
        ...

    def built_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """A runnable module whose every tensor comes from the engines."""
        ...

    def close(self) -> None:
        """Free the engines (GPU memory, files)."""
        ...


class BuiltModel(torch.nn.Module):
    """The original module's forward, with its tensors taken from the engines."""

    def __init__(self, model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.engine_tensors = tensors

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return torch.func.functional_call(self.model, self.engine_tensors, args, kwargs, tie_weights=False)


def _distinct(tensors: dict[str, torch.Tensor], aliases: dict[str, str]) -> dict[str, torch.Tensor]:
    """One name per tensor object (tied names would otherwise be copied twice).

    Every other name of an object already taken is recorded in ``aliases`` (name -> kept name).
    """
    first: dict[int, str] = {}
    out = {}
    for name, t in tensors.items():
        if id(t) in first:
            aliases[name] = first[id(t)]
        else:
            first[id(t)] = name
            out[name] = t
    return out


def _built(model: torch.nn.Module, parts: list[dict[str, torch.Tensor]], aliases: dict[str, str]) -> BuiltModel:
    merged = {k: v for part in parts for k, v in part.items()}
    merged.update({alias: merged[name] for alias, name in aliases.items()})
    return BuiltModel(model, merged)


ALIGN = 256  # bytes; every tensor in an engine buffer starts on this boundary


def packed_layout(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, int], int]:
    """Offsets of each tensor in one engine buffer, each aligned to :data:`ALIGN`, and the total size."""
    offsets, size = {}, 0
    for name, t in tensors.items():
        offsets[name] = size
        size += -(-(t.numel() * t.element_size()) // ALIGN) * ALIGN
    return offsets, size


@dataclass
class CopyToDevice:
    """``copy`` on a GPU: each engine is one device buffer holding its partition's tensors.

    One allocation per engine, as an engine blob is, rather than one per tensor: the
    caching allocator rounds every allocation up (small tensors share 2 MiB segments,
    large ones are rounded to 2 MiB), which for pi0.5's 813 tensors added 0.22 GiB
    (2.5% of the model) of GPU memory that no engine needs.
    """

    device: str = "cuda"
    name: str = "copy"
    engines: list[dict[str, torch.Tensor]] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    last_split: BuildSplit | None = None

    def build_engine(self, index: int, tensors: dict[str, torch.Tensor]) -> int:
        distinct = _distinct(tensors, self.aliases)
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
        self.last_split = BuildSplit(paged - started, time.perf_counter() - paged)
        return size

    def built_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return _built(model, self.engines, self.aliases)

    def close(self) -> None:
        self.engines.clear()


def _drop_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@dataclass
class CopyToFiles:
    """``copy`` without a GPU: each engine is a file, written and dropped from host memory."""

    workdir: Path
    device: str = "cpu"
    name: str = "copy"
    files: list[Path] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    last_split: BuildSplit | None = None

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)

    def build_engine(self, index: int, tensors: dict[str, torch.Tensor]) -> int:
        distinct = _distinct(tensors, self.aliases)
        started = time.perf_counter()
        fault_in(distinct.values())
        paged = time.perf_counter()
        path = self.workdir / f"engine-{index:03d}.safetensors"
        specs = [TensorSpec(n, t.dtype, tuple(t.shape)) for n, t in distinct.items()]
        header = write_checkpoint(path, specs, lambda spec: distinct[spec.name].detach())
        _drop_from_page_cache(path)
        self.files.append(path)
        self.last_split = BuildSplit(paged - started, time.perf_counter() - paged)
        return sum(e.nbytes for e in header.tensors.values())

    def built_model(self, model: torch.nn.Module) -> torch.nn.Module:
        from safetensors.torch import load_file

        return _built(model, [load_file(str(path)) for path in self.files], self.aliases)

    def close(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.files.clear()


def tensorrt_available() -> tuple[bool, str]:
    """Whether ``torch_tensorrt`` imports here, and why not."""
    try:
        import torch_tensorrt  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything
        return False, f"torch_tensorrt is not importable here ({type(exc).__name__}: {exc})"
    return True, ""


def inductor_available() -> tuple[bool, str]:
    """Whether AOTInductor can build here: ``torch._inductor`` imports, and its C++ compiler exists and links
    engines that load (see :mod:`harness.build.compile.toolchain`)."""
    try:
        import torch._inductor  # noqa: F401

        from harness.build.compile.toolchain import ToolchainError, check_toolchain, inductor_cxx
    except Exception as exc:
        return False, f"torch._inductor is not importable ({type(exc).__name__}: {exc})"
    try:
        cxx = inductor_cxx()
    except Exception as exc:  # torch's InvalidCxxCompiler: none of its candidates runs
        return False, f"no C++ compiler found (g++ or $CXX; {type(exc).__name__})"
    try:
        check_toolchain(cxx)
    except ToolchainError as exc:
        return False, str(exc)
    return True, ""


def check_backend(name: str) -> None:
    """Fail fast, before any strategy runs, when the backend cannot run here."""
    if name == "copy":
        return
    if name == "inductor":
        ok, why = inductor_available()
        if not ok:
            raise BackendUnavailable(f"backend 'inductor' needs AOTInductor: {why}")
        return
    if name == "tensorrt":
        ok, why = tensorrt_available()
        if not ok:
            raise BackendUnavailable(
                f"backend 'tensorrt' needs Torch-TensorRT: {why}. Use backend = \"copy\", "
                "or run on a machine where torch_tensorrt is installed."
            )
        raise BackendUnavailable(
            "backend 'tensorrt': torch_tensorrt imports here, but building engines with it is not "
            "implemented in this version of the harness; use backend = \"copy\"."
        )
    raise BackendUnavailable(f"unknown backend {name!r}: expected 'copy', 'inductor' or 'tensorrt'")


def resolve_device(device: str) -> str:
    """``auto`` is ``cuda`` when a GPU is usable, else ``cpu``."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable("device = \"cuda\" was asked for, but torch sees no CUDA device here")
    return device


def make_backend(name: str, device: str, workdir: Path) -> Backend:
    """The engine builder of the ``copy`` backend for a (resolved) device.

    Compiler backends (``inductor``) are made by :func:`make_compiler_backend`.
    """
    check_backend(name)
    if name != "copy":
        raise BackendUnavailable(f"backend {name!r} is a compiler backend: use make_compiler_backend")
    if device == "cuda":
        return CopyToDevice()
    return CopyToFiles(workdir)


def make_compiler_backend(name: str, device: str, workdir: Path, *, weights: str, count: int | None = None,
                          cap_bytes: int | None = None) -> CompilerBackend:
    """The compiler backend ``name`` on ``device``: engines with ``weights`` ("mapped" or "packaged"),
    partitions by ``count`` or ``cap_bytes``.

    A TensorRT builder would be a second :class:`~harness.build.compile.pipeline.EngineCompiler`
    made here; today ``tensorrt`` fails in :func:`check_backend`.
    """
    from harness.build.compile.backend import CompilerBackend, PartitionRule
    from harness.build.compile.inductor import InductorCompiler

    check_backend(name)
    if name != "inductor":
        raise BackendUnavailable(f"backend {name!r} builds no compiled engines here")
    if weights not in ("mapped", "packaged"):
        raise BackendUnavailable(f"backend 'inductor': weights must be 'mapped' or 'packaged', not {weights!r}")
    compiler = InductorCompiler(weights=weights, device=device)  # type: ignore[arg-type]
    return CompilerBackend(compiler, workdir, PartitionRule(count=count, cap_bytes=cap_bytes))
