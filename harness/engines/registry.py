"""The backends, one registry entry each: how to tell whether it can run here, and how to make its builder.

=============  =================================================================================
``copy``       :mod:`harness.engines.backends`: the partition's weights copied to GPU memory
               (``cuda``) or to one file per engine (``cpu``); runs everywhere
``inductor``   :mod:`harness.engines.compile`: the loaded model exported, its graph cut into
               partitions and each built with AOTInductor; needs ``torch._inductor`` and a C++
               compiler that links engines which load
``openvino``   the same graph partitions, each converted and compiled by OpenVINO into a blob
               (:mod:`harness.engines.compile.openvino`); needs the ``openvino`` package (the
               ``openvino`` extra), CPU only
``iree``       the same graph partitions, each imported by iree-turbine and compiled by IREE for
               ``llvm-cpu`` into a ``.vmfb`` (:mod:`harness.engines.compile.iree`); needs the
               ``iree`` extra, CPU only
``tensorrt``   needs Torch-TensorRT; no builder in this version, so its check always refuses,
               before anything runs
=============  =================================================================================

A new backend is a module with its :class:`~harness.engines.builder.EngineBuilder` and one
:class:`Backend` line in :data:`BACKEND_ENTRIES` (a TensorRT builder: its ``make``, and a ``why_not``
that asks only whether ``torch_tensorrt`` imports). :func:`check_backend` runs the entry's check
when the plan is made (fail fast); :func:`make_builder` runs it again in the strategy's process
and makes the builder there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from harness.catalog import is_gpu
from harness.engines.builder import BuildTarget, EngineBuilder
from harness.errors import HarnessError

if TYPE_CHECKING:
    from harness.engines.compile.compiler import EngineCompiler

__all__ = ["BACKEND_ENTRIES", "Backend", "BackendUnavailable", "check_backend", "make_builder", "resolve_device"]


class BackendUnavailable(HarnessError, RuntimeError):
    """The scenario asks for a backend or device this machine cannot provide."""


@dataclass(frozen=True)
class Backend:
    """One backend: ``why_not()`` is why it cannot run here (the whole message; None: it can);
    ``make(plan, workdir)`` its builder for a plan, engines under ``workdir`` (None: no builder yet);
    ``weights_why_not(weights)``, where given, why it cannot build engines with that weight setting here."""

    name: str
    why_not: Callable[[], str | None]
    make: Callable[[BuildTarget, Path], EngineBuilder] | None
    weights_why_not: Callable[[str], str | None] | None = None


def _copy_runs_everywhere() -> str | None:
    return None


def _make_copy(plan: BuildTarget, workdir: Path) -> EngineBuilder:
    from harness.engines.backends import CopyToDevice, CopyToFiles

    return CopyToDevice() if is_gpu(plan.device) else CopyToFiles(workdir)


def _inductor_why_not() -> str | None:
    """Why AOTInductor cannot build here: ``torch._inductor`` does not import, or its C++ compiler is missing
    or links engines that crash when loaded (see :mod:`harness.engines.compile.toolchain`)."""
    why = _inductor_missing()
    return None if why is None else f"backend 'inductor' needs AOTInductor: {why}"


def _inductor_missing() -> str | None:
    try:
        import torch._inductor  # noqa: F401
    except Exception as exc:
        return f"torch._inductor is not importable ({type(exc).__name__}: {exc})"
    # outside the try: an error in the harness's own compile modules is a bug to show, not a missing compiler
    from harness.engines.compile.toolchain import ToolchainError, check_toolchain, inductor_cxx

    try:
        cxx = inductor_cxx()
    except Exception as exc:  # torch's InvalidCxxCompiler: none of its candidates runs
        return f"no C++ compiler found (g++ or $CXX; {type(exc).__name__})"
    try:
        check_toolchain(cxx)
    except ToolchainError as exc:
        return str(exc)
    return None


def _inductor_weights_why_not(weights: str) -> str | None:
    """Why AOTInductor engines with ``weights`` cannot be built here: a ``packaged`` engine's blob size is written into
    its shared library with pyelftools (:func:`harness.engines.compile.streamed.record_blob_size`)."""
    if weights != "packaged":
        return None
    try:
        import elftools.elf.elffile  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything
        return (f"backend 'inductor' with weights = \"packaged\" needs pyelftools, which writes each engine's weights "
                f"size into it ({type(exc).__name__}: {exc}); install it (pip install pyelftools; it is in the harness "
                "extra) or use weights = \"packaged_compiler\"")
    return None


def _compiler_backend(plan: BuildTarget, workdir: Path, compiler: EngineCompiler) -> EngineBuilder:
    """The builder that drives ``compiler`` over the graph partitions of the plan's model."""
    from harness.engines.compile.backend import CompilerBackend
    from harness.engines.compile.planning import rule_for
    from harness.engines.compile.source import ModelSource

    build = plan.scenario.build
    rule = rule_for(build.engines, plan.engine_cap_bytes)
    source = ModelSource(config=plan.scenario.model, checkpoint=Path(plan.checkpoint.path),
                         files=tuple(Path(f) for f in plan.checkpoint_files), tokens=build.tokens,
                         seed=plan.checkpoint.seed, memory_limit_bytes=plan.memory_limit_bytes)
    return CompilerBackend(compiler, workdir, rule, source)


