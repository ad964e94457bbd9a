"""Resolve a checkpoint path to a table of tensor name -> (file header, entry).

A checkpoint is one safetensors file or several shards tied together by an index
(``model.safetensors.index.json``)::

    {"metadata": {...}, "weight_map": {"tensor.name": "model-00001-of-00002.safetensors", ...}}

Shard names are relative to the index's directory. Every shard header is read and
validated, and the index is checked against the headers: the index may leave
tensors out (they are taken from the shard headers) but may not send a tensor to a
shard that lacks it, and no tensor may live in two shards.

Every file is opened once (:func:`weightmap.files.open_regular`): it must be a
regular file, and anything else (missing, a dangling symbolic link or a loop, a
directory, a FIFO, a device, a socket) is a :class:`MappingError` saying what the
path is; a FIFO is never opened in a way that could block. Headers are read from
those descriptors. With ``keep_open=True`` the descriptors stay open in the
:class:`Checkpoint` so that the files mapped later are the files validated here;
otherwise they are closed before :func:`open_checkpoint` returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from weightmap.errors import HeaderError, MappingError
from weightmap.files import CheckpointFile, describe_unusable, open_regular, read_all
from weightmap.format import MAX_HEADER_BYTES, Header, TensorEntry

__all__ = ["INDEX_NAME", "Checkpoint", "index_shards", "open_checkpoint"]

INDEX_NAME = "model.safetensors.index.json"
_SUFFIX = ".safetensors"
_INDEX_BASE_COST = 64 * 2**20  # bytes an index may always cost to parse
_INDEX_COST_FACTOR = 8  # and this many times its size on top
_STRING_COST = 128  # bytes a parsed JSON string costs beyond its text, at most
_VALUE_COST = 48  # bytes any other parsed JSON value costs, at most


@dataclass(frozen=True)
class Checkpoint:
    """Every tensor of a checkpoint, with the validated header of the file that holds it.

    ``source`` is the path the caller passed; ``headers`` holds one validated header per
    file (shards sorted by name); ``entries`` maps each tensor name to its file's header
    and its entry, in ``headers`` order then file order.

    ``handles`` are the opened files, in ``headers`` order. They are open only for
    a checkpoint from ``open_checkpoint(path, keep_open=True)``, until :meth:`close`
    (or the end of a ``with`` block); :meth:`file` gives the one behind a header.
    """

    source: Path
    headers: tuple[Header, ...]
    entries: dict[str, tuple[Header, TensorEntry]]
    handles: tuple[CheckpointFile, ...] = field(default=(), repr=False, compare=False)

    @property
    def files(self) -> tuple[Path, ...]:
        """The checkpoint's files, in ``headers`` order."""
        return tuple(header.path for header in self.headers)

    def file(self, header: Header) -> CheckpointFile:
        """The opened file whose header this is."""
        for handle, own in zip(self.handles, self.headers, strict=True):
            if own is header:
                return handle
        raise KeyError(f"{header.path}: not a header of this checkpoint")

    @property
    def closed(self) -> bool:
        """True when no descriptor of this checkpoint is open."""
        return all(handle.closed for handle in self.handles)

    def close(self) -> None:
        """Close every descriptor (mappings already made from them stay valid)."""
        for handle in self.handles:
            handle.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_checkpoint(path: str | os.PathLike[str], *, keep_open: bool = False) -> Checkpoint:
    """Resolve ``path`` to a :class:`Checkpoint`, reading and validating every header.

    ``path`` may be:

    * a ``.json`` file: a sharded index;
    * a directory holding ``model.safetensors.index.json``: that index;
    * a directory holding exactly one ``*.safetensors`` file (hidden files ignored): that file;
    * any other file: a single safetensors file.

    Each file is opened once and must be a regular file. A path that does not
    exist or is not usable (see the module docstring), a directory with no index
    and several ``.safetensors`` files (or none) raise :class:`MappingError`;
    anything wrong in a header or the index raises :class:`HeaderError` naming the
    file and the tensor.

    With ``keep_open=False`` (the default) every descriptor is closed before this
    returns. With ``keep_open=True`` the checkpoint keeps them open for mapping
    exactly the files validated here; close it (``with open_checkpoint(p,
    keep_open=True) as checkpoint: ...``). On an error nothing is left open.
    """
    source = Path(os.fsdecode(path))
    try:
        is_directory = stat.S_ISDIR(os.stat(source).st_mode)
    except OSError:
        is_directory = False  # open_regular below says what the path is
    with contextlib.ExitStack() as stack:
        if is_directory:
            checkpoint = _open_directory(source, stack)
        elif source.suffix == ".json":
            checkpoint = _open_index(source, source, stack)
        else:
            checkpoint = _single(source, source, stack)
        if keep_open:
            stack.pop_all()
    return checkpoint


