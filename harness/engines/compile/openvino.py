"""OpenVINO as an engine compiler: one partition program in, one compiled blob out.

Each engine is built in two calls, measured apart (:class:`OpenVinoCompiler`):

1. **Convert.** ``openvino.convert_model`` takes the partition's ``ExportedProgram`` with its
   inputs' shapes fixed to the exported ones. It shares the memory of the tensors it is given
   (``share_weights``, its default): its constants are the partition's own tensors, for a mapped
   model the mapped views, and no weight is copied. It reads float32 weights all the same
   (openvino 2026.4 on this project's machine: every page of a float32 engine's weights was
   resident after the call, none of a bfloat16 one's). It shares them through numpy, and a
   storage numpy has viewed can never be resized again: the strategies that free a weight by
   resizing its storage after its last engine (``load``) could then free none. So OpenVINO is
   handed aliases (:func:`~harness.engines.compile.handover.alias`): tensors over the same
   memory, each with a storage of its own, which numpy may pin; the model's own storages stay
   resizable.
2. **Compile and write.** ``Core().compile_model`` builds the engine for the CPU with an empty
   model cache (``CACHE_DIR``) of the engine's own, so that OpenVINO writes the compiled blob to
   a file as it compiles, streamed (``export_model()`` would hand it back as bytes: two
   copies in memory). Writing the blob reads every weight; the compiled model keeps its own
   copies of some (weights repacked for its kernels, in anonymous memory) and points at the
   rest where they lie. Compiled for the exported (static) shapes, its CPU plugin repacks the
   weights of its matrix products while it compiles, in the precision it computes in: a
   bfloat16 weight becomes a float32 copy, twice its bytes (with dynamic shapes it defers the
   repacking to the first inference). Both the converted and the compiled model are dropped before
   :meth:`OpenVinoCompiler.compile` returns, so the harness's release after the engine frees
   what nothing reads any more (a resized storage the compiled model still pointed at would
   be read after it was freed).

The blob file is OpenVINO's cache entry: one header line (``<compiled_blob .../>``: the
OpenVINO version that wrote it) followed by exactly what ``CompiledModel.export_model`` writes.
It is moved to ``<stem>.blob``, flushed and dropped from the page cache
(:func:`~harness.measure.coldcache.write_back_and_drop`), as the other backends' engines are. OpenVINO
writes the file itself, as it compiles, so it cannot go through the harness's atomic writer
(:mod:`harness.fileio.atomic`): an engine is scratch of one run, removed when the run ends, and a
build that fails removes what OpenVINO wrote. :meth:`OpenVinoCompiler.load` maps the file and imports the model
from past that line (``Core().import_model`` of an ``openvino.Tensor`` over the mapping, no copy); the engine
then runs on torch tensors.

Precision: OpenVINO computes in bfloat16 by default on a CPU that has it, which moved a
float32 model's outputs by about 5e-3 of their size here; the engines are compiled, and
imported, with ``INFERENCE_PRECISION_HINT`` float32 (:data:`PRECISION`), which matched eager
within 1e-7 on the same model. The blob keeps the weights' dtypes (a bfloat16 weight stays
bfloat16 there); the compiled model's repacked copies are float32.

OpenVINO sends usage statistics where ``openvino_telemetry`` is installed (a dependency of the
``openvino`` wheel): an event when ``openvino`` is imported (its ``tools.ovc`` package, which
``import openvino`` imports, sends it) and more from ``convert_model``, and it counts its uses in a
file under the home directory. The harness imports ``openvino`` with ``openvino_telemetry``
hidden (:func:`import_openvino`), so that OpenVINO falls back to its own no-op stub, and converts
with that stub in place (:func:`without_telemetry`): no run reaches the network or writes there.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch.export import ExportedProgram

from harness.backends.columns import TwoCallColumns
from harness.engines.compile.compiler import Artifact, EngineBuildError, EngineLoadError
from harness.engines.compile.handover import aliased
from harness.measure.coldcache import write_back_and_drop
from harness.measure.procfs import read_peak, read_status
from harness.units import KIB

__all__ = [
    "DEVICE",
    "PRECISION",
    "WEIGHTS",
    "OpenVinoCompiler",
    "OpenVinoEngine",
    "blob_payload_offset",
    "import_openvino",
    "load_openvino_modules",
    "make_compiler",
    "openvino_missing",
    "without_telemetry",
]

WEIGHTS: tuple[str, ...] = ("packaged_compiler",)
"""The weight settings OpenVINO builds: its blob holds the engine's weights as OpenVINO itself writes them."""
DEVICE = "CPU"
"""The OpenVINO device engines are built for (its CPU plugin)."""
PRECISION = "f32"
"""``INFERENCE_PRECISION_HINT`` at compile and import (see the module docstring)."""
_HEADER = re.compile(rb'^<\?xml[^>]*\?>\s*<compiled_blob\b[^>]*\bheader_size_alignment="(\d+)"[^>]*/>\n')
_HEADER_LIMIT = 64 * KIB  # the header is one line of a few hundred bytes


