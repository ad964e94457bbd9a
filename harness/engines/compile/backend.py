"""A compiler as an engine builder: export the loaded model, cut its graph, build one engine per partition.

:class:`CompilerBackend` is the :class:`~harness.engines.builder.EngineBuilder` of any
:class:`~harness.engines.compile.compiler.EngineCompiler` (AOTInductor today,
:class:`~harness.engines.compile.inductor.InductorCompiler`; a TensorRT builder would be another),
through the steps the worker measures:

1. :meth:`~CompilerBackend.export`: ``torch.export.export`` of the model's entry
   (:mod:`harness.engines.compile.entry`) under ``torch.no_grad()`` (an inference graph, without
   grad-mode regions a partitioner cannot cut), measured by
   :func:`~harness.engines.compile.export.export_mapped`, as a phase of its own;
2. :meth:`~CompilerBackend.partition`: :func:`~harness.engines.compile.graph_partition.partition_program`
   with the scenario's count or cap (:meth:`~CompilerBackend.cut`), which must give the planned
   engines; their weight names are what the release plan releases;
3. :meth:`~CompilerBackend.build_engine` per partition, in order: the partition made a
   program of its own and compiled; its compile time, artifact bytes, the compiler's
   subprocesses and cache growth are the engine's record columns;
4. :meth:`~CompilerBackend.run_built`: the built model (the artifacts loaded one at a time,
   each run on the activations of the ones before and dropped) on the example inputs, and
   :meth:`~CompilerBackend.check`: those outputs against eager on a fresh mapping.

The worker measures the host high-water mark around each :meth:`build_engine` and
releases the engine's last-read weights after it, as for every builder.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

from harness.engines.builder import BuiltEngine, EngineBuilder, Phases
from harness.engines.compile.children import ChildPeak
from harness.engines.compile.compare import Comparison, compare_outputs, upcast_reference
from harness.engines.compile.compiler import Artifact, EngineCompiler
from harness.engines.compile.entry import Entry, export_entry
from harness.engines.compile.export import ExportResult, export_mapped
from harness.engines.compile.graph_partition import GraphPartition, PartitionRule, subprogram
from harness.engines.compile.pipeline import CompiledPipeline
from harness.engines.compile.planning import same_partitions
from harness.measure.procfs import mapping_rss, read_status
from harness.models import build_model, fill_non_persistent
from harness.results.record import ExportRecord
from harness.scenario import ModelConfig
from weightmap import map_weights

__all__ = ["CompilerBackend", "ModelSource"]


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


class CompilerBackend(EngineBuilder):
    """Engines built by ``compiler`` from the graph partitions of the exported model (see the module docstring).

    ``workdir`` receives the artifacts (``engine-NNN.*``) and, unless ``cache_dir`` names another
    place, the compiler's cache (``compiler-cache/``); :meth:`close` removes it. ``source``: the
    model :meth:`export` and :meth:`check` work on (None: only :meth:`export_program` exports).
    """

    def __init__(self, compiler: EngineCompiler, workdir: Path, rule: PartitionRule,
                 source: ModelSource | None = None, *, cache_dir: Path | None = None) -> None:
        self.engine_compiler = compiler
        self.workdir = Path(workdir)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else self.workdir / "compiler-cache"
        self.rule = rule
        self.source = source
        self.name = self.compiler = compiler.name
        self.device = compiler.device
        self.weights = compiler.weights
        self.keeps_model_tensors = compiler.weights == "mapped"
        self.program: torch.export.ExportedProgram | None = None
        self.entry: Entry | None = None
        self.parts: list[GraphPartition] = []
        self.artifacts: dict[int, Artifact] = {}
        self._session: contextlib.ExitStack | None = None
        self._cache: Path | None = None

    def _source(self) -> ModelSource:
        if self.source is None:
            raise RuntimeError("this compiler builder was made without the model it exports (source)")
        return self.source

    def export_program(self, entry: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                       checkpoint: Sequence[str | os.PathLike[str]]) -> ExportResult:
        """Export ``entry`` on the example inputs; the program is kept for :meth:`cut` and the builds."""
        with torch.no_grad():
            result = export_mapped(entry, args, example_kwargs=kwargs, checkpoint=checkpoint)
        self.program = result.program
        return result

    def export(self, model: nn.Module, phases: Phases) -> tuple[nn.Module, ExportRecord | None]:
        """Export the entry of the loaded ``model`` as the phase ``export``; returns the entry module."""
        source = self._source()
        self.entry = source.entry(model)
        with phases.phase("export", "exporting") as end:
            result = self.export_program(self.entry.module, self.entry.args, self.entry.kwargs, source.files)
            end["rss_bytes"] = result.record.rss_after_bytes
        return self.entry.module, result.record

    def constants(self) -> dict[str, torch.Tensor]:
        """The exported program's own constant tensors (lifted ``torch.tensor(...)`` values), by name; empty
        before export."""
        if self.program is None:
            return {}
        return {k: v for k, v in self.program.constants.items() if isinstance(v, torch.Tensor)}

    def cut(self) -> list[GraphPartition]:
        """The exported program's partitions under the rule, in build order: the engines."""
        if self.program is None:
            raise RuntimeError("export the model before partitioning it")
        self.parts = self.rule.apply(self.program)
        return self.parts

    def partition(self, planned: Sequence[Sequence[str]]) -> None:
        """Cut the exported program; its partitions must read the ``planned`` weights, engine by engine."""
        why = same_partitions(planned, self.cut())
        if why is not None:
            raise RuntimeError(f"the graph partitions of the loaded model are not the planned ones: {why}")

    def _open(self) -> Path:
        if self._cache is None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._session = contextlib.ExitStack()
            self._cache = self._session.enter_context(self.engine_compiler.session(self.cache_dir))
        return self._cache

    def build_engine(self, index: int, tensors: dict[str, torch.Tensor]) -> BuiltEngine:
        """Compile partition ``index`` into its artifact.

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
            sub = subprogram(self.program, part, example_device=self.engine_compiler.device)
            artifact = self.engine_compiler.compile(sub, self.workdir / f"engine-{index:03d}")
            del sub
        seconds = time.perf_counter() - start
        size = artifact.path.stat().st_size
        self.artifacts[index] = artifact
        return BuiltEngine(nbytes=size, artifact=artifact.path, columns={
            "compile_s": round(seconds, 3), "artifact_bytes": size, "rss_before_bytes": rss_before,
            "children_peak_bytes": children.peak_bytes, "cache_bytes": _tree_bytes(cache) - cache_before,
        })

    def release_note(self, unreleased_bytes: int) -> str | None:
        if not (self.keeps_model_tensors and unreleased_bytes):
            return None
        return ("the engines run on the model's own tensors (weights = \"mapped\"): mapped pages are dropped "
                "after each engine, other memory is kept for the engines to run on")

    def run_built(self, phases: Phases) -> Any:
        """The built model's output on the exported entry's example inputs: every engine loaded in turn,
        run, and dropped."""
        if self.program is None or self.entry is None or len(self.artifacts) != len(self.parts):
            raise RuntimeError("not every engine was built")
        engines: list[Callable[..., tuple[torch.Tensor, ...]]] = [
            _OnDemand(self.engine_compiler, self.artifacts[p.index]) for p in self.parts
        ]
        pipeline = CompiledPipeline(self.program, self.parts, engines, self.engine_compiler.device)
        with phases.doing("running the built model"), torch.no_grad():
            return pipeline(*self.entry.args, **self.entry.kwargs)

    def check(self, outputs: Any, phases: Phases) -> Comparison:
        """``outputs`` against eager's, run on a freshly mapped model; the comparison (its ``check()`` raises).

        The loaded model may have been released engine by engine, so eager runs on a new
        mapping of the checkpoint (released pages are read again from the file); the program
        and the entry, which hold the loaded model, are dropped first. Where the outputs differ
        beyond tolerance (a bfloat16 model), both are judged against a float32 run of eager.
        """
        source = self._source()
        self.drop_program()
        gc.collect()
        reference = build_model(source.config).module
        map_weights(reference, source.checkpoint, strict=True, allow_meta_buffers=True).close()
        fill_non_persistent(reference)
        eager = source.entry(reference)
        module, args, kwargs = eager.module, eager.args, eager.kwargs
        if self.device.startswith("cuda"):  # eager runs where the engines ran
            from torch.utils import _pytree as pytree

            def move(value: Any) -> Any:
                return value.to(self.device) if isinstance(value, torch.Tensor) else value

            module = module.to(self.device)
            args, kwargs = pytree.tree_map(move, (args, kwargs))
        with phases.doing("running eager"), torch.no_grad():
            want = module(*args, **kwargs)
        comparison = compare_outputs(outputs, want)
        if not comparison.ok:  # a bfloat16 model: judge both against a float32 run of eager
            with phases.doing("running eager in float32"):
                upcast, why = upcast_reference(module, args, kwargs, free_bytes=self._free_bytes(source))
            if upcast is not None:
                comparison = compare_outputs(outputs, want, upcast)
            else:
                comparison = replace(comparison, detail=f"{comparison.detail}; {why}")
        return comparison

    def _free_bytes(self, source: ModelSource) -> int:
        """Memory free for new tensors where eager runs: the GPU's free bytes, or the host's
        available memory, no more than the scenario's limit leaves above the current RSS less
        the checkpoint's mapped pages."""
        if self.device.startswith("cuda"):
            return int(torch.cuda.mem_get_info(torch.device(self.device))[0])
        free = int(psutil.virtual_memory().available)
        if source.memory_limit_bytes is not None:  # the checkpoint's mapped pages leave RSS as the copies are made
            mapped = sum(mapping_rss(f) for f in source.files)
            free = min(free, source.memory_limit_bytes - (read_status().rss_bytes - mapped))
        return free

    def drop_program(self) -> None:
        """Forget the program, the entry and the artifacts' tensors (the model's weights), keeping the records."""
        self.program = None
        self.entry = None
        self.artifacts.clear()

    def close(self) -> None:
        """Leave the compiler's session and remove the artifacts and the cache."""
        if self._session is not None:
            self._session.close()
            self._session = None
        self.drop_program()
        shutil.rmtree(self.workdir, ignore_errors=True)
