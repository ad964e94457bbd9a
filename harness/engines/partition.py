"""Grouping a model's weights into engines, in the order a build reads them.

A *unit* is a module that owns tensors directly (a Linear, a norm, an
embedding), taken in registration order, which for the models here is the
order their forward runs them and the order a partitioner walks them. A unit
never splits. Two ways of grouping units into consecutive engines:

* :func:`partition`: greedily under a byte cap; a unit larger than the cap gets
  an engine of its own;
* :func:`split_into`: exactly ``count`` engines with the largest as small as a
  contiguous split allows (the smallest cap whose greedy packing needs at most
  ``count`` engines, found by bisection; then the largest engines of several
  units are split until there are ``count``). It needs at least ``count`` units.

A tied tensor belongs to every unit that registers it (the embedding and the
head), so it is read by the first engine and the last, and released only after
the last; an engine's bytes count each of its tensor objects once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.errors import PlanError
from harness.scenario import BuildConfig


@dataclass(frozen=True)
class Unit:
    """One module's own tensors: their names and the bytes of the distinct objects."""

    module: str
    names: tuple[str, ...]
    tensors: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Engine:
    """The tensors one engine build reads."""

    index: int
    modules: tuple[str, ...]
    names: tuple[str, ...]
    nbytes: int  # distinct tensor objects, counted once


def _nbytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def _own(module: torch.nn.Module, prefix: str) -> tuple[list[tuple[str, torch.Tensor]], bool]:
    """A module's own tensors with their full names, and whether any of them is persistent."""
    dot = f"{prefix}." if prefix else ""
    params = [(dot + k, t) for k, t in module._parameters.items() if t is not None]
    buffers = [(dot + k, t) for k, t in module._buffers.items() if t is not None]
    persistent = bool(params) or any(n.rpartition(".")[2] not in module._non_persistent_buffers_set
                                     for n, _ in buffers)
    return params + buffers, persistent


def units(model: torch.nn.Module) -> list[Unit]:
    """Every module that owns weights, in registration order, with its tensors' full names.

    A module that owns only non-persistent buffers (rotary frequencies, say: a few
    hundred bytes, no weight) joins the next module that owns weights, or the last one,
    so that it never makes an engine of its own.
    """
    found: list[Unit] = []
    pending: list[tuple[str, torch.Tensor]] = []
    for prefix, module in model.named_modules(remove_duplicate=False):
        own, persistent = _own(module, prefix)
        if not own:
            continue
        if not persistent:
            pending.extend(own)
            continue
        tensors = pending + own
        pending = []
        found.append(Unit(prefix, tuple(n for n, _ in tensors), tuple(t for _, t in tensors)))
    if pending and found:
        last = found[-1]
        found[-1] = Unit(last.module, last.names + tuple(n for n, _ in pending),
                         last.tensors + tuple(t for _, t in pending))
    elif pending:
        found.append(Unit("", tuple(n for n, _ in pending), tuple(t for _, t in pending)))
    return found


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's distinct tensor objects (a tied weight once)."""
    return _nbytes([t for unit in units(model) for t in unit.tensors])


def _group_bytes(group: list[Unit]) -> int:
    return _nbytes([t for unit in group for t in unit.tensors])


def _pack(found: list[Unit], cap_bytes: int) -> list[list[Unit]]:
    """Consecutive groups of units, each closed before it would pass ``cap_bytes``."""
    groups: list[list[Unit]] = []
    group: list[Unit] = []
    sizes: dict[int, int] = {}  # id -> bytes of the distinct tensors in the open group
    for unit in found:
        extra = {id(t): t.numel() * t.element_size() for t in unit.tensors if id(t) not in sizes}
        if group and sum(sizes.values()) + sum(extra.values()) > cap_bytes:
            groups.append(group)
            group, sizes = [], {}
            extra = {id(t): t.numel() * t.element_size() for t in unit.tensors}
        group.append(unit)
        sizes.update(extra)
    if group:
        groups.append(group)
    return groups


def _engines(groups: list[list[Unit]]) -> list[Engine]:
    return [
        Engine(
            index=i,
            modules=tuple(u.module for u in group),
            names=tuple(n for u in group for n in u.names),
            nbytes=_group_bytes(group),
        )
        for i, group in enumerate(groups)
    ]


def partition(model: torch.nn.Module, cap_bytes: int) -> list[Engine]:
    """Pack the model's units into engines of at most ``cap_bytes`` each (a larger unit alone)."""
    if cap_bytes < 1:
        raise ValueError(f"the per-engine cap must be positive, not {cap_bytes}")
    return _engines(_pack(units(model), cap_bytes))


def _split_largest(groups: list[list[Unit]]) -> list[list[Unit]]:
    """Split the largest group of two or more units where its larger half is smallest."""
    index = max((i for i, g in enumerate(groups) if len(g) > 1), key=lambda i: _group_bytes(groups[i]))
    group = groups[index]
    at = min(range(1, len(group)), key=lambda k: max(_group_bytes(group[:k]), _group_bytes(group[k:])))
    return groups[:index] + [group[:at], group[at:]] + groups[index + 1:]


def split_into(model: torch.nn.Module, count: int) -> tuple[list[Engine], int]:
    """Exactly ``count`` consecutive engines, the largest as small as possible; returns them and the cap.

    The cap is the smallest byte cap under which greedy packing needs at most ``count``
    engines. Raises ``ValueError`` when ``count`` is below 1 or above the model's number
    of units (a unit never splits).
    """
    found = units(model)
    if count < 1:
        raise ValueError(f"the number of engines must be at least 1, not {count}")
    if count > len(found):
        raise ValueError(f"{count} engines asked for, but the model has only {len(found)} weight units "
                         "(modules that own weights), and a unit never splits")
    low, high = 1, max(1, _group_bytes(found))
    while low < high:  # the smallest cap whose packing needs at most `count` engines
        middle = (low + high) // 2
        if len(_pack(found, middle)) <= count:
            high = middle
        else:
            low = middle + 1
    groups = _pack(found, low)
    while len(groups) < count:
        groups = _split_largest(groups)
    return _engines(groups), low


def module_engines(model: torch.nn.Module, build: BuildConfig, where: Callable[[str], str],
                   ) -> tuple[list[Engine], int]:
    """The model's engines in module order (on meta: nothing is read), cut as ``build`` asks: under its
    ``engine_cap_bytes`` (:func:`partition`), else into exactly its ``engines`` (:func:`split_into`); and the
    per-engine cap they were cut at. A :class:`~harness.errors.PlanError` naming ``where('build.engines')`` for
    more engines than the model has units."""
    if build.engine_cap_bytes is not None:
        return partition(model, build.engine_cap_bytes), build.engine_cap_bytes
    assert build.engines is not None, "a build asks for a cap or a count of engines"
    try:
        return split_into(model, build.engines)
    except ValueError as exc:  # more engines than the model has units
        raise PlanError(f"{where('build.engines')}: {exc}; ask for fewer engines") from exc
