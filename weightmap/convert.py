"""Rewriting a checkpoint so that it maps without copies, one tensor in memory at a time.

:func:`convert_checkpoint` maps the source (as :func:`weightmap.map_weights`
does: headers validated, copy-on-write, ``MAP_NORESERVE``) and writes each tensor
in turn, cast to the dtype asked for, with
:func:`weightmap.format.write_checkpoint`: the output is aligned (every offset a
multiple of its item size) and replaces its path in one step. After each tensor
is written, its source pages are dropped from the process (``madvise``) and from
the page cache (``posix_fadvise``), so host memory stays near one tensor (its
cast copy; a tensor whose dtype does not change is written straight from the
mapping) whatever the checkpoint's size.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from weightmap.atomic_write import AtomicFile
from weightmap.checkpoint import INDEX_NAME, Checkpoint, index_shards, open_checkpoint
from weightmap.commit import SINGLE_NAME, checkpoint_to_replace, index_document, locked_directory, replace_checkpoint
from weightmap.errors import MappingError
from weightmap.format import DTYPE_CODES, Header, TensorEntry, check_little_endian
from weightmap.mapping import KeyMap, preview_from
from weightmap.sizes import parse_size
from weightmap.streamwrite import Layout, TensorSpec, prepare_checkpoint, write_tensors

__all__ = ["convert_checkpoint", "parse_size"]

@dataclass
class _Item:
    """One tensor to write: where it is in the source and what it becomes."""

    name: str
    header: Header
    entry: TensorEntry
    dtype: torch.dtype

    @property
    def out_bytes(self) -> int:
        return self.entry.numel * self.dtype.itemsize


def convert_checkpoint(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    model: torch.nn.Module | Any | None = None,
    key_map: KeyMap | None = None,
    max_shard_size: int | None = None,
    drop_cache: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> list[Path]:
    """Write ``source`` as a checkpoint that maps without copies; returns the files written.

    Contract:

    * ``source`` is what :func:`weightmap.map_weights` takes (a file, a sharded
      directory, an index); its headers are validated by the same rules and it is
      mapped, never written.
    * Each tensor is written in the dtype it will run in: with ``model`` (best
      built under :func:`weightmap.init_empty_weights`; ``key_map`` as for
      ``map_weights``), the dtype of the model's tensor it fills; otherwise, and
      for tensors the model does not take, ``dtype`` for floating-point tensors
      (integer and boolean ones keep theirs); with neither, the source dtype.
      ``dtype`` must be a floating-point dtype. Names, shapes and values (up to the
      cast) are kept, and so is the metadata of the source's first file. A shape
      the model disagrees with raises the :class:`MappingError` ``map_weights``
      would, before anything is written.
    * Output: without ``max_shard_size``, one file at ``destination``. With it,
      ``destination`` is a directory (created if missing) whose checkpoint becomes
      one ``model.safetensors`` when everything fits in one shard, else shards
      ``model-00001-of-0000N.safetensors`` of at most ``max_shard_size`` bytes of
      tensors each (a larger tensor gets a shard of its own) and a
      ``model.safetensors.index.json``.
    * Nothing is visible until everything is written: at every instant the
      destination reads as the complete earlier checkpoint (or nothing) or as the
      complete new one, whatever happens (an error, Ctrl-C, a full disk,
      ``SIGKILL``). A file destination is replaced in one step, as
      :func:`weightmap.save_weights_for_mapping` replaces it. A directory's
      checkpoint is replaced as a whole (:mod:`weightmap.commit`): the new files are
      written unnamed, made visible together, the index last, and the earlier
      checkpoint's files are removed, never left beside the new one. An error leaves
      nothing of the conversion behind, and a conversion after a killed one removes
      what that one left: the directory then holds exactly one checkpoint.
    * Only the checkpoint is ever removed or replaced. In a directory that is the index
      ``model.safetensors.index.json`` and the files it names, and, by the naming
      convention transformers uses, ``model.safetensors`` and
      ``model-NNNNN-of-NNNNN.safetensors``; nothing else. A directory holding another
      ``*.safetensors`` (a LoRA's ``adapter_model.safetensors``) is refused when it has no
      index, or when the new checkpoint is a lone file (it would stand beside it with no
      index to say which is the checkpoint).
    * A symbolic link at a destination name (the Hugging Face cache links each file of a
      snapshot to a blob other revisions share) is replaced by a regular file, and removed
      only once the new checkpoint is in place; what it points to is never written nor
      renamed onto.
    * Writing onto the source works by the same rule: a single-file source onto
      itself, a sharded source into its own directory. A file destination that is
      one shard of a sharded checkpoint (the source's or another's), an index
      (``.json``), or a ``model.safetensors`` beside an index (the directory would
      go on reading the index) is refused before anything is written, and so is a
      directory that holds files that are not a readable checkpoint.
    * Every file is aligned (each tensor at a multiple of its item size, as
      safetensors' writer lays it out); every header is parsed back by the reader's
      rules before anything is written.
    * Memory: one tensor at a time. Its cast copy is the only anonymous memory
      (none when the dtype does not change: the bytes go from the mapping to the
      file); once it is written its source pages are dropped from this process,
      and with ``drop_cache`` (the default) from the page cache too. Host memory
      stays near the largest tensor's cast copy, whatever the checkpoint's size.
    * ``progress(done, total)`` is called once before the first tensor and after
      each one, with the bytes of tensors written so far and in all.

    Raises :class:`MappingError` for a bad source or destination (naming the file, the
    tensor and the rule) and :class:`OSError` naming the destination for failures of
    the system (no space, a read-only directory).

    Example::

        convert_checkpoint("fp32.safetensors", "bf16.safetensors", dtype=torch.bfloat16)
    """
    check_little_endian()
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise MappingError(
            f"{destination}: dtype {dtype} is not a floating-point dtype; floating-point tensors are cast to it"
        )
    if dtype is not None and dtype not in DTYPE_CODES:
        raise MappingError(f"{destination}: dtype {dtype} has no safetensors code")
    if max_shard_size is not None and max_shard_size < 1:
        raise MappingError(f"{destination}: max_shard_size must be at least one byte, got {max_shard_size}")
    target = Path(os.fsdecode(destination))
    sharded = max_shard_size is not None
    _check_kind(target, sharded=sharded)
    with open_checkpoint(source, keep_open=True) as checkpoint:
        items = _items(checkpoint, dtype, model, key_map)
        metadata = checkpoint.headers[0].metadata if checkpoint.headers else None
        groups = _shards(items, max_shard_size)
        maps = {h.path: checkpoint.file(h).map() for h in checkpoint.headers if h.file_size > h.data_start}
        fds = {h.path: checkpoint.file(h).fd for h in checkpoint.headers}
        writer = _Writer(maps, fds if drop_cache else {}, sum(item.out_bytes for item in items), progress)
        if sharded:
            written = _write_directory(writer, target, groups, metadata)
        else:
            _check_file_destination(target, checkpoint)
            written = [writer.write(writer.prepare(target, items, metadata))]
        writer.finish()
        return written


def _shard_names(groups: list[list[_Item]]) -> list[str]:
    if len(groups) == 1:
        return [SINGLE_NAME]
    return [f"model-{number:05d}-of-{len(groups):05d}.safetensors" for number in range(1, len(groups) + 1)]


def _write_directory(writer: _Writer, target: Path, groups: list[list[_Item]],
                     metadata: dict[str, str] | None) -> list[Path]:
    """Write every shard unnamed, then make them and the index the directory's checkpoint as a whole."""
    created = not os.path.lexists(target)
    names = _shard_names(groups)
    try:
        with locked_directory(target) as dir_fd, contextlib.ExitStack() as staged_files:
            checkpoint_to_replace(target, lone=len(groups) == 1)  # what cannot be replaced is refused now
            prepared = [writer.prepare(target / name, group, metadata)
                        for name, group in zip(names, groups, strict=True)]
            staged = []
            for shard in prepared:
                staged.append(writer.stage(shard))
                staged_files.callback(staged[-1].discard)
            index = None
            if len(groups) > 1:
                weight_map = {item.name: name for name, group in zip(names, groups, strict=True) for item in group}
                index = index_document(weight_map, sum(item.out_bytes for group in groups for item in group))
            replace_checkpoint(target, dir_fd, staged, index)
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                target.rmdir()  # only when empty: nothing of the failed conversion is left
        raise
    return [target / name for name in names] + ([target / INDEX_NAME] if len(groups) > 1 else [])


def _items(checkpoint: Checkpoint, dtype: torch.dtype | None, model: Any, key_map: KeyMap | None) -> list[_Item]:
    """Every source tensor with the dtype it is written in (the model's first, then ``dtype`` for floats)."""
    wanted = preview_from(model, checkpoint, key_map=key_map).dtypes if model is not None else {}
    items = []
    for name, (header, entry) in checkpoint.entries.items():
        out = wanted.get(name)
        if out is None:
            out = dtype if dtype is not None and entry.dtype.is_floating_point else entry.dtype
        if out not in DTYPE_CODES:
            raise MappingError(f"{header.path}: tensor {name!r}: the model's dtype {out} has no safetensors code")
        items.append(_Item(name, header, entry, out))
    return items


def _check_kind(target: Path, *, sharded: bool) -> None:
    """Refuse a destination of the wrong kind before anything is written."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError:
        return  # the write says what is wrong, naming the path
    if sharded and mode is not None and not stat.S_ISDIR(mode):
        raise MappingError(f"{target}: exists and is not a directory; shards are written into a directory")
    if not sharded and mode is not None and stat.S_ISDIR(mode):
        raise MappingError(
            f"{target}: is a directory; give a file path, or a maximum shard size to write shards into it"
        )
    if not sharded and target.suffix == ".json":
        raise MappingError(
            f"{target}: a checkpoint written to a .json path would be read as a sharded index; give a "
            ".safetensors path"
        )


def _check_file_destination(target: Path, checkpoint: Checkpoint) -> None:
    """Refuse a file destination that would break a sharded checkpoint or leave its directory stale."""
    real = _named(target)
    index = target.parent / INDEX_NAME
    sources = [_named(path) for path in checkpoint.files]
    if real in sources and (len(sources) > 1 or checkpoint.source.suffix == ".json" or os.path.lexists(index)):
        raise MappingError(
            f"{target}: is one shard of the source checkpoint {checkpoint.source}; writing the whole checkpoint "
            "onto it would leave the source unreadable. Write into the source's directory with a maximum "
            "shard size, or to another file"
        )
    if not os.path.lexists(index):
        return
    try:
        shards = index_shards(index)
    except MappingError:
        shards = set()
    if target.name in shards:
        raise MappingError(
            f"{target}: is a shard of the sharded checkpoint in its directory (named by {index}); replacing it "
            "with a whole checkpoint would break that checkpoint. Write into the directory with a maximum shard "
            "size, or to another file"
        )
    if target.name == SINGLE_NAME:
        raise MappingError(
            f"{target}: its directory holds a sharded checkpoint ({index}), which the directory would go on "
            "reading instead of this file. Write into the directory with a maximum shard size (it replaces that "
            "checkpoint as a whole), or to another file"
        )


def _named(path: Path) -> Path:
    """``path`` with its directory resolved and its last name kept (a symlink there is the name, not its target)."""
    return Path(os.path.realpath(path.parent)) / path.name


def _shards(items: Sequence[_Item], limit: int | None) -> list[list[_Item]]:
    """Consecutive groups of at most ``limit`` output bytes (a larger tensor alone); one group without a limit."""
    if limit is None:
        return [list(items)]
    groups: list[list[_Item]] = [[]]
    size = 0
    for item in items:
        if groups[-1] and size + item.out_bytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += item.out_bytes
    return groups if groups[-1] else [[]]


class _Released:
    """The byte ranges of one source file whose tensors are written, merged, and their pages dropped.

    Pages are dropped over the merged range the tensor just written belongs to,
    not over the tensor alone: a page (or a large page-cache folio, up to 2 MiB)
    that a tensor shares with a neighbour can only go once both are written, and
    dropping the merged range catches it then. Tensors written in file order make
    one range that grows.
    """

    def __init__(self, mm: mmap.mmap, fd: int | None) -> None:
        self._mm = mm
        self._fd = fd  # None: leave the page cache alone
        self._ranges: list[tuple[int, int]] = []  # sorted, disjoint, not touching

    def add(self, start: int, end: int) -> None:
        merged_start, merged_end, kept = start, end, []
        for a, b in self._ranges:
            if b < start or a > end:
                kept.append((a, b))
            else:
                merged_start, merged_end = min(merged_start, a), max(merged_end, b)
        kept.append((merged_start, merged_end))
        self._ranges = sorted(kept)
        page = mmap.PAGESIZE
        first = -(-merged_start // page) * page
        last = merged_end // page * page
        if last <= first:
            return
        if hasattr(self._mm, "madvise"):
            self._mm.madvise(mmap.MADV_DONTNEED, first, last - first)  # out of this process
        if self._fd is not None and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, first, last - first, os.POSIX_FADV_DONTNEED)  # out of the page cache

    def finish(self) -> None:
        """Everything was written: drop whatever pages of the file are left (headers and shared folios)."""
        if self._fd is not None and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)


@dataclass(frozen=True)
class _Prepared:
    """One shard to write: its path, layout and header, validated before anything is written."""

    path: Path
    items: dict[str, _Item]
    layout: Layout
    head: bytes


class _Writer:
    """Writes groups of items from the mapped source, dropping each tensor's source pages once it is written.

    Every file is written with ``follow_symlinks=False``: a symbolic link at a destination name
    is replaced by a regular file, never written through. ``progress(0, total)`` is reported once
    the first new file is open, so that a destination that cannot be written (a FIFO, a device,
    a missing directory) fails before anything is shown.
    """

    def __init__(self, maps: dict[Path, mmap.mmap], fds: dict[Path, int], total: int,
                 progress: Callable[[int, int], None] | None) -> None:
        self._maps = maps
        self._released = {path: _Released(mm, fds.get(path)) for path, mm in maps.items()}
        self._progress = progress
        self._started = False
        self._done = 0
        self._total = total
        self._current: _Item | None = None

    def prepare(self, path: Path, items: Sequence[_Item], metadata: dict[str, str] | None) -> _Prepared:
        specs = [TensorSpec(item.name, item.dtype, item.entry.shape) for item in items]
        layout, head, _ = prepare_checkpoint(path, specs, metadata)
        return _Prepared(path, {item.name: item for item in items}, layout, head)

    def stage(self, shard: _Prepared) -> AtomicFile:
        """Write one prepared shard as a deferred new file (complete, durable, not yet visible)."""
        return self._write(shard, deferred=True)

    def write(self, shard: _Prepared) -> Path:
        """Write one prepared file and put it in place (a link at its path is replaced, not followed)."""
        self._write(shard, deferred=False)
        return shard.path

    def _write(self, shard: _Prepared, *, deferred: bool) -> AtomicFile:
        out = AtomicFile(shard.path, deferred=deferred, follow_symlinks=False)
        with out:
            if not self._started:
                self._started = True
                if self._progress is not None:
                    self._progress(0, self._total)
            write_tensors(out, shard.path, shard.layout, shard.head,
                          lambda spec: self._fill(shard.items[spec.name]), progress=self._written)
        return out

    def finish(self) -> None:
        for released in self._released.values():
            released.finish()

    def _fill(self, item: _Item) -> torch.Tensor:
        self._current = item
        entry = item.entry
        mm = self._maps[item.header.path]
        if entry.start % entry.dtype.itemsize:  # an old writer's offset: align a copy of the bytes first
            raw = torch.frombuffer(mm, dtype=torch.uint8, count=entry.nbytes, offset=entry.start)
            source = raw.clone().view(entry.dtype).view(entry.shape)
        else:
            source = torch.frombuffer(mm, dtype=entry.dtype, count=entry.numel, offset=entry.start).view(entry.shape)
        return source if source.dtype == item.dtype else source.to(item.dtype)

    def _written(self, nbytes: int) -> None:
        item, self._current = self._current, None
        if item is not None and item.entry.numel:
            self._released[item.header.path].add(item.entry.start, item.entry.end)
        self._done += nbytes
        if self._progress is not None:
            self._progress(self._done, self._total)
