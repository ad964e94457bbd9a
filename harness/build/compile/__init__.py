"""A real compiler in the loop: export a mapped model, cut it into engines, build each with AOTInductor.

The steps, in the order a strategy runs them::

    model = build_on_meta(); map_weights(model, checkpoint); fill_non_persistent(model)
    exported = export_mapped(model, inputs, checkpoint=paths)      # phase "export": reads nothing
    parts = partition_program(exported.program, count=16)          # or cap_bytes=...
    plan = ReleasePlan.from_names(exported.program, [p.weights for p in parts],
                                  release=release_mapped_storage)  # mapped engines keep the views
    built = build_engines(exported.program, parts, InductorCompiler(weights="mapped"), work_dir,
                          cache_dir=cache, on_built=lambda i, record: plan.built(i))
    compare_with_eager(built.load(), fresh_model, inputs).check()  # the built model equals eager

* :func:`export_mapped` (:mod:`.export`): ``torch.export.export`` measured: checkpoint pages
  read, host memory, and whether the program's tensors are the model's own.
* :func:`partition_program` (:mod:`.graph_partition`): the program's graph cut in execution
  order under a per-engine weight cap; each :class:`GraphPartition` lists the weights it
  reads. :func:`subprogram` makes one partition an ExportedProgram of its own.
* :class:`InductorCompiler`, :func:`compile_engine`, :func:`load_engine` (:mod:`.inductor`):
  AOTInductor with weights ``packaged`` in the artifact or ``mapped`` (the artifact holds
  none and runs on the given tensors); a ``mapped`` artifact is never loaded without them.
* :func:`input_layouts`, :func:`conform` (:mod:`.layouts`): the layout each engine input was
  compiled for, recorded in the artifact, and inputs laid out so before an engine runs.
* :func:`build_engines`, :class:`CompiledPipeline` (:mod:`.pipeline`): the build loop with
  per-engine records and callbacks, and the loaded engines run as one model;
* :func:`compare_with_eager`, :func:`compare_outputs`, :func:`upcast_reference`
  (:mod:`.compare`): the check of the built model against eager.
* :func:`check_toolchain` (:mod:`.toolchain`): the C++ compiler inductor links engines with
  must link libstdc++ dynamically (engines with a static copy crash when loaded).

In the harness (``[build] backend = "inductor"``) these steps are the ``inductor`` backend:
:class:`~harness.build.compile.backend.CompilerBackend` runs them for the worker,
:mod:`harness.build.compile.entry` says what is exported (the model's forward, or lerobot's
``sample_actions``) and on which inputs, and :mod:`harness.build.compile.planning` plans the graph
partitions once for every strategy.

``python -m harness.build.compile.probe`` measures one such build of a synthetic transformer.
"""

from harness.build.compile.compare import (
    TOLERANCES,
    Comparison,
    MismatchError,
    compare_outputs,
    compare_with_eager,
    upcast_reference,
)
from harness.build.compile.export import ExportResult, export_mapped, shared_with_model
from harness.build.compile.graph_partition import (
    GraphPartition,
    PartitionError,
    cap_for_program,
    partition_program,
    program_weight_bytes,
    program_weights,
    subprogram,
)
from harness.build.compile.inductor import (
    WEIGHTS,
    Artifact,
    EngineBuildError,
    EngineLoadError,
    InductorCompiler,
    LoadedEngine,
    WeightsMode,
    check_device,
    compile_engine,
    engine_tensors,
    inductor_cache,
    load_engine,
    to_device,
)
from harness.build.compile.layouts import EngineInputError, InputLayout, conform, input_layouts
from harness.build.compile.pipeline import (
    BuiltEngines,
    CompiledPipeline,
    EngineCompiler,
    EngineRecord,
    build_engines,
)
from harness.build.compile.toolchain import Toolchain, ToolchainError, check_toolchain

__all__ = [
    "TOLERANCES",
    "WEIGHTS",
    "Toolchain",
    "ToolchainError",
    "Artifact",
    "BuiltEngines",
    "Comparison",
    "CompiledPipeline",
    "EngineBuildError",
    "EngineInputError",
    "EngineLoadError",
    "EngineCompiler",
    "EngineRecord",
    "ExportResult",
    "GraphPartition",
    "InductorCompiler",
    "InputLayout",
    "LoadedEngine",
    "MismatchError",
    "PartitionError",
    "WeightsMode",
    "build_engines",
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
