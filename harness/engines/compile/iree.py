"""IREE as an engine compiler: one partition program in, one ``.vmfb`` out, for the CPU (``llvm-cpu``).

Each engine is built in two calls, measured apart (:class:`IreeCompiler`), as OpenVINO's are:

1. **Import.** ``iree.turbine.aot.export`` takes the partition's ``ExportedProgram`` and imports
   it into MLIR, in memory. It is handed aliases of the partition's tensors (tensors over the same
   memory with storages of their own, as OpenVINO is): its importer views an inlined weight with
   numpy, which would leave the model's storage unresizable, and the strategies that free a weight by
   resizing its storage after its last engine (``load``) could free none.
2. **Compile and write.** ``ExportOutput.compile(save_to=..., target_backends="llvm-cpu")``
   compiles that module in this process and writes the ``.vmfb`` to ``<stem>.vmfb``, which is
   flushed and dropped from the page cache as the other backends' engines are.

The two weight settings (:data:`WEIGHTS`):

``mapped``
    Every weight and constant of the partition is imported as an *external parameter*
    (iree-turbine's ``ExternalTensorTrait``: scope :data:`SCOPE`, the program's name for it),
    so the import reads no weight and the ``.vmfb`` holds none. At load the engine is handed
    the partition's tensors (:class:`~harness.engines.compile.compiler.Artifact` ``constants``,
    as AOTInductor's ``mapped`` engines are) and IREE's runtime reads them where they lie:
    a ``ParameterIndex`` whose entries are buffers over the tensors' own memory (no copy, and
    no numpy view that would pin their storages), served to the module by an
    ``io_parameters`` module. This is IREE's weightless engine refitted from the mapped
    checkpoint.
``packaged_compiler``
    The weights are inlined into the imported module (dense resources, a copy in memory) and
    compiled into the ``.vmfb``, which holds them as IREE writes them. iree-turbine 3.9's importer
    refuses a bfloat16 weight to inline (``TypeError: Got unsupported ScalarType BFloat16``, in
    ``fx_importer._import_argument``); float32 ones are inlined.

:meth:`IreeCompiler.load` maps the ``.vmfb`` (``VmModule.mmap``) into a context of its own on
IREE's ``local-task`` driver; the engine runs on torch tensors (copied into IREE's buffers and out
again). Both settings matched eager within 2e-7 on a float32 two-layer model here.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.export import ExportedProgram

from harness.backends.columns import TwoCallColumns
from harness.engines.compile.compiler import Artifact, EngineBuildError, EngineLoadError
from harness.engines.compile.handover import aliased
from harness.measure.coldcache import write_back_and_drop
from harness.measure.procfs import read_peak, read_status

__all__ = [
    "DRIVER",
    "SCOPE",
    "TARGET",
    "WEIGHTS",
    "IreeCompiler",
    "IreeEngine",
    "iree_missing",
    "load_iree_modules",
    "make_compiler",
    "program_tensors",
]

WEIGHTS: tuple[str, ...] = ("mapped", "packaged_compiler")
"""The weight settings IREE builds (see the module docstring)."""
TARGET = "llvm-cpu"
"""IREE's compiler target the engines are built for."""
DRIVER = "local-task"
"""IREE's runtime driver the engines run on (the CPU, multi-threaded)."""
SCOPE = "model"
"""The parameter scope a ``mapped`` engine's weights are named in."""


def iree_missing() -> str | None:
    """Why IREE cannot build here (``iree.turbine.aot`` or ``iree.runtime`` does not import, with how to install
    them); None when it can."""
    try:
        import iree.runtime  # noqa: F401
        import iree.turbine.aot  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything
        return (f"iree is not importable here ({type(exc).__name__}: {exc}); install it with "
                "pip install -e '.[iree]'")
    return None


def load_iree_modules() -> None:
    """Load what IREE builds and runs with (iree-turbine's importer, the compiler's and the runtime's libraries), so
    that a builder made before the worker's baseline has them loaded as torch itself is."""
    import iree.runtime
    import iree.turbine.aot  # noqa: F401
    from iree.compiler.api import Session

    Session().close()  # loads the compiler's library (its code, not an engine's build)
    iree.runtime.Config(DRIVER)


def program_tensors(program: ExportedProgram) -> dict[str, torch.Tensor]:
    """The tensors a partition program reads (its weights, buffers and lifted constants), by name: what a ``mapped``
    engine reads as parameters."""
    tensors: dict[str, Any] = {**program.state_dict, **program.constants}
    return {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}


