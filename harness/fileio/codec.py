"""One strict codec for every record the harness writes: JSON from a frozen dataclass's fields and back.

:func:`encode` writes a record as JSON-able data; :func:`decode` reads it back into its
class, driven by the fields and their type hints alone: ``int``, ``float``, ``str``,
``bool``, :class:`~pathlib.Path` (a string), ``X | None``, ``tuple[X, ...]`` (a list),
``dict[str, X]`` (an object), ``dict[str, Any]`` (any object, not checked) and nested
dataclasses. Nothing is written out by hand per class.

Paths: a :class:`~pathlib.Path` value, and a ``str`` field marked ``path`` (a ``tuple[str, ...]`` of them
too), are written relative to the repository root where inside it and read back resolved against it
(:mod:`harness.fileio.paths`), so that a record names no folder of the machine that made it and reads
alike in any checkout; a path outside the root, and every one a record of an earlier layout holds, is
absolute and reads as it is.

Reading is strict, so that no misspelt, hostile or corrupt file reaches a reader. A value
that is not what its field means is a :class:`RecordError` naming the file, the key's path
and what is wrong (``summary.json: strategies.map.engines[3]: missing key 'end_s'``):

- an object must hold exactly its fields' keys (an unknown key is reported first, then a
  missing one);
- an integer is a whole number (never a bool) below :data:`MAX_INTEGER` in size, a number
  any finite int or float (read as a float); a key whose name has the word ``bytes`` is a
  byte count, below :data:`MAX_BYTES`; neither is negative unless the field is ``signed``
  (bytes, counts, indices and times never are); a too-long integer reaches here as a
  :class:`LongInteger` (:func:`harness.fileio.files.parse_json`) and is refused by its size.

What one field adds is declared next to it, in its metadata (:data:`RULES`), e.g. ``field(default=None,
metadata={"since": 4})``: ``since``, the layout version that added the key (a record of an older layout holds
no such key and reads as the field's default); ``absent_until``, the last version in which the key may be left
out (read as the default); ``until``, the last layout version that holds the key, which a later layout
dropped (a record of a later layout holding it is refused as an unknown key; it is never written, so a field
with it needs a default), with ``moved_to``, the dotted key path (from the object that holds the key) where
the value is held since: where an older record holds both, they must agree, and the field reads as its
default, the value being held once; where the path holds nothing (``null``, or absent at that layout) the
field keeps what the older record says; ``signed``: the value may be negative; ``null_as``: what ``null``
reads as (for a
field that is not optional); ``path``: the ``str`` value names a file (see Paths above); ``check``: a rule of
the value, ``value -> problem or None``; ``check_keys``: the same for each key of an object; ``limit``: the
:class:`Limit` range a number must lie in (it replaces the kind and range tests above, and its own words say
what is expected); ``key``: the key the field is written and read under where it is not the field's name
(:func:`json_key`: a field renamed in code keeps its files' key, and the kind rules above go by the key). A
field marked ``version`` holds the layout version: written first, as its default (the layout this code
writes), and read as the version the record is read at. A rule that spans fields is a class's
``after_decode(version, fail)`` method, which the codec calls on the record it read and whose result it
returns (an upgrade of an older layout, say); ``fail(path, problem)`` makes the error for a key path below it.

The same reader serves another strict format, a TOML scenario (:mod:`harness.scenario`): its caller
passes ``optional=True`` (a key whose field has a default may be left out; ``required`` names keys
that may not although their field has one) and a :class:`Style`, which chooses the error class and
how the messages read (:data:`TABLE_STYLE`'s: ``<file>: build.engine: unknown key (did you mean
'engines'?; known: ...)``, ``... got "8" (str)``). :func:`decode_fields` reads some fields of a class
from an object that also holds keys its caller reads itself.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import types
import typing
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Self, TypeVar

from harness.errors import HarnessError
from harness.fileio.paths import record_path, resolved_path

__all__ = [
    "MAX_BYTES",
    "MAX_INTEGER",
    "NAME",
    "RECORD_STYLE",
    "TABLE_STYLE",
    "Limit",
    "LongInteger",
    "Record",
    "RULES",
    "RecordError",
    "Style",
    "check_name",
    "decode",
    "decode_fields",
    "describe",
    "describe_typed",
    "encode",
    "json_key",
    "field_since",
    "field_until",
    "key_at",
    "name_problem",
    "suggestion",
]

T = TypeVar("T")

NAME = re.compile(r"[a-z0-9_-]+")
"""What a results name and a strategy name may be: they name ``results/<name>/``, the report
and figures beside it, and the files of each strategy, so no path separator, dot or ``..``."""

MAX_INTEGER = 2**63
"""Every integer read is smaller than this in size: what a 64-bit count (the kernel's, numpy's) holds."""

MAX_BYTES = 2**53
"""Every byte count read is smaller than this (8 PiB, far above any machine's memory): the figures and
the samples compute in float64, which holds every whole number up to it exactly."""


class RecordError(HarnessError, ValueError):
    """A results file is not in a layout this harness reads; the message names the file and the key."""


class LongInteger:
    """A JSON integer too long to be any value of a record; kept as its digit count (never converted)."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __str__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def describe(value: Any) -> str:
    """``value`` as JSON, cut to 60 characters, for a message; never fails."""
    try:
        text = json.dumps(value, default=str)
    except (ValueError, RecursionError):  # a value nested past what json.dumps walks
        text = type(value).__name__
    return (text[:57] + "...") if len(text) > 60 else text


def describe_typed(value: Any) -> str:
    """``value`` as JSON cut to 60 characters and its type (``"8" (str)``), for a message; never fails (a
    huge integer is described by its size, a value that cannot be rendered by its type)."""
    kind = type(value).__name__
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of about {int((value.bit_length() - 1) * math.log10(2)) + 1} digits ({kind})"
    try:
        text = json.dumps(value, default=str)
    except (ValueError, RecursionError):
        return f"a {kind} that cannot be shown ({kind})"
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({kind})"


def suggestion(key: str, known: Collection[str]) -> str:
    """`` (did you mean 'cache'?; known: a, b)`` for an unknown ``key``, or `` (known: a, b)`` when none is close."""
    close = difflib.get_close_matches(key, sorted(known), n=1)
    names = ", ".join(sorted(known))
    return f" (did you mean {close[0]!r}?; known: {names})" if close else f" (known: {names})"


def _show_number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.12g}"


