"""Reading the files the harness wrote, refusing what is not one: regular files only, UTF-8 text,
JSON nested no deeper than :data:`MAX_JSON_DEPTH`, CSVs with a fixed header and whole, finite rows.

Every reader of results, notes and reports opens files through :func:`read_file`; a file that breaks a
rule is a :class:`~harness.fileio.codec.RecordError` naming it, the row or column and the rule. What the
files hold (the records, the CSVs' columns) is :mod:`harness.results.record`'s.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.fileio.codec import MAX_BYTES, MAX_INTEGER, LongInteger, RecordError
from harness.units import MIB
from weightmap import non_regular_kind

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "MAX_JSON_DEPTH",
    "JsonNestingError",
    "empty_frame",
    "load_bounded_json",
    "not_regular",
    "parse_json",
    "read_csv",
    "read_bounded_json",
    "read_file",
    "read_json_file",
    "read_text_file",
]

MAX_JSON_DEPTH = 64
"""The deepest nesting of objects and lists a results file may have (the records need 6)."""


def not_regular(path: Path) -> str | None:
    """What ``path`` is when it is there and is not a regular file (``stat``, following links; never
    opened), else None (a regular file, or nothing there)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be looked at ({exc.strerror or exc})"
    return non_regular_kind(mode)


def read_file(path: Path) -> bytes:
    """The bytes of ``path``, which must be a regular file (a link to one is followed).

    The file is opened without blocking (``O_NONBLOCK``: a FIFO without a writer, or a
    device, cannot hang the reader) and checked on the open descriptor (``fstat``), so
    nothing can swap it in between. Raises :class:`FileNotFoundError` when there is no
    such file, and a :class:`RecordError` naming the path for anything that is not a
    regular file or cannot be read. Every reader of results and notes opens files through it.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise RecordError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    try:
        kind = non_regular_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise RecordError(f"{path}: {kind}, not a regular file; expected a file the harness wrote")
        chunks = []
        while chunk := os.read(fd, MIB):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise RecordError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)


def read_text_file(path: Path) -> str | None:
    """The UTF-8 text of the regular file ``path`` (:func:`read_file`); ``None`` when there is no such file."""
    try:
        data = read_file(path)
    except FileNotFoundError:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"{path}: not UTF-8 text (byte {exc.start})") from exc


def _parse_int(text: str) -> int | LongInteger:
    digits = len(text.lstrip("-"))
    return LongInteger(digits) if digits > 19 else int(text)  # 19 digits hold every value below 2**63


_JSON_TOKENS = re.compile(r'\\.|["\[\]{}]')


class JsonNestingError(ValueError):
    """JSON text nests objects and lists deeper than its reader allows: ``depth`` is how deep it nests, ``limit``
    the most allowed and ``line`` the line where it first went deeper than that."""

    def __init__(self, depth: int, limit: int, line: int) -> None:
        super().__init__(f"nested deeper than {limit} levels (line {line})")
        self.depth, self.limit, self.line = depth, limit, line


def load_bounded_json(text: str, limit: int = MAX_JSON_DEPTH, parse_int: Callable[[str], Any] | None = None) -> Any:
    """``json.loads(text, parse_int=parse_int)``, refusing text that nests objects and lists more than ``limit``
    levels with :class:`JsonNestingError` before the parser (which recurses once per level) sees it.

    The depth is counted in one pass over the quotes, escapes and brackets, skipping strings, without recursion;
    for text that is not JSON it is at least as deep as the parser would get. ``json.JSONDecodeError``,
    ``ValueError`` and ``RecursionError`` (a caller already deep in its own stack) reach the caller.
    """
    depth = deepest = 0
    line: int | None = None
    in_string = False
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if in_string:
            in_string = token != '"'
        elif token == '"':
            in_string = True
        elif token in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if depth > limit and line is None:
                line = text.count("\n", 0, match.start()) + 1
        elif token in "]}":
            depth -= 1
    if line is not None:
        raise JsonNestingError(deepest, limit, line)
    return json.loads(text, parse_int=parse_int)


def read_bounded_json(path: Path, limit: int = MAX_JSON_DEPTH) -> Any:
    """The JSON of the UTF-8 file at ``path``, nested no deeper than ``limit`` (:func:`load_bounded_json`).

    ``OSError`` when ``path`` is there and is not a regular file (found by :func:`not_regular`, before it is
    opened) or cannot be read; ``UnicodeDecodeError``, and what :func:`load_bounded_json` raises, reach the caller.
    """
    kind = not_regular(path)
    if kind is not None and not kind.startswith("cannot"):
        raise OSError(f"it is {kind}, not a regular file")
    return load_bounded_json(path.read_text(encoding="utf-8"), limit)


def read_json_file(path: Path) -> Any:
    """The JSON in ``path``; a missing, unreadable or malformed file is a :class:`RecordError` naming it.

    Integers too long to be any record's value read as a placeholder
    (:class:`~harness.fileio.codec.LongInteger`) that the codec refuses, naming the key;
    ``NaN`` and ``Infinity`` are refused there too.
    """
    text = read_text_file(path)
    if text is None:
        raise RecordError(f"{path}: not found; is {path.parent} a results directory?")
    return parse_json(text, str(path))


def parse_json(text: str, source: str) -> Any:
    """The JSON ``text`` read from ``source``, as :func:`read_json_file` reads a file's."""
    try:
        return load_bounded_json(text, parse_int=_parse_int)
    except JsonNestingError as exc:
        raise RecordError(f"{source}: not a record: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise RecordError(f"{source}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"{source}: not a record ({' '.join(str(exc).split())})") from exc


