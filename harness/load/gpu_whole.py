"""The three GPU loader peers used as their authors recommend: the whole checkpoint in one open.

:mod:`harness.load.gpu_peers` opens each loader once per engine; here each is opened once, at the first engine's
build, for every tensor the engines read (a filter or plan of them, in build order where the API takes an order),
and the engines are built from the tensors it delivered. Each stored tensor is delivered once, kept while a later
engine reads it (a tied tensor) and dropped after its last engine; the loader is closed after the last engine.
What the authors write, in their own docs:

``st_prefetch_whole``
    safetensors >= 0.9.0rc1: one ``safe_open(file, framework="pt").prefetch(plan, device=..., threads=8)`` per
    file with every engine's tensors of that file in build order ("Start loading the file's tensors to a CUDA
    device in the background"), each ``take``-n at its first engine. Memory: "An allocation's memory is freed once
    every tensor in it has been taken and dropped": a dropped tensor frees its device memory only once the others
    of its allocation are dropped too; ``close()`` after the last engine releases what no engine took.
``fastsafetensors_whole`` (0.5.0)
    One ``ParallelLoader(None, files, device=..., nogds=..., tensor_filter=...)`` over every file, its documented
    defaults otherwise (``queue_size=0``, ``bbuf_size_kb=16384``, ``max_threads=16``), ``iterate_weights()`` read
    as far as each engine needs. It yields in file order, clones that own their memory ("Each batch's buffers are
    freed once the iterator moves past its last tensor"), so a tensor a later engine reads that comes earlier in
    the file is held from then until its engine. Runs on the CPU too.
``instanttensor_whole`` (0.2.2)
    One ``instanttensor.safe_open(files, framework="pt", device=..., tensor_filter=names,
    tensor_name_match_mode="exact")`` with its defaults ("Passing all files in a single ``safe_open`` call lets
    the backend plan reads across files and typically provides higher throughput"), ``tensors()`` read as far as
    each engine needs: clones (``copy=True``) in file order, held like fastsafetensors'; its ring buffer stays
    open until the last engine (the iteration runs alongside the builds). CUDA only.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from harness.load.gpu_peers import (
    PREFETCH_THREADS,
    DeviceHooks,
    fastsafetensors_module,
    gds_present,
    instanttensor_module,
    prefetching_safe_open,
)
from harness.load.loaded import Loaded

__all__ = [
    "FastSafetensorsWholeHooks",
    "InstantTensorWholeHooks",
    "StPrefetchWholeHooks",
    "load_fastsafetensors_whole",
    "load_instanttensor_whole",
    "load_st_prefetch_whole",
]

_LATER = ("opened once at the first engine's build for every tensor the engines read; each tensor put in place "
          "for its engines and dropped after its last one")


def load_st_prefetch_whole(model: torch.nn.Module, path: Path) -> Loaded:
    """``st_prefetch_whole`` loads nothing before the builds; the installed safetensors must have ``prefetch``."""
    prefetching_safe_open()
    return Loaded(model, f"safetensors' safe_open(...).prefetch(whole plan in build order, threads="
                         f"{PREFETCH_THREADS}) per file, {_LATER}")


def load_fastsafetensors_whole(model: torch.nn.Module, path: Path) -> Loaded:
    """``fastsafetensors_whole`` loads nothing before the builds; the package must be installed."""
    module = fastsafetensors_module()
    return Loaded(model, f"fastsafetensors {getattr(module, '__version__', '?')} ParallelLoader over every file "
                         f"(its defaults, filtered to the engines' tensors), {_LATER}")


def load_instanttensor_whole(model: torch.nn.Module, path: Path) -> Loaded:
    """``instanttensor_whole`` loads nothing before the builds; the package must be installed."""
    instanttensor_module()
    return Loaded(model, f"instanttensor.safe_open(every file, its defaults, filtered to the engines' tensors), "
                         f"{_LATER}")


class _WholeHooks(DeviceHooks):
    """What the three whole-checkpoint uses share: one open for the whole plan at the first fetch, each stored
    tensor delivered once and held until after the last engine that reads it, the loader closed after the last
    engine.

    Subclasses :meth:`_open` the loader on :meth:`plan`, :meth:`_deliver` a tensor into :attr:`held` (a loader
    that yields in an order of its own may deliver others first, which are held too) and :meth:`_close` it.
    """

    def __init__(self, model: torch.nn.Module, path: Path, device: str,
                 partitions: Sequence[Sequence[str]]) -> None:
        super().__init__(model, path, device, partitions)
        self.last_engine: dict[str, int] = {}
        """Each stored tensor the engines read: the last engine that reads it."""
        for index, names in enumerate(self.partitions):
            for stored_names in self.wanted(names).values():
                self.last_engine.update(dict.fromkeys(stored_names, index))
        self.held: dict[str, torch.Tensor] = {}
        """Tensors delivered and not dropped yet, by stored name."""
        self.opened = False
        self.closed = False

    def plan(self) -> dict[Path, list[str]]:
        """Every stored tensor the engines read, each once, in build order (first engine first), by file."""
        return self.wanted([name for names in self.partitions for name in names])

    @abstractmethod
    def _open(self, plan: dict[Path, list[str]]) -> None:
        """Open the loader once for ``plan`` (:meth:`plan`)."""

    @abstractmethod
    def _deliver(self, stored: str) -> None:
        """Put ``stored``'s tensor into :attr:`held` (and any the loader hands out before it)."""

    @abstractmethod
    def _close(self) -> None:
        """Close the loader (what it still holds is released)."""

    def _fetch(self, index: int, wanted: dict[Path, list[str]]) -> dict[str, torch.Tensor]:
        if not self.opened:
            self.opened = True
            self._open(self.plan())
        tensors = {}
        for names in wanted.values():
            for stored in names:
                if stored not in self.held:
                    self._deliver(stored)
                tensors[stored] = self.held[stored]
        return tensors

    def _kept_after(self, index: int) -> set[str]:
        return {stored for stored, last in self.last_engine.items() if last > index and stored in self.held}

    def _finish(self, index: int) -> None:
        for stored in [s for s in self.held if self.last_engine.get(s, -1) <= index]:
            del self.held[stored]
        if index >= len(self.partitions) - 1 and self.opened and not self.closed:
            self.closed = True
            self.held.clear()
            self._close()


