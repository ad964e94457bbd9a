"""The safetensors file format: read and validate headers.

A safetensors file is::

    [8 bytes: N, little-endian u64][N bytes: JSON header][data section]

The header maps each tensor name to ``{"dtype", "shape", "data_offsets"}``, where
``data_offsets`` are ``[begin, end)`` relative to the start of the data section,
plus an optional ``"__metadata__"`` object of string to string.

Rules :func:`parse_header` enforces (and so :func:`read_header`, :func:`read_header_fd`
and everything that maps a file). Any violation raises
:class:`~weightmap.errors.HeaderError` whose message names the file, the tensor (where
there is one) and the rule broken; nothing else is raised for any content.

1. The file is at least 8 bytes; N is at most 100,000,000 (:data:`MAX_HEADER_BYTES`)
   and 8 + N is within the file.
2. A file whose first bytes are another format's (a zip archive as ``torch.save``
   writes, a pickle, JSON or other text, GGUF, HDF5, a NumPy ``.npy``, compressed
   data, ...) is "not a safetensors file" and the message says what it looks like;
   so is a file whose first 8 bytes read as a length over the limit.
3. The header is UTF-8 JSON (RFC 8259: whitespace is space, tab, line feed and
   carriage return; no ``NaN``, comments or trailing commas; strings hold no raw
   control character, only JSON's escapes and no lone surrogate) of one object, with
   nothing after it but whitespace (writers pad with spaces).
4. ``__metadata__`` appears at most once and is ``null`` or an object of string to
   string whose keys are distinct.
5. Every other key is a tensor name, given once, whose value is an object with
   exactly the fields ``dtype``, ``shape`` and ``data_offsets``, each given once.
6. ``dtype`` is one of the codes in :data:`DTYPES`.
7. ``shape`` is a list of JSON integers of at most 20 digits with no sign, fraction
   or exponent (``-0``, ``1.0`` and ``1e0`` are rejected, as safetensors rejects
   them), each at most 2**63 - 1.
8. ``data_offsets`` is ``[begin, end]`` of such integers with begin <= end <= the
   size of the data section.
9. Sizes are computed as safetensors computes them: the product of the dimensions,
   taken in order, never exceeds 2**64 - 1 (even when a later dimension is 0, so
   ``[2**62, 7, 0]`` is rejected), nor does the element count times the item size in
   bits; and end - begin equals the element count times the item size.
10. Sorted by offsets, the tensors cover the data section exactly: no hole, no
    overlap (a zero-size tensor inside another one overlaps it).

This is what safetensors' own reader (0.8) accepts, with these deliberate
differences, each stricter: a tensor entry with fields besides the three is
rejected (safetensors ignores them); a tensor name or a ``__metadata__`` key given
twice is rejected (safetensors keeps one of them); a dimension must fit in a signed
64-bit integer, as torch sizes do; a shape has at most ``MAX_DIMS`` (64) dimensions,
refused before any is read (a valid header of 49 million dimensions of 1 would
otherwise cost about eight times its size); and dtype codes this torch has no dtype for (the
sub-byte ``F4``, ``F6_E2M3``, ``F6_E3M2``, and codes of newer torch versions) are
unknown.

Reading costs at most a bounded multiple of the header's size, whatever it holds.
The header is scanned left to right, without recursion, and a value of the wrong
kind is rejected where it starts, before it is read: 20 MB of ``[{},{},...]`` in
``__metadata__``, or lists nested millions deep, are rejected in milliseconds with no
Python object built for them, and a raised ``sys.setrecursionlimit`` cannot turn
them into a crash. Only what a valid header holds is ever built, so a header that is
valid up to a late error costs what the valid part would.

The writer is :mod:`weightmap.streamwrite`.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path

import torch

from weightmap.errors import HeaderError, MappingError
from weightmap.filekinds import non_regular_kind

__all__ = [
    "DTYPES",
    "DTYPE_CODES",
    "MAX_DIMS",
    "MAX_HEADER_BYTES",
    "Header",
    "TensorEntry",
    "check_little_endian",
    "parse_header",
    "read_header",
    "read_header_fd",
]

MAX_HEADER_BYTES: int = 100_000_000
"""Largest header length N that readers accept (safetensors' own limit)."""

MAX_DIMS: int = 64
"""Most dimensions a tensor's shape may have (numpy's own limit since 2.0; torch's kernels handle far fewer)."""

_LENGTH_BYTES = 8
_MAX_DIM = 2**63 - 1
_U64_MAX = 2**64 - 1
_MAX_INT_DIGITS = len(str(2**64 - 1))
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


@dataclass(frozen=True, slots=True)
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


# --------------------------------------------------------------------------- reading
#
# The header is read by a scanner over its bytes, not by a JSON library. A valid header is
# flat (an object of objects whose values are strings and lists of integers, and at most
# one object of strings), so each piece is matched by a regular expression, in C, and any
# value of the wrong kind is rejected where it starts, before it is parsed: a hostile
# header (millions of ``{}``, arrays nested a million deep) costs no Python objects and no
# recursion. Only values that a valid header holds are ever built.

_WS = rb"[ \t\n\r]*+"
_STRING = rb'"(?:[^"\\\x00-\x1f]++|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*+"'
_PLAIN_STRING = rb'"([^"\\\x00-\x1f]*+)"'  # no escapes: its bytes are its UTF-8 text
_INT = rb"(?:0|[1-9][0-9]{0,19}+)"  # JSON's integers without a sign; 20 digits cover 2**64 - 1
# At most MAX_DIMS items: a longer list stops matching after them, in constant time.
_INT_ITEMS = rb"\[" + _WS + rb"(?:" + _INT + _WS + rb"(?:," + _WS + _INT + _WS + rb"){0,%d}+)?" % (MAX_DIMS - 1)
_PAIR = _STRING + _WS + rb":" + _WS + _STRING
_PAIR_ITEMS = rb"\{" + _WS + rb"(?:" + _PAIR + _WS + rb"(?:," + _WS + _PAIR + _WS + rb")*+)?"

_WS_RE = re.compile(_WS)
_STRING_RE = re.compile(_STRING)
_INT_LIST_RE = re.compile(_INT_ITEMS + rb"\]")
_INT_ITEMS_RE = re.compile(_INT_ITEMS)
_OFFSETS_RE = re.compile(rb"\[" + _WS + rb"(" + _INT + rb")" + _WS + rb"," + _WS + rb"(" + _INT + rb")" + _WS + rb"\]")
_METADATA_RE = re.compile(_PAIR_ITEMS + rb"\}")
_PAIR_ITEMS_RE = re.compile(_PAIR_ITEMS)
_NULL_RE = re.compile(rb"null")
_DIGITS_RE = re.compile(rb"[0-9]++")
_INT_AFTER_COMMA_RE = re.compile(rb"," + _WS + _INT)
_SURROGATE_ESCAPE_RE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_TOKEN_RE = re.compile(_STRING + rb"|-?[0-9][0-9.eE+-]*+|[A-Za-z]++")
# One tensor entry as safetensors' writer (and most others) write it: a single match in C.
_ENTRY_RE = re.compile(
    _PLAIN_STRING + _WS + rb":" + _WS + rb"\{" + _WS
    + rb'"dtype"' + _WS + rb":" + _WS + _PLAIN_STRING + _WS + rb"," + _WS
    + rb'"shape"' + _WS + rb":" + _WS + rb"(" + _INT_ITEMS + rb"\])" + _WS + rb"," + _WS
    + rb'"data_offsets"' + _WS + rb":" + _WS + rb"\[" + _WS + rb"(" + _INT + rb")" + _WS + rb"," + _WS
    + rb"(" + _INT + rb")" + _WS + rb"\]" + _WS + rb"\}"
    + _WS + rb"(?:(,)" + _WS + rb"|(\}))?"  # and what follows it: another item or the end of the header object
)

# json's string decoder (in C): escapes and surrogate pairs exactly as JSON defines them.
_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_QUOTE, _COLON, _COMMA, _OPEN_OBJECT, _CLOSE_OBJECT, _OPEN_LIST = b'":,{}['
_EXCERPT = 60


def _shallow(value: object, limit: int) -> str:
    """repr of a scalar; nested lists and objects are elided, long strings cut before repr."""
    if isinstance(value, list | tuple):
        return "[...]"
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit])
    return repr(value)


