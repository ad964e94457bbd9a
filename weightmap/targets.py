"""Where a model keeps its tensors: every name, every slot, ties grouped.

A *target* is one tensor object of a module or an ``ExportedProgram`` with
every name it is registered under (tied weights have several) and every slot
(a dict and a key) that holds it, so that replacing it in all slots keeps the
tie. This module only reads the model; :mod:`weightmap.mapping` decides what
goes into the slots.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

__all__ = ["Target", "collect_targets", "is_exported_program"]

Kind = Literal["param", "buffer", "constant"]


@dataclass
class Target:
    """One tensor object and everywhere the model refers to it."""

    tensor: torch.Tensor
    kind: Kind
    names: list[str] = field(default_factory=list)
    persistent: bool = False
    slots: list[tuple[MutableMapping[str, Any], str]] = field(default_factory=list)

    def add(self, name: str, slot: MutableMapping[str, Any], key: str, persistent: bool) -> None:
        """Record one more name and slot of this tensor (a tie, or a shared module)."""
        if name not in self.names:
            self.names.append(name)
        if not any(s is slot and k == key for s, k in self.slots):
            self.slots.append((slot, key))
        self.persistent = self.persistent or persistent


def is_exported_program(obj: object) -> bool:
    """True for a ``torch.export.ExportedProgram`` (checked without importing export eagerly)."""
    export = getattr(torch, "export", None)
    cls = getattr(export, "ExportedProgram", None) if export is not None else None
    return cls is not None and isinstance(obj, cls)


def _add(found: dict[int, Target], tensor: torch.Tensor, kind: Kind, name: str,
         slot: MutableMapping[str, Any], key: str, persistent: bool) -> None:
    target = found.get(id(tensor))
    if target is None:
        target = found[id(tensor)] = Target(tensor, kind)
    target.add(name, slot, key, persistent)


def _module_targets(module: torch.nn.Module) -> list[Target]:
    found: dict[int, Target] = {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for key, tensor in sub._parameters.items():
            if tensor is not None:
                _add(found, tensor, "param", dot + key, sub._parameters, key, True)
        for key, tensor in sub._buffers.items():
            if tensor is not None:
                persistent = key not in sub._non_persistent_buffers_set
                _add(found, tensor, "buffer", dot + key, sub._buffers, key, persistent)
    return list(found.values())


def _program_targets(program: Any) -> list[Target]:
    found: dict[int, Target] = {}
    state = program.state_dict
    for name, tensor in state.items():
        kind: Kind = "param" if isinstance(tensor, torch.nn.Parameter) else "buffer"
        _add(found, tensor, kind, name, state, name, True)
    non_persistent = set(program.graph_signature.non_persistent_buffers)
    constants = program.constants
    for name, value in constants.items():
        if not isinstance(value, torch.Tensor):
            continue  # script objects are not weights
        if name in non_persistent:
            _add(found, value, "buffer", name, constants, name, False)
        else:
            _add(found, value, "constant", name, constants, name, True)
    return list(found.values())


def collect_targets(model: torch.nn.Module | Any) -> list[Target]:
    """Every tensor object of a module or an ExportedProgram, in registration order.

    Persistent means the tensor belongs in a checkpoint: parameters, persistent
    buffers and an ExportedProgram's lifted tensor constants. Non-persistent
    buffers (rotary frequencies, position ids) are collected too, because a
    model cannot run while they are still on the meta device.
    """
    if is_exported_program(model):
        return _program_targets(model)
    if isinstance(model, torch.nn.Module):
        return _module_targets(model)
    raise TypeError(
        f"map_weights needs a torch.nn.Module or a torch.export.ExportedProgram, not {type(model).__name__}"
    )
