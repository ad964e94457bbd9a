"""Stream-write a safetensors file, one tensor in memory at a time.

:func:`write_checkpoint` produces the layout safetensors' writer produces (header
padded with spaces to a multiple of 8, tensors ordered by descending item size
then name, so that every tensor starts at a multiple of its item size) while
holding at most one tensor in memory at a time; the header it writes is parsed back
by :func:`weightmap.format.parse_header` before any byte is written, so the file
is one every reader of the format accepts.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from weightmap.atomic_write import AtomicFile
from weightmap.errors import MappingError
from weightmap.format import (
    _MAX_DIM,
    _METADATA_KEY,
    DTYPE_CODES,
    MAX_HEADER_BYTES,
    Header,
    PathArg,
    _show,
    parse_header,
)

__all__ = ["Layout", "TensorSpec", "prepare_checkpoint", "write_checkpoint", "write_tensors"]


@dataclass(frozen=True)
class TensorSpec:
    """What :func:`write_checkpoint` should write for one tensor: name, dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


def _spec_error(path: Path, rule: str, name: object) -> MappingError:
    return MappingError(f"{path}: tensor {_show(name)}: {rule}")


def _check_spec(spec: TensorSpec, path: Path) -> tuple[int, ...]:
    """Validate one spec's name, dtype and shape; returns the shape as a tuple of ints."""
    if not isinstance(spec.name, str):
        raise _spec_error(path, f"name must be a string, got {type(spec.name).__name__}", spec.name)
    if spec.name == _METADATA_KEY:
        raise _spec_error(path, "the name __metadata__ is reserved by the format", spec.name)
    try:
        spec.name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _spec_error(path, "name is not valid UTF-8", spec.name) from exc
    if spec.dtype not in DTYPE_CODES:
        raise _spec_error(path, f"dtype {spec.dtype} has no safetensors code", spec.name)
    shape = tuple(spec.shape)
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= _MAX_DIM for d in shape):
        raise _spec_error(path, f"shape must be non-negative integers, got {_show(list(shape))}", spec.name)
    return tuple(int(d) for d in shape)


def _plan_layout(
    specs: Sequence[TensorSpec], path: Path
) -> list[tuple[TensorSpec, tuple[int, ...], int, int]]:
    """Order specs by descending item size then name; give each its [begin, end) in the data section."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        shape = _check_spec(spec, path)
        if spec.name in shapes:
            raise _spec_error(path, "name appears twice in the specs", spec.name)
        shapes[spec.name] = shape
    ordered = sorted(specs, key=lambda s: (-s.dtype.itemsize, s.name))
    layout = []
    position = 0
    for spec in ordered:
        shape = shapes[spec.name]
        size = math.prod(shape) * spec.dtype.itemsize
        layout.append((spec, shape, position, position + size))
        position += size
    return layout


def _encode_header(
    layout: list[tuple[TensorSpec, tuple[int, ...], int, int]],
    metadata: Mapping[str, str] | None,
    path: Path,
) -> bytes:
    """The 8-byte length plus the JSON header, padded with spaces to a multiple of 8."""
    document: dict[str, Any] = {}
    if metadata is not None:
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise MappingError(
                    f"{path}: metadata must map strings to strings, got {_show(key)}: {_show(value)}"
                )
        document[_METADATA_KEY] = dict(metadata)
    for spec, shape, begin, end in layout:
        document[spec.name] = {
            "dtype": DTYPE_CODES[spec.dtype],
            "shape": list(shape),
            "data_offsets": [begin, end],
        }
    try:
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise MappingError(f"{path}: metadata is not valid UTF-8") from exc
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_HEADER_BYTES:
        raise MappingError(
            f"{path}: header would be {len(text)} bytes, over the {MAX_HEADER_BYTES}-byte limit"
        )
    return struct.pack("<Q", len(text)) + text


def _filled(
    spec: TensorSpec, shape: tuple[int, ...], fill: Callable[[TensorSpec], torch.Tensor], path: Path
) -> torch.Tensor:
    """Ask ``fill`` for the tensor, check it against the spec, return it on CPU, contiguous, plain."""
    tensor = fill(spec)
    if not isinstance(tensor, torch.Tensor):
        raise _spec_error(path, f"fill returned {type(tensor).__name__}, not a tensor", spec.name)
    if tensor.dtype != spec.dtype:
        raise _spec_error(path, f"fill returned dtype {tensor.dtype}, the spec says {spec.dtype}", spec.name)
    if tuple(tensor.shape) != shape:
        raise _spec_error(
            path, f"fill returned shape {list(tensor.shape)}, the spec says {list(shape)}", spec.name
        )
    if tensor.layout != torch.strided:
        raise _spec_error(
            path, f"fill returned a {tensor.layout} tensor; only dense tensors can be written", spec.name
        )
    if tensor.device.type == "meta":
        raise _spec_error(path, "fill returned a meta tensor, which has no data", spec.name)
    return tensor.detach().to("cpu").resolve_conj().resolve_neg().contiguous()


def _write_tensor(out: AtomicFile, tensor: torch.Tensor) -> int:
    """Write a CPU contiguous tensor's bytes straight from its memory; returns the byte count."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes:
        # A ctypes array over the tensor's memory exposes it as a buffer without copying;
        # ``tensor`` stays referenced here until the write is done.
        buffer = (ctypes.c_ubyte * nbytes).from_address(tensor.data_ptr())
        out.write(memoryview(buffer))
    return nbytes


