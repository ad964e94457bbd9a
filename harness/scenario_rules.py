"""The rules a scenario's values obey (:mod:`harness.scenario` reads the file): every numeric setting's range
(:data:`LIMITS`), the choices a text setting takes (:class:`OneOf`), and the checks of lists and names. Each is a
field's metadata, applied by :func:`harness.fileio.codec.decode` and listed by :mod:`harness.schema`."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.catalog import STRATEGY_LISTINGS
from harness.fileio.codec import NAME, Limit
from harness.results.names import reserved_problem
from harness.units import GIB, MIB, PIB
from harness.weightspec import MAX_MODEL_BYTES
from weightmap import parse_size

__all__ = ["LIMITS", "OneOf", "callable_problem", "limit", "name_problem", "one_of", "repeats",
           "size_problem", "strategies_problem"]


def _int(low: int, high: int) -> Limit:
    return Limit(low, high, integer=True)


LIMITS: dict[str, Limit] = {
    "model.layers": _int(1, 1024),
    "model.width": _int(1, 65536),
    "model.heads": _int(1, 4096),
    "model.vocab": _int(1, 1 << 24),
    "model.ffn_mult": _int(1, 64),
    "checkpoint.seed": _int(0, 2**63 - 1),
    "build.engines": _int(1, 4096),
    "build.engine_cap_mib": Limit(0, MAX_MODEL_BYTES / MIB, low_open=True, unit="MiB", note="16 TiB"),
    "build.tokens": _int(1, 8192),
    "run.sample_interval_ms": Limit(0.1, 60_000, unit="ms"),
    "run.residency_every": _int(1, 100_000),
    "run.memory_limit_gib": Limit(MIB / GIB, PIB // GIB, unit="GiB", note="1 MiB to 1 PiB"),
    "run.timeout_s": Limit(0, 7 * 24 * 3600, low_open=True, unit="s", note="a week"),
    "run.repeats": _int(1, 100),
    "run.warmup": _int(0, 100),
}
"""Every numeric setting's range, by dotted key (a ``[[reference]]``'s are on
:class:`~harness.results.record.Reference`)."""


@dataclass(frozen=True)
class OneOf:
    """A field's ``check``: its value must be one of ``choices`` (which :mod:`harness.schema` lists).

    ``registry``, where a registry keeps the choices (the backends), names them in words (``the backends
    registered in harness.backends``): the listing :mod:`harness.scenario`'s docstring quotes says that in their
    place, so that registering one more changes no docstring."""

    choices: tuple[str, ...]
    registry: str | None = None

    def __call__(self, value: Any) -> str | None:
        if value in self.choices:
            return None
        return f"expected one of {', '.join(map(repr, self.choices))}, got {value!r}"


def one_of(choices: tuple[str, ...], registry: str | None = None) -> dict[str, Callable[[Any], str | None]]:
    """A field's metadata: its value must be one of ``choices`` (kept by ``registry``, where given: :class:`OneOf`)."""
    return {"check": OneOf(choices, registry)}


def limit(key: str) -> dict[str, Limit]:
    """A field's metadata: its number must lie in ``LIMITS[key]``."""
    return {"limit": LIMITS[key]}


def repeats(values: tuple[str, ...]) -> str | None:
    """What a list lists twice, or None."""
    seen: set[str] = set()
    for item in values:
        if item in seen:
            return f"{item!r} is listed twice"
        seen.add(item)
    return None


def strategies_problem(strategies: tuple[str, ...]) -> str | None:
    if problem := repeats(strategies):
        return problem
    if not strategies:
        return "expected at least one strategy"
    unknown = next((s for s in strategies if s not in STRATEGY_LISTINGS), None)
    if unknown is not None:
        return f"unknown strategy {unknown!r} (known: {', '.join(STRATEGY_LISTINGS)})"
    return None


CALLABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
"""``package.module:function``: what a model's ``factory`` and ``inputs`` name."""


def callable_problem(text: str | None) -> str | None:
    """Why ``text`` does not name a function as ``package.module:function``; None when it does (or is absent)."""
    if text is None or CALLABLE.fullmatch(text):
        return None
    return f"expected package.module:function, got {text!r}"


def size_problem(text: str | None) -> str | None:
    """Why ``text`` is not a size as transformers' ``max_shard_size`` takes it (``"5GB"``, ``"500MB"``:
    :func:`weightmap.parse_size`); None when it is one (or is absent)."""
    if text is None:
        return None
    try:
        parse_size(text)
    except ValueError as exc:
        return str(exc)
    return None


def name_problem(name: str) -> str | None:
    if not NAME.fullmatch(name):
        return f"expected [a-z0-9_-]+, got {name!r}"
    return reserved_problem(name)  # no name the harness derives from others (harness.results.names)