_TELEMETRY = "openvino_telemetry"


def import_openvino() -> ModuleType:
    """The ``openvino`` module; imported here first, with ``openvino_telemetry`` hidden (so that OpenVINO takes its
    own no-op telemetry stub for good, see the module docstring) and restored for anyone else afterwards."""
    module = sys.modules.get("openvino")
    if module is not None:
        return module
    saved = {k: v for k, v in sys.modules.items() if k == _TELEMETRY or k.startswith(_TELEMETRY + ".")}
    for name in saved:
        del sys.modules[name]
    sys.modules[_TELEMETRY] = None  # type: ignore[assignment]  # import openvino_telemetry raises ImportError
    try:
        import openvino
    finally:
        del sys.modules[_TELEMETRY]
        sys.modules.update(saved)
    return openvino


def openvino_missing() -> str | None:
    """Why OpenVINO cannot build here (the ``openvino`` package does not import, with how to install it); None
    when it can."""
    try:
        import_openvino()
    except Exception as exc:  # ImportError, or a broken install raising anything
        return (f"openvino is not importable here ({type(exc).__name__}: {exc}); install it with "
                "pip install -e '.[openvino]'")
    return None


_CORE: Any = None


def _core() -> Any:
    """This process's ``openvino.Core`` (one per process: it holds the loaded device plugins)."""
    global _CORE
    if _CORE is None:
        _CORE = import_openvino().Core()
    return _CORE


def load_openvino_modules() -> None:
    """Load what OpenVINO builds with (its PyTorch frontend and its CPU plugin), so that a builder made before the
    worker's baseline has them loaded as torch itself is: their code pages are no memory an engine's build adds."""
    import_openvino()
    from openvino.frontend import FrontEndManager

    FrontEndManager().load_by_framework("pytorch")
    _core().get_property(DEVICE, "FULL_DEVICE_NAME")


@contextlib.contextmanager
def without_telemetry() -> Iterator[None]:
    """While the block runs, ``openvino.convert_model`` reports to OpenVINO's no-op telemetry stub (the one it uses
    where ``openvino_telemetry`` is not installed) instead of sending usage statistics, also where ``openvino`` was
    imported by someone else first (with the telemetry :func:`import_openvino` hides)."""
    import_openvino()
    from openvino.tools.ovc import convert_impl, telemetry_stub, telemetry_utils

    modules = [m for m in (convert_impl, telemetry_utils) if hasattr(m, "tm")]
    saved = [m.tm for m in modules]
    for module in modules:
        module.tm = telemetry_stub
    try:
        yield
    finally:
        for module, value in zip(modules, saved, strict=True):
            module.tm = value


