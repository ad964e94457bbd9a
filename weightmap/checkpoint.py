"""Resolve a checkpoint path to a table of tensor name -> (file header, entry).

A checkpoint is one safetensors file or several shards tied together by an index
(``model.safetensors.index.json``)::

    {"metadata": {...}, "weight_map": {"tensor.name": "model-00001-of-00002.safetensors", ...}}

Shard names are relative to the index's directory. Every shard header is read and
validated, and the index is checked against the headers: the index may leave
tensors out (they are taken from the shard headers) but may not send a tensor to a
shard that lacks it, and no tensor may live in two shards.
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from weightmap.errors import HeaderError, MappingError
from weightmap.format import MAX_HEADER_BYTES, Header, TensorEntry, read_header

__all__ = ["INDEX_NAME", "Checkpoint", "open_checkpoint"]

INDEX_NAME = "model.safetensors.index.json"
_SUFFIX = ".safetensors"


@dataclass(frozen=True)
class Checkpoint:
    """Every tensor of a checkpoint, with the validated header of the file that holds it.

    ``source`` is the path the caller passed; ``headers`` holds one validated header per
    file (shards sorted by name); ``entries`` maps each tensor name to its file's header
    and its entry, in ``headers`` order then file order.
    """

    source: Path
    headers: tuple[Header, ...]
    entries: dict[str, tuple[Header, TensorEntry]]

    @property
    def files(self) -> tuple[Path, ...]:
        """The checkpoint's files, in ``headers`` order."""
        return tuple(header.path for header in self.headers)


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Resolve ``path`` to a :class:`Checkpoint`, reading and validating every header.

    ``path`` may be:

    * a ``.json`` file: a sharded index;
    * a directory holding ``model.safetensors.index.json``: that index;
    * a directory holding exactly one ``*.safetensors`` file (hidden files ignored): that file;
    * any other file: a single safetensors file.

    A missing path raises :class:`FileNotFoundError`; a directory with no index and
    several ``.safetensors`` files (or none) raises :class:`MappingError`; anything wrong
    in a header or the index raises :class:`HeaderError` naming the file and the tensor.
    """
    source = Path(os.fsdecode(path))
    if not source.exists():
        raise FileNotFoundError(errno.ENOENT, "checkpoint not found", str(source))
    if source.is_dir():
        return _open_directory(source)
    if source.suffix == ".json":
        return _open_index(source, source)
    return _single(source, read_header(source))


def _single(source: Path, header: Header) -> Checkpoint:
    entries = {name: (header, entry) for name, entry in header.tensors.items()}
    return Checkpoint(source=source, headers=(header,), entries=entries)


def _open_directory(directory: Path) -> Checkpoint:
    """Use the directory's index if it has one, else its only safetensors file."""
    index = directory / INDEX_NAME
    if index.is_file():
        return _open_index(directory, index)
    files = sorted(p for p in directory.iterdir() if _is_shard_file(p))
    if len(files) == 1:
        return _single(directory, read_header(files[0]))
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


def _is_shard_file(path: Path) -> bool:
    return path.name.endswith(_SUFFIX) and not path.name.startswith(".") and path.is_file()


# --------------------------------------------------------------------------- index


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"key {key!r} is given twice")
        result[key] = value
    return result


def _load_index(index: Path) -> dict[str, Any]:
    """The index JSON as a dict; it must be an object."""
    with open(index, "rb") as file:
        raw = file.read(MAX_HEADER_BYTES + 1)
    if len(raw) > MAX_HEADER_BYTES:
        raise HeaderError(f"{index}: index file is over {MAX_HEADER_BYTES} bytes")
    try:
        document = json.loads(raw.decode("utf-8"), object_pairs_hook=_object_without_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
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
        relative = PurePath(shard)
        if not shard or relative.is_absolute() or ".." in relative.parts:
            raise HeaderError(
                f"{index}: tensor {name!r}: shard {shard!r} must be a relative path "
                "inside the index's directory"
            )
    # One spelling per shard, so that "a.safetensors" and "./a.safetensors" are one file.
    return {name: os.path.normpath(shard) for name, shard in weight_map.items()}


def _read_shards(index: Path, weight_map: dict[str, str]) -> dict[str, Header]:
    """Read and validate the header of every shard the index names, in name order."""
    first_user = {shard: name for name, shard in reversed(weight_map.items())}
    headers: dict[str, Header] = {}
    for shard in sorted(first_user):
        shard_path = index.parent / shard
        if not shard_path.is_file():
            raise HeaderError(
                f"{index}: tensor {first_user[shard]!r}: the index names shard {shard!r}, "
                f"but {shard_path} does not exist"
            )
        headers[shard] = read_header(shard_path)
    return headers


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


def _open_index(source: Path, index: Path) -> Checkpoint:
    weight_map = _weight_map(index)
    headers = _read_shards(index, weight_map)
    _check_single_home(index, headers)
    _check_assignments(index, weight_map, headers)
    entries = {name: (header, entry) for header in headers.values() for name, entry in header.tensors.items()}
    return Checkpoint(source=source, headers=tuple(headers.values()), entries=entries)
