"""Checkpoints for the benchmark: seeded random values with the model's exact layout.

For memory measurements the values do not matter, the bytes do: a checkpoint holds
one tensor per persistent tensor object of the model (a tied group once, under its
first state-dict name, as ``safetensors.torch.save_model`` does), filled with seeded
random values, plus metadata that identifies it::

    {"format": "pt", "generator": "weightmap-harness", "values": "2", "seed": "<seed>"}

``format`` is what safetensors' own writer puts there (``"pt"``: a PyTorch checkpoint), and what
readers check (InstantTensor refuses a file whose ``format`` is another); ``values`` is this module's
own version of how the values are drawn.

:func:`ensure_checkpoint` reuses a file whose header (never its name) matches the
model and seed, and otherwise writes a new one with
:func:`weightmap.write_checkpoint`, one tensor in memory at a time.

Values (version "2"; files of version "1", whose chunks ignored the upper bits of the
seed, are regenerated, as are files that carried the version under ``format``): each
tensor is split into chunks of :data:`CHUNK_ELEMENTS`
elements, and chunk ``i`` is drawn from its own ``torch.Generator`` seeded from the
scenario seed, ``zlib.crc32`` of the tensor name and ``i`` (mixed, then folded to the
32 bits torch's CPU generator actually uses). So the values do not
depend on the number of worker threads, and chunks are filled in parallel:
floating tensors ``normal(0, 0.02)`` (drawn in float32 and rounded for dtypes with
fewer bits), integers uniform in [-8, 8) (unsigned: [0, 16)), bools fair coin flips.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import psutil
import torch
from torch import nn

from harness.errors import HarnessError
from harness.progress import byte_bar
from harness.scenario import checkpoint_path_problem, default_checkpoint_for
from harness.units import GIB, MIB
from weightmap import TensorSpec, read_header, write_checkpoint

if TYPE_CHECKING:
    from harness.scenario import Scenario

__all__ = [
    "CHUNK_ELEMENTS",
    "GENERATOR",
    "CheckpointError",
    "SeededFill",
    "checkpoint_matches",
    "checkpoint_metadata",
    "checkpoint_specs",
    "check_room",
    "default_checkpoint_path",
    "describe_specs",
    "ensure_checkpoint",
    "file_bytes",
    "tied_aliases",
]

GENERATOR = "weightmap-harness"
"""``generator`` metadata value: files with it are ours to replace."""

FORMAT = "pt"
"""``format`` metadata value: safetensors' own for a PyTorch checkpoint."""

VALUES = "2"
"""``values`` metadata value; change it whenever the generated values change."""

CHUNK_ELEMENTS = 1 << 22
"""Elements per independently seeded chunk (16 MiB of float32 scratch per worker)."""

_STD = 0.02
_DIRECT_NORMAL = (torch.float32, torch.float64)
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


class CheckpointError(HarnessError, RuntimeError):
    """A checkpoint cannot be used or written as asked (a directory, someone else's file, a missing file)."""


def checkpoint_metadata(seed: int) -> dict[str, str]:
    """The metadata a generated checkpoint carries."""
    return {"format": FORMAT, "generator": GENERATOR, "values": VALUES, "seed": str(seed)}


def default_checkpoint_path(scenario: Scenario) -> Path:
    """``<root>/data/<model key>.safetensors``: where a scenario's checkpoint goes unless it names one.

    The model key differs whenever the model's tensors do (trimmed vs. untrimmed,
    another synthetic size), so differing models never share a default file.
    """
    return default_checkpoint_for(scenario.model)


def checkpoint_specs(module: nn.Module) -> list[TensorSpec]:
    """One :class:`TensorSpec` per persistent tensor object of ``module``, in state-dict order.

    A tied group (one object under several names) appears once, under its first name.
    """
    seen: set[int] = set()
    specs = []
    for name, tensor in module.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        specs.append(TensorSpec(name, tensor.dtype, tuple(tensor.shape)))
    return specs


def tied_aliases(module: nn.Module) -> dict[str, str]:
    """``{alias: name in the checkpoint}`` for every state-dict name a checkpoint leaves out.

    Loading a generated checkpoint with ``load_state_dict`` reports these names as
    missing; they are the same objects as the names they map to.
    """
    first: dict[int, str] = {}
    aliases = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        owner = first.setdefault(id(tensor), name)
        if owner != name:
            aliases[name] = owner
    return aliases


def checkpoint_matches(path: str | os.PathLike[str], specs: Sequence[TensorSpec], seed: int) -> bool:
    """True when ``path`` is a valid safetensors file generated for exactly ``specs`` and ``seed``.

    Reads only the header: the same names, and for each the same dtype and shape,
    and metadata with this module's ``format``, ``generator``, ``values`` and ``seed`` (other
    metadata keys are ignored). A missing, unreadable or corrupt file gives False.
    """
    try:
        header = read_header(path)
    except (OSError, ValueError):
        return False
    if len(header.tensors) != len(specs):
        return False
    for spec in specs:
        entry = header.tensors.get(spec.name)
        if entry is None or entry.dtype != spec.dtype or tuple(entry.shape) != tuple(spec.shape):
            return False
    metadata = header.metadata or {}
    return all(metadata.get(key) == value for key, value in checkpoint_metadata(seed).items())


