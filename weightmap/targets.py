"""Where a model keeps its tensors: every name, every slot, ties grouped.

A *target* is one tensor of a module or an ``ExportedProgram`` with every name
it is registered under (tied weights have several) and every slot (a dict and a
key) that holds it, so that replacing it in all slots keeps the tie. Tensors are
one target when they are the same object, or the same view of one storage (a
"storage tie": ``nn.Parameter(a.weight.data)`` is another object on ``a.weight``'s
storage, on meta as on the CPU); the other objects are its ``aliases``. This module
only reads the model; :mod:`weightmap.mapping` decides what goes into the slots.
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
    aliases: list[torch.Tensor] = field(default_factory=list)  # other objects, the same view of its storage

    def add(self, tensor: torch.Tensor, name: str, slot: MutableMapping[str, Any], key: str,
            persistent: bool) -> None:
        """Record one more name and slot of this tensor (a tie, a storage tie or a shared module)."""
        if tensor is not self.tensor and all(tensor is not alias for alias in self.aliases):
            self.aliases.append(tensor)
        if name not in self.names:
            self.names.append(name)
        if not any(s is slot and k == key for s, k in self.slots):
            self.slots.append((slot, key))
        self.persistent = self.persistent or persistent

    @property
    def objects(self) -> list[torch.Tensor]:
        """The tensor and its aliases."""
        return [self.tensor, *self.aliases]


def is_exported_program(obj: object) -> bool:
    """True for a ``torch.export.ExportedProgram`` (checked without importing export eagerly)."""
    export = getattr(torch, "export", None)
    cls = getattr(export, "ExportedProgram", None) if export is not None else None
    return cls is not None and isinstance(obj, cls)


def _view_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    """What makes two tensors one: the same object, or the same view of the same storage.

    A storage's identity is its ``StorageImpl`` (``_cdata``), which meta tensors have too
    (their data pointer is 0 for all of them). Tensors without a storage (sparse, nested,
    subclasses that refuse, lazy modules' parameters) and empty tensors are one only with
    themselves.
    """
    try:
        if tensor.numel() == 0:  # no bytes to share; a lazy module's parameter raises here
            return ("object", id(tensor))
        storage = tensor.untyped_storage()
        return ("view", storage._cdata, tensor.device, tensor.dtype, tensor.storage_offset(),
                tuple(tensor.shape), tuple(tensor.stride()))
    except (RuntimeError, ValueError, NotImplementedError, TypeError, AttributeError):
        return ("object", id(tensor))


def _add(found: dict[tuple[Any, ...], Target], tensor: torch.Tensor, kind: Kind, name: str,
         slot: MutableMapping[str, Any], key: str, persistent: bool) -> None:
    view = _view_key(tensor)
    target = found.get(view)
    if target is None:
        target = found[view] = Target(tensor, kind)
    target.add(tensor, name, slot, key, persistent)


def _module_targets(module: torch.nn.Module) -> list[Target]:
    found: dict[tuple[Any, ...], Target] = {}
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
    found: dict[tuple[Any, ...], Target] = {}
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