def _open(path: Path, stack: contextlib.ExitStack) -> tuple[CheckpointFile, Header]:
    """Open one file (closed by ``stack``) and read its header from the descriptor."""
    file = open_regular(path)
    stack.callback(file.close)
    return file, file.read_header()


def _single(source: Path, path: Path, stack: contextlib.ExitStack) -> Checkpoint:
    file, header = _open(path, stack)
    entries = {name: (header, entry) for name, entry in header.tensors.items()}
    return Checkpoint(source=source, headers=(header,), entries=entries, handles=(file,))


def _open_directory(directory: Path, stack: contextlib.ExitStack) -> Checkpoint:
    """Use the directory's index if it has one, else its only safetensors file."""
    index = directory / INDEX_NAME
    if os.path.lexists(index):
        return _open_index(directory, index, stack)
    try:
        files = sorted(p for p in directory.iterdir() if _is_shard_name(p))
    except OSError as exc:
        raise MappingError(f"{directory}: cannot list the directory: {exc.strerror or exc}") from exc
    if len(files) == 1:
        return _single(directory, files[0], stack)
    other_indexes = sorted(p.name for p in directory.glob("*.index.json"))
    hint = (
        f" (other index files here: {', '.join(other_indexes)}; pass one explicitly)" if other_indexes else ""
    )
    if not files:
        raise MappingError(f"{directory}: no {INDEX_NAME} and no *{_SUFFIX} file in the directory{hint}")
    names = ", ".join(p.name for p in files)
    raise MappingError(
        f"{directory}: {len(files)} *{_SUFFIX} files ({names}) but no {INDEX_NAME} to say how they "
        f"combine; pass one file or add an index{hint}"
    )


def _is_shard_name(path: Path) -> bool:
    """A visible ``*.safetensors`` entry (whatever it is: opening it says if it is not a file)."""
    return path.name.endswith(_SUFFIX) and not path.name.startswith(".")


# --------------------------------------------------------------------------- index


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"key {key!r} is given twice")
        result[key] = value
    return result


def _parse_cost(raw: bytes, width: int) -> int:
    """An upper bound on the bytes ``json.loads`` spends on ``raw`` (the decoded text included).

    ``width`` is the bytes per character of the decoded text (CPython stores a string in 1,
    2 or 4 bytes per character, by its widest character: one emoji makes the whole text 4).
    Counted without parsing: the raw bytes, the decoded text, and every string at most
    :data:`_STRING_COST` bytes beyond its text, every other value (each one follows a ``,``,
    ``[``, ``{`` or the start) at most :data:`_VALUE_COST`. Quotes, commas and brackets inside
    strings only make the bound larger. Measured on CPython 3.11: 86 to 125 bytes per
    string, 7 to 40 per number.
    """
    strings = raw.count(b'"') // 2
    others = raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1
    return len(raw) + width * len(raw) + _STRING_COST * strings + _VALUE_COST * others


def _text_width(text: str) -> int:
    """Bytes per character CPython stores ``text`` in (1, 2 or 4), read off its size.

    ``getsizeof`` is a fixed header (tens of bytes) plus a byte, 2 or 4 per character; the
    header is negligible for the texts where the width matters (megabytes).
    """
    if text.isascii():
        return 1
    per_character = (sys.getsizeof(text) - sys.getsizeof("")) / (len(text) + 1)
    return 4 if per_character > 2.5 else 2 if per_character > 1.5 else 1


