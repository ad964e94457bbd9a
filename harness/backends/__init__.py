"""The backends a scenario may name (``[build] backend``), one :class:`~harness.backends.spec.BackendSpec` each.

:data:`BACKENDS` is the one registration of every backend; the scenario's choices, the engine registry
(:mod:`harness.engines.registry`: the check and the builder), the machine line (:mod:`harness.measure.machine`)
and the report (:mod:`harness.report.compiler`) read it, and no other module names a backend but the one that
builds its engines. A new backend is its module (a compiler's: its
:class:`~harness.engines.compile.compiler.EngineCompiler` and ``make_compiler``; another's: its
:class:`~harness.engines.builder.EngineBuilder` and ``make_builder``) and one spec here. Imports no torch: what
runs code is imported when it is called.
"""

from __future__ import annotations

from harness.backends.columns import CompileColumns, CopyColumns, InductorColumns, TwoCallColumns
from harness.backends.spec import BackendSpec, Package, TwoCalls
from harness.catalog import ENGINE_WEIGHTS

__all__ = ["BACKENDS", "BackendSpec", "backend_names", "backend_packages", "backend_spec", "compiler_backends",
           "compiler_calls"]

BACKENDS: dict[str, BackendSpec] = {
    spec.name: spec
    for spec in (
        BackendSpec("copy", "copy", "harness.engines.copy:make_builder", (CopyColumns,)),
        BackendSpec("inductor", "AOTInductor", "harness.engines.compile.inductor:make_compiler",
                    (CompileColumns, InductorColumns), missing="harness.engines.compile.toolchain:inductor_missing",
                    compiler=True, weights=ENGINE_WEIGHTS,
                    weights_missing="harness.engines.compile.streamed:packaged_weights_missing"),
        BackendSpec("openvino", "OpenVINO", "harness.engines.compile.openvino:make_compiler",
                    (CompileColumns, TwoCallColumns), ("cpu",),
                    missing="harness.engines.compile.openvino:openvino_missing", extra="openvino",
                    packages=(Package("openvino", ("openvino",)),), compiler=True, weights=("packaged_compiler",),
                    two_calls=TwoCalls("OpenVINO's convert_model", "OpenVINO's compile_model, its blob written")),
        BackendSpec("iree", "IREE", "harness.engines.compile.iree:make_compiler", (CompileColumns, TwoCallColumns),
                    ("cpu",), missing="harness.engines.compile.iree:iree_missing", extra="iree",
                    packages=(Package("iree_compiler", ("iree-base-compiler",)),
                              Package("iree_runtime", ("iree-base-runtime",)),
                              Package("iree_turbine", ("iree-turbine",))),
                    compiler=True, weights=("mapped", "packaged_compiler"),
                    two_calls=TwoCalls("iree-turbine's import", "IREE's compile, its .vmfb written")),
        BackendSpec("tensorrt", "Torch-TensorRT", None, (CompileColumns,), ("cuda",),
                    missing="harness.engines.tensorrt:torch_tensorrt_missing",
                    packages=(Package("torch_tensorrt", ("torch_tensorrt", "torch-tensorrt")),),
                    compiler=True, weights=ENGINE_WEIGHTS),
    )
}
"""Every backend, in the order scenarios list them (their weight settings: OpenVINO's blob holds the weights as
OpenVINO writes them; IREE's module holds none, read as parameters from the model's tensors, or holds them
inlined)."""


def backend_names() -> tuple[str, ...]:
    """The backends' names, as ``[build] backend`` takes them, in registry order."""
    return tuple(BACKENDS)


def compiler_backends() -> tuple[str, ...]:
    """The backends that export the model and build engines from graph partitions (they need a model with a
    forward)."""
    return tuple(name for name, spec in BACKENDS.items() if spec.compiler)


def backend_spec(name: str) -> BackendSpec | None:
    """The spec of backend ``name``; None for a name not registered (a record of another version)."""
    return BACKENDS.get(name)


def compiler_calls(name: str) -> tuple[str, str] | None:
    """The two calls of compiler ``name`` as the report names them (its conversion, its compile), or None for a
    backend that does not build in two calls or is not registered."""
    spec = BACKENDS.get(name)
    calls = spec.two_calls if spec is not None else None
    return (calls.convert, calls.compile) if calls is not None else None


def backend_packages() -> tuple[Package, ...]:
    """Every backend's optional packages, in registry order: what the machine line names the versions of."""
    return tuple(p for spec in BACKENDS.values() for p in spec.packages)
