"""Building a partitioned program engine by engine, and running the engines as one model.

:func:`build_engines` compiles the partitions in build order and measures each build:
compile time, artifact bytes, the kernel's high-water mark of host RSS over the build
(``VmHWM`` reset just before it), the memory of the compiler's subprocesses (sampled), the
growth of its cache and the checkpoint pages it read. Around each build it calls the caller back: ``on_start(i,
partition)`` before, ``on_built(i, record)`` after; the caller releases the weights whose
last reader that engine was there (``weightmap.ReleasePlan.built(i)``), so the next
engine starts without them.

:class:`CompiledPipeline` is the built model: the loaded engines run in order, each on the
activations the earlier ones produced. :mod:`harness.build.compile.compare` judges its outputs
against eager's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.export.graph_signature import TensorArgument as _TensorArgument
from torch.utils import _pytree as pytree

from harness.build.compile.children import ChildPeak
from harness.build.compile.graph_partition import GraphPartition, subprogram
from harness.build.compile.inductor import Artifact
from harness.measure.procfs import PeakTracker, mapping_rss, read_status

__all__ = [
    "BuiltEngines",
    "CompiledPipeline",
    "EngineCompiler",
    "EngineRecord",
    "build_engines",
]


class EngineCompiler(Protocol):
    """What :func:`build_engines` needs of an engine compiler (AOTInductor here; a TensorRT builder would fit).

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


@dataclass(frozen=True)
class EngineRecord:
    """One engine build, as measured.

    ``host_hwm_bytes``: peak RSS of this process during the build (None where the kernel
    refused the reset). ``cache_bytes``: growth of the compiler's cache directory.
    ``children_peak_bytes``: the largest summed RSS of the compiler's subprocesses at one
    sample (every 20 ms, see :class:`~harness.build.compile.children.ChildPeak`), and
    ``largest_child_bytes``/``largest_child``: the largest single one and its name; they are
    not in ``host_hwm_bytes``, which is this process alone. ``pages_read_bytes``:
    growth of this process's resident pages of the checkpoint files over the build (what the
    compiler read of the mapped weights; None when no checkpoint was named).
    """

    index: int
    compiler: str
    weights: str
    device: str
    weight_bytes: int
    weight_count: int
    nodes: int
    compile_s: float
    artifact_bytes: int
    rss_before_bytes: int
    rss_after_bytes: int
    host_hwm_bytes: int | None
    cache_bytes: int
    children_peak_bytes: int
    largest_child_bytes: int
    largest_child: str
    path: str
    pages_read_bytes: int | None = None

    @property
    def peak_over_floor_bytes(self) -> int | None:
        """What the compiler added on top of this engine's weights: peak - (RSS at start + weights)."""
        if self.host_hwm_bytes is None:
            return None
        return self.host_hwm_bytes - (self.rss_before_bytes + self.weight_bytes)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["peak_over_floor_bytes"] = self.peak_over_floor_bytes
        return out


