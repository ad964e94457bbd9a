"""What every loader returns, and the one way loaders put tensors into a model's slots and restore its ties."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Loaded", "retie", "tensor_slot"]


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
