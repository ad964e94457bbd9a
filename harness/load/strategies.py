"""The strategy registry: every way of getting a checkpoint's weights into a model that the harness compares.

A :class:`Strategy` is what the harness does for one: its name (what a scenario lists), its
loader, how its weights are released after their last engine, and optional per-engine
hooks. The names, with the label and colour results show them by, are declared in the
torch-free catalog (:mod:`harness.catalog`), which scenario validation, the results and the
figures read; the worker, the plan and budget mode read :data:`STRATEGIES`. Adding a
strategy is adding its listing to the catalog and its entry here.

Each loader takes the model on the meta device and returns it with its weights in place:

* ``map``: :func:`weightmap.map_weights`: views of the file, nothing read yet;
  released after each engine by dropping pages (``madvise``);
* ``load``: what most code does: the model is built on the CPU with
  uninitialised tensors (``to_empty``), the whole checkpoint is read into host
  memory, then ``load_state_dict`` copies it in; released with ``resize_(0)``;
* ``load_file``: ``safetensors.torch.load_file`` + ``load_state_dict(assign=True)``,
  ties restored: file-backed tensors that ``resize_(0)`` cannot free;
* ``torch_mmap``: ``torch.load(mmap=True)`` of a ``.pt`` conversion of the checkpoint
  (made once by the strategy's ``prepare``, before any measured run) +
  ``load_state_dict(assign=True)``: file-backed, and never released while the model
  holds it (:mod:`harness.load.peers`);
* ``stream``: nothing is loaded up front; per-engine hooks bring each engine's tensors
  in with ``safetensors.safe_open`` right before its build and drop them right after,
  so only one engine's weights are loaded at a time (:class:`StreamHooks`).
* ``read_file``: ``stream`` with safetensors' ``pread`` backend (its answer for files larger
  than half of memory): each engine's tensors read into buffers of safetensors' own right
  before its build and dropped right after (:class:`ReadFileHooks`); where the installed
  safetensors has no such backend the strategy fails saying so.
* ``map_no_prefetch``: ``map`` with prefetch off whatever the scenario says (``drop_cache``
  still follows it), so that one run shows what prefetch buys.
* ``map_keep_cache``: ``map`` with ``drop_cache`` off whatever the scenario says (prefetch
  still follows it): released weights stay in the page cache, so that one run shows what
  dropping them buys.
* ``st_prefetch``, ``fastsafetensors``, ``instanttensor``: loaders that read each engine's
  tensors straight to the device (safetensors' ``prefetch``, one engine ahead; fastsafetensors;
  instanttensor), per engine as ``stream`` does, buffers sized to the engine where the API sizes
  them, each package optional (:mod:`harness.load.gpu_peers`);
* ``st_prefetch_whole``, ``fastsafetensors_whole``, ``instanttensor_whole``: the same loaders as
  their authors recommend them, opened once for the whole checkpoint at the first engine's build,
  each tensor dropped after its last engine (:mod:`harness.load.gpu_whole`).

A strategy with a ``prefetch_plan`` warms the page cache for the next engine while one is
built, with the scenario's ``[run] prefetch`` method (its release plan is made by
``prefetch_plan`` instead of ``release_plan``); prefetch never changes what is released.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import torch

from harness.catalog import STRATEGY_LISTINGS
from harness.load.gpu_peers import (
    FastSafetensorsHooks,
    InstantTensorHooks,
    StPrefetchHooks,
    load_fastsafetensors,
    load_instanttensor,
    load_st_prefetch,
)
from harness.load.gpu_whole import (
    FastSafetensorsWholeHooks,
    InstantTensorWholeHooks,
    StPrefetchWholeHooks,
    load_fastsafetensors_whole,
    load_instanttensor_whole,
    load_st_prefetch_whole,
)
from harness.load.loaded import Loaded, put_in_place, restore, retie
from harness.load.peers import StreamLoader, converted_path, ensure_pt, load_torch_mmap, read_file_backend
from weightmap import PrefetchMethod, ReleasePlan, collect_targets, map_weights, open_checkpoint

__all__ = ["STRATEGIES", "EngineHooks", "ReadFileHooks", "StreamHooks", "Strategy", "release_without_resizing"]


def load_map(model: torch.nn.Module, path: Path) -> Loaded:
    """Map the checkpoint: every persistent tensor becomes a view of the file."""
    mapped = map_weights(model, path, strict=True)
    mapped.close()  # the views keep the mapping alive; the handle is not needed
    return Loaded(model, f"map_weights: {len(mapped.mapped)} tensors mapped, {mapped.nbytes} bytes, no copy")


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Read every tensor of a checkpoint into ordinary host memory (one allocation each)."""
    checkpoint = open_checkpoint(path)
    state = {}
    for header in checkpoint.headers:
        with open(header.path, "rb", buffering=0) as f:
            for name, entry in header.tensors.items():
                tensor = torch.empty(entry.shape, dtype=entry.dtype)
                if entry.nbytes:
                    f.seek(entry.start)
                    view = memoryview(tensor.reshape(-1).view(torch.uint8).numpy().data)
                    got = 0
                    while got < entry.nbytes:
                        n = f.readinto(view[got:])
                        if not n:
                            raise OSError(f"{header.path}: unexpected end of file in {name!r}")
                        got += n
                state[name] = tensor
    return state