def _show(value: object, limit: int = 120) -> str:
    """A short repr of a name or value, for error messages.

    Never recurses into nested values and never renders more than a few elements, so
    its cost does not depend on what the header holds.
    """
    if isinstance(value, list | tuple):
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


def _check_text(text: str, path: Path, what: str, tensor: str | None = None) -> None:
    """Reject strings that are not valid Unicode (lone surrogates from ``\\ud800`` escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _fail(path, f"{what} is not valid UTF-8 (lone surrogate escape)", tensor) from exc


class _Scanner:
    """The bytes of one header, read left to right.

    Positions are indices into ``buf``; the header is ``buf[start:end]`` and nothing outside
    it is read. Every method returns the position after what it read, or raises HeaderError.
    """

    __slots__ = ("buf", "end", "in_order", "last", "path", "shapes", "start")

    def __init__(self, buf: memoryview, start: int, end: int, path: Path) -> None:
        self.buf, self.start, self.end, self.path = buf, start, end, path
        # Objects shared between entries, so that a header of many tensors costs less: one tuple
        # per distinct shape, and one int where a tensor starts at the offset the last one ended.
        self.shapes: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.last: TensorEntry | None = None
        self.in_order = True  # entries met so far are in (start, end, name) order

    def at(self, pos: int) -> int:
        """The byte at ``pos``, or -1 at the end of the header."""
        return self.buf[pos] if pos < self.end else -1

    def skip(self, pos: int) -> int:
        """Past any JSON whitespace at ``pos``."""
        match = _WS_RE.match(self.buf, pos, self.end)
        return match.end() if match is not None else pos

    def excerpt(self, pos: int) -> str:
        """The JSON value starting at ``pos`` as it is written, cut to a few dozen bytes."""
        window = bytes(self.buf[pos : min(self.end, pos + _EXCERPT)])
        token = _TOKEN_RE.match(window)
        if token is not None and token.end() < len(window):
            return token.group().decode("utf-8", "replace")
        if window[:1] in (b"[", b"{"):
            depth = 0
            for index, byte in enumerate(window):
                depth += (byte in b"[{") - (byte in b"]}")
                if depth == 0:
                    return window[: index + 1].decode("utf-8", "replace")
        cut = pos + _EXCERPT < self.end
        return window.decode("utf-8", "replace") + ("..." if cut else "")

    def syntax(self, pos: int, expected: str) -> HeaderError:
        """The error for a place where the JSON itself is broken."""
        if pos >= self.end:
            return _fail(self.path, f"header is not valid JSON: expected {expected}, found the end of the header")
        if self.buf[pos] >= 0x80:
            try:
                bytes(self.buf[pos : min(self.end, pos + 4)]).decode("utf-8")
            except UnicodeDecodeError as exc:
                if exc.start == 0:
                    return _fail(self.path, f"header is not valid UTF-8 (byte {pos - self.start} of the header)")
        return _fail(
            self.path,
            f"header is not valid JSON: expected {expected} at byte {pos - self.start}, "
            f"found {self.excerpt(pos)}",
        )

    def decode(self, raw: bytes | memoryview, pos: int) -> str:
        """UTF-8 bytes that begin at ``pos`` as text."""
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            at = pos + exc.start - self.start
            raise _fail(self.path, f"header is not valid UTF-8 (byte {at} of the header)") from exc

    def string(self, pos: int, expected: str, what: str, tensor: str | None = None) -> tuple[str, int]:
        """A JSON string at ``pos``; ``expected`` describes it in a syntax error, ``what`` otherwise."""
        match = _STRING_RE.match(self.buf, pos, self.end)
        if match is None:
            if self.at(pos) == _QUOTE:
                raise _fail(
                    self.path,
                    f"header is not valid JSON: the string at byte {pos - self.start} is unterminated or "
                    "holds a control character or a bad escape",
                )
            raise self.syntax(pos, expected)
        raw = match.group()
        text = self.decode(raw, pos)
        if b"\\" in raw:
            text = _scanstring(text, 1, True)[0]
            _check_text(text, self.path, what, tensor)
        else:
            text = text[1:-1]
        return text, match.end()

    def colon(self, pos: int, after: str) -> int:
        pos = self.skip(pos)
        if self.at(pos) != _COLON:
            raise self.syntax(pos, f"':' after {after}")
        return self.skip(pos + 1)

    def next_item(self, pos: int, inside: str, name: str = "") -> tuple[bool, int]:
        """After an item of an object: (True, start of the next one) at ',', (False, past it) at '}'.

        ``inside`` says where, for the error, with ``{}`` standing for ``name``.
        """
        pos = self.skip(pos)
        byte = self.at(pos)
        if byte == _COMMA:
            return True, self.skip(pos + 1)
        if byte == _CLOSE_OBJECT:
            return False, pos + 1
        raise self.syntax(pos, "',' or '}' " + inside.replace("{}", _show(name)))

    def ints(self, pos: int, rule: str, tensor: str) -> tuple[list[int], int]:
        """A shape: a JSON list of at most :data:`MAX_DIMS` non-negative integers of at most 20 digits.

        ``rule`` names it in errors.
        """
        match = _INT_LIST_RE.match(self.buf, pos, self.end)
        if match is None:
            raise self._bad_ints(pos, rule, tensor)
        return self.shape_values(pos + 1, match.end() - 1), match.end()

    def offsets(self, pos: int, tensor: str) -> tuple[int, int, int]:
        """``[begin, end]``: begin, end and the position after the list."""
        match = _OFFSETS_RE.match(self.buf, pos, self.end)
        if match is None:
            raise self._bad_ints(pos, "data_offsets must be [begin, end] of non-negative integers", tensor)
        return int(match.group(1)), int(match.group(2)), match.end()

    def shape_values(self, first: int, stop: int) -> list[int]:
        """The dimensions of a shape list already matched (so of at most :data:`MAX_DIMS` items),
        ``buf[first:stop]`` being what is between its brackets."""
        inner = bytes(self.buf[first:stop])
        return [int(item) for item in inner.split(b",")] if inner.strip(b" \t\n\r") else []

    def _bad_ints(self, pos: int, rule: str, tensor: str) -> HeaderError:
        if self.at(pos) == _OPEN_LIST:
            items = _INT_ITEMS_RE.match(self.buf, pos, self.end)
            stop = items.end() if items is not None else pos
            if (self.at(stop) == _COMMA and _INT_AFTER_COMMA_RE.match(self.buf, stop, self.end)
                    and bytes(self.buf[pos:stop]).count(b",") == MAX_DIMS - 1):
                return _fail(self.path, f"shape has more than {MAX_DIMS} dimensions, the most this reader accepts",
                             tensor)
            if 0x30 <= self.at(stop) <= 0x39:  # digits go on where a number had to end
                begin = stop
                while begin > pos and 0x30 <= self.buf[begin - 1] <= 0x39:
                    begin -= 1
                digits = _DIGITS_RE.match(self.buf, begin, self.end)
                count = (digits.end() if digits is not None else stop) - begin
                if count > _MAX_INT_DIGITS:
                    return _fail(self.path, f"{rule}: an integer of {count} digits is out of the 64-bit range", tensor)
        return _fail(self.path, f"{rule}, got {self.excerpt(pos)}", tensor)


def _make_entry(
    sc: _Scanner, name: str, code: str, shape: list[int], begin: int, end: int, data_start: int, data_size: int
) -> TensorEntry:
    """Check one tensor's dtype, shape and offsets; offsets in the result are absolute."""
    dtype = DTYPES.get(code)
    if dtype is None:
        raise _fail(sc.path, f"unknown dtype {_show(code)} (known: {', '.join(DTYPES)})", name)
    if shape and max(shape) > _MAX_DIM:
        raise _fail(
            sc.path, f"shape {_show(shape)} has a dimension over 2**63 - 1, which torch cannot size", name
        )
    if begin > end:
        raise _fail(sc.path, f"data_offsets begin {begin} is greater than end {end}", name)
    if end > data_size:
        raise _fail(
            sc.path, f"data_offsets end {end} is past the end of the {data_size}-byte data section", name
        )
    _check_size(name, dtype, shape, end - begin, sc.path)
    dims = tuple(shape)
    start = data_start + begin
    last = sc.last
    if last is not None and start == last.end:
        start = last.end
    stop = start if end == begin else data_start + end
    if last is not None and (
        start < last.start
        or (start == last.start and (stop < last.end or (stop == last.end and name < last.name)))
    ):
        sc.in_order = False
    entry = TensorEntry(name, dtype, sc.shapes.setdefault(dims, dims), start, stop)
    sc.last = entry
    return entry