@dataclasses.dataclass(frozen=True)
class Limit:
    """The range a number must lie in: ``low`` to ``high``, both included unless ``low_open`` (then
    ``> low``); an ``integer`` limit takes integers only (never a bool), others any finite number.
    ``unit`` and ``note`` go into the message. A field's ``limit`` rule (see the module docstring)."""

    low: float
    high: float
    integer: bool = False
    low_open: bool = False
    unit: str = ""
    note: str = ""

    def expected(self) -> str:
        """``expected an integer >= 1 and <= 1024`` / ``expected a number > 0 and <= 604800 (s, a week)``."""
        kind = "an integer" if self.integer else "a number"
        span = f"{'>' if self.low_open else '>='} {_show_number(self.low)} and <= {_show_number(self.high)}"
        extra = ", ".join(part for part in (self.unit, self.note) if part)
        return f"expected {kind} {span}" + (f" ({extra})" if extra else "")

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is of the right kind and in range; compared exactly, so an integer too
        large for a float is refused rather than overflowing."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high


@dataclasses.dataclass(frozen=True)
class Style:
    """How :func:`decode` words and raises its errors; :data:`RECORD_STYLE` (a JSON record's) unless told.

    ``error`` makes the exception from the whole message; ``describe`` shows a value read;
    ``null``: the format has null (a wrong value of an optional field is then ``expected X or null``);
    ``object``: what the format calls an object; ``resolve_paths``: a path read is resolved against the
    repository root (:func:`~harness.fileio.paths.resolved_path`), else kept as written (a TOML scenario's
    reader resolves its paths by its own rules); ``by_key``: an unknown or a missing key is reported at
    the key, the first unknown one in the data's order with a :func:`suggestion`, the first missing one
    in the fields' order (``required key is missing``), and a list of plain values that is not one is
    reported as a whole (``expected a list of strings``); else at the object, the first of each in sorted
    order with how many more, and a list's item at its index.
    """

    error: Callable[[str], Exception] = RecordError
    describe: Callable[[Any], str] = describe
    null: bool = True
    object: str = "an object"
    by_key: bool = False
    resolve_paths: bool = True