def load_eager(model: torch.nn.Module, path: Path) -> Loaded:
    """Allocate the model on the CPU, read the checkpoint into memory, copy it in."""
    groups = [t.names for t in collect_targets(model) if len(t.names) > 1]
    unfilled = _meta_non_persistent(model)
    model.to_empty(device="cpu")
    retie(model, groups)  # to_empty allocates each name separately
    # No checkpoint fills a non-persistent buffer: put those back on meta, so that they get
    # the values every other strategy's model gets (fill_non_persistent), not to_empty's
    # uninitialised memory (an index buffer of garbage makes an engine index out of bounds).
    for owner, leaf in unfilled:
        owner._buffers[leaf] = torch.empty_like(owner._buffers[leaf], device="meta")  # type: ignore[arg-type]
    state = read_state_dict(path)
    absent = [t.names[0] for t in collect_targets(model) if t.persistent and not any(n in state for n in t.names)]
    if absent:
        raise KeyError(f"{path}: the checkpoint lacks {len(absent)} tensors of the model, e.g. {absent[:5]}")
    model.load_state_dict(state, strict=False)  # a tied tensor is filled through any one of its names
    del state
    return Loaded(model, "to_empty + full read into host memory + load_state_dict (two copies at the peak)")


def _meta_non_persistent(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """(module, buffer name) of every non-persistent buffer still on meta."""
    return [(sub, leaf) for sub in model.modules() for leaf, buf in sub._buffers.items()
            if buf is not None and buf.is_meta and leaf in sub._non_persistent_buffers_set]


def load_with_safetensors(model: torch.nn.Module, path: Path) -> Loaded:
    """``safetensors.torch.load_file`` per file, then ``load_state_dict(assign=True)``, ties restored."""
    from safetensors.torch import load_file

    groups = [t.names for t in collect_targets(model) if len(t.names) > 1]
    state: dict[str, torch.Tensor] = {}
    for file in open_checkpoint(path).files:
        state.update(load_file(str(file)))
    model.load_state_dict(state, strict=False, assign=True)
    retie(model, groups)
    return Loaded(model, "safetensors load_file + load_state_dict(assign=True)")


def prepare_torch_mmap(path: Path) -> bool:
    """Convert the checkpoint to its ``.pt`` once (kept while current); True when it converted."""
    return ensure_pt(path, converted_path(path))


def torch_mmap_reads(path: Path) -> tuple[Path, ...]:
    """The file ``torch_mmap`` reads instead of the checkpoint: its ``.pt`` conversion."""
    return (converted_path(path),)


def load_nothing(model: torch.nn.Module, path: Path) -> Loaded:
    """``stream`` loads nothing up front: the model stays on meta until each engine's hooks."""
    return Loaded(model, "nothing loaded up front: each engine's tensors are safe_open views taken right "
                         "before its build and dropped right after")


class EngineHooks(Protocol):
    """Per-engine steps a strategy takes around each build, for loaders that work engine by engine.

    The worker calls ``before(index, names)`` right before engine ``index`` is built (the
    moment to bring in the weights ``names``) and ``after(index, names)`` right after it is
    built and its weights released by the release plan; ``after`` returns the bytes it
    released itself (0 when it released nothing), counted in the engine's
    ``released_bytes``. Both run inside the engine's measured span, so what they cost
    shows in its high-water mark and its build time.
    """

    def before(self, index: int, names: Sequence[str]) -> None: ...

    def after(self, index: int, names: Sequence[str]) -> int: ...


Loader = Callable[[torch.nn.Module, Path], Loaded]
ReleasePlanner = Callable[[torch.nn.Module, Sequence[Sequence[str]]], ReleasePlan]
PrefetchPlanner = Callable[[torch.nn.Module, Sequence[Sequence[str]], PrefetchMethod | None, bool, int, int],
                          ReleasePlan]
"""``(model, partitions, prefetch method or None, drop_cache, prefetch readers, prefetch request bytes) ->
ReleasePlan``."""
HooksFactory = Callable[[torch.nn.Module, Path, str, Sequence[Sequence[str]]], EngineHooks]
"""``(model, checkpoint, device, partitions) -> EngineHooks``: ``device`` is the one the engines are built on,
as the plan resolved it (``cpu``, ``cuda``), ``partitions`` each engine's tensor names in build order (for hooks
that fetch ahead)."""
Preparer = Callable[[Path], bool]
FilesRead = Callable[[Path], Sequence[Path]]


class StreamHooks:
    """``stream``'s per-engine steps: put the engine's weights in place from ``safe_open``, then take them out.

    ``before`` asks a :class:`harness.load.peers.StreamLoader` for the engine's tensors (views
    of safetensors' mapping of the file, not clones: a clone would add an anonymous copy
    of the engine, which no memory limit can reclaim, on top of the file pages it is
    copied from, and the builds read each weight once) and puts them into the model in
    place of its meta tensors; ``after`` puts the meta tensors back and drops the views,
    which unmaps them once nothing else holds them, and returns the bytes of those not
    released before: a tensor read by two engines (a tied one) is loaded for each, and counts
    once among the model's released bytes, as for the other strategies.
    """

    def __init__(self, model: torch.nn.Module, path: Path, device: str, partitions: Sequence[Sequence[str]],
                 backend: str | None = None) -> None:
        del device, partitions  # the views are host memory whatever the device; fetched one engine at a time
        self.model = model
        self.loader = StreamLoader.for_model(model, path, backend)
        self._meta: dict[str, torch.Tensor | None] = {}
        self._names: list[str] = []
        self._released: set[str] = set()

    def before(self, index: int, names: Sequence[str]) -> None:
        self._names = [n for n in names if self.loader.holds(n)]
        self._meta = put_in_place(self.model, self.loader.load(self._names))

    def after(self, index: int, names: Sequence[str]) -> int:
        restore(self.model, self._meta)
        self._meta = {}
        dropped = self.loader.drop(self._names)
        self._names = []
        fresh = {stored: nbytes for stored, nbytes in dropped.items() if stored not in self._released}
        self._released.update(fresh)
        return sum(fresh.values())


class ReadFileHooks(StreamHooks):
    """``read_file``'s per-engine steps: :class:`StreamHooks` with safe_open's ``pread`` backend, whose
    tensors are copies in buffers of safetensors' own (anonymous memory), freed when dropped after the build."""

    def __init__(self, model: torch.nn.Module, path: Path, device: str,
                 partitions: Sequence[Sequence[str]]) -> None:
        super().__init__(model, path, device, partitions, read_file_backend(path))


def load_nothing_yet(model: torch.nn.Module, path: Path) -> Loaded:
    """``read_file`` loads nothing up front; the installed safetensors must have the backend it reads with."""
    backend = read_file_backend(path)
    return Loaded(model, f"nothing loaded up front: each engine's tensors are read with safe_open(backend="
                         f"{backend!r}) right before its build and dropped right after")


def _release_after_last_reader(model: torch.nn.Module, partitions: Sequence[Sequence[str]]) -> ReleasePlan:
    """weightmap's default plan: mapped pages dropped after every engine that reads them; nothing resized."""
    return ReleasePlan.from_names(model, partitions)


def _resize_after_last_reader(model: torch.nn.Module, partitions: Sequence[Sequence[str]]) -> ReleasePlan:
    """Ordinary storages resized to 0 after their last engine (the built model is not run afterwards)."""
    return ReleasePlan.from_names(model, partitions, resize=True)


def release_without_resizing(model: torch.nn.Module, partitions: Sequence[Sequence[str]]) -> ReleasePlan:
    """The plan for engines that run on the model's own tensors: mapped pages dropped after their last
    engine, no storage resized (whatever the strategy), so that the engines can still run on them."""
    return _release_after_last_reader(model, partitions)


def _release_and_prefetch(model: torch.nn.Module, partitions: Sequence[Sequence[str]],
                          method: PrefetchMethod | None, drop_cache: bool, readers: int,
                          request_bytes: int) -> ReleasePlan:
    """weightmap's default plan, warming the page cache one engine ahead with ``method`` (None: not at all),
    ``readers`` threads asking at once in requests of ``request_bytes``, and evicting released weights from it
    with ``drop_cache``."""
    return ReleasePlan.from_names(model, partitions, prefetch=method, prefetch_ahead=1, drop_cache=drop_cache,
                                  prefetch_readers=readers, prefetch_request_bytes=request_bytes)


@dataclass(frozen=True)
class Strategy:
    """One loading strategy: the name a scenario lists, how it loads and releases.

    How results show it (label, colour) is the catalog's (:mod:`harness.catalog`).
    ``release_plan(model, partitions)`` makes the plan that releases each weight after the
    last engine that reads it (``partitions``: each engine's tensor names, in build order);
    this is the one place that decides how a strategy's weights are released.
    ``released_how`` and ``kept_why`` complete the sentence the results print about release.
    ``hooks``, when set, makes the :class:`EngineHooks` the worker calls around each build.
    ``prepare(checkpoint)``, when set, is a one-off step the plan runs before any measured
    run (a conversion), and ``reads(checkpoint)`` names the files the loader reads instead of
    or besides the checkpoint, so that a cold cache drops them too.
    ``prefetch_plan``, when set, makes the release plan instead of ``release_plan`` where
    the scenario turns prefetch or ``drop_cache`` on (see the module docstring);
    ``prefetches=False`` hands it no prefetch method whatever the scenario says, and
    ``drops_cache=False`` turns ``drop_cache`` off for it likewise.
    """

    name: str
    load: Loader
    release_plan: ReleasePlanner
    released_how: str
    kept_why: str
    hooks: HooksFactory | None = None
    prepare: Preparer | None = None
    reads: FilesRead | None = None
    prefetch_plan: PrefetchPlanner | None = None
    prefetches: bool = True
    drops_cache: bool = True

    def files_read(self, checkpoint: Path) -> tuple[Path, ...]:
        """The files this strategy's loader reads besides the checkpoint's (a cold cache drops them too)."""
        return tuple(self.reads(checkpoint)) if self.reads else ()

    def release_note(self, release: bool, unreleased_bytes: int) -> str:
        """The sentence the results print about what this strategy released."""
        if not release:
            return "release = false: every weight kept until the end"
        if unreleased_bytes == 0:
            return f"every weight released after its last engine ({self.released_how})"
        return self.kept_why


_MAP_KEPT_WHY = ("mapped weights released; what was kept is ordinary memory the model still reads "
                 "(non-persistent buffers such as rotary frequencies: the plan resizes nothing unless asked), "
                 "or mapped storages that madvise refused")

_MAP = Strategy(
    name="map",
    load=load_map,
    release_plan=_release_after_last_reader,
    released_how="pages dropped with madvise(MADV_DONTNEED)",
    kept_why=_MAP_KEPT_WHY,
    prefetch_plan=_release_and_prefetch,
)

def _device_peer(name: str, load: Loader, hooks: HooksFactory, released_how: str) -> Strategy:
    """A GPU loader peer (:mod:`harness.load.gpu_peers`, :mod:`harness.load.gpu_whole`): loads nothing up front,
    its hooks fetch and drop the weights, ``released_how`` says how."""
    return Strategy(
        name=name,
        load=load,
        release_plan=_release_after_last_reader,
        released_how=released_how,
        kept_why=(f"{released_how}; what was kept is ordinary memory the model still reads (non-persistent buffers "
                  "such as rotary frequencies)"),
        hooks=hooks,
    )


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        _MAP,
        Strategy(
            name="load",
            load=load_eager,
            release_plan=_resize_after_last_reader,
            released_how="storages resized to 0",
            kept_why="some storages could not be released (neither mapped by weightmap nor resizable)",
        ),
        Strategy(
            name="load_file",
            load=load_with_safetensors,
            release_plan=_release_after_last_reader,
            released_how="released",
            kept_why=("safetensors' load_file storages are file-backed and not resizable: resize_(0) fails, "
                      "so nothing could be released"),
        ),
        Strategy(
            name="torch_mmap",
            load=load_torch_mmap,
            release_plan=_release_after_last_reader,
            released_how="released",
            kept_why=("file-backed views of a .pt converted once (torch.load mmap=True): one mapping of the whole "
                      "file, not resizable, so nothing could be released while the model holds them"),
            prepare=prepare_torch_mmap,
            reads=torch_mmap_reads,
        ),
        Strategy(
            name="stream",
            load=load_nothing,
            release_plan=_release_after_last_reader,
            released_how="each engine's safe_open views dropped after its build, which unmaps them",
            kept_why=("each engine's safe_open views dropped after its build, which unmaps them; what was kept is "
                      "ordinary memory the model still reads (non-persistent buffers such as rotary frequencies)"),
            hooks=StreamHooks,
        ),
        Strategy(
            name="read_file",
            load=load_nothing_yet,
            release_plan=_release_after_last_reader,
            released_how="each engine's tensors, read into safetensors' own buffers, dropped after its build",
            kept_why=("each engine's tensors, read into safetensors' own buffers, dropped after its build; what was "
                      "kept is ordinary memory the model still reads (non-persistent buffers such as rotary "
                      "frequencies)"),
            hooks=ReadFileHooks,
        ),
        replace(_MAP, name="map_no_prefetch", prefetches=False),
        replace(_MAP, name="map_keep_cache", drops_cache=False),
        _device_peer("st_prefetch", load_st_prefetch, StPrefetchHooks,
                     "each engine's prefetched device tensors dropped after its build and its loaders closed"),
        _device_peer("st_prefetch_whole", load_st_prefetch_whole, StPrefetchWholeHooks,
                     "each prefetched device tensor dropped after its last engine, the loaders closed after the last "
                     "engine"),
        _device_peer("fastsafetensors", load_fastsafetensors, FastSafetensorsHooks,
                     "each engine's fastsafetensors tensors dropped after its build and its loader closed"),
        _device_peer("fastsafetensors_whole", load_fastsafetensors_whole, FastSafetensorsWholeHooks,
                     "each fastsafetensors tensor dropped after its last engine, the loader closed after the last "
                     "engine"),
        _device_peer("instanttensor", load_instanttensor, InstantTensorHooks,
                     "each engine's instanttensor clones dropped after its build"),
        _device_peer("instanttensor_whole", load_instanttensor_whole, InstantTensorWholeHooks,
                     "each instanttensor clone dropped after its last engine, the loader closed after the last engine"),
    )
}
"""Every strategy of the catalog (:data:`harness.catalog.STRATEGY_LISTINGS`), in its order."""

if tuple(STRATEGIES) != tuple(STRATEGY_LISTINGS):
    raise RuntimeError(f"harness/load/strategies.py: the registry's strategies {tuple(STRATEGIES)} are not the "
                       f"catalog's {tuple(STRATEGY_LISTINGS)} (harness/catalog.py), in its order")