def blob_payload_offset(path: Path, head: bytes) -> int:
    """Where the exported model starts in the cache entry ``path`` whose first bytes are ``head``: past its header
    line. ``EngineLoadError`` naming the file for a file that does not start with OpenVINO's cache header, or
    whose header pads the model to an alignment (a layout this loader does not read)."""
    match = _HEADER.match(head[:_HEADER_LIMIT])
    if match is None:
        raise EngineLoadError(f"{path}: not an OpenVINO compiled blob written by its model cache (no "
                              "<compiled_blob .../> header line)")
    alignment = int(match.group(1))
    if alignment != 0:
        raise EngineLoadError(f"{path}: its header pads the model to {alignment} bytes "
                              "(header_size_alignment), which this loader does not read")
    return match.end()


def make_compiler(*, weights: str, device: str, release: bool) -> OpenVinoCompiler:
    """The ``openvino`` backend's compiler for a scenario's build (its factory, :mod:`harness.backends`), OpenVINO's
    modules loaded first (:func:`load_openvino_modules`); ``release`` changes nothing: its engines hold their
    weights."""
    load_openvino_modules()
    return OpenVinoCompiler(weights=weights, device=device)


@dataclass(frozen=True)
class OpenVinoCompiler:
    """OpenVINO's CPU plugin as an :class:`~harness.engines.compile.compiler.EngineCompiler` (see the module
    docstring). ``weights``: ``packaged_compiler`` only (:data:`WEIGHTS`); ``device``: ``cpu`` only. Plain data, so
    that a check process can be handed it."""

    weights: str = "packaged_compiler"
    device: str = "cpu"
    name: str = field(default="openvino", init=False)

    def __post_init__(self) -> None:
        if self.weights not in WEIGHTS:
            raise ValueError(f"OpenVINO builds engines with weights {', '.join(WEIGHTS)} only, not {self.weights!r}: "
                             "its compiled blob holds the weights it wrote itself")
        if torch.device(self.device).type != "cpu":
            raise ValueError(f"OpenVINO builds engines for the cpu here, not {self.device}")

    def session(self, cache_dir: str | os.PathLike[str]) -> contextlib.AbstractContextManager[Path]:
        """Check that OpenVINO imports and yield ``cache_dir`` (created); each engine has a cache of its own beside
        its file, so nothing is shared between engines. ``EngineBuildError`` where OpenVINO is missing."""
        why = openvino_missing()
        if why is not None:
            raise EngineBuildError(f"backend {self.name!r}: {why}")
        path = Path(cache_dir)
        path.mkdir(parents=True, exist_ok=True)
        return contextlib.nullcontext(path)

    def compile(self, program: ExportedProgram, stem: str | os.PathLike[str]) -> Artifact:
        """Build ``<stem>.blob`` from a partition program whose weights are on the CPU (see the module docstring).

        The artifact's ``columns`` (:class:`~harness.results.record.EngineRecord` fields): ``convert_s``;
        ``convert_hwm_bytes`` and ``compile_hwm_bytes``, this process's high-water mark when the conversion and
        when the compile were done (``VmHWM``, since its last reset: the worker resets it as each engine's build
        begins); ``compiler_read_bytes`` and ``compiler_held_bytes``, the growth of file-backed and of anonymous
        RSS from the call's start to the end of the compile, both models still held: the weights' pages OpenVINO
        read, and what it held of its own beside them.
        """
        openvino = import_openvino()
        path = Path(stem).with_suffix(".blob")
        cache = path.with_name(path.name + ".cache")
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        args, _ = program.example_inputs
        start = read_status()
        try:
            began = time.perf_counter()
            with without_telemetry(), aliased(program):
                model = openvino.convert_model(program, input=[list(a.shape) for a in args])
            convert_s = time.perf_counter() - began
            convert_hwm = read_peak()
            compiled = _core().compile_model(model, DEVICE, {"INFERENCE_PRECISION_HINT": PRECISION,
                                                             "CACHE_DIR": str(cache)})
            compile_hwm = read_peak()
            done = read_status()
            del compiled, model
        except Exception as exc:
            shutil.rmtree(cache, ignore_errors=True)
            raise EngineBuildError(f"OpenVINO failed to build {path.name}: {type(exc).__name__}: {exc}") from exc
        finally:
            gc.collect()  # the converted model holds the partition's tensors: drop it before they are released
        blobs = sorted(cache.glob("*.blob"))
        if len(blobs) != 1:
            shutil.rmtree(cache, ignore_errors=True)
            raise EngineBuildError(f"{path.name}: OpenVINO's model cache holds {len(blobs)} compiled blobs, not one: "
                                   "the engine was not written")
        os.replace(blobs[0], path)
        shutil.rmtree(cache, ignore_errors=True)
        write_back_and_drop(path)
        return Artifact(path, {}, TwoCallColumns(
            convert_s=round(convert_s, 3), convert_hwm_bytes=convert_hwm, compile_hwm_bytes=compile_hwm,
            compiler_read_bytes=done.file_bytes - start.file_bytes,
            compiler_held_bytes=done.anon_bytes - start.anon_bytes,
        ))

    def load(self, artifact: Artifact) -> OpenVinoEngine:
        """The engine of ``artifact``, imported from a mapping of its file (see :class:`OpenVinoEngine`)."""
        return OpenVinoEngine.load(artifact.path)