def _scan_entry(sc: _Scanner, name: str, pos: int, data_start: int, data_size: int) -> tuple[TensorEntry, int]:
    """A tensor entry written in any order or spacing, field by field; ``pos`` is at its value."""
    if sc.at(pos) != _OPEN_OBJECT:
        raise _fail(
            sc.path, f"entry must be an object with dtype, shape and data_offsets, got {sc.excerpt(pos)}", name
        )
    code: str | None = None
    shape: list[int] | None = None
    offsets: tuple[int, int] | None = None
    seen: set[str] = set()
    pos = sc.skip(pos + 1)
    more = sc.at(pos) != _CLOSE_OBJECT
    if not more:
        pos += 1
    while more:
        key, pos = sc.string(pos, "a field name in double quotes", "field name", name)
        if key in seen:
            raise _fail(sc.path, f"entry: key {_show(key)} is given twice", name)
        if key not in _ENTRY_FIELDS:
            raise _fail(
                sc.path, f"entry has unknown field {_show(key)} (it may hold dtype, shape and data_offsets only)",
                name,
            )
        seen.add(key)
        pos = sc.colon(pos, f"the field name {_show(key)}")
        if key == "dtype":
            if sc.at(pos) != _QUOTE:
                raise _fail(sc.path, f"dtype must be a string, got {sc.excerpt(pos)}", name)
            code, pos = sc.string(pos, "a string", "dtype", name)
        elif key == "shape":
            shape, pos = sc.ints(pos, "shape must be a list of non-negative integers", name)
        else:
            begin, end, pos = sc.offsets(pos, name)
            offsets = (begin, end)
        more, pos = sc.next_item(pos, "in the entry of tensor {}", name)
    if code is None or shape is None or offsets is None:
        missing = sorted(_ENTRY_FIELDS - seen)
        raise _fail(sc.path, f"entry lacks field(s) {', '.join(missing)}", name)
    return _make_entry(sc, name, code, shape, offsets[0], offsets[1], data_start, data_size), pos