def _mix64(value: int) -> int:
    """A 64-bit finaliser (splitmix64): every input bit affects every output bit."""
    value = (value + _GOLDEN) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def _chunk_seed(seed: int, name: str, chunk: int) -> int:
    """The generator seed of one chunk, folded to 32 bits (torch's CPU generator uses only those)."""
    mixed = _mix64(_mix64(_mix64(seed & _MASK64) ^ zlib.crc32(name.encode("utf-8"))) ^ chunk)
    return (mixed ^ (mixed >> 32)) & 0xFFFFFFFF


class SeededFill:
    """``fill`` for :func:`write_checkpoint`: a CPU tensor of seeded random values per spec.

    Chunks of one tensor are filled by a pool of ``workers`` threads (default: the
    CPUs this process may use); torch releases the GIL while it draws. Values depend
    only on the seed, the tensor's name, dtype and shape (see the module docstring).

    ``reuse_buffer=False`` (default): each call returns a new tensor.
    ``reuse_buffer=True``: each call returns a view of one buffer that this object
    keeps (grown to the largest tensor asked for, or :meth:`reserve`-d up front) and
    overwrites on the next call. Faulting in fresh pages for every tensor costs about
    a third of the fill time; reuse avoids it. Only for a consumer that is done with
    each tensor before asking for the next, as :func:`write_checkpoint` is.

    Memory: one tensor (or the buffer) plus a float32 chunk of scratch per worker.
    Use as a context manager (or call :meth:`close`) to stop the threads and free
    the buffer.
    """

    def __init__(self, seed: int, workers: int | None = None, *, reuse_buffer: bool = False) -> None:
        self.seed = seed
        if workers is None:
            workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        self.workers = max(1, workers or 1)
        self.reuse_buffer = reuse_buffer
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="fill") if self.workers > 1 else None
        self._scratch = threading.local()
        self._buffer: torch.Tensor | None = None

    def __enter__(self) -> SeededFill:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker threads and free the reused buffer."""
        self._buffer = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def reserve(self, nbytes: int) -> None:
        """With ``reuse_buffer``, allocate the buffer for ``nbytes`` now (no-op otherwise)."""
        if self.reuse_buffer and (self._buffer is None or self._buffer.numel() < nbytes):
            self._buffer = None  # free the old one before allocating the new one
            self._buffer = torch.empty(nbytes, dtype=torch.uint8)

    def _empty(self, spec: TensorSpec) -> torch.Tensor:
        nbytes = _nbytes(spec)
        if not self.reuse_buffer or nbytes == 0:
            return torch.empty(spec.shape, dtype=spec.dtype)
        self.reserve(nbytes)
        assert self._buffer is not None
        return self._buffer[:nbytes].view(spec.dtype).view(spec.shape)

    def __call__(self, spec: TensorSpec) -> torch.Tensor:
        tensor = self._empty(spec)
        flat = tensor.view(-1)
        count = -(-flat.numel() // CHUNK_ELEMENTS)
        jobs = [(spec.name, i, flat[i * CHUNK_ELEMENTS : (i + 1) * CHUNK_ELEMENTS]) for i in range(count)]
        if self._pool is None or count < 2:
            for job in jobs:
                self._fill_chunk(*job)
        else:
            for done in [self._pool.submit(self._fill_chunk, *job) for job in jobs]:
                done.result()
        return tensor

    def _float_scratch(self, numel: int) -> torch.Tensor:
        buffer = getattr(self._scratch, "buffer", None)
        if buffer is None:
            buffer = self._scratch.buffer = torch.empty(CHUNK_ELEMENTS, dtype=torch.float32)
        return buffer[:numel]

    def _fill_chunk(self, name: str, index: int, chunk: torch.Tensor) -> None:
        generator = torch.Generator().manual_seed(_chunk_seed(self.seed, name, index))
        dtype = chunk.dtype
        if dtype in _DIRECT_NORMAL:
            chunk.normal_(0.0, _STD, generator=generator)
        elif dtype.is_floating_point:
            chunk.copy_(self._float_scratch(chunk.numel()).normal_(0.0, _STD, generator=generator))
        elif dtype == torch.bool:
            chunk.random_(0, 2, generator=generator)
        elif dtype.is_complex:
            raise TypeError(f"{name}: complex tensors are not generated ({dtype})")
        elif dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
            chunk.random_(0, 16, generator=generator)
        else:
            chunk.random_(-8, 8, generator=generator)


def _replaceable(path: Path) -> bool:
    """True when ``path`` is a checkpoint this module wrote (so it may be replaced)."""
    try:
        metadata = read_header(path).metadata or {}
    except (OSError, ValueError):
        return False
    return metadata.get("generator") == GENERATOR


def ensure_checkpoint(
    module: nn.Module,
    path: str | os.PathLike[str],
    seed: int,
    *,
    generate: bool = True,
    progress: bool = True,
) -> tuple[Path, bool]:
    """Make sure ``path`` holds the checkpoint of ``module`` for ``seed``; returns ``(path, generated)``.

    A file that :func:`checkpoint_matches` is reused untouched (``generated`` False).
    Otherwise, with ``generate``, a stale file of ours is deleted first (frees its disk
    space) and a new one written with :func:`write_checkpoint` (temporary file, fsync,
    rename), parent directories created. :class:`CheckpointError`, naming the path and
    what to do, when: the path is a directory; a file there was not written by this
    module (or is not a readable safetensors file; it is never replaced); or, without
    ``generate``, the file is missing or was generated for another model or seed.
    Before anything is deleted or written, the file must fit on its disk (free space, plus
    the stale file about to be deleted) and its largest tensor in available memory, else
    :class:`CheckpointError` saying how much is needed and how much there is.
    Progress: a bar of the tensor bytes written (:func:`harness.progress.byte_bar`: on stderr when it is
    a terminal; ``progress=False``: never).
    Memory: one buffer of the largest tensor's size, reused for every tensor, plus a
    16 MiB chunk of scratch per worker thread, whatever the model's size.
    """
    target = Path(path)
    problem = checkpoint_path_problem(target)  # stat only: a FIFO is never opened
    if problem:
        raise CheckpointError(problem)
    specs = checkpoint_specs(module)
    if checkpoint_matches(target, specs, seed):
        return target, False
    if target.exists() and not _replaceable(target):
        raise CheckpointError(
            f"{target}: exists and was not written by the harness (no generator={GENERATOR!r} "
            "metadata, or not a readable safetensors file); move it away or set checkpoint.path"
        )
    if not generate:
        if target.exists():
            raise CheckpointError(f"{target}: was generated for another model or seed; "
                                  "set checkpoint.generate = true to write it again")
        raise CheckpointError(f"{target}: no such file; check checkpoint.path, or set "
                              "checkpoint.generate = true to write one with seeded values")
    sizes = describe_specs(specs)
    check_room(target, needed=file_bytes(specs, checkpoint_metadata(seed)), largest=sizes["largest"],
               stale=target.stat().st_size if target.is_file() else 0)  # a stale file of ours, deleted first
    target.unlink(missing_ok=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    with SeededFill(seed, reuse_buffer=True) as fill:
        fill.reserve(sizes["largest"])  # the one buffer every tensor is filled in, before the bar starts
        with byte_bar(f"generating {target.name}", sizes["nbytes"], enabled=progress) as bar:
            write_checkpoint(target, specs, fill, metadata=checkpoint_metadata(seed), progress=bar.update)
    return target, True


def _show(n: int) -> str:
    return f"{n / GIB:.2f} GiB ({n:,} bytes)" if n >= GIB else f"{n / MIB:.1f} MiB ({n:,} bytes)"


def file_bytes(specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> int:
    """An upper bound on the size of the safetensors file of ``specs``: the data, plus a header
    that spends at most 96 bytes and 21 per dimension and offset on each entry besides its name."""
    data = sum(_nbytes(spec) for spec in specs)
    header = sum(len(json.dumps(spec.name)) + 96 + 21 * (len(spec.shape) + 2) for spec in specs)
    return 8 + header + len(json.dumps(dict(metadata))) + 64 + data


def check_room(target: Path, *, needed: int, stale: int, largest: int) -> None:
    """Refuse to start writing a checkpoint that cannot fit: ``needed`` bytes on the disk of ``target`` (a file or
    a folder of shards), counting the ``stale`` bytes of ours deleted before writing as free, or its ``largest``
    tensor in available memory. :class:`CheckpointError` saying how much is needed and how much there is."""
    where = target.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        free = None  # nothing to measure against: writing will say
    if free is not None and needed > free + stale:
        freed = f" (with the {_show(stale)} of the old files it replaces)" if stale else ""
        raise CheckpointError(f"{target}: generating it needs {_show(needed)} on disk, and {where} has "
                              f"{_show(free + stale)} free{freed}; free some space or set checkpoint.path to "
                              "a disk with room")
    available = psutil.virtual_memory().available
    if largest > available:
        raise CheckpointError(f"{target}: generating it holds its largest tensor ({_show(largest)}) in "
                              f"memory, and {_show(available)} is available; generate it on a machine with more "
                              "memory, or use a smaller model")


def _nbytes(spec: TensorSpec) -> int:
    count = 1
    for size in spec.shape:
        count *= size
    return count * torch.empty((), dtype=spec.dtype).element_size()


def describe_specs(specs: Sequence[TensorSpec]) -> Mapping[str, int]:
    """``{"tensors": n, "nbytes": total, "largest": largest tensor's bytes}`` of a checkpoint."""
    sizes = [_nbytes(spec) for spec in specs]
    return {"tensors": len(sizes), "nbytes": sum(sizes), "largest": max(sizes, default=0)}