def _load_index(index: Path) -> dict[str, Any]:
    """The index JSON as a dict; it must be an object.

    Parsing costs at most 64 MiB + 8 x the index's size: an index whose parse would cost
    more (millions of tiny names or numbers, or a text of wide characters) is refused after
    it is decoded (the raw bytes and the text cost at most 5 x its size) and before it is
    parsed. Real indexes cost 4 to 6 x their size (names of tens of characters).
    """
    file = open_regular(index)
    try:
        raw = read_all(file, MAX_HEADER_BYTES)
    except OSError as exc:
        raise MappingError(f"{index}: cannot read the index: {exc.strerror or exc}") from exc
    finally:
        file.close()
    if len(raw) > MAX_HEADER_BYTES:
        raise HeaderError(f"{index}: index file is over {MAX_HEADER_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(f"{index}: index is not valid UTF-8 JSON ({str(exc)[:200]})") from exc
    width = _text_width(text)
    cost, bound = _parse_cost(raw, width), _INDEX_BASE_COST + _INDEX_COST_FACTOR * len(raw)
    if cost > bound:
        wide = f" (its text takes {width} bytes a character)" if width > 1 else ""
        raise HeaderError(
            f"{index}: index of {len(raw)} bytes holds too many values for its size{wide}: parsing it could cost "
            f"{cost // 2**20} MiB, over the bound of 64 MiB + {_INDEX_COST_FACTOR} x its size "
            f"({bound // 2**20} MiB)"
        )
    del raw
    try:
        document = json.loads(text, object_pairs_hook=_object_without_duplicates)
    except (ValueError, RecursionError) as exc:
        raise HeaderError(f"{index}: index is not valid UTF-8 JSON ({str(exc)[:200]})") from exc
    if not isinstance(document, dict):
        raise HeaderError(f"{index}: index is not a JSON object")
    return document


def _weight_map(index: Path) -> dict[str, str]:
    """The index's weight_map: an object of tensor name -> shard file name."""
    weight_map = _load_index(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise HeaderError(f"{index}: index needs a 'weight_map' object of tensor name -> shard file name")
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise HeaderError(
                f"{index}: tensor {name!r}: weight_map value must be a shard file name, got {shard!r}"
            )
        if "\x00" in shard:
            raise HeaderError(f"{index}: tensor {name!r}: shard name {shard!r} holds a NUL character")
        relative = PurePath(shard)
        if not shard or relative.is_absolute() or ".." in relative.parts:
            raise HeaderError(
                f"{index}: tensor {name!r}: shard {shard!r} must be a relative path "
                "inside the index's directory"
            )
    # One spelling per shard, so that "a.safetensors" and "./a.safetensors" are one file.
    return {name: os.path.normpath(shard) for name, shard in weight_map.items()}


def index_shards(index: Path) -> set[str]:
    """The shard file names an index names (normalised); :class:`HeaderError` for a bad index."""
    return set(_weight_map(index).values())


def _read_shards(
    index: Path, weight_map: dict[str, str], stack: contextlib.ExitStack
) -> dict[str, tuple[CheckpointFile, Header]]:
    """Open every shard the index names and validate its header, in name order."""
    first_user = {shard: name for name, shard in reversed(weight_map.items())}
    shards: dict[str, tuple[CheckpointFile, Header]] = {}
    for shard in sorted(first_user):
        shard_path = index.parent / shard
        problem = describe_unusable(shard_path)
        if problem is not None:
            raise HeaderError(
                f"{index}: tensor {first_user[shard]!r}: the index names shard {shard!r}, "
                f"but {shard_path} {problem}"
            )
        shards[shard] = _open(shard_path, stack)
    return shards


def _check_single_home(index: Path, headers: dict[str, Header]) -> None:
    """No tensor name may appear in two shards."""
    home: dict[str, str] = {}
    for shard, header in headers.items():
        for name in header.tensors:
            if name in home:
                raise HeaderError(f"{index}: tensor {name!r} is in two shards: {home[name]!r} and {shard!r}")
            home[name] = shard


def _check_assignments(index: Path, weight_map: dict[str, str], headers: dict[str, Header]) -> None:
    """Every tensor the index assigns to a shard must be in that shard's header."""
    for name, shard in weight_map.items():
        if name in headers[shard].tensors:
            continue
        elsewhere = [other for other, header in headers.items() if name in header.tensors]
        found = f"; it is in {elsewhere[0]!r}" if elsewhere else "; no shard holds it"
        raise HeaderError(
            f"{index}: tensor {name!r}: the index assigns it to shard {shard!r}, whose header lacks it{found}"
        )


def _open_index(source: Path, index: Path, stack: contextlib.ExitStack) -> Checkpoint:
    weight_map = _weight_map(index)
    shards = _read_shards(index, weight_map, stack)
    headers = {shard: header for shard, (_, header) in shards.items()}
    _check_single_home(index, headers)
    _check_assignments(index, weight_map, headers)
    entries = {name: (header, entry) for header in headers.values() for name, entry in header.tensors.items()}
    return Checkpoint(
        source=source,
        headers=tuple(headers.values()),
        entries=entries,
        handles=tuple(file for file, _ in shards.values()),
    )