class StPrefetchWholeHooks(_WholeHooks):
    """``st_prefetch_whole``: one ``PrefetchLoader`` per file for every engine's tensors of it, in build order,
    started at the first engine; each tensor taken at its first engine."""

    strategy = "st_prefetch_whole"
    cuda_only = True
    _package = staticmethod(prefetching_safe_open)

    def __init__(self, model: torch.nn.Module, path: Path, device: str,
                 partitions: Sequence[Sequence[str]]) -> None:
        super().__init__(model, path, device, partitions)
        self._loaders: dict[str, Any] = {}  # stored name -> the PrefetchLoader of its file

    def _open(self, plan: dict[Path, list[str]]) -> None:
        ordinal = torch.device(self.device).index
        for file, stored in plan.items():
            handle = self.package(str(file), framework="pt")
            order: dict[str, slice | None] = dict.fromkeys(stored)
            loader = handle.prefetch(order, device=ordinal, threads=PREFETCH_THREADS)
            self._loaders.update(dict.fromkeys(stored, loader))

    def _deliver(self, stored: str) -> None:
        self.held[stored] = self._loaders[stored].take(stored)

    def _close(self) -> None:
        for loader in {id(loader): loader for loader in self._loaders.values()}.values():
            loader.close()
        self._loaders = {}


class _IteratedWholeHooks(_WholeHooks):
    """A loader that yields ``(name, tensor)`` in an order of its own: read as far as the tensor asked for."""

    _weights: Iterator[tuple[str, torch.Tensor]] | None = None

    def _deliver(self, stored: str) -> None:
        assert self._weights is not None
        for name, tensor in self._weights:
            self.held[name] = tensor
            if name == stored:
                return
        raise KeyError(f"{self.strategy}: the loader handed out no tensor {stored!r}")

    def _end_iteration(self) -> None:
        weights, self._weights = self._weights, None
        close = getattr(weights, "close", None)
        if close is not None:
            close()


class FastSafetensorsWholeHooks(_IteratedWholeHooks):
    """``fastsafetensors_whole``: one ``ParallelLoader`` over every file, filtered to the engines' tensors, its
    documented defaults otherwise, its ``iterate_weights()`` read as far as each engine needs."""

    strategy = "fastsafetensors_whole"
    _package = staticmethod(fastsafetensors_module)

    def __init__(self, model: torch.nn.Module, path: Path, device: str,
                 partitions: Sequence[Sequence[str]]) -> None:
        super().__init__(model, path, device, partitions)
        self.nogds = not gds_present(device)
        self._loader: Any = None

    def _open(self, plan: dict[Path, list[str]]) -> None:
        keep = {stored for names in plan.values() for stored in names}
        self._loader = self.package.ParallelLoader(None, [str(file) for file in plan], device=self.device,
                                                   nogds=self.nogds, use_tqdm_on_load=False,
                                                   tensor_filter=keep.__contains__)
        self._weights = self._loader.iterate_weights()

    def _close(self) -> None:
        self._end_iteration()  # its docs: close the iterator before the loader, or its buffers stay
        if self._loader is not None:
            loader, self._loader = self._loader, None
            loader.close()


class InstantTensorWholeHooks(_IteratedWholeHooks):
    """``instanttensor_whole``: one ``instanttensor.safe_open`` of every file, filtered to the engines' tensors by
    exact name, its defaults otherwise, its ``tensors()`` read as far as each engine needs."""

    strategy = "instanttensor_whole"
    cuda_only = True
    _package = staticmethod(instanttensor_module)

    def __init__(self, model: torch.nn.Module, path: Path, device: str,
                 partitions: Sequence[Sequence[str]]) -> None:
        super().__init__(model, path, device, partitions)
        self._handle: Any = None

    def _open(self, plan: dict[Path, list[str]]) -> None:
        names = [stored for stored_names in plan.values() for stored in stored_names]
        self._handle = self.package.safe_open([str(file) for file in plan], framework="pt", device=self.device,
                                              tensor_filter=names, tensor_name_match_mode="exact")
        self._weights = self._handle.__enter__().tensors()

    def _close(self) -> None:
        self._end_iteration()
        if self._handle is not None:
            handle, self._handle = self._handle, None
            handle.__exit__(None, None, None)