def write_checkpoint(
    path: PathArg,
    specs: Sequence[TensorSpec],
    fill: Callable[[TensorSpec], torch.Tensor],
    metadata: Mapping[str, str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Header:
    """Stream a safetensors file to ``path`` holding one tensor in memory at a time.

    The header is built from ``specs``; then, in file order (descending item size,
    then name), ``fill(spec)`` is called once per tensor, its result checked (dtype and
    shape must equal the spec, else :class:`MappingError` naming the tensor), copied to
    CPU if needed, written and dropped (a tensor of no elements has nothing to write, and
    ``fill`` is not called for it). ``progress(nbytes)`` is called after each tensor.
    The result may live on any device and be non-contiguous.

    The file is replaced in one step (:class:`~weightmap.atomic_write.AtomicFile`): it is
    written as a new file in the same directory, unnamed where the file system allows
    (Linux ``O_TMPFILE``), fsynced and renamed onto ``path``. A crash or ``SIGKILL``
    never leaves a partial file under the final name nor, with ``O_TMPFILE``, any file
    at all; without it, the hidden file a killed writer leaves is removed by the next
    save in that directory. Replacing a file this process has mapped is safe (the
    mapping keeps the old inode). Replacing a file keeps its permission bits; a
    symlink is followed and left in place. On an exception, nothing is left that was
    not there before.

    Duplicate names, the reserved name ``__metadata__``, dtypes without a safetensors
    code, metadata that is not string to string, and anything else the reader would
    refuse in the header it would write (it is parsed back by :func:`parse_header`: more
    than 64 dimensions, say) raise :class:`MappingError` before anything is written.
    Failures of the system (no space, a missing or read-only directory) raise
    :class:`OSError` with its errno whose message names ``path``; a directory at
    ``path`` is an :class:`IsADirectoryError`. Returns the written file's :class:`Header`.
    """
    target = Path(os.fsdecode(path))
    layout, head, header = prepare_checkpoint(target, specs, metadata)
    with AtomicFile(target) as out:
        write_tensors(out, target, layout, head, fill, progress)
    return header


Layout = list[tuple[TensorSpec, tuple[int, ...], int, int]]


def prepare_checkpoint(
    target: Path, specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None
) -> tuple[Layout, bytes, Header]:
    """The layout, the encoded header and that header parsed back by :func:`parse_header`.

    Everything a reader would refuse (more than 64 dimensions, a size that overflows, ...)
    raises here, before anything is written.
    """
    layout = _plan_layout(specs, target)
    head = _encode_header(layout, metadata, target)
    file_size = len(head) + (layout[-1][3] if layout else 0)
    return layout, head, parse_header(head, file_size, target)


def write_tensors(
    out: AtomicFile,
    target: Path,
    layout: Layout,
    head: bytes,
    fill: Callable[[TensorSpec], torch.Tensor],
    progress: Callable[[int], None] | None = None,
) -> None:
    """Write the header and then each tensor (from ``fill``) of a prepared checkpoint into ``out``.

    A tensor of no elements has no bytes to write: ``fill`` is not called for it (its shape,
    such as ``[0, 2**62, 2**62]``, may be one no tensor can be made with).
    """
    out.write(head)
    for spec, shape, begin, end in layout:
        if begin == end:
            if progress is not None:
                progress(0)
            continue
        tensor = _filled(spec, shape, fill, target)
        written = _write_tensor(out, tensor)
        del tensor
        if progress is not None:
            progress(written)
