"""The safetensors file format: read and validate headers, stream-write files.

A safetensors file is::

    [8 bytes: N, little-endian u64][N bytes: JSON header][data section]

The header maps each tensor name to ``{"dtype", "shape", "data_offsets"}``, where
``data_offsets`` are ``[begin, end)`` relative to the start of the data section,
plus an optional ``"__metadata__"`` object of string to string.

:func:`parse_header` accepts what safetensors' own reader accepts, with three
deliberate differences, each stricter: a tensor entry with fields besides
``dtype``/``shape``/``data_offsets`` is rejected (safetensors ignores them), a key
given twice in any JSON object is rejected (safetensors keeps one of them), and a
dimension must fit in a signed 64-bit integer, as torch sizes do. Everything it
rejects raises :class:`~weightmap.errors.HeaderError` whose message names the
file, the tensor (where there is one) and the rule broken.

:func:`write_checkpoint` produces the layout safetensors' writer produces (header
padded with spaces to a multiple of 8, tensors ordered by descending item size
then name, so that every tensor starts at a multiple of its item size) while
holding at most one tensor in memory at a time.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import secrets
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from weightmap.errors import HeaderError, MappingError

__all__ = [
    "DTYPES",
    "DTYPE_CODES",
    "MAX_HEADER_BYTES",
    "Header",
    "TensorEntry",
    "TensorSpec",
    "check_little_endian",
    "parse_header",
    "read_header",
    "read_header_fd",
    "write_checkpoint",
]

MAX_HEADER_BYTES: int = 100_000_000
"""Largest header length N that readers accept (safetensors' own limit)."""

_LENGTH_BYTES = 8
_MAX_DIM = 2**63 - 1
_U64_MAX = 2**64 - 1
_MAX_INT_DIGITS = len(str(2**64 - 1))
_WRITE_CHUNK = 64 * 1024 * 1024
_ENTRY_FIELDS = frozenset({"dtype", "shape", "data_offsets"})
_METADATA_KEY = "__metadata__"

PathArg = str | os.PathLike[str]

# Codes every supported torch has, then codes whose torch dtype only some versions have.
_CORE_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
_OPTIONAL_DTYPES: dict[str, str] = {
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
    "C64": "complex64",
}


def _dtype_table() -> dict[str, torch.dtype]:
    """The safetensors dtype codes this torch can represent, mapped to torch dtypes."""
    table = dict(_CORE_DTYPES)
    for code, attribute in _OPTIONAL_DTYPES.items():
        dtype = getattr(torch, attribute, None)
        if isinstance(dtype, torch.dtype):
            table[code] = dtype
    return table


DTYPES: dict[str, torch.dtype] = _dtype_table()
"""safetensors dtype code -> torch dtype."""

DTYPE_CODES: dict[torch.dtype, str] = {dtype: code for code, dtype in DTYPES.items()}
"""torch dtype -> safetensors dtype code (inverse of :data:`DTYPES`)."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file, with absolute byte offsets.

    ``start``/``end`` are offsets from the beginning of the file
    (``8 + N + data_offsets[i]``), ``end`` exclusive.
    """

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        """Number of bytes the tensor occupies in the file."""
        return self.end - self.start

    @property
    def numel(self) -> int:
        """Number of elements (1 for a scalar, 0 when any dimension is 0)."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class Header:
    """A validated safetensors header.

    ``tensors`` is ordered by start offset, and together the entries cover
    ``[data_start, file_size)`` exactly. Hashing uses the path, data start and file
    size, so headers can key caches (the dict fields would make the default hash fail).
    """

    path: Path
    data_start: int
    file_size: int
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str] | None

    def __hash__(self) -> int:
        return hash((self.path, self.data_start, self.file_size))


@dataclass(frozen=True)
class TensorSpec:
    """What :func:`write_checkpoint` should write for one tensor: name, dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


# --------------------------------------------------------------------------- reading


class _JsonObject:
    """A JSON object as its list of key/value pairs, so that repeated keys stay visible."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs

    def __repr__(self) -> str:
        return "{...}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _parse_int(digits: str) -> int | float:
    """JSON integers; longer than any 64-bit value is an error (and never a slow conversion)."""
    if len(digits.lstrip("-")) > _MAX_INT_DIGITS:
        raise ValueError(f"integer of {len(digits)} characters is out of the 64-bit range")
    if digits == "-0":
        return -0.0  # JSON's -0 is not an integer to safetensors' reader either (serde reads -0.0)
    return int(digits)


def _shallow(value: object, limit: int) -> str:
    """repr of a scalar; nested lists and objects are elided, long strings cut before repr."""
    if isinstance(value, list):
        return "[...]"
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit])
    return repr(value)


def _show(value: object, limit: int = 120) -> str:
    """A short repr of a value from an untrusted header, for error messages.

    Never recurses into nested values and never renders more than a few elements, so
    its cost does not depend on what the header holds.
    """
    if isinstance(value, list):
        items = [_shallow(item, limit) for item in value[:8]] + (["..."] if len(value) > 8 else [])
        text = "[" + ", ".join(items) + "]"
    else:
        text = _shallow(value, limit)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fail(path: Path, rule: str, tensor: str | None = None) -> HeaderError:
    """A HeaderError whose message names the file, the tensor (if any) and the rule."""
    if tensor is None:
        return HeaderError(f"{path}: {rule}")
    return HeaderError(f"{path}: tensor {_show(tensor)}: {rule}")


def _is_count(value: object) -> bool:
    """True for a non-negative int that is not a bool (JSON true/false come back as bool)."""
    return type(value) is int and value >= 0


def _check_text(text: str, path: Path, what: str, tensor: str | None = None) -> None:
    """Reject strings that are not valid Unicode (lone surrogates from ``\\ud800`` escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _fail(path, f"{what} is not valid UTF-8 (lone surrogate escape)", tensor) from exc


def _pairs_to_dict(obj: _JsonObject, path: Path, what: str, tensor: str | None = None) -> dict[str, Any]:
    """The object's pairs as a dict; a key given twice is an error."""
    result: dict[str, Any] = {}
    for key, value in obj.pairs:
        if key in result:
            raise _fail(path, f"{what}: key {_show(key)} is given twice", tensor)
        result[key] = value
    return result


def _decode_json(text_bytes: bytes, path: Path) -> _JsonObject:
    """Decode the header bytes as UTF-8 JSON of an object."""
    try:
        text = text_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(path, f"header is not valid UTF-8 (byte {exc.start} of the header)") from exc
    try:
        document = json.loads(
            text, object_pairs_hook=_JsonObject, parse_constant=_reject_constant, parse_int=_parse_int
        )
    except RecursionError as exc:
        raise _fail(path, "header JSON is nested too deeply") from exc
    except ValueError as exc:
        raise _fail(path, f"header is not valid JSON ({_show(str(exc), 200)})") from exc
    if not isinstance(document, _JsonObject):
        raise _fail(path, f"header JSON is not an object (got {type(document).__name__})")
    return document


def _parse_metadata(value: Any, path: Path) -> dict[str, str] | None:
    """``__metadata__``: null (as if absent) or an object of string to string."""
    if value is None:
        return None
    if not isinstance(value, _JsonObject):
        raise _fail(path, f"__metadata__ must be an object of string to string, got {_show(value)}")
    metadata = _pairs_to_dict(value, path, "__metadata__")
    for key, item in metadata.items():
        if not isinstance(item, str):
            raise _fail(path, f"__metadata__ value for key {_show(key)} is not a string: {_show(item)}")
        _check_text(key, path, "__metadata__ key")
        _check_text(item, path, f"__metadata__ value for key {_show(key)}")
    return metadata


def _parse_fields(name: str, value: Any, path: Path) -> dict[str, Any]:
    """The entry's fields: exactly dtype, shape and data_offsets."""
    if not isinstance(value, _JsonObject):
        raise _fail(
            path, f"entry must be an object with dtype, shape and data_offsets, got {_show(value)}", name
        )
    fields = _pairs_to_dict(value, path, "entry", name)
    missing = sorted(_ENTRY_FIELDS - fields.keys())
    if missing:
        raise _fail(path, f"entry lacks field(s) {', '.join(missing)}", name)
    extra = sorted(fields.keys() - _ENTRY_FIELDS)
    if extra:
        raise _fail(path, f"entry has unknown field(s) {_show(', '.join(extra))}", name)
    return fields


def _parse_dtype(code: Any, name: str, path: Path) -> torch.dtype:
    if not isinstance(code, str):
        raise _fail(path, f"dtype must be a string, got {_show(code)}", name)
    dtype = DTYPES.get(code)
    if dtype is None:
        raise _fail(path, f"unknown dtype {_show(code)} (known: {', '.join(DTYPES)})", name)
    return dtype


def _parse_shape(shape: Any, name: str, path: Path) -> tuple[int, ...]:
    if type(shape) is not list or not all(_is_count(dim) for dim in shape):
        raise _fail(path, f"shape must be a list of non-negative integers, got {_show(shape)}", name)
    if any(dim > _MAX_DIM for dim in shape):
        raise _fail(
            path, f"shape {_show(shape)} has a dimension over 2**63 - 1, which torch cannot size", name
        )
    return tuple(shape)


def _parse_offsets(offsets: Any, name: str, path: Path, data_size: int) -> tuple[int, int]:
    """``[begin, end]`` relative to the data section, with begin <= end <= data_size."""
    if type(offsets) is not list or len(offsets) != 2 or not all(_is_count(x) for x in offsets):
        raise _fail(
            path, f"data_offsets must be [begin, end] of non-negative integers, got {_show(offsets)}", name
        )
    begin, end = offsets
    if begin > end:
        raise _fail(path, f"data_offsets begin {begin} is greater than end {end}", name)
    if end > data_size:
        raise _fail(
            path, f"data_offsets end {end} is past the end of the {data_size}-byte data section", name
        )
    return begin, end


def _check_size(name: str, dtype: torch.dtype, shape: tuple[int, ...], span: int, path: Path) -> None:
    """end - begin must equal numel * itemsize, computed as safetensors computes it.

    safetensors multiplies the dimensions in order in unsigned 64-bit arithmetic and rejects
    the tensor on overflow, even when a later dimension is 0 (``[2**62, 7, 0]``), then
    multiplies by the item size in bits, again rejecting overflow. The loop stops at the
    first 0 or overflow, so a header of many dimensions costs at most one pass over them.
    """
    product = 1
    for index, dim in enumerate(shape):
        product *= dim
        if product > _U64_MAX:
            later_zero = " (a later dimension is 0, but the size overflows before it)" if 0 in shape[index:] else ""
            raise _fail(
                path,
                f"shape {_show(list(shape))}: the product of its dimensions exceeds 2**64 - 1 at "
                f"dimension {index}{later_zero}",
                name,
            )
        if product == 0:
            break
    if product * dtype.itemsize * 8 > _U64_MAX:
        raise _fail(
            path,
            f"shape {_show(list(shape))} of {DTYPE_CODES[dtype]}: {product} elements of {dtype.itemsize} "
            "bytes exceed 2**64 - 1 bits",
            name,
        )
    needed = product * dtype.itemsize
    if needed != span:
        raise _fail(
            path,
            f"data_offsets span {span} bytes but shape {_show(list(shape))} of {DTYPE_CODES[dtype]} "
            f"needs {needed} bytes",
            name,
        )


def _parse_entry(name: str, value: Any, path: Path, data_start: int, data_size: int) -> TensorEntry:
    """Validate one tensor's entry; offsets in the result are absolute."""
    _check_text(name, path, "tensor name")
    fields = _parse_fields(name, value, path)
    dtype = _parse_dtype(fields["dtype"], name, path)
    shape = _parse_shape(fields["shape"], name, path)
    begin, end = _parse_offsets(fields["data_offsets"], name, path, data_size)
    _check_size(name, dtype, shape, end - begin, path)
    return TensorEntry(name=name, dtype=dtype, shape=shape, start=data_start + begin, end=data_start + end)


def _check_coverage(entries: list[TensorEntry], header_end: int, file_size: int, path: Path) -> None:
    """Entries, sorted by offsets, must tile [header_end, file_size) with no hole and no overlap."""
    position, previous = header_end, None
    for entry in entries:
        if entry.start > position:
            after = (
                f"after tensor {_show(previous)}"
                if previous is not None
                else "at the start of the data section"
            )
            raise _fail(
                path,
                f"hole of {entry.start - position} bytes {after}: data_offsets begin at "
                f"{entry.start - header_end} but the data before ends at {position - header_end}",
                entry.name,
            )
        if entry.start < position:
            raise _fail(
                path,
                f"data_offsets [{entry.start - header_end}, {entry.end - header_end}] overlap "
                f"tensor {_show(previous)}, which ends at {position - header_end}",
                entry.name,
            )
        position, previous = entry.end, entry.name
    if position != file_size:
        last = (
            f"the last tensor {_show(previous)} ends"
            if previous is not None
            else "no tensor is declared, data ends"
        )
        raise _fail(
            path,
            f"data section not covered exactly: it is {file_size - header_end} bytes but "
            f"{last} at {position - header_end}",
        )


# Leading bytes of formats a checkpoint is often confused with, and what to call each.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"PK\x03\x04", "a zip archive (torch.save writes those; read it with torch.load)"),
    (b"PK\x05\x06", "an empty zip archive"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (Keras .h5 weights are HDF5)"),
    (b"GGUF", "a GGUF file (llama.cpp's format)"),
    (b"\x93NUMPY", "a NumPy .npy array (numpy.save writes those)"),
    (b"\x1f\x8b", "gzip-compressed data"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data"),
    (b"\xfd7zXZ\x00", "xz-compressed data"),
    (b"BZh", "bzip2-compressed data"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"\x7fELF", "an ELF executable or library"),
)
_PICKLE = (
    "a Python pickle (torch.save(..., _use_new_zipfile_serialization=False) and pickle.dump write "
    "those; read it with torch.load)"
)
_SNIFF_BYTES = 64


def _looks_like(view: memoryview, *, plausible: bool) -> str | None:
    """What the file's first bytes say it is, when they say it is something other than safetensors.

    ``plausible`` is True when the first 8 bytes read as a header length within the limit (bytes
    4 to 7 are then zero, as in every safetensors file): only signatures of 4 bytes or more are
    trusted then, since shorter ones (gzip's, a pickle's) can be the low bytes of a real length.
    Returns None when the bytes match nothing known.
    """
    head = bytes(view[:_SNIFF_BYTES])
    for magic, what in _MAGIC:
        if head.startswith(magic) and (len(magic) >= 4 or not plausible):
            return what
    if plausible:
        return None
    if head[0] == 0x80 and 2 <= head[1] <= 5:
        return _PICKLE
    text = head.decode("utf-8", errors="ignore")  # a character cut at the end is dropped
    if len(text) * 2 >= len(head) and all(c.isprintable() or c in "\t\n\r" for c in text):
        first = text.lstrip("\ufeff \t\n\r")[:1]
        return "JSON text" if first in ("{", "[") else "text"
    return None


def _not_safetensors(path: Path, what: str) -> HeaderError:
    return _fail(path, f"not a safetensors file: it starts like {what}")


def _split_length(raw: memoryview, file_size: int, path: Path, *, complete: bool = True) -> int:
    """Read and check the 8-byte header length N against the limit, the file and the bytes given.

    A length over the limit means the file is not safetensors at all: the message says what its
    first bytes look like instead. So does a length past the end of the file when the first bytes
    match a known format; otherwise that is reported as the truncation it most likely is.
    """
    if file_size < _LENGTH_BYTES:
        raise _fail(path, f"file is {file_size} bytes, too short for the 8-byte header length")
    if len(raw) < _LENGTH_BYTES:
        raise _fail(path, f"got {len(raw)} bytes, too few for the 8-byte header length")
    (length,) = struct.unpack_from("<Q", raw)
    if length > MAX_HEADER_BYTES:
        what = _looks_like(raw, plausible=False)
        if what is not None:
            raise _not_safetensors(path, what)
        raise _fail(
            path,
            f"not a safetensors file: its first 8 bytes ({bytes(raw[:8]).hex(' ')}) read as a header "
            f"length of {length}, over the limit of {MAX_HEADER_BYTES} bytes, and match no format "
            "weightmap recognises",
        )
    if _LENGTH_BYTES + length > file_size:
        what = _looks_like(raw, plausible=True)
        if what is not None:
            raise _not_safetensors(path, what)
        raise _fail(path, f"header length {length} runs past the end of the file ({file_size} bytes)")
    if len(raw) > _LENGTH_BYTES and length:
        first = bytes(raw[_LENGTH_BYTES : _LENGTH_BYTES + min(length, _SNIFF_BYTES)]).lstrip(b" \t\n\r")[:1]
        what = _looks_like(raw, plausible=True) if first not in (b"{", b"") else None
        if what is not None:
            raise _not_safetensors(path, what)
    if complete and len(raw) < _LENGTH_BYTES + length:
        raise _fail(path, f"got {len(raw)} bytes, fewer than the {_LENGTH_BYTES + length} the header needs")
    return int(length)


def parse_header(raw: bytes | bytearray | memoryview, file_size: int, path: PathArg) -> Header:
    """Parse and validate a safetensors header.

    ``raw`` holds the file's first bytes: at least the 8-byte length N and the N bytes
    of JSON (bytes after them are ignored). ``file_size`` is the size of the whole file;
    ``path`` only names the file in the result and in messages. Every rule of the
    format is checked (see the module docstring); any violation raises
    :class:`HeaderError`, and nothing else is raised for any content of ``raw``.
    """
    where = Path(os.fsdecode(path))
    view = memoryview(raw).cast("B")
    length = _split_length(view, file_size, where)
    document = _decode_json(bytes(view[_LENGTH_BYTES : _LENGTH_BYTES + length]), where)
    data_start = _LENGTH_BYTES + length
    metadata: dict[str, str] | None = None
    entries: dict[str, TensorEntry] = {}
    seen_metadata = False
    for key, value in document.pairs:
        if key == _METADATA_KEY:
            if seen_metadata:
                raise _fail(where, "__metadata__ is given twice")
            metadata, seen_metadata = _parse_metadata(value, where), True
        elif key in entries:
            raise _fail(where, "name appears twice in the header", key)
        else:
            entries[key] = _parse_entry(key, value, where, data_start, file_size - data_start)
    ordered = sorted(entries.values(), key=lambda e: (e.start, e.end, e.name))
    _check_coverage(ordered, data_start, file_size, where)
    return Header(
        path=where,
        data_start=data_start,
        file_size=file_size,
        tensors={entry.name: entry for entry in ordered},
        metadata=metadata,
    )


_PREFIX_BYTES = _LENGTH_BYTES + 4096


def _pread_into(fd: int, buffer: memoryview, offset: int) -> int:
    """Fill ``buffer`` from ``fd`` at ``offset``; returns the bytes read (fewer only at end of file)."""
    filled = 0
    while filled < len(buffer):
        count = os.preadv(fd, [buffer[filled:]], offset + filled)
        if not count:
            break
        filled += count
    return filled


def read_header_fd(fd: int, path: PathArg) -> Header:
    """Read and validate the header of the safetensors file open as ``fd``.

    Reads with ``pread`` (the descriptor's position is left alone): first a few KiB, enough to
    tell a safetensors file from something else, then the rest of the header if it is longer.
    ``path`` only names the file in the result and in messages; the file size comes from
    ``fstat(fd)``, so the header is checked against the file the descriptor refers to.
    """
    where = Path(os.fsdecode(path))
    file_size = os.fstat(fd).st_size
    prefix = bytearray(min(file_size, _PREFIX_BYTES))
    got = _pread_into(fd, memoryview(prefix), 0)
    view = memoryview(prefix)[:got]
    if got < _LENGTH_BYTES:
        return parse_header(view, file_size, where)
    length = _split_length(view, file_size, where, complete=False)
    if _LENGTH_BYTES + length <= got:
        return parse_header(view, file_size, where)
    raw = bytearray(_LENGTH_BYTES + length)
    raw[:got] = view
    got += _pread_into(fd, memoryview(raw)[got:], got)
    return parse_header(memoryview(raw)[:got], file_size, where)


def read_header(path: PathArg) -> Header:
    """Read and validate the header of the safetensors file at ``path``.

    Reads only the 8-byte length and the header itself, never the data. A file that
    cannot be opened raises the usual :class:`OSError` (``FileNotFoundError`` when
    missing); everything wrong with the content raises :class:`HeaderError`.
    """
    where = Path(os.fsdecode(path))
    with open(where, "rb") as file:
        return read_header_fd(file.fileno(), where)


def check_little_endian() -> None:
    """Raise :class:`MappingError` on a big-endian host.

    safetensors stores data little-endian and mapped views are used as they are, with
    no byte swapping, so mapping is only correct on little-endian machines.
    """
    if sys.byteorder != "little":
        raise MappingError(
            "weightmap needs a little-endian host: safetensors data is little-endian and mapped "
            f"views are not byte-swapped (this host is {sys.byteorder}-endian)"
        )


# --------------------------------------------------------------------------- writing


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


def _write_all(fd: int, data: memoryview | bytes) -> None:
    """os.write until every byte is written (a single write may be partial)."""
    view = memoryview(data).cast("B")
    written = 0
    while written < len(view):
        written += os.write(fd, view[written : written + _WRITE_CHUNK])


def _write_tensor(fd: int, tensor: torch.Tensor) -> int:
    """Write a CPU contiguous tensor's bytes straight from its memory; returns the byte count."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes:
        # A ctypes array over the tensor's memory exposes it as a buffer without copying;
        # ``tensor`` stays referenced here until the write is done.
        buffer = (ctypes.c_ubyte * nbytes).from_address(tensor.data_ptr())
        _write_all(fd, memoryview(buffer))
    return nbytes


def _create_temp(target: Path) -> tuple[int, Path]:
    """Create a new hidden file next to ``target``; returns its descriptor and path."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    while True:
        temp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(temp, flags, 0o666), temp
        except FileExistsError:
            continue


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable, where the platform allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


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
    CPU if needed, written and dropped. ``progress(nbytes)`` is called after each tensor.
    The result may live on any device and be non-contiguous.

    The file is written under a hidden temporary name in the same directory
    (``.<name>.<random>.tmp``), fsynced, then renamed onto ``path``: a crash never
    leaves a partial file under the final name, and replacing a file this process has
    mapped is safe (the mapping keeps the old inode). On any error the temporary file
    is removed and nothing is left under ``path``'s name that was not there before.

    Duplicate names, the reserved name ``__metadata__``, dtypes without a safetensors
    code and metadata that is not string to string raise :class:`MappingError` before
    anything is written. Returns the written file's :class:`Header`.
    """
    target = Path(os.fsdecode(path))
    if target.is_dir():
        raise IsADirectoryError(f"{target}: is a directory, cannot write a checkpoint onto it")
    layout = _plan_layout(specs, target)
    head = _encode_header(layout, metadata, target)
    file_size = len(head) + (layout[-1][3] if layout else 0)
    fd, temp = _create_temp(target)
    finished = False
    try:
        try:
            _write_all(fd, head)
            for spec, shape, _, _ in layout:
                tensor = _filled(spec, shape, fill, target)
                written = _write_tensor(fd, tensor)
                del tensor
                if progress is not None:
                    progress(written)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, target)
        finished = True
    finally:
        if not finished:
            _remove_quietly(temp)
    _fsync_directory(target.parent)
    return parse_header(head, file_size, target)
