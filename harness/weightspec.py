"""Weight-spec JSON files read and sized without torch: what a scenario checks of its spec before anything runs.

A weight spec (``harness/specs/*.json``, format in ``harness/specs/README.md``) lists a model's tensors by
name, shape and dtype. :func:`read_spec` reads one, refusing a path that is not a regular file before it is
opened and JSON nested deeper than :data:`MAX_SPEC_NESTING` before it is parsed; :func:`read_spec_data`
requires its ``tensors`` list of named entries; :func:`spec_problem` says why the model it describes cannot be
represented (more than :data:`MAX_SPEC_TENSORS` tensors, or weights beyond :data:`MAX_MODEL_BYTES`).
:mod:`harness.models.spec` checks every entry and builds the model; :mod:`harness.scenario` uses these rules
when a scenario is loaded or validated.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.fileio.files import JsonNestingError, load_bounded_json, read_bounded_json
from harness.units import TIB, format_size

__all__ = [
    "MAX_MODEL_BYTES",
    "MAX_SPEC_NESTING",
    "MAX_SPEC_TENSORS",
    "NestingError",
    "SpecFileError",
    "dtype_itemsize",
    "load_json_bounded",
    "model_bytes_problem",
    "read_spec",
    "read_spec_data",
    "spec_problem",
]

MAX_MODEL_BYTES = 16 * TIB
"""The most weight bytes a model may have (well within what a file offset, a tensor's byte
count and torch's element count can hold; larger than any disk the harness writes to)."""
MAX_SPEC_TENSORS = 100_000
"""The most tensors a weight spec may list (pi0.5 has 813)."""
MAX_SPEC_NESTING = 16
"""How deep a weight-spec JSON may nest arrays and objects (the format needs 4)."""


def dtype_itemsize(name: Any) -> int | None:
    """Bytes per element of the torch dtype called ``name``; None when there is none."""
    import torch  # only a scenario with a synthetic model or a spec asks: torch knows its dtypes

    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    return dtype.itemsize if isinstance(dtype, torch.dtype) else None


def model_bytes_problem(what: str, nbytes: int) -> str | None:
    """Why ``nbytes`` of weights (``what``, in words) are too many for a model (above :data:`MAX_MODEL_BYTES`);
    else None."""
    if nbytes <= MAX_MODEL_BYTES:
        return None
    return (f"{what} come to {nbytes:,} bytes ({format_size(nbytes)}); a model may have at most "
            f"{MAX_MODEL_BYTES:,} bytes (16 TiB)")


def _entry_bytes(entry: Any) -> tuple[int, int]:
    """``(bytes, largest dimension)`` of one spec entry; (0, 0) for an entry :func:`harness.models.load_spec`
    refuses (no shape of integers >= 0, an unknown dtype), which is not this check's to report."""
    if not isinstance(entry, dict):
        return 0, 0
    shape, size = entry.get("shape"), dtype_itemsize(entry.get("dtype"))
    if size is None or not isinstance(shape, list):
        return 0, 0
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return 0, 0
    return math.prod(shape) * size, max(shape, default=0)


def spec_problem(data: Mapping[str, Any], trim: tuple[str, ...] | set[str]) -> str | None:
    """What makes a weight spec's model unrepresentable (too many tensors, a dimension or a total
    beyond :data:`MAX_MODEL_BYTES`), or None. Counts what the model holds: persistent tensors not
    trimmed (a tied group once) and non-persistent buffers."""
    tensors = data.get("tensors")
    tensors = tensors if isinstance(tensors, list) else []
    buffers = data.get("non_persistent_buffers")
    buffers = buffers if isinstance(buffers, list) else []
    if len(tensors) + len(buffers) > MAX_SPEC_TENSORS:
        return (f"lists {len(tensors) + len(buffers):,} tensors and buffers; a weight spec may list at most "
                f"{MAX_SPEC_TENSORS:,}")
    group_of: dict[str, int] = {}
    tied = data.get("tied")
    for i, group in enumerate(tied if isinstance(tied, list) else []):
        for name in group if isinstance(group, list) else []:
            if isinstance(name, str):
                group_of.setdefault(name, i)
    skip = set(trim)
    groups: set[int] = set()
    total = 0
    for persistent, entries in ((True, tensors), (False, buffers)):
        for entry in entries:
            name = entry.get("name") if isinstance(entry, dict) else None
            if persistent and name in skip:
                continue
            group = group_of.get(name) if persistent and isinstance(name, str) else None
            if group is not None:
                if group in groups:
                    continue
                groups.add(group)
            nbytes, largest = _entry_bytes(entry)
            if largest > MAX_MODEL_BYTES:
                return f"tensor {name!r} has a dimension of {largest:,}; at most {MAX_MODEL_BYTES:,}"
            total += nbytes
    return model_bytes_problem("its tensors", total)


class NestingError(ValueError):
    """Text nests arrays or objects deeper than its format needs (and a parser's recursion can take)."""


@contextlib.contextmanager
def _nesting_refused(limit: int) -> Iterator[None]:
    """JSON nested deeper than ``limit`` (or too deep for the caller's stack) raised as :class:`NestingError`."""
    try:
        yield
    except JsonNestingError as exc:
        raise NestingError(f"arrays and objects nest {exc.depth} levels deep; at most {limit}") from exc
    except RecursionError as exc:  # a caller already deep in its own stack
        raise NestingError(f"arrays and objects nest too deeply to parse; at most {limit}") from exc


def load_json_bounded(text: str, limit: int = MAX_SPEC_NESTING) -> Any:
    """``json.loads(text)``, refusing text that nests more than ``limit`` levels with
    :class:`NestingError` before the parser recurses into it (:func:`harness.fileio.files.load_bounded_json`)."""
    with _nesting_refused(limit):
        return load_bounded_json(text, limit)


def read_spec(path: Path) -> Any:
    """A weight spec's JSON; ``OSError``, ``UnicodeDecodeError``, ``json.JSONDecodeError`` or
    :class:`NestingError` when it cannot be read as one (:func:`harness.fileio.files.read_bounded_json`: a path
    that is not a regular file is refused before it is opened)."""
    with _nesting_refused(MAX_SPEC_NESTING):
        return read_bounded_json(path, MAX_SPEC_NESTING)


class SpecFileError(ValueError):
    """A weight-spec file that cannot be read as one; the message names the file and what is wrong."""


def read_spec_data(path: Path) -> dict[str, Any]:
    """A weight-spec JSON with a list of named tensors; raises :class:`SpecFileError` naming ``path`` when it is
    not one."""
    try:
        data = read_spec(path)
    except UnicodeDecodeError as exc:
        raise SpecFileError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise SpecFileError(f"{path} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
    except NestingError as exc:
        raise SpecFileError(f"{path} is not a weight spec: {exc} (a weight spec needs 4)") from exc
    except OSError as exc:
        raise SpecFileError(f"cannot read {path} ({exc.strerror or exc})") from exc
    tensors = data.get("tensors") if isinstance(data, dict) else None
    if not isinstance(tensors, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                for t in tensors):
        raise SpecFileError(f"{path} is not a weight spec: expected an object whose \"tensors\" "
                            "is a list of objects with a \"name\"")
    assert isinstance(data, dict)
    return data
