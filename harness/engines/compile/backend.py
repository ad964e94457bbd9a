"""A compiler as an engine builder: export the loaded model, cut its graph, build one engine per partition.

:class:`CompilerBackend` is the :class:`~harness.engines.builder.EngineBuilder` of any
:class:`~harness.engines.compile.compiler.EngineCompiler` (AOTInductor,
:class:`~harness.engines.compile.inductor.InductorCompiler`, and OpenVINO,
:class:`~harness.engines.compile.openvino.OpenVinoCompiler`, and IREE,
:class:`~harness.engines.compile.iree.IreeCompiler`; a TensorRT builder would be another),
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
   subprocesses and cache growth are the engine's record columns; on a GPU, what the caching
   allocator keeps of the engine's freed device memory is then handed back
   (:func:`release_device_cache`), so that no engine starts on the blocks of the one before;
4. :meth:`~CompilerBackend.check`: the built model (the artifacts loaded one at a time, each
   run on the activations of the ones before) against eager, both on a fresh mapping of the
   checkpoint in processes of their own (:mod:`harness.engines.compile.check_process`).

The worker measures the host high-water mark around each :meth:`build_engine` and
releases the engine's last-read weights after it, as for every builder.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.backends.columns import CompileColumns
from harness.catalog import is_gpu
from harness.engines.builder import BuiltEngine, EngineBuilder, PhaseRecorder
from harness.engines.compile.check_process import (
    CheckRequest,
    check_in_processes,
    engine_files,
    model_tensors,
)
from harness.engines.compile.children import ChildPeak
from harness.engines.compile.compare import Checked
from harness.engines.compile.compiler import Artifact, EngineCompiler
from harness.engines.compile.entry import Entry
from harness.engines.compile.export import ExportResult, export_mapped
from harness.engines.compile.graph_engines import same_partitions
from harness.engines.compile.graph_partition import GraphPartition, PartitionRule, subprogram
from harness.engines.compile.pipeline import Routing
from harness.engines.compile.source import ModelSource
from harness.measure.procfs import read_status
from harness.results.record import ExportRecord

__all__ = ["CompilerBackend", "ModelSource", "release_device_cache"]


def _tree_bytes(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):  # a temporary file removed while walking
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def release_device_cache(device: str) -> bool:
    """On a GPU, hand what this process's caching allocator keeps of freed memory back to the driver: the
    partition program's example inputs and its weights' device copies once freed (a ``packaged`` engine's: a
    ``mapped`` one runs on them, and they stay), so that the next engine starts with none of this one's blocks
    reserved. Collects garbage first, for a program freed only with a reference cycle. Whether it did (never on
    the CPU, nor before CUDA is initialised)."""
    if not is_gpu(device) or not torch.cuda.is_initialized():
        return False
    gc.collect()
    torch.cuda.empty_cache()
    return True


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
        self.routing: Routing | None = None
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

    def export(self, model: nn.Module, phases: PhaseRecorder) -> tuple[nn.Module, ExportRecord | None]:
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
        self.routing = Routing.of(self.program, self.parts)
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
        release_device_cache(self.device)
        size = artifact.path.stat().st_size
        self.artifacts[index] = artifact
        measured = CompileColumns(compile_s=round(seconds, 3), artifact_bytes=size, rss_before_bytes=rss_before,
                                  children_peak_bytes=children.peak_bytes,
                                  children_pss_bytes=children.pss_peak_bytes,
                                  cache_bytes=_tree_bytes(cache) - cache_before)
        own = () if artifact.columns is None else (artifact.columns,)
        return BuiltEngine(nbytes=size, artifact=artifact.path, columns=(measured, *own))

    def release_note(self, unreleased_bytes: int) -> str | None:
        if not (self.keeps_model_tensors and unreleased_bytes):
            return None
        return ("the engines run on the model's own tensors (weights = \"mapped\"): mapped pages are dropped "
                "after each engine, other memory is kept for the engines to run on")

    def check_request(self) -> CheckRequest:
        """What the check's processes are handed: the model source, the compiler, the program's routing and
        how each engine is loaded (a ``mapped`` engine's weights by name, the program's own constants copied)."""
        source = self._source()
        if self.program is None or self.entry is None or self.routing is None or len(self.artifacts) != len(self.parts):
            raise RuntimeError("not every engine was built")
        names = set(model_tensors(self.entry.module))
        engines = tuple(engine_files(self.artifacts[p.index], names) for p in self.parts)
        return CheckRequest(source, self.engine_compiler, self.routing, engines)

    def check(self, phases: PhaseRecorder) -> Checked:
        """The built model against eager, in processes of their own (:func:`check_in_processes`); the outcome.

        The program and the entry, which hold the loaded model, are dropped first: the check's
        processes re-map the checkpoint and load the engines from their artifacts alone.
        """
        request = self.check_request()
        self.drop_program()
        gc.collect()
        with phases.doing("checking the built model against eager, in processes of their own"):
            return check_in_processes(request, self.workdir)

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
