"""What a builder measures per engine, typed: the column groups a backend's builds record.

Each group is a frozen dataclass whose fields are :class:`~harness.results.record.EngineRecord` fields of the
same name, each of a type that field takes (the record declares them, with the layout version that added each,
and its codec writes and reads them). A builder hands back the groups it measured
(:attr:`harness.engines.builder.BuiltEngine.columns`); the worker puts them on the engine's record
(:meth:`~harness.results.record.EngineRecord.with_columns`), which refuses a field the record does not declare.
Every backend says which groups its builds record (:attr:`harness.backends.spec.BackendSpec.columns`). Imports no
torch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CompileColumns", "CopyColumns", "EngineColumns", "InductorColumns", "TwoCallColumns"]


@dataclass(frozen=True)
class EngineColumns:
    """A group of engine-record fields one builder measured (the base of every group; holds none)."""


@dataclass(frozen=True)
class CopyColumns(EngineColumns):
    """A copy build split in two, timed apart: faulting the partition's pages in, then copying them."""

    pages_s: float
    copy_s: float


@dataclass(frozen=True)
class CompileColumns(EngineColumns):
    """What any compiler's build measured around the compiler: its seconds, the artifact's bytes, RSS at the
    engine's start, the compiler's processes (their largest summed RSS and PSS) and the growth of its cache
    (negative where the compiler cleaned it)."""

    compile_s: float
    artifact_bytes: int
    rss_before_bytes: int
    children_peak_bytes: int
    children_pss_bytes: int
    cache_bytes: int


@dataclass(frozen=True)
class InductorColumns(EngineColumns):
    """What AOTInductor measured: the high-water mark when it was done; for weights the harness writes into the
    artifact (``packaged``), RSS when the write began, its largest RSS and the weights' pages read meanwhile; on a
    GPU, the bytes of the weights' device copies the build made (None elsewhere)."""

    compile_hwm_bytes: int
    write_rss_bytes: int | None = None
    write_peak_bytes: int | None = None
    write_read_bytes: int | None = None
    gpu_weights_bytes: int | None = None


@dataclass(frozen=True)
class TwoCallColumns(EngineColumns):
    """What a compiler that converts, then compiles measured: the conversion's seconds, the high-water marks when
    each call was done, and the growth of file-backed and of anonymous RSS from the first call's start to the end
    of the second (the weights' pages it read, and what it held of its own beside them)."""

    convert_s: float
    convert_hwm_bytes: int
    compile_hwm_bytes: int
    compiler_read_bytes: int
    compiler_held_bytes: int
