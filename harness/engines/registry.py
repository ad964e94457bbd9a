"""The backends at work: whether one can run here, and its builder, both read from its spec.

Every backend is one :class:`~harness.backends.spec.BackendSpec` in :data:`harness.backends.BACKENDS` (what it
needs, the weight settings and devices it builds, its factory); nothing here names one.
:func:`check_backend` runs the spec's checks when the plan is made (fail fast; a backend without a factory is
refused there too); :func:`make_builder` runs them again in the strategy's process and makes the builder there:
a compiler's through one generic builder, :class:`~harness.engines.compile.backend.CompilerBackend`, over the
compiler its factory makes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.backends import BACKENDS, BackendSpec
from harness.backends.columns import EngineColumns
from harness.backends.spec import resolve
from harness.catalog import is_gpu
from harness.errors import HarnessError

if TYPE_CHECKING:
    from harness.engines.builder import BuildTarget, EngineBuilder

__all__ = ["BackendUnavailable", "backend_problem", "check_backend", "declared_columns", "make_builder",
           "resolve_device"]


class BackendUnavailable(HarnessError, RuntimeError):
    """The scenario asks for a backend or device this machine cannot provide."""


def _spec(name: str) -> BackendSpec:
    spec = BACKENDS.get(name)
    if spec is None:
        names = [repr(n) for n in BACKENDS]
        raise BackendUnavailable(f"unknown backend {name!r}: expected {', '.join(names[:-1])} or {names[-1]}")
    return spec


def _choices(values: tuple[str, ...]) -> str:
    """``a``, ``a or b``, ``one of a, b, c``: the values a setting may take, in words."""
    return f"one of {', '.join(values)}" if len(values) > 2 else " or ".join(values)


def backend_problem(spec: BackendSpec, weights: str | None = None) -> str | None:
    """Why ``spec``'s backend cannot build engines here (with ``weights``, where given and it is a compiler): what
    it needs does not import, it has no builder in this version, or it cannot build that weight setting here;
    None when it can."""
    why = resolve(spec.missing)() if spec.missing is not None else None
    if why is not None:
        return f"backend {spec.name!r} needs {spec.title}: {why}"
    if spec.factory is None:
        return (f"backend {spec.name!r}: {spec.title} is installed here, but building engines with it is not "
                "implemented in this version of the harness; use backend = \"copy\".")
    if weights is not None and spec.compiler and spec.weights_missing is not None:
        why = resolve(spec.weights_missing)(weights)
        if why is not None:
            return f"backend {spec.name!r} with weights = \"{weights}\" {why}"
    return None


def check_backend(name: str, weights: str | None = None) -> None:
    """Fail fast, before any strategy runs, when the backend cannot build engines here (:func:`backend_problem`)."""
    why = backend_problem(_spec(name), weights)
    if why is not None:
        raise BackendUnavailable(why)


def _compiler_builder(spec: BackendSpec, plan: BuildTarget, workdir: Path) -> EngineBuilder:
    """The builder that drives ``spec``'s compiler, made by its factory, over the graph partitions of the plan's
    model."""
    from harness.engines.compile.backend import CompilerBackend
    from harness.engines.compile.graph_engines import rule_for
    from harness.engines.compile.source import ModelSource

    build = plan.scenario.build
    assert spec.factory is not None  # checked by backend_problem
    compiler = resolve(spec.factory)(weights=build.weights, device=plan.device, release=build.release)
    if compiler.name != spec.name:
        raise RuntimeError(f"backend {spec.name!r}: its factory {spec.factory} made compiler {compiler.name!r}")
    rule = rule_for(build.engines, plan.engine_cap_bytes)
    source = ModelSource(config=plan.scenario.model, checkpoint=Path(plan.checkpoint.path),
                         files=tuple(Path(f) for f in plan.checkpoint_files), tokens=build.tokens,
                         seed=plan.checkpoint.seed, memory_limit_bytes=plan.memory_limit_bytes)
    return CompilerBackend(compiler, workdir, rule, source)


def make_builder(plan: BuildTarget, workdir: Path) -> EngineBuilder:
    """The builder of ``plan``'s backend on its (resolved) device, engines under ``workdir``; checked first."""
    build = plan.scenario.build
    spec = _spec(build.backend)
    check_backend(spec.name, build.weights if spec.compiler else None)
    if spec.compiler and build.weights not in spec.weights:
        raise BackendUnavailable(f"backend {spec.name!r}: weights must be {_choices(spec.weights)}, "
                                 f"not {build.weights!r}")
    if not spec.builds_on(plan.device):
        raise BackendUnavailable(f"backend {spec.name!r} builds engines for the {' or '.join(spec.devices)}, not "
                                 f"{plan.device}: set [build] device = \"{spec.devices[0]}\"")
    if spec.compiler:
        return _compiler_builder(spec, plan, workdir)
    assert spec.factory is not None  # checked by backend_problem
    builder: EngineBuilder = resolve(spec.factory)(plan, workdir)
    return builder


def declared_columns(name: str, groups: Sequence[EngineColumns]) -> tuple[EngineColumns, ...]:
    """``groups``, what backend ``name``'s builder measured for an engine, each of a group its spec declares
    (:attr:`~harness.backends.spec.BackendSpec.columns`); a ``RuntimeError`` naming the backend and the group
    otherwise."""
    declared = _spec(name).columns
    for group in groups:
        if type(group) not in declared:
            raise RuntimeError(f"backend {name!r}: its builder recorded {type(group).__name__}, which its spec does "
                               f"not declare (it declares {', '.join(c.__name__ for c in declared) or 'none'})")
    return tuple(groups)


def resolve_device(device: str) -> str:
    """``auto`` is ``cuda`` when a GPU is usable, else ``cpu``."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if is_gpu(device) and not torch.cuda.is_available():
        raise BackendUnavailable("device = \"cuda\" was asked for, but torch sees no CUDA device here")
    return device
