"""The engine-builder interface: what every backend does for the worker, and what it measures.

An :class:`EngineBuilder` is made per strategy (:func:`harness.engines.registry.make_builder`) and
driven by the worker through the same steps for every backend:

1. :meth:`~EngineBuilder.export`: a phase of its own for a builder that builds from a traced
   program (a compiler exports the loaded model, and returns the traced module and an
   :class:`~harness.results.record.ExportRecord`); the others have none and return the model;
2. :meth:`~EngineBuilder.partition`: check that the builder's own cut of the model (a compiler's
   graph partitions) is the planned one; nothing to check for the others;
3. :meth:`~EngineBuilder.build` per engine, in order (for most builders: :meth:`~EngineBuilder.build_engine`):
   the engine built from its partition's tensors; it returns a :class:`BuiltEngine`, the columns of the
   engine's :class:`~harness.results.record.EngineRecord` the build measured and its artifact, and calls
   the worker's ``done(i)`` for each engine ``i`` whose tensors it reads no more (the worker then releases
   them); after the last, :meth:`~EngineBuilder.finish` calls ``done`` for those still being read;
4. :meth:`~EngineBuilder.check`: the built model run on the example inputs and compared with
   eager, after the measured phases (a compiler does it in processes of its own); a builder whose
   engines are the weights' own bytes has nothing to run and nothing to compare;
5. :meth:`~EngineBuilder.close`: free the engines (GPU memory, files).

The worker measures around each step (host high-water mark, events, release); what only a
builder knows (how long its copy or compile took, what its compiler's subprocesses used) comes
back in :attr:`BuiltEngine.columns`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from harness.backends.columns import EngineColumns
from harness.results.record import CheckpointInfo, ExportRecord
from harness.scenario import Scenario

if TYPE_CHECKING:
    from harness.engines.compile.compare import Checked

__all__ = ["BuildTarget", "BuiltEngine", "Done", "EngineBuilder", "PhaseRecorder"]

Done = Callable[[int], None]
"""The worker's ``done(index)``: the builder reads engine ``index``'s tensors no more, so they may be released."""


class BuildTarget(Protocol):
    """What a builder is made for: a scenario resolved on this machine (:class:`harness.plan.Plan` is one).

    ``device`` is the resolved one (``cuda`` or ``cpu``), ``engine_cap_bytes`` the per-engine
    weight cap the engines were cut at, ``checkpoint_files`` every file of the checkpoint.
    """

    @property
    def scenario(self) -> Scenario: ...
    @property
    def device(self) -> str: ...
    @property
    def engine_cap_bytes(self) -> int: ...
    @property
    def checkpoint(self) -> CheckpointInfo: ...
    @property
    def checkpoint_files(self) -> tuple[str, ...]: ...
    @property
    def memory_limit_bytes(self) -> int | None: ...


@dataclass(frozen=True)
class BuiltEngine:
    """One engine's build: ``columns``, the groups of :class:`~harness.results.record.EngineRecord` fields only
    the builder measures (:mod:`harness.backends.columns`: how long its copy or its compile took, what the
    compiler and its subprocesses used), each of a group its backend's spec declares
    (:attr:`~harness.backends.spec.BackendSpec.columns`; :mod:`harness.engines.copy`;
    :meth:`~harness.engines.compile.backend.CompilerBackend.build_engine` with its compiler's
    :attr:`~harness.engines.compile.compiler.Artifact.columns`); ``artifact``, the engine's file (None for an
    engine in device memory); ``nbytes``, the engine's size."""

    nbytes: int
    artifact: Path | None = None
    columns: tuple[EngineColumns, ...] = ()


class PhaseRecorder(Protocol):
    """What the worker offers a builder for the steps it measures beside the engines."""

    def phase(self, name: str, doing: str) -> AbstractContextManager[dict[str, int | None]]:
        """A measured phase ``name`` (its start and end are events and phase boundaries, the sampler marks it),
        shown as ``doing`` while it runs; the dict it yields takes values for the end event (``rss_bytes``)."""
        ...

    def doing(self, what: str) -> AbstractContextManager[None]:
        """Show ``what`` while the block runs (no phase: outside the measured run)."""
        ...


class EngineBuilder(ABC):
    """Builds engines one at a time from partitions of a loaded model (see the module docstring).

    ``name``: the backend; ``device``: where its engines live. ``compiler`` and ``weights``: the
    compiler's name and weight setting (``StrategyRecord.compiler``, ``compiler_weights``); None
    for a builder that is no compiler. ``keeps_model_tensors``: the engines run on the model's own
    tensors, so a release may drop their mapped pages but must keep the tensors.
    """

    name: str
    device: str
    compiler: str | None = None
    weights: str | None = None
    keeps_model_tensors: bool = False

    def export(self, model: torch.nn.Module, phases: PhaseRecorder) -> tuple[torch.nn.Module, ExportRecord | None]:
        """The module whose tensors the engines read, and what its export measured: ``model`` itself and
        None, unless the builder builds from a traced program (then its export is a phase of ``phases``)."""
        return model, None

    def partition(self, planned: Sequence[Sequence[str]]) -> None:
        """Raise where the builder cuts the model otherwise than ``planned`` (weight names per engine); a
        builder that builds from the model's own tensors takes the plan's cut as it is."""
        return None

    def constants(self) -> dict[str, torch.Tensor]:
        """Tensors engines may read that are not the model's (a traced program's own constants), by name."""
        return {}

    @abstractmethod
    def build_engine(self, index: int, tensors: dict[str, torch.Tensor]) -> BuiltEngine:
        """Build engine ``index`` (engines come in build order) from the tensors it reads, by name."""

    def build(self, index: int, tensors: dict[str, torch.Tensor], done: Done) -> BuiltEngine:
        """Build engine ``index`` and call ``done(i)`` for every engine ``i`` whose tensors the builder reads no
        more, in engine order, each once, on this thread: the worker releases their weights there.

        Here: :meth:`build_engine`, then ``done(index)``. A builder that goes on reading an engine's tensors after
        its build returns (a copy still in flight) calls ``done`` for it later, in a later build or in
        :meth:`finish`, never before the last read of them.
        """
        built = self.build_engine(index, tensors)
        done(index)
        return built

    def finish(self, done: Done) -> None:
        """Wait until the builder reads no engine's tensors and call ``done`` for each engine not yet reported
        (the worker calls it after the last build, and before a strategy's hooks bring in the next engine's
        weights); nothing to wait for here."""
        return None

    def release_note(self, unreleased_bytes: int) -> str | None:
        """Why ``unreleased_bytes`` of weights stayed after the build, where the builder is the reason."""
        return None

    def check(self, phases: PhaseRecorder) -> Checked | None:
        """The built model run on the example inputs and compared with eager's (None: nothing to compare)."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Free the engines (GPU memory, files)."""