RECORD_STYLE = Style()
"""How a results record's errors read: ``summary.json: strategies.map: missing key 'wall_s'``."""

TABLE_STYLE = Style(describe=describe_typed, null=False, object="a table", by_key=True, resolve_paths=False)
"""How a TOML table's errors read (its caller passes its own ``error`` class with :func:`dataclasses.replace`)."""


def name_problem(name: str, what: str) -> str | None:
    """What is wrong with ``name`` as a name of files (:data:`NAME`), ``what`` saying what it names; else None."""
    if NAME.fullmatch(name):
        return None
    return f"expected letters a-z, digits, '_' or '-' only ({what}), got {describe(name)}"


def check_name(name: str, where: str, what: str) -> str:
    """``name`` when it obeys :data:`NAME`; else a :class:`RecordError` ``<where>: expected ...``."""
    problem = name_problem(name, what)
    if problem:
        raise RecordError(f"{where}: {problem}")
    return name


class Record:
    """A record's :func:`encode` and :func:`decode` as its methods, for a frozen dataclass deriving from it."""

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-able data (:func:`encode`)."""
        return encode(self)  # type: ignore[no-any-return]

    @classmethod
    def from_json(cls, data: Any, source: str, where: str = "", version: int | None = None) -> Self:
        """The record in ``data`` (:func:`decode`)."""
        return decode(cls, data, source=source, where=where, version=version)


# --------------------------------------------------------------------------- writing


def encode(value: Any) -> Any:
    """``value`` as JSON-able data: a dataclass as an object of its fields in order (its ``version`` field
    first, as its default), a tuple as a list, a path as a string relative to the repository root where inside
    it (:func:`~harness.fileio.paths.record_path`; so is a ``str`` of a field marked ``path``), an object's
    values encoded."""
    return _encode(value, path=False)


def _encode(value: Any, path: bool) -> Any:
    """:func:`encode`; ``path``: ``value`` is held by a field marked ``path``, so a string in it is a path."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            if f.metadata.get("version"):
                out = {json_key(f): f.default, **out}
            elif "until" not in f.metadata:  # a key a later layout dropped is never written
                out[json_key(f)] = _encode(getattr(value, f.name), bool(f.metadata.get("path")))
        return out
    if isinstance(value, tuple | list):
        return [_encode(v, path) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v, path) for k, v in value.items()}
    if isinstance(value, Path) or (path and isinstance(value, str)):
        return record_path(value)
    return value


# --------------------------------------------------------------------------- reading


class _Place:
    """Where a value is being read: the file and the key's path, for messages."""

    def __init__(self, source: str, path: str, style: Style) -> None:
        self.source, self.path, self.style = source, path, style

    def key(self, key: str) -> _Place:
        return _Place(self.source, f"{self.path}.{key}" if self.path else key, self.style)

    def item(self, index: int) -> _Place:
        return _Place(self.source, f"{self.path}[{index}]", self.style)

    def error(self, problem: str) -> Exception:
        return self.style.error(f"{self.source}: {self.path or '<top level>'}: {problem}")


RULES = frozenset({"since", "absent_until", "until", "moved_to", "signed", "null_as", "version", "check", "check_keys",
                   "limit", "key", "path"})
