"""Grouping a model's weights into engines, in the order a build reads them.

A *unit* is a module that owns tensors directly (a Linear, a norm, an
embedding), taken in registration order, which for the models here is the
order their forward runs them and the order a partitioner walks them. Units
are packed greedily into engines under a byte cap: a unit never splits, and a
unit larger than the cap gets an engine of its own. A tied tensor belongs to
every unit that registers it (the embedding and the head), so it is read by
the first engine and the last, and released only after the last.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


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


def cap_for(model: torch.nn.Module, engines: int) -> int:
    """The per-engine byte cap that splits the model into about ``engines`` engines."""
    if engines < 1:
        raise ValueError(f"engines must be at least 1, not {engines}")
    return math.ceil(model_bytes(model) / engines)


def partition(model: torch.nn.Module, cap_bytes: int) -> list[Engine]:
    """Pack the model's units into engines of at most ``cap_bytes`` each (a larger unit alone)."""
    if cap_bytes < 1:
        raise ValueError(f"the per-engine cap must be positive, not {cap_bytes}")
    engines: list[Engine] = []
    group: list[Unit] = []
    sizes: dict[int, int] = {}  # id -> bytes of the distinct tensors in the open group

    def close() -> None:
        engines.append(
            Engine(
                index=len(engines),
                modules=tuple(u.module for u in group),
                names=tuple(n for u in group for n in u.names),
                nbytes=sum(sizes.values()),
            )
        )
        group.clear()
        sizes.clear()

    for unit in units(model):
        extra = {id(t): t.numel() * t.element_size() for t in unit.tensors if id(t) not in sizes}
        if group and sum(sizes.values()) + sum(extra.values()) > cap_bytes:
            close()
            extra = {id(t): t.numel() * t.element_size() for t in unit.tensors}
        group.append(unit)
        sizes.update(extra)
    if group:
        close()
    return engines