def _fast_entry(
    sc: _Scanner, match: re.Match[bytes], data_start: int, data_size: int
) -> tuple[str, TensorEntry]:
    """A tensor entry matched whole by ``_ENTRY_RE``."""
    name = sc.decode(match.group(1), match.start(1))
    code = sc.decode(match.group(2), match.start(2))
    shape = sc.shape_values(match.start(3) + 1, match.end(3) - 1)
    begin, end = int(match.group(4)), int(match.group(5))
    return name, _make_entry(sc, name, code, shape, begin, end, data_start, data_size)


def _skip_metadata(sc: _Scanner, pos: int) -> tuple[tuple[int, int] | None, int]:
    """Check ``__metadata__`` (null or an object of string to string) without building it.

    Returns where its object lies (None for null) and the position after it. A value of the
    wrong kind is reported where it starts, without reading it.
    """
    null = _NULL_RE.match(sc.buf, pos, sc.end)
    if null is not None:
        return None, null.end()
    whole = _METADATA_RE.match(sc.buf, pos, sc.end)
    if whole is not None:
        return (pos, whole.end()), whole.end()
    if sc.at(pos) != _OPEN_OBJECT:
        raise _fail(sc.path, f"__metadata__ must be an object of string to string, got {sc.excerpt(pos)}")
    # Find the first pair that breaks the rule: the pairs before it are fine.
    first = sc.skip(pos + 1)
    items = _PAIR_ITEMS_RE.match(sc.buf, pos, sc.end)
    at = items.end() if items is not None else first
    if at > first:
        if sc.at(at) != _COMMA:
            raise sc.syntax(at, "',' or '}' in __metadata__")
        at = sc.skip(at + 1)
    key, at = sc.string(at, "a key in double quotes in __metadata__", "__metadata__ key")
    at = sc.colon(at, f"the __metadata__ key {_show(key)}")
    if sc.at(at) != _QUOTE:
        raise _fail(sc.path, f"__metadata__ value for key {_show(key)} is not a string: {sc.excerpt(at)}")
    sc.string(at, "a string", f"__metadata__ value for key {_show(key)}")
    raise sc.syntax(sc.skip(at), "',' or '}' in __metadata__")  # pragma: no cover - the match above failed


