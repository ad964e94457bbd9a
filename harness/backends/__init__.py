"""The backends a scenario may name (``[build] backend``), one :class:`~harness.backends.spec.BackendSpec` each.

:data:`BACKENDS` is the one registration of every backend; the scenario's choices, the engine registry
(:mod:`harness.engines.registry`: the check and the builder), the machine line (:mod:`harness.measure.machine`),
the report (:mod:`harness.report.compiler`) and the predictor (:mod:`harness.predict.rules`: each backend's measured
memory, :class:`~harness.backends.spec.BackendMemory`) read it, and no other module names a backend but the one that
builds its engines. A new backend is its module (a compiler's: its
:class:`~harness.engines.compile.compiler.EngineCompiler` and ``make_compiler``; another's: its
:class:`~harness.engines.builder.EngineBuilder` and ``make_builder``) and one spec here. Imports no torch: what
runs code is imported when it is called.
"""

from __future__ import annotations

from harness.backends.columns import CompileColumns, CopyColumns, InductorColumns, TwoCallColumns
from harness.backends.spec import BackendMemory, BackendSpec, OwnBytes, Package, TwoCalls, WeightCopies
from harness.catalog import ENGINE_WEIGHTS
from harness.units import MIB

__all__ = ["BACKENDS", "BackendSpec", "backend_memory", "backend_names", "backend_packages", "backend_spec",
           "compiler_backends", "compiler_calls", "memory_sources"]

BACKENDS: dict[str, BackendSpec] = {
    spec.name: spec
    for spec in (
        BackendSpec("copy", "copy", "harness.engines.copy:make_builder", (CopyColumns,),
                    memory=BackendMemory(OwnBytes(0, "results/pi05: `map`'s peak is the baseline plus the largest "
                                                     "engine within 0.01 GiB"))),
        BackendSpec("inductor", "AOTInductor", "harness.engines.compile.inductor:make_compiler",
                    (CompileColumns, InductorColumns), missing="harness.engines.compile.toolchain:inductor_missing",
                    compiler=True, weights=ENGINE_WEIGHTS,
                    weights_missing="harness.engines.compile.streamed:packaged_weights_missing",
                    memory=BackendMemory(
                        OwnBytes(52 * MIB, "results/smoke-compile (`map`, `mapped` weights on the host, which read "
                                           "no weight): build-phase peak less the baseline. Misses: lerobot's "
                                           "ten-step graph is larger than pi0.5's one step, and AOTInductor held "
                                           "0.14-0.21 GiB for it (results/lerobot-compile*), 1.1-2.4 % of the model",
                                 "smoke-compile"),
                        (WeightCopies("packaged_compiler", 2.0,
                                      "its `AotCodeCompiler` joins every constant's bytes, `b\"\".join(_to_bytes("
                                      "...))`, each `bytes(...)` of a storage; results/pi05-compile-packaged-compiler: "
                                      "engine 6's high-water mark 3.671 GiB = the RSS before it 0.428 + 3 x 1.078, "
                                      "the engine's mapped pages and the two copies"),))),
        BackendSpec("openvino", "OpenVINO", "harness.engines.compile.openvino:make_compiler",
                    (CompileColumns, TwoCallColumns), ("cpu",),
                    missing="harness.engines.compile.openvino:openvino_missing", extra="openvino",
                    packages=(Package("openvino", ("openvino",)),), compiler=True, weights=("packaged_compiler",),
                    two_calls=TwoCalls("OpenVINO's convert_model", "OpenVINO's compile_model, its blob written"),
                    memory=BackendMemory(
                        OwnBytes(27 * MIB, "results/smoke-openvino (`map`): build-phase peak less the baseline less "
                                           "3 x the largest engine (its pages and its two weight copies)",
                                 "smoke-openvino"),
                        (WeightCopies("packaged_compiler", 2.0,
                                      "its repack; results/pi05-compile-openvino records `compiler_held_bytes` of "
                                      "2.00-2.03 x every engine but the first, whose 0.18 x this rule overstates"),))),
        BackendSpec("iree", "IREE", "harness.engines.compile.iree:make_compiler", (CompileColumns, TwoCallColumns),
                    ("cpu",), missing="harness.engines.compile.iree:iree_missing", extra="iree",
                    packages=(Package("iree_compiler", ("iree-base-compiler",)),
                              Package("iree_runtime", ("iree-base-runtime",)),
                              Package("iree_turbine", ("iree-turbine",))),
                    compiler=True, weights=("mapped", "packaged_compiler"),
                    two_calls=TwoCalls("iree-turbine's import", "IREE's compile, its .vmfb written"),
                    memory=BackendMemory(
                        OwnBytes(131 * MIB, "results/smoke-iree (`map`, `mapped` weights on the host, which read "
                                            "no weight): build-phase peak less the baseline", "smoke-iree"),
                        (WeightCopies("packaged_compiler", 5.4,
                                      "results/smoke-iree-packaged-compiler alone (`map`): build-phase peak less the "
                                      "baseline, the own bytes and the largest engine, over the largest engine; no "
                                      "larger run checks it, and its engines' RSS grows from one to the next there, "
                                      "so it may grow with the number of engines",
                                      "smoke-iree-packaged-compiler"),))),
        BackendSpec("tensorrt", "Torch-TensorRT", None, (CompileColumns,), ("cuda",),
                    missing="harness.engines.tensorrt:torch_tensorrt_missing",
                    packages=(Package("torch_tensorrt", ("torch_tensorrt", "torch-tensorrt")),),
                    compiler=True, weights=ENGINE_WEIGHTS),
    )
}
"""Every backend, in the order scenarios list them (their weight settings: OpenVINO's blob holds the weights as
OpenVINO writes them; IREE's module holds none, read as parameters from the model's tensors, or holds them
inlined). Each compiler's own bytes were measured on its smallest committed run, where the fixed part dominates;
:mod:`harness.tests.test_predict` recomputes every figure that names its result from that result."""


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


def backend_memory(name: str) -> BackendMemory:
    """What backend ``name`` states of its memory while it builds an engine; none (no own bytes, no copies) for a
    name not registered (a record of another version)."""
    spec = BACKENDS.get(name)
    return spec.memory if spec is not None else BackendMemory()


def memory_sources() -> dict[str, str]:
    """The committed results that set a backend's memory figure, each with what it set (``<backend>'s own bytes``;
    several joined by ``; ``), in registry order."""
    found: dict[str, list[str]] = {}
    for name, spec in BACKENDS.items():
        for result, what in spec.memory.sources().items():
            found.setdefault(result, []).append(f"{name}'s {what}")
    return {result: "; ".join(what) for result, what in found.items()}
