"""The model a compiler builder exports and checks, as plain data a check process can be handed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

from harness.engines.compile.entry import Entry, export_entry
from harness.scenario import ModelConfig

__all__ = ["ModelSource"]


@dataclass(frozen=True)
class ModelSource:
    """The model a compiler builder exports and checks: ``config`` (what is built on meta), the
    ``checkpoint`` mapped into it and its ``files``; ``tokens`` and ``seed`` make the example inputs;
    ``memory_limit_bytes``: the scenario's limit, which the float32 run of eager must stay under."""

    config: ModelConfig
    checkpoint: Path
    files: tuple[Path, ...]
    tokens: int
    seed: int
    memory_limit_bytes: int | None = None

    def entry(self, model: nn.Module) -> Entry:
        """The module to export from ``model`` and its example inputs."""
        return export_entry(self.config, model, tokens=self.tokens, seed=self.seed)
