"""The three ways of getting a checkpoint's weights into a model that the harness compares.

Each loader takes the model on the meta device and returns it with its
weights in place:

* ``map``: :func:`weightmap.map_weights`: views of the file, nothing read yet;
  released after each engine by dropping pages (``madvise``);
* ``load``: what most code does: the model is built on the CPU with
  uninitialised tensors (``to_empty``), the whole checkpoint is read into host
  memory, then ``load_state_dict`` copies it in; released with ``resize_(0)``;
* ``load_file``: ``safetensors.torch.load_file`` + ``load_state_dict(assign=True)``,
  ties restored: file-backed tensors that ``resize_(0)`` cannot free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from weightmap import map_weights
from weightmap.checkpoint import open_checkpoint
from weightmap.targets import collect_targets

STRATEGIES = ("map", "load", "load_file")


@dataclass(frozen=True)
class Loaded:
    """A loaded model and what the loader had to say about it."""

    model: torch.nn.Module
    note: str


def load_map(model: torch.nn.Module, path: Path) -> Loaded:
    """Map the checkpoint: every persistent tensor becomes a view of the file."""
    mapped = map_weights(model, path, strict=True)
    mapped.close()  # the views keep the mapping alive; the handle is not needed
    return Loaded(model, f"map_weights: {len(mapped.mapped)} tensors mapped, {mapped.nbytes} bytes, no copy")


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Read every tensor of a checkpoint into ordinary host memory (one allocation each)."""
    checkpoint = open_checkpoint(path)
    state = {}
    for header in checkpoint.headers:
        with open(header.path, "rb", buffering=0) as f:
            for name, entry in header.tensors.items():
                tensor = torch.empty(entry.shape, dtype=entry.dtype)
                if entry.nbytes:
                    f.seek(entry.start)
                    view = memoryview(tensor.reshape(-1).view(torch.uint8).numpy().data)
                    got = 0
                    while got < entry.nbytes:
                        n = f.readinto(view[got:])
                        if not n:
                            raise OSError(f"{header.path}: unexpected end of file in {name!r}")
                        got += n
                state[name] = tensor
    return state


def load_eager(model: torch.nn.Module, path: Path) -> Loaded:
    """Allocate the model on the CPU, read the checkpoint into memory, copy it in."""
    groups = [t.names for t in collect_targets(model) if len(t.names) > 1]
    model.to_empty(device="cpu")
    _retie(model, groups)  # to_empty allocates each name separately
    state = read_state_dict(path)
    absent = [t.names[0] for t in collect_targets(model) if t.persistent and not any(n in state for n in t.names)]
    if absent:
        raise KeyError(f"{path}: the checkpoint lacks {len(absent)} tensors of the model, e.g. {absent[:5]}")
    model.load_state_dict(state, strict=False)  # a tied tensor is filled through any one of its names
    del state
    return Loaded(model, "to_empty + full read into host memory + load_state_dict (two copies at the peak)")


def load_with_safetensors(model: torch.nn.Module, path: Path) -> Loaded:
    """``safetensors.torch.load_file`` per file, then ``load_state_dict(assign=True)``, ties restored."""
    from safetensors.torch import load_file

    groups = [t.names for t in collect_targets(model) if len(t.names) > 1]
    state: dict[str, torch.Tensor] = {}
    for file in open_checkpoint(path).files:
        state.update(load_file(str(file)))
    model.load_state_dict(state, strict=False, assign=True)
    _retie(model, groups)
    return Loaded(model, "safetensors load_file + load_state_dict(assign=True)")


def _slot(model: torch.nn.Module, name: str) -> tuple[dict[str, torch.Tensor | None], str]:
    prefix, _, key = name.rpartition(".")
    module = model.get_submodule(prefix) if prefix else model
    slots = module._parameters if key in module._parameters else module._buffers
    return slots, key  # type: ignore[return-value]


def _retie(model: torch.nn.Module, groups: list[list[str]]) -> None:
    """``assign=True`` fills only the names the file holds: point the other tied names at them."""
    for names in groups:
        slots = [_slot(model, n) for n in names]
        present = [s[k] for s, k in slots]
        loaded = next((t for t in present if t is not None and t.device.type != "meta"), None)
        if loaded is None:
            continue
        for s, k in slots:
            s[k] = loaded


LOADERS: dict[str, Callable[[torch.nn.Module, Path], Loaded]] = {
    "map": load_map,
    "load": load_eager,
    "load_file": load_with_safetensors,
}