_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
"""A number in a results CSV, as Python and pandas write them (``nan``, ``inf`` and the like are not numbers)."""


def _csv_rows(path: Path, columns: tuple[str, ...], expected_rows: int | None) -> list[list[str]]:
    """The data rows of a results CSV, each with every column; the header must be ``columns``, and the
    rows ``expected_rows`` in number where the record states it."""
    text = read_text_file(path)
    if text is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    if not text.strip():
        raise RecordError(f"{path}: empty; expected a header of {', '.join(columns)}")
    if not text.endswith("\n"):
        line = text.count("\n") + 1
        raise RecordError(f"{path}: row {line}: the file ends inside a row (it was cut short)")
    try:
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        header = next(reader)
        rows = list(reader)
    except csv.Error as exc:
        raise RecordError(f"{path}: not a readable CSV ({exc})") from exc
    if tuple(header) != columns:
        raise RecordError(f"{path}: expected the columns {', '.join(columns)}; got {', '.join(header)}")
    for i, row in enumerate(rows):
        if len(row) != len(columns):
            raise RecordError(f"{path}: row {i + 2}: expected {len(columns)} fields, got {len(row)}"
                              + (" (a short or cut row)" if len(row) < len(columns) else ""))
    if expected_rows is not None and len(rows) != expected_rows:
        cut = " (it was cut short)" if len(rows) < expected_rows else ""
        raise RecordError(f"{path}: {len(rows)} data rows, but the strategy's record states {expected_rows} were "
                          f"written{cut}")
    return rows


def read_csv(path: Path, columns: tuple[str, ...], text_column: str, rows: int | None) -> pd.DataFrame:
    """A results CSV: numbers as float64 (an empty cell NaN), ``text_column`` as text (an empty cell NA).

    A number must be finite and below :data:`MAX_BYTES` in a byte column, :data:`MAX_INTEGER`
    elsewhere; ``t_s`` must be present and not negative, byte columns not negative, ``engine``
    at least -1 (no engine). ``rows``: how many data rows the record states (None: not checked).
    """
    import pandas as pd

    frame = pd.DataFrame(_csv_rows(path, columns, rows), columns=list(columns), dtype=object)
    for column in columns:
        cells = frame[column].astype(str)
        empty = cells == ""
        if column == text_column:
            frame[column] = cells.where(~empty, None).astype("string")
            continue
        lowest = -1.0 if column == "engine" else 0.0

        def fail(mask: pd.Series, problem: str, column: str = column, cells: pd.Series = cells) -> RecordError:
            row = int(mask.to_numpy().nonzero()[0][0])
            return RecordError(f"{path}: row {row + 2}, column {column}: {problem} ({cells.iloc[row]!r})")

        if column == "t_s" and empty.any():
            raise fail(empty, "missing")
        bad = ~empty & ~cells.str.fullmatch(_NUMBER)
        if bad.any():
            raise fail(bad, "not a finite number")
        values = pd.to_numeric(cells.where(~empty, None), errors="coerce").astype("float64")
        bound, words = (MAX_BYTES, "less than 2**53 expected") if column.endswith("bytes") else (
            MAX_INTEGER, "at most 2**63 - 1 in size")
        in_range = values.abs() < bound
        if (~empty & ~in_range).any():
            raise fail(~empty & ~in_range, f"out of range ({words})")
        if (values < lowest).any():
            raise fail(values < lowest, f"expected at least {lowest:g}")
        frame[column] = values
    return frame.sort_values("t_s", kind="stable").reset_index(drop=True)


def empty_frame(columns: tuple[str, ...], text_column: str) -> pd.DataFrame:
    """A frame with no rows and the columns of :func:`read_csv`: ``text_column`` as text, the rest float64."""
    import pandas as pd

    return pd.DataFrame({c: pd.Series(dtype="string" if c == text_column else "float64") for c in columns})