"""The metadata keys of a field the codec reads (see the module docstring); any other is a mistake."""

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The fields' types of ``cls``; a metadata key outside :data:`RULES` is refused (a misspelt rule)."""
    if cls not in _HINTS:
        for f in dataclasses.fields(cls):
            unknown = set(f.metadata) - RULES
            if unknown:
                raise TypeError(f"{cls.__name__}.{f.name}: unknown rule {sorted(unknown)[0]!r} (known: "
                                f"{', '.join(sorted(RULES))})")
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def json_key(f: dataclasses.Field[Any]) -> str:
    """The key field ``f`` is written and read under: its ``key`` rule where it has one (a field renamed in code
    whose files keep the old key), else its name."""
    return str(f.metadata.get("key", f.name))


def _since(f: dataclasses.Field[Any]) -> int:
    return int(f.metadata.get("since", 1))


def field_until(f: dataclasses.Field[Any]) -> int | None:
    """The last layout version that holds ``f``'s key, where a later one dropped it (its ``until``); else ``None``."""
    until = f.metadata.get("until")
    return None if until is None else int(until)


def key_at(data: Any, path: str) -> Any:
    """The value at the dotted key ``path`` of the JSON object ``data``; ``None`` where any key on the way is
    absent or holds no object."""
    for key in path.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def field_since(cls: type, name: str) -> int:
    """The layout version that added the key ``name`` of a ``cls`` record: its field's ``since`` (1 where it says
    none), so that a reader asks whether a record holds a key by its layout without restating the version."""
    for f in dataclasses.fields(cls):
        if json_key(f) == name:
            return _since(f)
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def _default(f: dataclasses.Field[Any], place: _Place) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise place.error(f"no default for a key this layout has no {f.name!r} of")  # a class declared wrongly


def _version_field(cls: type) -> dataclasses.Field[Any] | None:
    return next((f for f in dataclasses.fields(cls) if f.metadata.get("version")), None)


def _read_version(cls: type, data: Any, place: _Place) -> int:
    """The layout version ``data`` says it is in (its ``version`` field's key; absent: version 1)."""
    f = _version_field(cls)
    if f is None or not isinstance(data, dict):
        return 1
    version, current = data.get(json_key(f), 1), int(f.default)  # type: ignore[arg-type]
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= current:
        raise place.key(json_key(f)).error(f"this harness reads {json_key(f)} versions 1 to {current}, got "
                                      f"{place.style.describe(version)}")
    return version


def decode(cls: type[T], data: Any, *, source: str, where: str = "", version: int | None = None,
           style: Style = RECORD_STYLE, optional: bool = False, required: Collection[str] = ()) -> T:
    """The ``cls`` record in JSON ``data`` read from ``source`` at key path ``where``; see the module docstring.

    ``version`` is the layout ``data`` is in; ``None``: what its ``version`` field's key says (absent:
    version 1), or 1 for a class without one. ``optional``: a key whose field has a default may be left
    out, unless it is one of ``required``. Raises ``style``'s error (:class:`RecordError`) naming the
    file and the key.
    """
    place = _Place(source, where, style)
    if version is None:
        version = _read_version(cls, data, place)
    return _object(cls, data, place, version, _Keys(optional, frozenset(required)))  # type: ignore[no-any-return]


def decode_fields(cls: type, data: Any, names: Collection[str], *, source: str, where: str = "",
                  others: Collection[str] = (), style: Style = RECORD_STYLE, optional: bool = False) -> dict[str, Any]:
    """The values of ``cls``'s fields ``names`` read from the object ``data`` as :func:`decode` reads them
    (version 1, no ``after_decode``), for a caller that reads the object's ``others`` keys itself: ``data``
    may hold those too (left unread), and no other key."""
    place = _Place(source, where, style)
    fields = [f for f in dataclasses.fields(cls) if json_key(f) in names]
    return _values(cls, fields, data, place, 1, _Keys(optional, frozenset(), frozenset(others)))