@contextlib.contextmanager
def _handed(program: ExportedProgram, external: bool) -> Iterator[None]:
    """While the block runs, ``program``'s weights and constants are :func:`~harness.engines.compile.handover.alias`
    es of its tensors (iree-turbine's importer views an inlined weight with numpy, which would make the model's own
    storage unresizable for good), each marked an external parameter named by its key in :data:`SCOPE` where
    ``external``; the program's tables are restored afterwards."""
    from iree.turbine.aot.tensor_traits import ExternalTensorTrait

    def mark(name: str, handed: torch.Tensor) -> None:
        if external:
            ExternalTensorTrait(external_scope=SCOPE, external_name=name).set(handed)

    with aliased(program, mark):
        yield


def make_compiler(*, weights: str, device: str, release: bool) -> IreeCompiler:
    """The ``iree`` backend's compiler for a scenario's build (its factory, :mod:`harness.backends`), IREE's
    modules loaded first (:func:`load_iree_modules`); ``release`` changes nothing here."""
    load_iree_modules()
    return IreeCompiler(weights=weights, device=device)


@dataclass(frozen=True)
class IreeCompiler:
    """IREE's ``llvm-cpu`` target as an :class:`~harness.engines.compile.compiler.EngineCompiler` (see the module
    docstring). ``weights``: one of :data:`WEIGHTS`; ``device``: ``cpu`` only. Plain data, so that a check process
    can be handed it."""

    weights: str = "mapped"
    device: str = "cpu"
    name: str = field(default="iree", init=False)

    def __post_init__(self) -> None:
        if self.weights not in WEIGHTS:
            raise ValueError(f"IREE builds engines with weights {' or '.join(WEIGHTS)}, not {self.weights!r}")
        if torch.device(self.device).type != "cpu":
            raise ValueError(f"IREE builds engines for the cpu here ({TARGET}), not {self.device}")

    def session(self, cache_dir: str | os.PathLike[str]) -> contextlib.AbstractContextManager[Path]:
        """Check that IREE imports and yield ``cache_dir`` (created; IREE keeps no cache there). ``EngineBuildError``
        where IREE is missing."""
        why = iree_missing()
        if why is not None:
            raise EngineBuildError(f"backend {self.name!r}: {why}")
        path = Path(cache_dir)
        path.mkdir(parents=True, exist_ok=True)
        return contextlib.nullcontext(path)

    def compile(self, program: ExportedProgram, stem: str | os.PathLike[str]) -> Artifact:
        """Build ``<stem>.vmfb`` from a partition program whose weights are on the CPU (see the module docstring).

        The artifact's ``constants`` are the partition's tensors for ``mapped`` (the engine reads them as its
        parameters), none for ``packaged_compiler``. Its ``columns``, OpenVINO's fields with the same meaning:
        ``convert_s``, the import's seconds; ``convert_hwm_bytes`` and ``compile_hwm_bytes``, this process's
        high-water mark when the import and when the compile were done; ``compiler_read_bytes`` and
        ``compiler_held_bytes``, the growth of file-backed and of anonymous RSS from the call's start to the end of
        the compile, the imported module still held.
        """
        import iree.turbine.aot as aot

        path = Path(stem).with_suffix(".vmfb")
        path.unlink(missing_ok=True)
        tensors = program_tensors(program)
        start = read_status()
        try:
            with _handed(program, external=self.weights == "mapped"):
                began = time.perf_counter()
                exported = aot.export(program)
                convert_s = time.perf_counter() - began
            convert_hwm = read_peak()
            exported.compile(save_to=str(path), target_backends=TARGET)
            compile_hwm = read_peak()
            done = read_status()
            del exported
        except Exception as exc:
            path.unlink(missing_ok=True)
            raise EngineBuildError(f"IREE failed to build {path.name}: {type(exc).__name__}: "
                                   f"{' '.join(str(exc).split())}") from exc
        finally:
            gc.collect()  # the imported module may hold the partition's tensors: drop it before they are released
        if not path.is_file() or not path.stat().st_size:
            raise EngineBuildError(f"{path.name}: IREE's compile returned without writing the module")
        write_back_and_drop(path)
        return Artifact(path, tensors if self.weights == "mapped" else {}, TwoCallColumns(
            convert_s=round(convert_s, 3), convert_hwm_bytes=convert_hwm, compile_hwm_bytes=compile_hwm,
            compiler_read_bytes=done.file_bytes - start.file_bytes,
            compiler_held_bytes=done.anon_bytes - start.anon_bytes,
        ))

    def load(self, artifact: Artifact) -> IreeEngine:
        """The engine of ``artifact``, its module mapped, a ``mapped`` one reading ``artifact.constants`` as its
        parameters (see :class:`IreeEngine`)."""
        return IreeEngine.load(artifact.path, artifact.constants if self.weights == "mapped" else None)


