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

import json
import math
import mmap
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from weightmap.atomic_write import AtomicFile
from weightmap.checkpoint import INDEX_NAME, Checkpoint, open_checkpoint
from weightmap.errors import MappingError
from weightmap.format import DTYPE_CODES, Header, TensorEntry, TensorSpec, check_little_endian, write_checkpoint
from weightmap.mapping import KeyMap, preview_from

__all__ = ["convert_checkpoint", "parse_size"]

SINGLE_NAME = "model.safetensors"
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """Bytes from ``"2GB"``, ``"500MiB"``, ``"1e9"`` or ``"123"``; anything else is a ``ValueError``."""
    raw = text.strip().upper().replace(" ", "")
    number = raw.rstrip("KMGTIB")
    unit = raw[len(number):]
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except (KeyError, ValueError):
        raise ValueError(f"{text!r} is not a size: use bytes or a number with KB, MB, GB, KiB, MiB or GiB") from None
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"{text!r} is not a size of at least one byte")
    return int(value)


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
      Names, shapes and values (up to the cast) are kept, and so is the metadata
      of the source's first file. A shape the model disagrees with raises the
      :class:`MappingError` ``map_weights`` would, before anything is written.
    * Output: without ``max_shard_size``, one file at ``destination``. With it,
      ``destination`` is a directory (created if missing) that receives one
      ``model.safetensors`` when everything fits in one shard, else shards
      ``model-00001-of-0000N.safetensors`` of at most ``max_shard_size`` bytes
      of tensors each (a larger tensor gets a shard of its own) and a
      ``model.safetensors.index.json`` written after them.
    * Every file is aligned (each tensor at a multiple of its item size, as
      safetensors' writer lays it out) and replaces its path in one step, as
      :func:`weightmap.save_weights_for_mapping` does: an error or a kill leaves
      no partial file under a final name. Writing onto the source itself is safe.
    * Memory: one tensor at a time. Its cast copy is the only anonymous memory
      (none when the dtype does not change: the bytes go from the mapping to the
      file); once it is written its source pages are dropped from this process,
      and with ``drop_cache`` (the default) from the page cache too. Host memory
      stays near the largest tensor's cast copy, whatever the checkpoint's size.
    * ``progress(done, total)`` is called once before the first tensor and after
      each one, with the bytes of tensors written so far and in all.

    Raises :class:`MappingError` for a bad source (naming the file, the tensor
    and the rule) and :class:`OSError` naming the destination for failures of the
    system (no space, a read-only directory).

    Example::

        convert_checkpoint("fp32.safetensors", "bf16.safetensors", dtype=torch.bfloat16)
    """
    check_little_endian()
    if dtype is not None and dtype not in DTYPE_CODES:
        raise MappingError(f"{destination}: dtype {dtype} has no safetensors code")
    if max_shard_size is not None and max_shard_size < 1:
        raise MappingError(f"{destination}: max_shard_size must be at least one byte, got {max_shard_size}")
    target = Path(os.fsdecode(destination))
    with open_checkpoint(source, keep_open=True) as checkpoint:
        items = _items(checkpoint, dtype, model, key_map)
        _check_destination(target, sharded=max_shard_size is not None)
        metadata = checkpoint.headers[0].metadata if checkpoint.headers else None
        groups = _shards(items, max_shard_size)
        maps = {h.path: checkpoint.file(h).map() for h in checkpoint.headers if h.file_size > h.data_start}
        fds = {h.path: checkpoint.file(h).fd for h in checkpoint.headers}
        writer = _Writer(maps, fds if drop_cache else {}, progress, sum(item.out_bytes for item in items))
        written = _write_all(writer, target, items, groups, metadata, sharded=max_shard_size is not None)
        writer.finish()
        return written


def _write_all(writer: _Writer, target: Path, items: list[_Item], groups: list[list[_Item]],
               metadata: dict[str, str] | None, *, sharded: bool) -> list[Path]:
    if not sharded:
        return [writer.write(target, items, metadata)]
    target.mkdir(parents=True, exist_ok=True)
    if len(groups) == 1:
        return [writer.write(target / SINGLE_NAME, groups[0], metadata)]
    written = []
    weight_map: dict[str, str] = {}
    for number, group in enumerate(groups, start=1):
        name = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        written.append(writer.write(target / name, group, metadata))
        weight_map.update(dict.fromkeys((item.name for item in group), name))
    index = target / INDEX_NAME
    document = {"metadata": {"total_size": sum(i.out_bytes for i in items)}, "weight_map": weight_map}
    with AtomicFile(index) as out:
        out.write(json.dumps(document, indent=2, ensure_ascii=False).encode("utf-8") + b"\n")
    return [*written, index]


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


def _check_destination(target: Path, *, sharded: bool) -> None:
    """Refuse a destination of the wrong kind before anything is written."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return
    except OSError:
        return  # the write says what is wrong, naming the path
    if sharded and not stat.S_ISDIR(mode):
        raise MappingError(f"{target}: exists and is not a directory; shards are written into a directory")
    if not sharded and stat.S_ISDIR(mode):
        raise MappingError(
            f"{target}: is a directory; give a file path, or a maximum shard size to write shards into it"
        )


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


class _Writer:
    """Writes groups of items from the mapped source, dropping each tensor's source pages once it is written."""

    def __init__(self, maps: dict[Path, mmap.mmap], fds: dict[Path, int],
                 progress: Callable[[int, int], None] | None, total: int) -> None:
        self._maps = maps
        self._released = {path: _Released(mm, fds.get(path)) for path, mm in maps.items()}
        self._progress = progress
        self._done = 0
        self._total = total
        self._current: _Item | None = None
        if progress is not None:
            progress(0, total)

    def write(self, path: Path, items: Sequence[_Item], metadata: dict[str, str] | None) -> Path:
        by_name = {item.name: item for item in items}
        specs = [TensorSpec(item.name, item.dtype, item.entry.shape) for item in items]
        write_checkpoint(path, specs, lambda spec: self._fill(by_name[spec.name]), metadata=metadata,
                         progress=self._written)
        return path

    def finish(self) -> None:
        for released in self._released.values():
            released.finish()

    def _fill(self, item: _Item) -> torch.Tensor:
        self._current = item
        entry = item.entry
        if entry.numel == 0:
            return torch.empty(entry.shape, dtype=item.dtype)
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
