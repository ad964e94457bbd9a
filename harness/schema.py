"""What a scenario file and a results record hold, printed from the dataclasses' fields: ``python -m harness schema``.

:func:`scenario_schema` lists every key of a scenario file (:mod:`harness.scenario`), one line each: its
dotted key (``run.cache``; ``reference.label`` for each ``[[reference]]`` table), what it takes (the field's
type, the choices of its ``check`` where that is a :class:`~harness.scenario_rules.OneOf`, the range of its
``limit``; :mod:`harness.scenario`'s docstring quotes it with the registry's words in place of the choices a
registry keeps) and its default (``required`` where the field has none; what the loader puts in its place where
it computes one, :data:`LOADER_DEFAULTS`). :func:`layout_history` lists, for each layout version of
``summary.json`` (:data:`~harness.results.record.LAYOUT_VERSION`), the keys it added (each field's
``since``), the keys it made required (``absent_until``) and those it dropped (``until``), by their path in
the record: ``*`` for any key of an object (a strategy's name), ``[]`` for any item of a list.

Both are read from the fields alone, so they cannot differ from what the loader and the codec read; what a
key means is said where its field is declared and in :mod:`harness.scenario`'s and
:mod:`harness.results.layouts`' docstrings, which the tests check against these listings. Imports no torch.
"""

from __future__ import annotations

import dataclasses
import textwrap
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.fileio.codec import Limit, field_until, json_key, key_at
from harness.results.record import LAYOUT_VERSION, RunRecord
from harness.scenario import TABLES, TOP_KEYS, Scenario
from harness.scenario_rules import OneOf

__all__ = [
    "LOADER_DEFAULTS",
    "RecordKey",
    "ScenarioKey",
    "at_layout",
    "layout_history",
    "record_keys",
    "scenario_keys",
    "scenario_schema",
    "toml_text",
]

_LINE = 104
"""The longest line :func:`scenario_schema` and :func:`layout_history` write (a docstring quotes them indented
by 4, within the project's 120 columns)."""

LOADER_DEFAULTS: dict[str, str] = {
    "checkpoint.path": "data/<model key>.safetensors; transformers: the config's folder",
    "checkpoint.generate": "true without a path, false with one or for factory and transformers",
}
"""The keys whose default :func:`harness.scenario.load_scenario` computes from the rest of the file rather than
taking their field's, and what it computes, as the listing shows it."""


def _arms(tp: Any) -> tuple[Any, bool]:
    """``tp`` without ``None``, and whether ``None`` was one of its arms."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        arms = [a for a in typing.get_args(tp) if a is not type(None)]
        return (arms[0] if len(arms) == 1 else tp), len(arms) < len(typing.get_args(tp))
    return tp, False


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


# --------------------------------------------------------------------------- scenario


@dataclasses.dataclass(frozen=True)
class ScenarioKey:
    """One key of a scenario file: ``key`` dotted (``build.engines``), ``takes`` in words, ``default`` as TOML
    (``required``; ``absent`` where leaving it out means none)."""

    key: str
    takes: str
    default: str

    def line(self, width: int) -> str:
        """The key's line of :func:`scenario_schema`, the key in a column ``width`` wide, wrapped under the next."""
        text = f"{self.takes} [{self.default}]"
        return textwrap.fill(text, _LINE, initial_indent=f"{self.key:<{width}}", subsequent_indent=" " * width,
                             break_on_hyphens=False, break_long_words=False)


_KINDS = {str: "string", int: "integer", float: "number", bool: "true | false", Path: "path"}


def toml_text(value: Any) -> str:
    """``value`` as a scenario file writes it (``None``, which a file writes by leaving the key out: ``absent``)."""
    if value is None:
        return "absent"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | Path):
        return f'"{value}"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    return repr(value)


def _takes(f: dataclasses.Field[Any], tp: Any, registered: bool) -> str:
    """What ``f`` (of type ``tp``) takes, in words: its choices (those a registry keeps only where ``registered``,
    else where they are registered), its range, else its type."""
    tp, _ = _arms(tp)
    check, limit = f.metadata.get("check"), f.metadata.get("limit")
    if isinstance(check, OneOf) and check.registry is not None and not registered:
        return f"one of {check.registry}"
    if isinstance(check, OneOf):
        return " | ".join(toml_text(c) for c in check.choices)
    if isinstance(limit, Limit):
        return limit.expected().removeprefix("expected ")
    item = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else tp
    if item not in _KINDS:
        raise TypeError(f"{f.name}: a scenario key of type {tp}, which the schema listing cannot name")
    return f"list of {_KINDS[item]}s" if item is not tp else _KINDS[tp]


def _table_keys(cls: type, prefix: str, registered: bool, names: tuple[str, ...] | None = None
                ) -> Iterator[ScenarioKey]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if names is not None and json_key(f) not in names:
            continue
        key = prefix + json_key(f)
        default = (LOADER_DEFAULTS[key] if key in LOADER_DEFAULTS else
                   toml_text(_default(f)) if _has_default(f) else "required")
        yield ScenarioKey(key, _takes(f, hints[f.name], registered), default)


def scenario_keys(registered: bool = True) -> list[ScenarioKey]:
    """Every key of a scenario file, in the order the loader reads them: the top-level keys, then each table's;
    ``registered`` False: a key whose choices a registry keeps (the backends,
    :class:`~harness.scenario_rules.OneOf`'s ``registry``) says where they are registered instead of listing them."""
    keys = list(_table_keys(Scenario, "", registered, TOP_KEYS))
    for table, cls in TABLES.items():
        keys.extend(_table_keys(cls, f"{table}.", registered))
    return keys