def _window(name: str, tensor: torch.Tensor, path: Path) -> Any:
    """A buffer over ``tensor``'s bytes (no copy, its storage left as it is); ``EngineLoadError`` for a tensor that
    is not contiguous on the CPU or whose storage was released."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise EngineLoadError(f"{path}: parameter {name!r} must be a contiguous tensor on the cpu to be read in "
                              f"place, not {tensor.device} with strides {tuple(tensor.stride())}")
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes and tensor.untyped_storage().nbytes() < tensor.storage_offset() * tensor.element_size() + nbytes:
        raise EngineLoadError(f"{path}: parameter {name!r}: its storage was released (resized); a mapped engine "
                              "reads its weights where they lie, so release them with "
                              "weightmap.release_mapped_storage, which only drops pages")
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())) if nbytes else b""


def _to_iree(device: Any, tensor: torch.Tensor) -> Any:
    """A HAL buffer view holding a copy of ``tensor``'s values on ``device``; bfloat16, which numpy lacks, from its
    16-bit patterns typed ``BFLOAT_16``."""
    import iree.runtime as rt

    host = tensor.detach().to("cpu").contiguous()
    if host.dtype == torch.bfloat16:
        return device.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=device,
            buffer=host.view(torch.int16).numpy(), element_type=rt.HalElementType.BFLOAT_16)
    return host.numpy()


def _to_torch(value: Any) -> torch.Tensor:
    """A torch tensor copied out of an output ``DeviceArray``; bfloat16 (which IREE hands back as ``ml_dtypes``'
    bfloat16, which torch does not take from numpy) from its 16-bit patterns."""
    host = np.array(value.to_host(), copy=True)
    if host.dtype.name == "bfloat16":
        return torch.from_numpy(host.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(host)


@dataclass
class IreeEngine:
    """A loaded ``.vmfb``, callable on its partition's inputs (torch tensors, in the partition's order); returns a
    tuple of its outputs as torch tensors on the CPU.

    ``context`` holds the mapped module (and, for a ``mapped`` engine, the parameter index over ``tensors``, which
    it reads as long as it lives: they are kept here with it).
    """

    path: Path
    context: Any
    function: Any
    tensors: dict[str, torch.Tensor]

    @classmethod
    def load(cls, path: Path, parameters: Mapping[str, torch.Tensor] | None = None) -> IreeEngine:
        """Load ``path`` (written by :meth:`IreeCompiler.compile`); ``parameters``: the tensors a ``mapped`` engine
        reads, by name (None for one that holds its weights). ``EngineLoadError`` naming the file where IREE refuses
        it or a parameter cannot be read in place."""
        import iree.runtime as rt

        config = rt.Config(DRIVER)
        modules = []
        kept = dict(parameters or {})
        if parameters is not None:
            index = rt.ParameterIndex()
            for name, tensor in kept.items():
                index.add_buffer(name, _window(name, tensor, path))
            modules.append(rt.create_io_parameters_module(config.vm_instance, index.create_provider(scope=SCOPE)))
        try:
            modules.append(rt.create_hal_module(config.vm_instance, config.device))
            modules.append(rt.VmModule.mmap(config.vm_instance, str(path)))
            context = rt.SystemContext(vm_modules=modules, config=config)
            function = context.modules.module["main"]
        except Exception as exc:
            raise EngineLoadError(f"{path}: IREE cannot load it: {type(exc).__name__}: "
                                  f"{' '.join(str(exc).split())}") from exc
        return cls(path, context, function, kept)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        device = self.context.config.device
        result = self.function(*(_to_iree(device, t) for t in inputs))
        outputs = result if isinstance(result, (tuple, list)) else (result,)
        return tuple(_to_torch(o) for o in outputs)