def _build_metadata(sc: _Scanner, span: tuple[int, int]) -> dict[str, str]:
    """The ``__metadata__`` object that :func:`_skip_metadata` checked, as a dict."""
    raw = sc.buf[span[0] : span[1]]
    text = sc.decode(raw, span[0])
    pairs: list[tuple[str, str]] = json.loads(text, object_pairs_hook=lambda items: items)
    metadata = dict(pairs)
    if len(metadata) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _fail(sc.path, f"__metadata__: key {_show(key)} is given twice")
            seen.add(key)
    if _SURROGATE_ESCAPE_RE.search(raw):
        for key, value in pairs:
            _check_text(key, sc.path, "__metadata__ key")
            _check_text(value, sc.path, f"__metadata__ value for key {_show(key)}")
    return metadata


def _scan_document(
    sc: _Scanner, data_start: int, data_size: int
) -> tuple[dict[str, TensorEntry], tuple[int, int] | None]:
    """The header's tensor entries, and where its ``__metadata__`` object lies (if any)."""
    pos = sc.skip(sc.start)
    if sc.at(pos) != _OPEN_OBJECT:
        if pos >= sc.end:
            raise _fail(sc.path, "header is not valid JSON: it is empty")
        raise _fail(sc.path, f"header JSON is not an object: it starts with {sc.excerpt(pos)}")
    entries: dict[str, TensorEntry] = {}
    metadata: tuple[int, int] | None = None
    seen_metadata = False
    pos = sc.skip(pos + 1)
    more = sc.at(pos) != _CLOSE_OBJECT
    if not more:
        pos += 1
    while more:
        fast = _ENTRY_RE.match(sc.buf, pos, sc.end)
        if fast is not None and fast.group(1) != b"__metadata__":
            name, entry = _fast_entry(sc, fast, data_start, data_size)
            pos = fast.end()
            if fast.group(6) is not None:  # matched the ',' after the entry too
                more = True
            elif fast.group(7) is not None:  # matched the '}' that ends the header's object
                more = False
            else:
                more, pos = sc.next_item(pos, "after the entry of tensor {}", name)
        else:
            name, pos = sc.string(pos, "a tensor name in double quotes", "tensor name")
            pos = sc.colon(pos, f"the name {_show(name)}")
            if name == _METADATA_KEY:
                if seen_metadata:
                    raise _fail(sc.path, "__metadata__ is given twice")
                metadata, pos = _skip_metadata(sc, pos)
                seen_metadata = True
                more, pos = sc.next_item(pos, "after __metadata__")
                continue
            entry, pos = _scan_entry(sc, name, pos, data_start, data_size)
            more, pos = sc.next_item(pos, "after the entry of tensor {}", name)
        if name in entries:
            raise _fail(sc.path, "name appears twice in the header", name)
        entries[name] = entry
    pos = sc.skip(pos)
    if pos < sc.end:
        raise _fail(
            sc.path, f"header is not valid JSON: it goes on after its object, at byte {pos - sc.start}: "
            f"{sc.excerpt(pos)}"
        )
    return entries, metadata