def scenario_schema(registered: bool = True) -> str:
    """The scenario keys as text: one line per key (wrapped under its second column), ``key  takes [default]``.

    ``registered`` False gives what :mod:`harness.scenario`'s docstring quotes: every line as listed, but a key
    whose choices a registry keeps names the registry (:func:`scenario_keys`), so that a backend registered
    (:data:`harness.backends.BACKENDS`) needs no edit of that docstring; ``python -m harness schema scenario`` lists
    the choices registered now."""
    keys = scenario_keys(registered)
    width = max(len(k.key) for k in keys) + 2
    return "\n".join(k.line(width) for k in keys) + "\n"


# --------------------------------------------------------------------------- results layout


@dataclasses.dataclass(frozen=True)
class RecordKey:
    """One key of a record: its ``path`` (``strategies.*.engines[].compile_s``), the layout version that added it
    (``since``: the key's own, or the key holding it where that came later), the last version that may leave
    it out (``absent_until``, 0 where none may) and the last version that holds it, where a later one dropped it
    (``until``, else ``None``), and the last version that holds the key holding it (``held_until``, ``None``
    where no key holding it was dropped)."""

    path: str
    since: int
    absent_until: int
    field: dataclasses.Field[Any]
    until: int | None = None
    held_until: int | None = None


def _record_class(tp: Any) -> tuple[type | None, str]:
    """The record class ``tp`` holds (through ``None``, lists and objects) and the path suffix that reaches it."""
    tp, _ = _arms(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple and args:
        inner, suffix = _record_class(args[0])
        return inner, "[]" + suffix
    if origin is dict and len(args) == 2:
        inner, suffix = _record_class(args[1])
        return inner, ".*" + suffix
    return (tp, "") if dataclasses.is_dataclass(tp) and isinstance(tp, type) else (None, "")


def record_keys(cls: type = RunRecord, prefix: str = "", since: int = 1,
                held_until: int | None = None) -> Iterator[RecordKey]:
    """Every key of a ``cls`` record and of the records it holds, depth first in the fields' order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + json_key(f)
        added = max(since, int(f.metadata.get("since", 1)))
        yield RecordKey(path, added, int(f.metadata.get("absent_until", 0)), f, field_until(f), held_until)
        inner, suffix = _record_class(hints[f.name])
        if inner is not None:
            held = min((u for u in (held_until, field_until(f)) if u is not None), default=None)
            yield from record_keys(inner, f"{path}{suffix}.", added, held)


def at_layout(cls: type, data: dict[str, Any], version: int) -> dict[str, Any]:
    """``data``, the JSON of a ``cls`` record, as layout ``version`` wrote it: without the keys a later layout added
    (each field's ``since``), with those a later layout dropped (``until``) where ``version`` held them, their value
    taken from where it is held since (``moved_to``), in the records it holds too. What is left is what the codec
    reads at ``version``."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        key, until = json_key(f), field_until(f)
        if int(f.metadata.get("since", 1)) > version or (until is not None and until < version):
            continue
        if until is not None and "moved_to" in f.metadata:
            out[key] = key_at(data, _held_now(cls, str(f.metadata["moved_to"])))
        elif key in data:
            out[key] = _at_layout(hints[f.name], data[key], version)
    return out


def _held_now(cls: type, path: str) -> str:
    """Where a ``cls`` record holds now what ``path`` named when it was declared: its first key followed where a
    later layout moved that key too (``moved_to`` of a dropped key)."""
    head, dot, rest = path.partition(".")
    for f in dataclasses.fields(cls):
        if json_key(f) == head and field_until(f) is not None and "moved_to" in f.metadata:
            return _held_now(cls, str(f.metadata["moved_to"]) + dot + rest)
    return path


def _at_layout(tp: Any, value: Any, version: int) -> Any:
    tp, _ = _arms(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if value is None:
        return None
    if origin is tuple and args and isinstance(value, list):
        return [_at_layout(args[0], item, version) for item in value]
    if origin is dict and len(args) == 2 and isinstance(value, dict):
        return {key: _at_layout(args[1], item, version) for key, item in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type) and isinstance(value, dict):
        return at_layout(tp, value, version)
    return value


def _wrapped(head: str, paths: list[str]) -> list[str]:
    return textwrap.wrap(f"{head} {', '.join(paths)}", _LINE, subsequent_indent="    ", break_on_hyphens=False,
                         break_long_words=False)


def layout_history(cls: type = RunRecord, version: int = LAYOUT_VERSION) -> str:
    """For each layout from 2 to ``version``, the keys of a ``cls`` record it added and those it made required.

    A key added with the key that holds it (the fields of a record added whole) is not listed apart; the keys
    of one version are listed the record's own first, then those of the records it holds.
    """
    keys = sorted(record_keys(cls), key=lambda k: k.path.count("."))  # the record's own keys first
    lines = [f"Layout 1: every key not listed below (a summary.json with no {_version_key(cls)!r} key)."]
    for v in range(2, version + 1):
        added = [k.path for k in keys if k.since == v and int(k.field.metadata.get("since", 1)) == v]
        required = [k.path for k in keys if k.absent_until == v - 1 and k.absent_until > 0 and k.since <= v
                    and (k.held_until is None or k.held_until >= v)]  # where the key holding it is held
        dropped = [k.path for k in keys if k.until == v - 1]
        lines.extend(_wrapped(f"Layout {v} adds:", added) if added else [f"Layout {v} adds no key."])
        if dropped:
            lines.extend(_wrapped("    and drops, holding each value once elsewhere:", dropped))
        if required:
            lines.extend(_wrapped("    and always writes, where it could leave them out before:", required))
    return "\n".join(lines) + "\n"


def _version_key(cls: type) -> str:
    return next(json_key(f) for f in dataclasses.fields(cls) if f.metadata.get("version"))
