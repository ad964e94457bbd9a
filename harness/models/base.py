"""What every model source shares: the errors, :class:`ModelInfo` and small tensor helpers.

Kept apart from the package ``__init__`` so that each source module can import these
without importing the others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from harness.errors import HarnessError
from harness.units import GIB

__all__ = [
    "LerobotUnavailableError",
    "ModelError",
    "ModelInfo",
    "SpecMismatchError",
    "describe",
    "dtype_name",
    "owner_of",
    "parse_dtype",
    "pattern",
    "show_path",
]


class ModelError(HarnessError, RuntimeError):
    """A model cannot be built as configured; the message says what and why."""


class SpecMismatchError(ModelError):
    """A model built from code differs from the spec it must match; lists the differences."""


class LerobotUnavailableError(ModelError):
    """lerobot cannot be imported in this interpreter; the message gives the reason."""


@dataclass(frozen=True, eq=False)
class ModelInfo:
    """A built model and where it came from.

    ``module`` holds every parameter and buffer on the meta device. ``name`` is the
    model key (see :attr:`ModelConfig.key`); ``source`` is ``"synthetic"``,
    ``"spec:<path>"`` or ``"lerobot <version>"``; ``source_note`` is a sentence for
    the results (e.g. why a spec was used instead of lerobot).
    """

    module: nn.Module
    name: str
    source: str
    source_note: str


def dtype_name(dtype: torch.dtype) -> str:
    """The torch dtype's name without the ``torch.`` prefix (``"bfloat16"``)."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: object) -> torch.dtype | None:
    """The torch dtype called ``name``, or None when there is none."""
    value = getattr(torch, name, None) if isinstance(name, str) else None
    return value if isinstance(value, torch.dtype) else None


def pattern(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Deterministic CPU values for a buffer no checkpoint holds.

    Floating: ``1 / (1 + i)`` over the flat index (decreasing, like rotary
    frequencies; a scalar is 1). Integers: ``i``. Bool: ``i`` odd.
    """
    index = torch.arange(math.prod(shape), dtype=torch.int64)
    if dtype == torch.bool:
        values = index % 2 == 1
    elif dtype.is_floating_point or dtype.is_complex:
        values = (1.0 / (1.0 + index.to(torch.float64))).to(dtype)
    else:
        values = index.to(dtype)
    return values.reshape(tuple(shape))


def owner_of(root: nn.Module, dotted: str, *, create: bool) -> tuple[nn.Module, str]:
    """The module that holds tensor ``dotted`` and the tensor's own name, creating containers."""
    *path, leaf = dotted.split(".")
    module = root
    for i, part in enumerate(path):
        child = module._modules.get(part)
        if child is None:
            if not create or hasattr(module, part):
                raise ModelError(f"{dotted}: {'.'.join(path[: i + 1])} is not a submodule")
            child = nn.Module()
            module.add_module(part, child)
        module = child
    return module, leaf


def show_path(path: Path) -> str:
    """``path`` relative to the working directory where it lies below it, else as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def describe(module: nn.Module) -> str:
    """Count and size of the persistent tensors, a tied tensor once: ``"N tensors, B bytes (G GiB)"``."""
    seen: set[int] = set()
    total = 0
    for t in module.state_dict(keep_vars=True).values():
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return f"{len(seen)} tensors, {total:,} bytes ({total / GIB:.2f} GiB)"