def _tree_bytes(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue  # a temporary file removed while walking
    return total


@dataclass
class BuiltEngines:
    """The artifacts of one build, their records, and what loading them needs."""

    program: ExportedProgram
    parts: list[GraphPartition]
    compiler: EngineCompiler
    artifacts: list[Artifact]
    records: list[EngineRecord]
    baseline_rss_bytes: int
    cache_dir: Path

    @property
    def copy_floor_bytes(self) -> int:
        """RSS at the start of the build + the largest engine's weights: no build can use less."""
        return self.baseline_rss_bytes + max((p.weight_bytes for p in self.parts), default=0)

    def load(self) -> CompiledPipeline:
        """Load every artifact (``mapped`` ones with their weights) into a runnable pipeline."""
        engines = [self.compiler.load(artifact) for artifact in self.artifacts]
        return CompiledPipeline(self.program, self.parts, engines, self.compiler.device)


def build_engines(
    program: ExportedProgram,
    parts: Sequence[GraphPartition],
    compiler: EngineCompiler,
    work_dir: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    on_start: Callable[[int, GraphPartition], None] | None = None,
    on_built: Callable[[int, EngineRecord], None] | None = None,
    track_peak: bool = True,
    checkpoint: Sequence[str | os.PathLike[str]] = (),
) -> BuiltEngines:
    """Compile ``parts`` of ``program`` in order into ``work_dir/engine-NNN.*``.

    ``cache_dir`` (default ``work_dir/compiler-cache``) holds the compiler's caches for the
    build (``compiler.session``). ``on_start`` and ``on_built`` are called around each
    engine; ``on_built`` is where the caller releases that engine's last-read weights.
    ``track_peak=False`` leaves ``VmHWM`` to the caller (the reset is process-wide).
    ``checkpoint`` names the mapped files whose pages each build reads (``pages_read_bytes``).

    With ``weights="mapped"`` the engines keep running on the program's tensors: release
    them with weightmap's default ``ReleasePlan``, which only drops mapped pages; a plan made
    with ``resize=True`` resizes other tensors (non-persistent
    buffers, loaded weights) to 0 and the inductor loader then refuses them. A failed build
    raises the compiler's error (AOTInductor's is an ``EngineBuildError`` naming
    ``engine-NNN.pt2``); engines built before it stay on disk.
    """
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    cache = Path(cache_dir) if cache_dir is not None else work / "compiler-cache"
    tracker = PeakTracker()
    built = BuiltEngines(program, list(parts), compiler, [], [], read_status().rss_bytes, cache)
    with compiler.session(cache) as cache_path:
        built.cache_dir = cache_path
        for part in parts:
            i = part.index
            if on_start is not None:
                on_start(i, part)
            cache_before = _tree_bytes(cache_path)
            ckpt_before = sum(mapping_rss(p) for p in checkpoint) if checkpoint else None
            rss_before = read_status().rss_bytes
            if track_peak:
                tracker.begin()
            start = time.perf_counter()
            with ChildPeak() as children:
                sub = subprogram(program, part, example_device=compiler.device)
                artifact = compiler.compile(sub, work / f"engine-{i:03d}")
            seconds = time.perf_counter() - start
            hwm = tracker.end() if track_peak else None
            ckpt_after = sum(mapping_rss(p) for p in checkpoint) if checkpoint else None
            record = EngineRecord(
                index=i,
                compiler=compiler.name,
                weights=compiler.weights,
                device=compiler.device,
                weight_bytes=part.weight_bytes,
                weight_count=len(part.weights),
                nodes=len(part.nodes),
                compile_s=seconds,
                artifact_bytes=artifact.path.stat().st_size,
                rss_before_bytes=rss_before,
                rss_after_bytes=read_status().rss_bytes,
                host_hwm_bytes=hwm,
                cache_bytes=_tree_bytes(cache_path) - cache_before,
                children_peak_bytes=children.peak_bytes,
                largest_child_bytes=children.largest_bytes,
                largest_child=children.largest_name,
                path=str(artifact.path),
                pages_read_bytes=None if ckpt_before is None or ckpt_after is None else ckpt_after - ckpt_before,
            )
            built.artifacts.append(artifact)
            built.records.append(record)
            del sub
            if on_built is not None:
                on_built(i, record)
    return built


class CompiledPipeline:
    """The engines of a partitioned program, run in build order as the program's forward.

    Called like the exported model (same positional and keyword arguments); inputs are moved
    to the engines' device, and outputs come back as the model returns them (on that device).
    An activation is dropped as soon as no later engine reads it.
    """

    def __init__(
        self,
        program: ExportedProgram,
        parts: Sequence[GraphPartition],
        engines: Sequence[Callable[..., tuple[torch.Tensor, ...]]],
        device: str,
    ) -> None:
        if len(parts) != len(engines):
            raise ValueError(f"{len(parts)} partitions but {len(engines)} engines")
        self.parts = list(parts)
        self.engines = list(engines)
        self.device = torch.device(device)
        sig = program.graph_signature
        self._inputs = [s.arg.name for s in sig.input_specs if s.kind == InputKind.USER_INPUT
                        and isinstance(s.arg, _TensorArgument)]
        self._in_spec = program.call_spec.in_spec
        self._out_spec = program.call_spec.out_spec
        output = next(n for n in program.graph.nodes if n.op == "output")
        self._outputs: list[Any] = [a.name if isinstance(a, torch.fx.Node) else _Constant(a)
                                    for a in output.args[0]]
        kept = {o for o in self._outputs if isinstance(o, str)}
        self._last_read: dict[str, int] = {}
        for part in self.parts:
            for name in part.inputs:
                if name not in kept:
                    self._last_read[name] = part.index

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch.export._tree_utils import reorder_kwargs

        flat = pytree.tree_leaves((args, reorder_kwargs(kwargs, self._in_spec) if kwargs else {}))
        if len(flat) != len(self._inputs) or not all(isinstance(t, torch.Tensor) for t in flat):
            raise TypeError(f"the model takes {len(self._inputs)} tensors ({', '.join(self._inputs)}), "
                            f"got {len(flat)} values")
        env: dict[str, torch.Tensor] = {n: t.to(self.device) for n, t in zip(self._inputs, flat, strict=True)}
        for part, engine in zip(self.parts, self.engines, strict=True):
            outs = engine(*(env[name] for name in part.inputs))
            for name in part.inputs:
                if self._last_read.get(name) == part.index:
                    del env[name]
            env.update(zip(part.outputs, outs, strict=True))
        values = [env[o] if isinstance(o, str) else o.value for o in self._outputs]
        return pytree.tree_unflatten(values, self._out_spec)


@dataclass(frozen=True)
class _Constant:
    value: Any