def _check_size(name: str, dtype: torch.dtype, shape: Sequence[int], span: int, path: Path) -> None:
    """end - begin must equal numel * itemsize, computed as safetensors computes it.

    safetensors multiplies the dimensions in order in unsigned 64-bit arithmetic and rejects
    the tensor on overflow, even when a later dimension is 0 (``[2**62, 7, 0]``), then
    multiplies by the item size in bits, again rejecting overflow. The loop stops at the
    first 0 or overflow, so a header of many dimensions costs at most one pass over them.
    """
    if 0 not in shape:
        # With no 0, the running product only grows: it overflows exactly when the whole does.
        product = math.prod(shape)
        if product > _U64_MAX:
            index = 0
            running = 1
            for index, dim in enumerate(shape):  # noqa: B007 - the index is reported
                running *= dim
                if running > _U64_MAX:
                    break
            raise _fail(
                path, f"shape {_show(shape)}: the product of its dimensions exceeds 2**64 - 1 at dimension {index}",
                name,
            )
    else:
        product = 1
        for index, dim in enumerate(shape):
            product *= dim
            if product == 0:
                break
            if product > _U64_MAX:
                raise _fail(
                    path,
                    f"shape {_show(shape)}: the product of its dimensions exceeds 2**64 - 1 at dimension "
                    f"{index} (a later dimension is 0, but the size overflows before it)",
                    name,
                )
    if product * dtype.itemsize * 8 > _U64_MAX:
        raise _fail(
            path,
            f"shape {_show(shape)} of {DTYPE_CODES[dtype]}: {product} elements of {dtype.itemsize} "
            "bytes exceed 2**64 - 1 bits",
            name,
        )
    needed = product * dtype.itemsize
    if needed != span:
        raise _fail(
            path,
            f"data_offsets span {span} bytes but shape {_show(shape)} of {DTYPE_CODES[dtype]} "
            f"needs {needed} bytes",
            name,
        )


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
    data_start = _LENGTH_BYTES + length
    scanner = _Scanner(view, _LENGTH_BYTES, data_start, where)
    entries, metadata_span = _scan_document(scanner, data_start, file_size - data_start)
    ordered = list(entries.values())
    del entries
    if not scanner.in_order:
        # Three stable sorts on single existing keys order by (start, end, name) without a key
        # tuple per tensor.
        ordered.sort(key=attrgetter("name"))
        ordered.sort(key=attrgetter("end"))
        ordered.sort(key=attrgetter("start"))
    _check_coverage(ordered, data_start, file_size, where)
    metadata = _build_metadata(scanner, metadata_span) if metadata_span is not None else None
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
    missing, ``IsADirectoryError`` for a directory); a path that is not a regular file
    (a named pipe, a device, a socket) raises :class:`MappingError` naming what it is,
    without blocking: it is opened with ``O_NONBLOCK``, so a FIFO with no writer cannot
    hang the call. Everything wrong with the content raises :class:`HeaderError`.
    """
    where = Path(os.fsdecode(path))
    fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory, not a safetensors file", str(where))
        if not stat.S_ISREG(mode):
            raise MappingError(f"{where}: is {non_regular_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
        return read_header_fd(fd, where)
    finally:
        os.close(fd)



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