@dataclasses.dataclass(frozen=True)
class _Keys:
    """Which keys an object may leave out (``optional``: those of fields with a default, but ``required``)
    and which others it may hold (read by the caller)."""

    optional: bool = False
    required: frozenset[str] = frozenset()
    others: frozenset[str] = frozenset()


_STRICT = _Keys()


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _object(cls: type, data: Any, place: _Place, version: int, keys: _Keys = _STRICT) -> Any:
    record = cls(**_values(cls, list(dataclasses.fields(cls)), data, place, version, keys))
    after = getattr(record, "after_decode", None)
    if after is not None:
        record = after(version, lambda path, problem: place.key(path).error(problem))
    return record


def _values(cls: type, fields: list[dataclasses.Field[Any]], data: Any, place: _Place, version: int,
            keys: _Keys) -> dict[str, Any]:
    """The values of ``fields`` read from the object ``data``: its keys checked first (unknown, then missing)."""
    if not isinstance(data, dict):
        raise place.error(f"expected {place.style.object}, got {place.style.describe(data)}")
    hints = _hints(cls)
    present = [f for f in fields if _since(f) <= version <= (field_until(f) or version)]
    required = [json_key(f) for f in present if version > f.metadata.get("absent_until", 0)
                and not (keys.optional and _has_default(f) and json_key(f) not in keys.required)]
    _check_keys(data, [json_key(f) for f in present] + sorted(keys.others), required, place)
    values: dict[str, Any] = {}
    for f in fields:
        key = json_key(f)
        at = place.key(key)
        if f.metadata.get("version"):
            values[f.name] = version
        elif key not in data:
            values[f.name] = _default(f, at)
        elif data[key] is None and "null_as" in f.metadata:
            values[f.name] = f.metadata["null_as"]
        else:
            values[f.name] = _value(hints[f.name], data[key], at, f, version)
            if "moved_to" in f.metadata:
                values[f.name] = _moved(f, values[f.name], data, at)
    return values


def _moved(f: dataclasses.Field[Any], value: Any, data: dict[str, Any], place: _Place) -> Any:
    """An older layout's ``value`` of a key a later layout dropped (``until``): the field's default where its
    ``moved_to`` path holds the value (they must agree), else ``value``, the only one the record holds."""
    path = str(f.metadata["moved_to"])
    now = key_at(data, path)
    if now is None:
        return value
    if now != value or isinstance(now, bool) != isinstance(value, bool):
        raise place.error(f"expected {place.style.describe(now)}, the value {path} records, got "
                          f"{place.style.describe(value)}")
    return _default(f, place)


def _check_keys(data: dict[Any, Any], known: list[str], required: list[str], place: _Place) -> None:
    """Refuse a key of ``data`` not ``known``, then a ``required`` one it lacks, as ``place``'s style says."""
    if place.style.by_key:
        for key in data:
            if key not in known:
                raise place.key(key).error(f"unknown key{suggestion(key, known)}")
        for key in required:
            if key not in data:
                raise place.key(key).error("required key is missing")
        return
    for problem, keys in (("unknown", set(data) - set(known)), ("missing", set(required) - set(data))):
        if keys:
            first, more = sorted(keys)[0], len(keys) - 1
            raise place.error(f"{problem} key {first!r}" + (f" (and {more} more)" if more else ""))


_KINDS: dict[Any, str] = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
                          Path: "a string"}


