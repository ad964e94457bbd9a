"""What :func:`harness.engines.compile.entry.export_entry` returns, and its error; apart, so that the modules that
make the inputs of each kind of model import them without importing one another."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from harness.errors import HarnessError

__all__ = ["Entry", "EntryError"]


class EntryError(HarnessError, ValueError):
    """The model cannot be exported: it has no forward a compiler could trace."""


@dataclass(frozen=True)
class Entry:
    """The module to export and its example inputs (CPU tensors, deterministic for a seed)."""

    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
