"""Two loaders a careful user would write instead of mapping, to measure ``map`` against.

``torch_mmap``
    The checkpoint (one file or all of its shards) is converted once to a ``.pt``
    (:func:`ensure_pt`, outside the measured run, at :func:`converted_path`), then
    loaded with ``torch.load(path, mmap=True, weights_only=True)`` and ``load_state_dict(assign=True)``, ties restored
    (:func:`load_torch_mmap`). The weights are views of torch's mapping of the
    ``.pt``: file-backed, read on first use, and never given back while the
    model holds any of them. torch maps the whole file once, so dropping one
    tensor unmaps nothing, and the storages are not resizable (``resize_(0)``
    raises): like ``load_file``, nothing can be released engine by engine.

``stream`` and ``read_file``
    Per-engine loading with ``safetensors.safe_open`` (:class:`StreamLoader`):
    before an engine is built, ``load(engine's names)`` opens the file(s) that
    hold them and ``get_tensor``-s each; after the build, ``drop(names)`` lets
    them go, so only one engine's weights are loaded at any time. It needs a
    build loop that loads weights per partition, which a compile of a whole
    exported model does not offer. ``stream`` takes safetensors' default backend
    (its mapping of the file); ``read_file`` its answer for files larger than
    half of memory (safetensors PR #760): ``pread`` into buffers of its own,
    dropped when the tensors are, named ``"pread"`` in safetensors 0.8.0 and
    ``"read_file"`` where it was proposed (:func:`read_file_backend` finds
    which one the installed version takes).

Measured here (safetensors 0.8, torch 2.13, Linux 6.18; see ``harness/tests/test_peers.py``)
    * ``safe_open(...).get_tensor`` on the CPU returns a view of safetensors'
      own mapping of the whole file, not a copy: reading 64 MiB through it grew
      RssFile by 64 MiB and RssAnon by nothing. The mapping lives as long as the
      handle or any tensor taken from it: dropping one of two tensors taken from
      a handle gave nothing back; dropping the last unmapped the file and RSS
      fell by everything read through it (the pages stay in the page cache,
      clean, for the kernel to reclaim).
    * ``torch.save`` of a dict of such views wrote one storage per tensor and
      grew RssFile (the views, as read) but not RssAnon: the conversion costs
      page cache, reclaimable, and no anonymous copy of the model.
    * ``torch.load(mmap=True)`` storages: file-backed as read, not resizable;
      dropping one tensor of the state dict unmapped nothing.

Views, not clones, for ``stream``
    Cloning each tensor into ordinary memory would add an anonymous copy of
    the engine (which a memory limit cannot reclaim) on top of the file pages
    it is copied from, for nothing a build needs: the builds here read the
    weights once (a copy to the device, or to an engine file). Views cost only
    the engine's file pages, and :meth:`StreamLoader.load` opens fresh handles
    for each call, so dropping everything one call returned unmaps it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, cast

import torch

from harness.fileio.atomic import atomic_file, write_atomic
from harness.load.loaded import Loaded, retie, stored_names
from harness.progress import byte_bar
from harness.scenario import DATA_DIR
from weightmap import collect_targets, open_checkpoint

__all__ = ["CONVERTED_DIR", "READ_FILE_BACKENDS", "StreamLoader", "converted_path", "ensure_pt", "load_torch_mmap",
           "read_file_backend"]


# --------------------------------------------------------------------------- torch_mmap


CONVERTED_DIR = DATA_DIR / "converted"
"""Where the ``.pt`` conversions of checkpoints that are not the harness's own go, relative to the repository root
(the current directory): the harness's own data directory, never the user's folder."""


def converted_path(checkpoint_path: str | os.PathLike[str]) -> Path:
    """Where the ``.pt`` conversion of a checkpoint lives.

    Beside a checkpoint the harness generated (one file of ours: its name + ``.pt``), as it always has. For any
    other checkpoint (a user's file, sharded folder or index) under :data:`CONVERTED_DIR`, named by the checkpoint's
    name and a digest of its resolved path, so that nothing is ever written into a user's folder; the run's engine
    directory is no place for it, since it is emptied after every strategy's process.
    """
    from harness.models.user_checkpoint import is_generated_file

    source = Path(checkpoint_path)
    if is_generated_file(source):
        return source.with_name(source.name + ".pt")
    digest = hashlib.sha256(os.fsencode(source.resolve())).hexdigest()[:16]
    return Path.cwd() / CONVERTED_DIR / f"{source.name}-{digest}.pt"


def _source_record(checkpoint_path: Path) -> dict[str, Any]:
    checkpoint = open_checkpoint(checkpoint_path)
    files = []
    for path in checkpoint.files:
        stat = path.stat()
        files.append({"file": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    return {"files": files, "tensors": len(checkpoint.entries), "torch": torch.__version__.split("+")[0]}


def _sidecar(out_path: Path) -> Path:
    return out_path.with_name(out_path.name + ".source.json")


def ensure_pt(checkpoint_path: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> bool:
    """Write ``out_path`` (``torch.save`` of the checkpoint's state dict) unless it is already current.

    Returns True when it converted, False when ``out_path`` was kept: it is kept while
    the record beside it (``<out_path>.source.json``: the checkpoint's files, sizes and
    modification times) matches the checkpoint. One entry per stored tensor, names as
    in the file (a tied group under the one name the checkpoint holds).

    Memory: the state dict is made of ``safe_open`` views (file-backed, see the module
    docstring), so the conversion's resident memory is the checkpoint's pages as
    ``torch.save`` reads them, plus the written file's page cache until it is flushed;
    both are clean, reclaimable page cache, not an anonymous copy of the model. The file
    and then its record are written with :func:`~harness.fileio.atomic.atomic_file` (a temporary
    name, ``fsync``, rename), so a failed conversion never leaves a ``.pt`` that looks current
    (:class:`~harness.errors.OutputError` names the file). A one-off step: never inside a measured run.
    Progress: a bar of the bytes written (:func:`harness.progress.byte_bar`, on a terminal).
    """
    from safetensors import safe_open

    source, out = Path(checkpoint_path), Path(out_path)
    record = _source_record(source)
    sidecar = _sidecar(out)
    if out.is_file() and sidecar.is_file():
        try:
            if json.loads(sidecar.read_text()) == record:
                return False
        except ValueError:
            pass  # an unreadable record: convert again
    state: dict[str, torch.Tensor] = {}
    for header in open_checkpoint(source).headers:
        with safe_open(str(header.path), framework="pt") as handle:
            for name in header.tensors:
                state[name] = handle.get_tensor(name)
    with atomic_file(out) as written, byte_bar(f"converting to {out.name}", _nbytes(state.values())) as bar:
        torch.save(state, cast(BinaryIO, _Counted(written, bar.update)))  # torch writes and flushes, no more
        del state
        bar.total = bar.n  # the tensors' bytes, and the archive's own (pickle, headers, alignment)
    write_atomic(sidecar, json.dumps(record, indent=1))
    return True


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class _Counted:
    """A binary file that ``torch.save`` writes through, each write's bytes passed to ``written``."""

    def __init__(self, handle: BinaryIO, written: Callable[[int], object]) -> None:
        self.handle, self.written = handle, written

    def write(self, data: bytes | memoryview) -> int:
        n = self.handle.write(data)
        self.written(n)
        return n

    def flush(self) -> None:
        self.handle.flush()


def load_torch_mmap(model: torch.nn.Module, path: Path) -> Loaded:
    """``torch.load(mmap=True, weights_only=True)`` of the checkpoint's ``.pt`` + ``load_state_dict(assign=True)``.

    ``path`` is the safetensors checkpoint, as for the other loaders; its conversion must
    exist at :func:`converted_path` (made with :func:`ensure_pt` before the measured run).
    The model comes on the meta device; ties are restored after ``assign=True``.
    """
    pt = converted_path(path)
    if not pt.is_file():
        raise FileNotFoundError(f"{pt}: no .pt conversion of {path}; make it once with "
                                "harness.load.peers.ensure_pt before the measured run")
    groups = [t.names for t in collect_targets(model) if len(t.names) > 1]
    state = torch.load(pt, mmap=True, weights_only=True)
    absent = [t.names[0] for t in collect_targets(model) if t.persistent and not any(n in state for n in t.names)]
    if absent:
        raise KeyError(f"{pt}: the conversion lacks {len(absent)} tensors of the model, e.g. {absent[:5]}")
    model.load_state_dict(state, strict=False, assign=True)
    retie(model, groups)
    return Loaded(model, "torch.load(mmap=True, weights_only=True) of a .pt converted once + "
                         "load_state_dict(assign=True)")


# --------------------------------------------------------------------------- stream


class StreamLoader:
    """One engine's weights at a time, from ``safetensors.safe_open``.

    ::

        loader = StreamLoader.for_model(model, checkpoint)
        for engine in engines:
            weights = loader.load(n for n in engine.names if loader.holds(n))
            build(engine, weights)          # reads the views: the pages come in
            loader.drop(weights)            # unmapped once nothing else holds them
            del weights

    :meth:`load` opens a fresh ``safe_open`` handle per file it needs and closes it
    before returning; the tensors are views of that handle's mapping (see the module
    docstring), which goes away when every tensor from the call is dropped, here and by
    the caller. A name loaded and not yet dropped is returned again without a second read.
    ``resident_bytes`` counts the distinct stored tensors the loader holds now;
    ``peak_resident_bytes`` the most it ever held.
    """

    def __init__(self, checkpoint_path: str | os.PathLike[str], aliases: Mapping[str, str] | None = None,
                 backend: str | None = None) -> None:
        self.checkpoint = open_checkpoint(checkpoint_path)
        self.backend = backend  # safe_open's backend (None: its default, the mapping)
        self._aliases = dict(aliases or {})  # a model's name -> the name the checkpoint stores it under
        self._tensors: dict[str, torch.Tensor] = {}  # stored name -> view
        self._held: dict[str, str] = {}  # requested name -> stored name
        self.peak_resident_bytes = 0

    @classmethod
    def for_model(cls, model: torch.nn.Module, checkpoint_path: str | os.PathLike[str],
                  backend: str | None = None) -> StreamLoader:
        """A loader that also answers to every name of a tied group the checkpoint holds under one name."""
        return cls(checkpoint_path, stored_names(model, open_checkpoint(checkpoint_path).entries), backend)

    def _stored(self, name: str) -> str:
        return self._aliases.get(name, name)

    def holds(self, name: str) -> bool:
        """Whether the checkpoint has a tensor for ``name`` (non-persistent buffers it has not)."""
        return self._stored(name) in self.checkpoint.entries

    def load(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """Views of the named tensors (tied names share one tensor); nothing is read until used.

        Raises ``KeyError`` naming the checkpoint and the tensor for a name it lacks,
        before anything is loaded.
        """
        wanted = {name: self._stored(name) for name in names}
        missing = [name for name, stored in wanted.items() if stored not in self.checkpoint.entries]
        if missing:
            raise KeyError(f"{self.checkpoint.source}: no tensor {missing[0]!r} in the checkpoint"
                           + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        by_file: dict[Path, list[str]] = {}
        for stored in dict.fromkeys(wanted.values()):
            if stored not in self._tensors:
                header, _ = self.checkpoint.entries[stored]
                by_file.setdefault(header.path, []).append(stored)
        if by_file:
            from safetensors import safe_open

            for file, stored_names in by_file.items():
                extra = {} if self.backend is None else {"backend": self.backend}
                with safe_open(str(file), framework="pt", **extra) as handle:
                    for stored in stored_names:
                        self._tensors[stored] = handle.get_tensor(stored)
        self._held.update(wanted)
        self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes)
        return {name: self._tensors[stored] for name, stored in wanted.items()}

    def drop(self, names: Iterable[str]) -> dict[str, int]:
        """Let the named tensors go (a tied tensor once none of its loaded names is held); returns the
        stored tensors let go, by the name the checkpoint stores them under, with their bytes.

        Raises ``KeyError`` for a name that is not loaded, before dropping anything.
        """
        names = list(names)
        absent = [name for name in names if name not in self._held]
        if absent:
            raise KeyError(f"{self.checkpoint.source}: {absent[0]!r} is not loaded, so it cannot be dropped")
        dropped: dict[str, int] = {}
        for name in names:
            stored = self._held.pop(name, None)
            if stored is not None and stored not in self._held.values():
                tensor = self._tensors.pop(stored)
                dropped[stored] = tensor.numel() * tensor.element_size()
        return dropped

    @property
    def resident_bytes(self) -> int:
        """Bytes of the distinct stored tensors loaded and not dropped."""
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    def close(self) -> None:
        """Drop everything still loaded."""
        self._tensors.clear()
        self._held.clear()

    def __enter__(self) -> StreamLoader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


READ_FILE_BACKENDS: tuple[str, ...] = ("read_file", "pread")
"""The names safetensors' ``pread`` backend of ``safe_open`` has gone by, newest first."""


def read_file_backend(path: str | os.PathLike[str]) -> str:
    """The name the installed safetensors takes for its ``pread`` backend, tried on the first file of the
    checkpoint ``path`` (a file, a sharded folder or its index: ``safe_open`` takes one file only).

    Raises ``RuntimeError`` saying which version is installed and what it lacks where it takes
    none of :data:`READ_FILE_BACKENDS` (safetensors before 0.8).
    """
    import safetensors
    from safetensors import SafetensorError, safe_open

    first = open_checkpoint(path).files[0]
    for name in READ_FILE_BACKENDS:
        try:
            with safe_open(str(first), framework="pt", backend=name):  # type: ignore[call-arg]
                return name
        except (SafetensorError, TypeError) as exc:
            if "backend" not in str(exc):
                raise
    raise RuntimeError(f"safetensors {safetensors.__version__} has no pread backend for safe_open (tried "
                       f"{', '.join(READ_FILE_BACKENDS)}; it came with safetensors 0.8): read_file cannot run here")