def _make_inductor(plan: BuildTarget, workdir: Path) -> EngineBuilder:
    from harness.engines.compile.compiler import WEIGHTS
    from harness.engines.compile.inductor import InductorCompiler, load_compiler_modules

    weights = plan.scenario.build.weights
    if weights not in WEIGHTS:
        raise BackendUnavailable(f"backend 'inductor': weights must be one of {', '.join(WEIGHTS)}, not {weights!r}")
    load_compiler_modules()
    compiler = InductorCompiler(weights=weights, device=plan.device,  # type: ignore[arg-type]
                                drop_host_pages=plan.scenario.build.release)
    return _compiler_backend(plan, workdir, compiler)


def _openvino_why_not() -> str | None:
    """Why OpenVINO cannot build here: the ``openvino`` package does not import."""
    from harness.engines.compile.openvino import openvino_missing

    why = openvino_missing()
    return None if why is None else f"backend 'openvino' needs OpenVINO: {why}"


def _make_openvino(plan: BuildTarget, workdir: Path) -> EngineBuilder:
    from harness.engines.compile.openvino import WEIGHTS, OpenVinoCompiler, load_openvino_modules

    weights = plan.scenario.build.weights
    if weights not in WEIGHTS:
        raise BackendUnavailable(f"backend 'openvino': weights must be {' or '.join(WEIGHTS)}, not {weights!r}")
    if is_gpu(plan.device):
        raise BackendUnavailable(f"backend 'openvino' builds engines for the cpu, not {plan.device}: "
                                 "set [build] device = \"cpu\"")
    load_openvino_modules()
    return _compiler_backend(plan, workdir, OpenVinoCompiler(weights=weights, device=plan.device))


def _iree_why_not() -> str | None:
    """Why IREE cannot build here: its compiler, runtime or iree-turbine does not import."""
    from harness.engines.compile.iree import iree_missing

    why = iree_missing()
    return None if why is None else f"backend 'iree' needs IREE: {why}"


def _make_iree(plan: BuildTarget, workdir: Path) -> EngineBuilder:
    from harness.engines.compile.iree import WEIGHTS, IreeCompiler, load_iree_modules

    weights = plan.scenario.build.weights
    if weights not in WEIGHTS:
        raise BackendUnavailable(f"backend 'iree': weights must be {' or '.join(WEIGHTS)}, not {weights!r}")
    if is_gpu(plan.device):
        raise BackendUnavailable(f"backend 'iree' builds engines for the cpu, not {plan.device}: "
                                 "set [build] device = \"cpu\"")
    load_iree_modules()
    return _compiler_backend(plan, workdir, IreeCompiler(weights=weights, device=plan.device))


def _tensorrt_why_not() -> str | None:
    """Always a reason: without ``torch_tensorrt`` it is missing; with it, this version has no TensorRT builder."""
    try:
        import torch_tensorrt  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything
        why = f"torch_tensorrt is not importable here ({type(exc).__name__}: {exc})"
        return (f"backend 'tensorrt' needs Torch-TensorRT: {why}. Use backend = \"copy\", "
                "or run on a machine where torch_tensorrt is installed.")
    return ("backend 'tensorrt': torch_tensorrt imports here, but building engines with it is not "
            "implemented in this version of the harness; use backend = \"copy\".")


BACKEND_ENTRIES: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("copy", _copy_runs_everywhere, _make_copy),
        Backend("inductor", _inductor_why_not, _make_inductor, _inductor_weights_why_not),
        Backend("openvino", _openvino_why_not, _make_openvino),
        Backend("iree", _iree_why_not, _make_iree),
        Backend("tensorrt", _tensorrt_why_not, None),
    )
}
"""The registry entry of every backend a scenario may name (:data:`harness.catalog.BACKENDS`, the names alone), by
name."""


def _entry(name: str) -> Backend:
    backend = BACKEND_ENTRIES.get(name)
    if backend is None:
        names = [repr(n) for n in BACKEND_ENTRIES]
        raise BackendUnavailable(f"unknown backend {name!r}: expected {', '.join(names[:-1])} or {names[-1]}")
    return backend


def check_backend(name: str, weights: str | None = None) -> None:
    """Fail fast, before any strategy runs, when the backend cannot run here (its entry's ``why_not``), or cannot
    build engines with the ``weights`` setting (its ``weights_why_not``)."""
    entry = _entry(name)
    why = entry.why_not()
    if why is None and weights is not None and entry.weights_why_not is not None:
        why = entry.weights_why_not(weights)
    if why is not None:
        raise BackendUnavailable(why)


def make_builder(plan: BuildTarget, workdir: Path) -> EngineBuilder:
    """The builder of ``plan``'s backend on its (resolved) device, engines under ``workdir``; checked first."""
    backend = plan.scenario.build.backend
    check_backend(backend, plan.scenario.build.weights)
    make = _entry(backend).make
    if make is None:
        raise BackendUnavailable(f"backend {backend!r} has no engine builder in this version of the harness")
    return make(plan, workdir)


def resolve_device(device: str) -> str:
    """``auto`` is ``cuda`` when a GPU is usable, else ``cpu``."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if is_gpu(device) and not torch.cuda.is_available():
        raise BackendUnavailable("device = \"cuda\" was asked for, but torch sees no CUDA device here")
    return device
