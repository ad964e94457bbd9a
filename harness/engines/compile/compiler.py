"""What every engine compiler is and makes: the :class:`EngineCompiler` protocol, its :class:`Artifact`, its
weight settings and its errors.

AOTInductor (:class:`harness.engines.compile.inductor.InductorCompiler`) is one; a TensorRT builder
would be another. :class:`harness.engines.compile.backend.CompilerBackend` drives any of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, get_args

import torch
from torch.export import ExportedProgram

from harness.backends.columns import EngineColumns
from harness.catalog import ENGINE_WEIGHTS, HOLDS_WEIGHTS

__all__ = [
    "HOLDS_WEIGHTS",
    "WEIGHTS",
    "Artifact",
    "EngineBuildError",
    "EngineCompiler",
    "EngineLoadError",
    "WeightsMode",
]

WeightsMode = Literal["packaged", "packaged_compiler", "mapped"]
"""``packaged``: the artifact holds its weights, written into it by the harness from the partition's tensors;
``packaged_compiler``: it holds them as the compiler itself packages them; ``mapped``: it holds none and runs
on the partition's tensors."""
WEIGHTS: tuple[str, ...] = ENGINE_WEIGHTS
"""The weight settings (declared in :mod:`harness.catalog`); :data:`WeightsMode` is their type."""
if set(get_args(WeightsMode)) != set(WEIGHTS):  # the type cannot be built from the tuple
    raise ImportError(f"WeightsMode {get_args(WeightsMode)} is not harness.catalog.ENGINE_WEIGHTS {WEIGHTS}")


class EngineBuildError(RuntimeError):
    """An engine cannot be built as asked; the message names the engine and the reason."""


class EngineLoadError(RuntimeError):
    """An artifact cannot be loaded safely; the message names the file, the tensor and the rule."""


@dataclass(frozen=True)
class Artifact:
    """One built engine: its file, the tensors it runs on (empty when it holds its weights), and ``columns``:
    what the compiler measured while it built it (:mod:`harness.backends.columns`; None for an artifact loaded
    from its file)."""

    path: Path
    constants: dict[str, torch.Tensor]
    columns: EngineColumns | None = None


class EngineCompiler(Protocol):
    """An engine compiler (AOTInductor here; a TensorRT builder would fit).

    ``name``, ``weights`` (the compiler's weight setting, for the records) and ``device``.
    ``session(cache_dir)``: a context for the whole build that keeps the compiler's caches
    under ``cache_dir`` and yields that directory. ``compile(program, stem)``: one engine from
    one partition program (its weights the partition's own tensors, on the CPU), written
    beside ``stem``; the :class:`Artifact` names the file and the tensors the engine will run
    on. ``load(artifact)``: a callable taking the partition's inputs, returning a tuple of its
    outputs.
    """

    @property
    def name(self) -> str: ...

    @property
    def weights(self) -> str: ...

    @property
    def device(self) -> str: ...

    def session(self, cache_dir: str | os.PathLike[str]) -> AbstractContextManager[Path]: ...

    def compile(self, program: ExportedProgram, stem: str | os.PathLike[str]) -> Artifact: ...

    def load(self, artifact: Artifact) -> Callable[..., tuple[torch.Tensor, ...]]: ...
