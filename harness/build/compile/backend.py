"""A compiler as a harness backend: export the loaded model, cut its graph, build one engine per partition.

:class:`CompilerBackend` drives any :class:`~harness.build.compile.pipeline.EngineCompiler`
(AOTInductor today, :class:`~harness.build.compile.inductor.InductorCompiler`; a TensorRT builder
would be another) through the steps the worker measures:

1. :meth:`~CompilerBackend.export`: ``torch.export.export`` of the entry module under
   ``torch.no_grad()`` (an inference graph, without grad-mode regions a partitioner cannot
   cut), measured by :func:`~harness.build.compile.export.export_mapped`;
2. :meth:`~CompilerBackend.partition`: :func:`~harness.build.compile.graph_partition.partition_program`
   with the scenario's count or cap; these partitions are the engines, and their weight
   names what the release plan releases;
3. :meth:`~CompilerBackend.build_engine` per partition, in order: the partition made a
   program of its own and compiled; its compile time, artifact bytes, the compiler's
   subprocesses and cache growth kept in :meth:`~CompilerBackend.details`;
4. :meth:`~CompilerBackend.run_built`: the built model (the artifacts loaded one at a time,
   each run on the activations of the ones before and dropped) on the example inputs.

The worker measures the host high-water mark around each :meth:`build_engine` and
releases the engine's last-read weights after it, as for every backend.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.build.compile.children import ChildPeak
from harness.build.compile.export import ExportResult, export_mapped
from harness.build.compile.graph_partition import GraphPartition, partition_program, subprogram
from harness.build.compile.inductor import Artifact
from harness.build.compile.pipeline import CompiledPipeline, EngineCompiler
from harness.measure.procfs import read_status

__all__ = ["CompilerBackend", "EngineDetails", "PartitionRule"]


@dataclass(frozen=True)
class PartitionRule:
    """Exactly one of ``count`` (about that many engines) or ``cap_bytes`` (per-engine weight cap)."""

    count: int | None = None
    cap_bytes: int | None = None

    def apply(self, program: torch.export.ExportedProgram) -> list[GraphPartition]:
        return partition_program(program, count=self.count, cap_bytes=self.cap_bytes)


@dataclass(frozen=True)
class EngineDetails:
    """What one engine's build cost the compiler, besides the host peak the worker measures."""

    compile_s: float
    artifact_bytes: int
    rss_before_bytes: int
    children_peak_bytes: int
    cache_bytes: int


def _tree_bytes(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):  # a temporary file removed while walking
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


class _OnDemand:
    """An artifact loaded when called, run once, and dropped: one engine's weights in memory at a time."""

    def __init__(self, compiler: EngineCompiler, artifact: Artifact) -> None:
        self.compiler, self.artifact = compiler, artifact

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        engine = self.compiler.load(self.artifact)
        outputs = engine(*inputs)
        del engine
        return outputs


class CompilerBackend:
    """Engines built by ``compiler`` from the graph partitions of the exported model (see the module docstring).

    ``workdir`` receives the artifacts (``engine-NNN.*``) and the compiler's cache
    (``compiler-cache/``); :meth:`close` removes it.
    """

    def __init__(self, compiler: EngineCompiler, workdir: Path, rule: PartitionRule) -> None:
        self.compiler = compiler
        self.workdir = Path(workdir)
        self.rule = rule
        self.program: torch.export.ExportedProgram | None = None
        self.parts: list[GraphPartition] = []
        self.artifacts: dict[int, Artifact] = {}
        self._details: dict[int, EngineDetails] = {}
        self._session: contextlib.ExitStack | None = None
        self._cache: Path | None = None

    @property
    def name(self) -> str:
        return self.compiler.name

    @property
    def device(self) -> str:
        return self.compiler.device

    @property
    def weights(self) -> str:
        return self.compiler.weights

    def export(self, entry: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
               checkpoint: Sequence[str | os.PathLike[str]]) -> ExportResult:
        """Export ``entry`` on the example inputs; the program is kept for :meth:`partition` and the builds."""
        with torch.no_grad():
            result = export_mapped(entry, args, example_kwargs=kwargs, checkpoint=checkpoint)
        self.program = result.program
        return result

    def constants(self) -> dict[str, torch.Tensor]:
        """The exported program's own constant tensors (lifted ``torch.tensor(...)`` values), by name; empty
        before export."""
        if self.program is None:
            return {}
        return {k: v for k, v in self.program.constants.items() if isinstance(v, torch.Tensor)}

    def partition(self) -> list[GraphPartition]:
        """The exported program's partitions under the rule, in build order: the engines."""
        if self.program is None:
            raise RuntimeError("export the model before partitioning it")
        self.parts = self.rule.apply(self.program)
        return self.parts

    def _open(self) -> Path:
        if self._cache is None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._session = contextlib.ExitStack()
            self._cache = self._session.enter_context(self.compiler.session(self.workdir / "compiler-cache"))
        return self._cache

    def build_engine(self, index: int, tensors: dict[str, torch.Tensor]) -> int:
        """Compile partition ``index``; returns its artifact's bytes.

        ``tensors`` (the worker's view of the engine's weights, by name) must be the
        partition's weights; the compiler reads them through the program, which holds the
        same tensors.
        """
        if self.program is None or not 0 <= index < len(self.parts):
            raise RuntimeError(f"engine {index}: export and partition the model first")
        part = self.parts[index]
        if set(tensors) != set(part.weights):
            raise RuntimeError(f"engine {index}: the worker's weights are not the partition's")
        cache = self._open()
        cache_before = _tree_bytes(cache)
        rss_before = read_status().rss_bytes
        start = time.perf_counter()
        with ChildPeak() as children:
            sub = subprogram(self.program, part, example_device=self.compiler.device)
            artifact = self.compiler.compile(sub, self.workdir / f"engine-{index:03d}")
            del sub
        seconds = time.perf_counter() - start
        size = artifact.path.stat().st_size
        self.artifacts[index] = artifact
        self._details[index] = EngineDetails(
            compile_s=seconds, artifact_bytes=size, rss_before_bytes=rss_before,
            children_peak_bytes=children.peak_bytes, cache_bytes=_tree_bytes(cache) - cache_before,
        )
        return size

    def details(self, index: int) -> EngineDetails:
        """What building engine ``index`` cost the compiler."""
        return self._details[index]

    def run_built(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The built model's output on ``args``: every engine loaded in turn, run, and dropped."""
        if self.program is None or len(self.artifacts) != len(self.parts):
            raise RuntimeError("not every engine was built")
        engines: list[Callable[..., tuple[torch.Tensor, ...]]] = [
            _OnDemand(self.compiler, self.artifacts[p.index]) for p in self.parts
        ]
        pipeline = CompiledPipeline(self.program, self.parts, engines, self.compiler.device)
        with torch.no_grad():
            return pipeline(*args, **kwargs)

    def drop_program(self) -> None:
        """Forget the program and the artifacts' tensors (the model's weights), keeping the records."""
        self.program = None
        self.artifacts.clear()

    def close(self) -> None:
        """Leave the compiler's session and remove the artifacts and the cache."""
        if self._session is not None:
            self._session.close()
            self._session = None
        self.drop_program()
        shutil.rmtree(self.workdir, ignore_errors=True)
