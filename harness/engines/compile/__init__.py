"""A real compiler in the loop: export a mapped model, cut it into engines, build each with AOTInductor.

The steps, in the order a strategy runs them (the worker, through
:class:`~harness.engines.compile.backend.CompilerBackend`, the ``inductor`` backend's builder)::

    model = build_on_meta(); map_weights(model, checkpoint); fill_non_persistent(model)
    exported = export_mapped(model, inputs, checkpoint=paths)      # phase "export": reads nothing
    parts = partition_program(exported.program, count=16)          # or cap_bytes=...
    plan = ReleasePlan.from_names(exported.program, [p.weights for p in parts])  # mapped pages dropped,
                                                                   # the views kept for mapped engines
    compiler = InductorCompiler(weights="mapped")
    with compiler.session(cache_dir):
        for part in parts:                                         # one engine per partition, in order
            artifact = compiler.compile(subprogram(exported.program, part), work_dir / f"engine-{part.index:03d}")
            plan.built(part.index)                                 # its last-read weights released
    pipeline = CompiledPipeline(Routing.of(exported.program, parts), [compiler.load(a) for a in artifacts], "cpu")
    compare_with_eager(pipeline, fresh_model, inputs).check()      # the built model equals eager

* :func:`export_mapped` (:mod:`.export`): ``torch.export.export`` measured: checkpoint pages
  read, host memory, and whether the program's tensors are the model's own.
* :func:`partition_program` (:mod:`.graph_partition`): the program's graph cut in execution
  order under a per-engine weight cap; each :class:`GraphPartition` lists the weights it
  reads. :func:`subprogram` makes one partition an ExportedProgram of its own.
* :class:`EngineCompiler`, :class:`Artifact`, the weight settings and the build and load errors
  (:mod:`.compiler`): what every engine compiler is and makes.
* :class:`InductorCompiler`, :func:`compile_engine`, :func:`load_engine` (:mod:`.inductor`):
  AOTInductor with weights ``packaged`` in the artifact or ``mapped`` (the artifact holds
  none and runs on the given tensors); a ``mapped`` artifact is never loaded without them.
* :class:`~harness.engines.compile.openvino.OpenVinoCompiler` (:mod:`.openvino`): OpenVINO, the
  second compiler (the ``openvino`` backend): each partition converted, compiled for the
  CPU and written as a compiled blob that holds its weights.
* :class:`~harness.engines.compile.iree.IreeCompiler` (:mod:`.iree`): IREE, the third
  (the ``iree`` backend): each partition imported by iree-turbine and compiled for
  ``llvm-cpu`` into a ``.vmfb`` that reads the partition's tensors as parameters (``mapped``) or
  holds them inlined (``packaged_compiler``).
* :func:`input_layouts`, :func:`conform` (:mod:`.layouts`): the layout each engine input was
  compiled for, recorded in the artifact, and inputs laid out so before an engine runs.
* :class:`CompiledPipeline` and its :class:`Routing` (:mod:`.pipeline`): the loaded engines run as one model;
* :func:`compare_with_eager`, :func:`compare_outputs`, :func:`upcast_reference`
  (:mod:`.compare`): the check of the built model against eager.
* :func:`~harness.engines.compile.check_process.check_in_processes` (:mod:`.check_process`): that
  check in processes of their own, each re-mapping the checkpoint, after the measured phases.
* :func:`check_toolchain` (:mod:`.toolchain`): the C++ compiler inductor links engines with
  must link libstdc++ dynamically (engines with a static copy crash when loaded).

In the harness these steps are the ``inductor`` backend (its spec in :mod:`harness.backends`, its builder
made by :mod:`harness.engines.registry`): :class:`~harness.engines.compile.backend.CompilerBackend` runs them
for the worker and measures each engine's build, :mod:`harness.engines.compile.entry` says what is
exported (the model's forward, or lerobot's ``sample_actions``) and on which inputs, and
:mod:`harness.engines.compile.graph_engines` plans the graph partitions once for every strategy.
"""

from harness.engines.compile.compare import (
    TOLERANCES,
    MismatchError,
    OutputMatch,
    compare_outputs,
    compare_with_eager,
    upcast_reference,
)
from harness.engines.compile.compiler import (
    WEIGHTS,
    Artifact,
    EngineBuildError,
    EngineCompiler,
    EngineLoadError,
    WeightsMode,
)
from harness.engines.compile.export import ExportResult, export_mapped, shared_with_model
from harness.engines.compile.graph_partition import (
    GraphPartition,
    PartitionError,
    PartitionRule,
    cap_for_program,
    partition_program,
    program_weight_bytes,
    program_weights,
    subprogram,
)
from harness.engines.compile.inductor import (
    InductorCompiler,
    LoadedEngine,
    check_device,
    compile_engine,
    engine_tensors,
    inductor_cache,
    load_engine,
    to_device,
)
from harness.engines.compile.input_strides import EngineInputError, InputLayout, conform, input_layouts
from harness.engines.compile.pipeline import CompiledPipeline, Routing
from harness.engines.compile.toolchain import Toolchain, ToolchainError, check_toolchain

__all__ = [
    "TOLERANCES",
    "WEIGHTS",
    "Toolchain",
    "ToolchainError",
    "Artifact",
    "OutputMatch",
    "CompiledPipeline",
    "EngineBuildError",
    "EngineInputError",
    "EngineLoadError",
    "EngineCompiler",
    "ExportResult",
    "GraphPartition",
    "InductorCompiler",
    "InputLayout",
    "LoadedEngine",
    "MismatchError",
    "PartitionError",
    "PartitionRule",
    "Routing",
    "WeightsMode",
    "cap_for_program",
    "check_device",
    "check_toolchain",
    "compare_outputs",
    "compare_with_eager",
    "compile_engine",
    "conform",
    "engine_tensors",
    "export_mapped",
    "inductor_cache",
    "input_layouts",
    "load_engine",
    "partition_program",
    "program_weight_bytes",
    "program_weights",
    "shared_with_model",
    "subprogram",
    "to_device",
    "upcast_reference",
]
