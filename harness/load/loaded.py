"""What every loader returns, and the one way loaders put tensors into a model's slots and restore its ties."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch

from weightmap import collect_targets

__all__ = ["Loaded", "put_in_place", "restore", "retie", "stored_names", "tensor_slot"]


@dataclass(frozen=True)
class Loaded:
    """A loaded model and what the loader had to say about it."""

    model: torch.nn.Module
    note: str


def tensor_slot(model: torch.nn.Module, name: str) -> tuple[dict[str, torch.Tensor | None], str]:
    """``(slots, key)``: the parameter or buffer dict of the module that holds ``name``, and its key there."""
    prefix, _, key = name.rpartition(".")
    module = model.get_submodule(prefix) if prefix else model
    slots = module._parameters if key in module._parameters else module._buffers
    return slots, key  # type: ignore[return-value]


def retie(model: torch.nn.Module, groups: list[list[str]]) -> None:
    """``assign=True`` fills only the names the file holds: point the other tied names at them.

    ``groups`` are the model's tied names (each list one tensor); a group none of whose names
    holds a loaded (non-meta) tensor is left as it is.
    """
    for names in groups:
        slots = [tensor_slot(model, n) for n in names]
        present = [s[k] for s, k in slots]
        loaded = next((t for t in present if t is not None and t.device.type != "meta"), None)
        if loaded is None:
            continue
        for s, k in slots:
            s[k] = loaded


def stored_names(model: torch.nn.Module, held: Collection[str]) -> dict[str, str]:
    """Each name of a tied group the checkpoint holds under one name (``held``: its names) -> that name, for
    every group it holds; a per-engine loader asks the checkpoint for the stored name."""
    aliases: dict[str, str] = {}
    for target in collect_targets(model):
        stored = [n for n in target.names if n in held]
        if stored:
            aliases.update({n: stored[0] for n in target.names})
    return aliases


def put_in_place(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
    """Put each named tensor into the model's slot of that name (a parameter's as a frozen Parameter, names
    given one tensor object sharing one Parameter); returns what the slots held, for :func:`restore`."""
    before: dict[str, torch.Tensor | None] = {}
    wrapped: dict[int, torch.Tensor] = {}  # tied names in one engine share one parameter
    for name, tensor in tensors.items():
        slots, key = tensor_slot(model, name)
        before[name] = slots[key]
        if isinstance(slots[key], torch.nn.Parameter):
            tensor = wrapped.setdefault(id(tensor), torch.nn.Parameter(tensor, requires_grad=False))
        slots[key] = tensor
    return before


def restore(model: torch.nn.Module, before: Mapping[str, torch.Tensor | None]) -> None:
    """Put back what :func:`put_in_place` took out of the model's slots."""
    for name, tensor in before.items():
        slots, key = tensor_slot(model, name)
        slots[key] = tensor