def _value(tp: Any, value: Any, place: _Place, f: dataclasses.Field[Any], version: int, whole: bool = True) -> Any:
    """``value`` read as type ``tp`` for field ``f``: its range rules apply to the items of a list or an object
    too, its ``check`` to the ``whole`` value only."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    null = False
    if origin in (typing.Union, types.UnionType):
        arms = [a for a in args if a is not type(None)]
        if value is None and len(arms) < len(args):
            return None
        tp, null = arms[0], True
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    result = _typed(tp, origin, args, value, place, f, version, null)
    check = f.metadata.get("check") if whole else None
    if check is not None and (problem := check(result)):
        raise place.error(problem)
    return result


_PLURALS: dict[Any, str] = {int: "integers", float: "numbers", str: "strings", bool: "true or false values",
                            Path: "strings"}


def _wrong(place: _Place, what: str, value: Any, null: bool) -> Exception:
    """``expected <what>, got <value>`` (``<what> or null`` where the value may be null and the format has null)."""
    either = " or null" if null and place.style.null else ""
    return place.error(f"{what}{either}, got {place.style.describe(value)}")


def _is_kind(tp: Any, value: Any) -> bool:
    """Whether ``value`` is of the plain kind ``tp`` (:data:`_KINDS`): an int never a bool, a float finite."""
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if tp in (str, Path):
        return isinstance(value, str)
    return tp is bool and isinstance(value, bool)


def _typed(tp: Any, origin: Any, args: tuple[Any, ...], value: Any, place: _Place, f: dataclasses.Field[Any],
           version: int, null: bool) -> Any:
    if dataclasses.is_dataclass(tp):
        return _object(tp, value, place, version)  # type: ignore[arg-type]
    if origin is tuple:
        if place.style.by_key and args[0] in _PLURALS and not (
                isinstance(value, list) and all(_is_kind(args[0], v) for v in value)):
            raise _wrong(place, f"expected a list of {_PLURALS[args[0]]}", value, null)
        if not isinstance(value, list):
            raise _wrong(place, "expected a list", value, null)
        return tuple(_element(args[0], v, place.item(i), f, version) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise _wrong(place, f"expected {place.style.object}", value, null)
        if args[1] is Any:
            return value
        check_keys = f.metadata.get("check_keys")
        out = {}
        for key, item in value.items():
            if check_keys is not None and (problem := check_keys(key)):
                raise place.key(key).error(problem)
            out[key] = _element(args[1], item, place.key(key), f, version)
        return out
    if tp is Any:
        return value
    limit = f.metadata.get("limit")
    if tp in (int, float) and limit is not None:
        if isinstance(value, LongInteger) or not limit.accepts(value):
            raise _wrong(place, limit.expected(), value, null)
        return float(value) if tp is float else value
    if tp in (int, float) and isinstance(value, LongInteger):
        kind = "an integer" if tp is int else "a number"
        raise place.error(f"{kind} of {value.digits} digits is out of range (at most 2**63 - 1 in size)")
    if tp not in _KINDS:
        raise TypeError(f"{place.path}: the codec does not read {tp!r}")
    if not _is_kind(tp, value):
        raise _wrong(place, f"expected {_KINDS[tp]}", value, null)
    if tp in (int, float):
        _in_range(value, place, f)
        return float(value) if tp is float else value
    if tp is Path or (tp is str and f.metadata.get("path")):
        text = resolved_path(value) if place.style.resolve_paths else value
        return Path(text) if tp is Path else text
    return value


def _element(tp: Any, value: Any, place: _Place, f: dataclasses.Field[Any], version: int) -> Any:
    """An item of a list or a value of an object: read as ``tp`` under ``f``'s range rules, without its check."""
    return _value(tp, value, place, f, version, whole=False)


def _in_range(value: int | float, place: _Place, f: dataclasses.Field[Any]) -> None:
    """Refuse a value its key cannot mean (negative unless ``signed``, a byte count of :data:`MAX_BYTES`
    or more) or the machine cannot hold (:data:`MAX_INTEGER`); ``value`` is an int or a finite float."""
    if "bytes" in json_key(f).split("_") and abs(value) >= MAX_BYTES:
        raise place.error(f"{place.style.describe(value)} bytes is out of range (less than 2**53, 8 PiB, expected)")
    if abs(value) >= MAX_INTEGER:
        raise place.error(f"{place.style.describe(value)} is out of range (at most 2**63 - 1 in size)")
    if value < 0 and not f.metadata.get("signed"):
        raise place.error(f"expected a value of at least 0, got {place.style.describe(value)}")