def _to_openvino(tensor: torch.Tensor) -> Any:
    """An ``openvino.Tensor`` holding a copy of ``tensor``'s values; bfloat16, which numpy lacks, as its 16-bit
    patterns typed ``bf16``."""
    openvino = import_openvino()

    host = tensor.detach().to("cpu").contiguous()
    if host.dtype == torch.bfloat16:
        copy = openvino.Tensor(openvino.Type.bf16, list(host.shape))
        np.copyto(np.asarray(copy.data).view(np.int16), host.view(torch.int16).numpy())
        return copy
    return openvino.Tensor(host.numpy(), shared_memory=False)


def _to_torch(value: Any) -> torch.Tensor:
    """A torch tensor copied out of an output ``openvino.Tensor`` (bfloat16 from its 16-bit patterns)."""
    openvino = import_openvino()

    data = value.data
    if value.element_type == openvino.Type.bf16:
        return torch.from_numpy(np.array(data).view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(data, copy=True))


@dataclass
class OpenVinoEngine:
    """An imported blob, callable on its partition's inputs (torch tensors, in the partition's order); returns a
    tuple of its outputs as torch tensors on the CPU.

    ``mapping`` is the file mapped copy-on-write (a private mapping: OpenVINO's tensor must be writable, and
    nothing writes it) and ``source`` the ``openvino.Tensor`` over it past the header: the imported model reads its
    weights there, so both live as long as it does.
    """

    path: Path
    compiled: Any
    mapping: Any
    source: Any

    @classmethod
    def load(cls, path: Path) -> OpenVinoEngine:
        """Import ``path`` (written by :meth:`OpenVinoCompiler.compile`); ``EngineLoadError`` naming the file where
        it is not such a blob or OpenVINO refuses it."""
        openvino = import_openvino()

        try:
            mapping = np.memmap(path, dtype=np.uint8, mode="c")
        except (OSError, ValueError) as exc:
            raise EngineLoadError(f"{path}: cannot map it ({type(exc).__name__}: {exc})") from exc
        offset = blob_payload_offset(path, bytes(mapping[:_HEADER_LIMIT]))
        source = openvino.Tensor(mapping[offset:], shared_memory=True)
        try:
            compiled = _core().import_model(source, DEVICE, {"INFERENCE_PRECISION_HINT": PRECISION})
        except Exception as exc:
            raise EngineLoadError(f"{path}: OpenVINO cannot import it: {type(exc).__name__}: "
                                  f"{' '.join(str(exc).split())}") from exc
        return cls(path, compiled, mapping, source)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ports = self.compiled.inputs
        if len(inputs) != len(ports):
            raise TypeError(f"{self.path.name}: the engine takes {len(ports)} inputs, got {len(inputs)}")
        request = self.compiled.create_infer_request()
        handed = [_to_openvino(tensor) for tensor in inputs]  # referenced until the request has run
        for i, tensor in enumerate(handed):
            request.set_input_tensor(i, tensor)
        request.infer()
        return tuple(_to_torch(request.get_output_tensor(i)) for i in range(len(self.compiled.outputs)))
