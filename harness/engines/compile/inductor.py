"""AOTInductor as an engine compiler: one partition program in, one ``.pt2`` artifact out.

Three weight settings:

``packaged``
    The artifact holds its weights, as a TensorRT engine holds its own, and the harness writes
    them: the engine is compiled with its weights left out, built to read them from an external
    blob in its archive, and the blob is streamed in from the partition's own tensors a chunk at a
    time (:mod:`harness.engines.compile.streamed`). No copy of the weights passes through the
    compiler or the linker.
``packaged_compiler``
    AOTInductor's default packaging: the weights are serialized into the shared library by the
    compiler, which reads every weight and writes copies of it on the way.
``mapped``
    ``aot_inductor.package_constants_in_so = False``: the artifact holds no weight. Loading
    it hands the engine the partition's tensors with ``load_constants(...,
    user_managed=True)``, which keeps their pointers (no copy): on the CPU the engine runs
    on the mapped views themselves, the way a weight-stripped engine is refitted.

Such an artifact without its constants crashes the process on its first run (a
segmentation fault, not an error). So every artifact built here records its setting and the
name, dtype and shape of each weight it needs in its metadata, and :func:`load_engine`
refuses to return a ``mapped`` engine unless every constant it asks for is given with the
recorded dtype and shape, on its device; an artifact that carries no such record is refused
too. The metadata also records the layout each input was compiled for, and a loaded engine
lays its inputs out that way before it runs (see :mod:`harness.engines.compile.input_strides`: a GPU
engine fed a broadcast view it was not built for reads neighbouring memory).

Compiling on ``cuda`` moves the partition's weights to the GPU first (the engine's weights
live there); the artifact is then built for the GPU. It needs a CUDA build of torch and a GPU;
without one, :func:`check_device` says so before anything is compiled. Two settings keep what a
GPU build holds beside those device copies down:

* the mapped host pages of each weight copied to the device are dropped once the copies are made
  (``drop_host_pages``, :func:`release_copied_sources`): nothing in the build reads them again
  (a packaged engine's blob is written from the device copies), and a weight a later engine
  reads is read from the file again;
* the Triton kernels are tuned by running the engine once on its own weights
  (``triton.autotune_at_compile_time = False``: inductor's two-pass AOT compile), unless
  ``configs`` say otherwise. AOTInductor's default tunes them at compile time on random tensors
  it allocates for every argument of every kernel, the weights a kernel reads included, each
  kept until its last kernel ran: beside the device copies, another device copy of every weight
  a Triton kernel reads (a gathered embedding table, whole).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from harness.backends.columns import InductorColumns
from harness.engines.compile.compiler import (
    HOLDS_WEIGHTS,
    WEIGHTS,
    Artifact,
    EngineBuildError,
    EngineLoadError,
    WeightsMode,
)
from harness.engines.compile.input_strides import (
    InputLayout,
    conform,
    input_layouts,
    layouts_from_json,
    layouts_to_json,
)
from harness.engines.compile.streamed import BlobWriteStats, compile_without_weights, package_streamed
from harness.engines.compile.toolchain import ToolchainError, check_toolchain
from harness.measure.procfs import read_peak

__all__ = [
    "CompiledEngine",
    "InductorCompiler",
    "LoadedEngine",
    "check_device",
    "compile_engine",
    "device_copy_bytes",
    "engine_tensors",
    "examples_as_recorded",
    "free_device_copies",
    "inductor_cache",
    "load_compiler_modules",
    "load_engine",
    "make_compiler",
    "release_copied_sources",
    "to_device",
]

RESERVED_CONFIGS: tuple[str, ...] = (
    "aot_inductor.package",
    "aot_inductor.package_constants_in_so",
    "aot_inductor.package_constants_on_disk_format",
    "aot_inductor.metadata",
)
"""The inductor settings the weight setting decides, which ``configs`` may not give."""
GPU_CONFIGS: Mapping[str, Any] = {"triton.autotune_at_compile_time": False}
"""The inductor settings a GPU build takes unless ``configs`` give them (see the module docstring)."""
_WEIGHTS_KEY = "weightmap_harness.weights"
_CONSTANTS_KEY = "weightmap_harness.constants"
_INPUTS_KEY = "weightmap_harness.inputs"


def load_compiler_modules() -> None:
    """Import the modules AOTInductor builds with, so that a builder made before the worker's baseline has
    them loaded as torch itself is (they are not memory any engine's build adds)."""
    import torch._inductor.codecache  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    import torch._inductor.graph  # noqa: F401
    import torch._inductor.lowering  # noqa: F401
    import torch.export  # noqa: F401


def make_compiler(*, weights: str, device: str, release: bool) -> InductorCompiler:
    """The ``inductor`` backend's compiler for a scenario's build (its factory, :mod:`harness.backends`): engines
    with ``weights`` for ``device``, the host pages of weights copied to a GPU dropped where the scenario releases
    weights; AOTInductor's modules loaded first (:func:`load_compiler_modules`)."""
    load_compiler_modules()
    return InductorCompiler(weights=weights, device=device, drop_host_pages=release)  # type: ignore[arg-type]


@dataclass(frozen=True)
class InductorCompiler:
    """AOTInductor, configured: builds and loads one engine per partition program.

    ``weights``: one of :data:`~harness.engines.compile.compiler.WEIGHTS` (see the module docstring).
    ``device``: ``"cpu"`` or ``"cuda[:N]"``. ``configs``: further ``torch._inductor.config`` settings, by
    their dotted names; those this module sets itself (:data:`RESERVED_CONFIGS`) may not be given; on a GPU
    :data:`GPU_CONFIGS` apply where ``configs`` do not give them. ``drop_host_pages``: on a GPU, drop the
    mapped pages of the weights copied to the device once copied (:func:`release_copied_sources`). It is the
    :class:`~harness.engines.compile.compiler.EngineCompiler` that
    :class:`~harness.engines.compile.backend.CompilerBackend` drives.
    """

    weights: WeightsMode = "packaged"
    device: str = "cpu"
    configs: Mapping[str, Any] = field(default_factory=dict)
    drop_host_pages: bool = False
    name: str = field(default="inductor", init=False)

    def __post_init__(self) -> None:
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, not {self.weights!r}")
        reserved = set(RESERVED_CONFIGS) & set(self.configs)
        if reserved:
            raise ValueError(f"{', '.join(sorted(reserved))} is set by the weights setting, not by configs")
        torch.device(self.device)  # a malformed device name fails here

    def session(self, cache_dir: str | os.PathLike[str]) -> contextlib.AbstractContextManager[Path]:
        """Check the device and the C++ toolchain, and keep inductor's caches under ``cache_dir`` while the block runs.

        ``EngineBuildError`` where the device is missing or the compiler would link engines
        that crash when loaded (see :mod:`harness.engines.compile.toolchain`).
        """
        check_device(self.device)
        try:
            check_toolchain()
        except ToolchainError as exc:
            raise EngineBuildError(str(exc)) from exc
        return inductor_cache(cache_dir)

    def compile(self, program: ExportedProgram, stem: str | os.PathLike[str]) -> Artifact:
        """Build ``stem.pt2`` from a partition program whose weights may still be on the CPU."""
        sources = engine_tensors(program)  # before the move, which replaces them in the program
        on_device = to_device(program, self.device)
        moved = engine_tensors(on_device)
        copied = device_copy_bytes(moved, sources)
        if self.drop_host_pages:
            release_copied_sources(moved, sources)
        built = compile_engine(on_device, Path(stem).with_suffix(".pt2"), self)
        columns = built.columns
        if check_device(self.device).type != "cpu":
            columns = dataclasses.replace(columns, gpu_weights_bytes=copied)
        # A mapped engine runs on the partition's own tensors (on the CPU, the mapped views;
        # on a GPU, their device copies); a packaged one holds its weights.
        if self.weights == "mapped":
            return Artifact(built.path, moved, columns)
        free_device_copies(moved, sources)
        return Artifact(built.path, {}, columns)

    def load(self, artifact: Artifact) -> LoadedEngine:
        """The engine, ready to run (see :func:`load_engine`)."""
        return load_engine(artifact.path, device=self.device, constants=artifact.constants)


def check_device(device: str) -> torch.device:
    """The device engines are built for, with its index; ``EngineBuildError`` where this machine has none."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = torch.version.cuda
            why = "this torch has no CUDA support" if build is None else "no CUDA device is visible"
            raise EngineBuildError(f"engines for {device} need a GPU: {why}")
        # Tensors live on an indexed device (cuda:0); export's device assertions compare the
        # names literally, so a bare "cuda" would fail them once the program is moved.
        return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())
    raise EngineBuildError(f"engines can be built for cpu or cuda, not {device}")


@contextlib.contextmanager
def inductor_cache(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """Inductor's on-disk caches (``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``) under ``directory``.

    The directory is created and kept (it holds the precompiled headers a later build in
    the same directory reuses). Inductor's in-memory caches are cleared on entry and exit so
    that nothing from another directory is used; the variables are restored on exit.
    """
    from torch._inductor.utils import clear_caches

    path = Path(directory).resolve()
    path.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    clear_caches()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    os.environ["TRITON_CACHE_DIR"] = str(path / "triton")
    try:
        yield path
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        clear_caches()


def engine_tensors(program: ExportedProgram) -> dict[str, torch.Tensor]:
    """The tensors a partition program reads, by name: what a ``mapped`` engine is loaded with."""
    tensors: dict[str, Any] = {**program.state_dict, **program.constants}
    return {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}


def _describe_constants(tensors: Mapping[str, torch.Tensor]) -> str:
    return json.dumps({k: [_dtype(v), list(v.shape), list(v.stride())] for k, v in tensors.items()})


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


@dataclass(frozen=True)
class CompiledEngine:
    """What :func:`compile_engine` built: the artifact's ``path``; ``compile_hwm_bytes``, this process's
    high-water mark when the compiler was done (for ``packaged``, before the weights were written;
    VmHWM, so since its last reset: the worker resets it as each engine's build begins); ``write``:
    how the weights were written into the artifact (``packaged`` only)."""

    path: Path
    compile_hwm_bytes: int
    write: BlobWriteStats | None = None

    @property
    def columns(self) -> InductorColumns:
        """What this measured, as the engine's record stores it (the write's columns None without a write)."""
        if self.write is None:
            return InductorColumns(compile_hwm_bytes=self.compile_hwm_bytes)
        return InductorColumns(compile_hwm_bytes=self.compile_hwm_bytes, write_rss_bytes=self.write.rss_start_bytes,
                               write_peak_bytes=self.write.peak_rss_bytes, write_read_bytes=self.write.peak_read_bytes)


def compile_engine(
    program: ExportedProgram,
    package_path: str | os.PathLike[str],
    compiler: InductorCompiler,
) -> CompiledEngine:
    """Compile one partition program with AOTInductor into ``package_path`` (a ``.pt2``).

    ``program`` must already be on ``compiler.device`` (see :func:`to_device`). Run it inside
    :func:`inductor_cache` to keep the compiler's cache where the caller wants it. Returns
    the artifact and what its build measured; failures are ``EngineBuildError`` carrying inductor's message.
    """
    path = Path(package_path)
    if path.suffix != ".pt2":
        raise ValueError(f"an AOTInductor package must end in .pt2: {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = engine_tensors(program)
    configs: dict[str, Any] = dict(compiler.configs)
    if check_device(compiler.device).type != "cpu":
        configs = {**GPU_CONFIGS, **configs}
    configs["aot_inductor.metadata"] = {
        _WEIGHTS_KEY: compiler.weights,
        _CONSTANTS_KEY: _describe_constants(tensors),
        _INPUTS_KEY: layouts_to_json(input_layouts(program)),
    }
    try:
        # without grad: a GPU build runs the engine once to tune its kernels, on weights that may require it
        with torch.no_grad():
            if compiler.weights == "packaged" and tensors:
                files = compile_without_weights(program, configs)
                compiled_hwm = read_peak()
                return CompiledEngine(path, compiled_hwm, package_streamed(files, path, tensors))
            # A program without weights is packaged by the compiler, which then has nothing to copy
            # (and torch's loader cannot map an empty external blob).
            configs["aot_inductor.package_constants_in_so"] = compiler.weights != "mapped"
            out = torch._inductor.aoti_compile_and_package(program, package_path=str(path),
                                                           inductor_configs=configs)
            return CompiledEngine(Path(out), read_peak())
    except EngineBuildError:
        raise
    except Exception as exc:
        raise EngineBuildError(f"AOTInductor failed to build {path.name}: {type(exc).__name__}: {exc}") from exc
    finally:
        _forget_last_trace()


def _forget_last_trace() -> None:
    """Drop torch's module-level record of the last traced graph, which keeps that program's weights alive.

    ``make_fx`` fills ``proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT`` with the nodes of
    every graph it traces, for export's leak detection, and clears it only when it traces
    again; a node holds its graph, whose module holds the program's parameters. After a
    build on a GPU those are the engine's device copies: without this they stay allocated
    until the next engine is traced.
    """
    from torch.fx.experimental import proxy_tensor

    record = getattr(proxy_tensor, "_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT", None)
    if isinstance(record, dict):
        record.clear()


def _copies(moved: Mapping[str, torch.Tensor],
            sources: Mapping[str, torch.Tensor]) -> list[tuple[torch.UntypedStorage, torch.UntypedStorage]]:
    """(the copy's storage, its source's storage) for each storage :func:`to_device` copied from ``sources`` into
    ``moved`` that holds memory, each copy once (names tied to one weight share one). A tensor that shares its
    source's storage was not moved (the CPU, or a weight already on the device): it is none of them."""
    found: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}
    for name, tensor in moved.items():
        source = sources.get(name)
        if source is None:
            continue
        copy, original = tensor.untyped_storage(), source.untyped_storage()
        if copy.data_ptr() != original.data_ptr() and copy.nbytes() > 0:
            found.setdefault(copy.data_ptr(), (copy, original))
    return list(found.values())


def device_copy_bytes(moved: Mapping[str, torch.Tensor], sources: Mapping[str, torch.Tensor]) -> int:
    """The bytes of the storages :func:`to_device` copied from ``sources`` into ``moved`` (each storage once): the
    partition's weights on the device. 0 on the CPU, where nothing is moved."""
    return sum(copy.nbytes() for copy, _ in _copies(moved, sources))


def free_device_copies(moved: Mapping[str, torch.Tensor], sources: Mapping[str, torch.Tensor]) -> int:
    """Free the storage of every tensor in ``moved`` that :func:`to_device` copied from ``sources``; returns the bytes.

    A packaged engine holds its weights, so their device copies are dead once it is
    written; but torch keeps references to some of them (on CUDA, a module tree named
    like the program's parameters outlives the build, some for several builds), and while any
    reference lives the caching allocator cannot reuse the memory: the copies pile up
    engine by engine. Resizing the storage frees the memory whoever still refers to it.
    A tensor that shares its storage with its source (nothing was moved: the CPU, or a
    weight already on the device) is the caller's and is left as it is.
    """
    freed = 0
    for copy, _ in _copies(moved, sources):
        freed += copy.nbytes()
        copy.resize_(0)
    return freed


def release_copied_sources(moved: Mapping[str, torch.Tensor], sources: Mapping[str, torch.Tensor]) -> int:
    """Drop the mapped pages of every tensor in ``sources`` that :func:`to_device` copied into ``moved``; the bytes
    of the storages whose pages were dropped (:func:`weightmap.release_mapped_storage`: each storage once; a
    storage that is not mapped, or was not copied, is left as it is). The tensors stay valid: a later read
    brings their pages in from the file again."""
    from weightmap import release_mapped_storage

    released = {original.data_ptr(): original.nbytes() for _, original in _copies(moved, sources)
                if release_mapped_storage(original)}
    return sum(released.values())


def to_device(program: ExportedProgram, device: str) -> ExportedProgram:
    """``program`` with its weights, examples and device arguments on ``device``.

    On the CPU it is returned as is (mapped views stay mapped). Elsewhere the weights are
    copied there (``torch.export.passes.move_to_device_pass``, in place), and the example
    inputs are laid out as the moved graph records its inputs (:func:`examples_as_recorded`).
    """
    dev = check_device(device)
    if dev.type == "cpu":
        return program
    from torch.export.passes import move_to_device_pass

    return examples_as_recorded(move_to_device_pass(program, dev))


def examples_as_recorded(program: ExportedProgram) -> ExportedProgram:
    """``program`` (changed in place) with each example input in the layout its graph records for that input.

    The move to a device re-strides a recorded broadcast value (stride 0) to a dense one but
    leaves an example already on that device as it was; AOTInductor compiles against the
    graph's layout and, tuning on a GPU, runs the program on its examples, which must match it.
    """
    if program.example_inputs is None:
        return program
    args, kwargs = program.example_inputs
    laid = conform(Path("example inputs"), input_layouts(program), list(args))
    program.example_inputs = (tuple(laid), kwargs)
    return program


@dataclass
class LoadedEngine:
    """A loaded artifact, callable on its partition's inputs; returns a tuple of its outputs.

    For a ``mapped`` engine ``constants`` holds the tensors it runs on: the engine keeps
    only their pointers, so they stay referenced here for as long as the engine lives.
    ``inputs``: the layout each input was compiled for; a call lays its inputs out so
    (:func:`harness.engines.compile.input_strides.conform`) and raises ``EngineInputError`` for a wrong
    dtype, shape or device.
    """

    path: Path
    weights: WeightsMode
    model: Any
    constants: dict[str, torch.Tensor]
    inputs: tuple[InputLayout, ...]

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.model(*conform(self.path, self.inputs, inputs)))


def _recorded(
    path: Path, metadata: Mapping[str, str]
) -> tuple[WeightsMode, dict[str, list[Any]], tuple[InputLayout, ...]]:
    weights = metadata.get(_WEIGHTS_KEY)
    if weights not in WEIGHTS or _CONSTANTS_KEY not in metadata:
        raise EngineLoadError(
            f"{path}: the artifact does not record its weight setting ({_WEIGHTS_KEY}), so it cannot be "
            "known whether it holds its weights; only artifacts built by compile_engine are loaded"
        )
    if _INPUTS_KEY not in metadata:
        raise EngineLoadError(
            f"{path}: the artifact does not record the layouts of its inputs ({_INPUTS_KEY}), so an input "
            "laid out otherwise could not be caught; rebuild it with compile_engine"
        )
    described = json.loads(metadata[_CONSTANTS_KEY])
    return weights, dict(described), tuple(layouts_from_json(metadata[_INPUTS_KEY]))  # type: ignore[return-value]


def load_engine(
    package_path: str | os.PathLike[str],
    *,
    device: str = "cpu",
    constants: Mapping[str, torch.Tensor] | None = None,
) -> LoadedEngine:
    """Load an artifact built by :func:`compile_engine` for ``device``.

    A ``mapped`` artifact needs ``constants``: every name it asks for
    (``get_constant_fqns``), with the dtype and shape recorded when it was built, on
    ``device``. They are handed over with ``user_managed=True`` (no copy). Anything missing
    or different (strides included) is an ``EngineLoadError`` naming the file and the tensor, raised before the
    engine could run. An artifact that holds its weights (:data:`HOLDS_WEIGHTS`) ignores ``constants``.
    """
    path = Path(package_path)
    dev = check_device(device)
    index = dev.index if dev.index is not None else (0 if dev.type == "cuda" else -1)
    try:
        model = torch._inductor.aoti_load_package(str(path), device_index=index)
    except Exception as exc:  # torch's loader names neither the file nor, for a missing one, the reason
        raise EngineLoadError(f"{path}: AOTInductor cannot load it: {type(exc).__name__}: {exc}") from exc
    weights, described, layouts = _recorded(path, model.get_metadata())
    if weights in HOLDS_WEIGHTS:
        return LoadedEngine(path, weights, model, {}, layouts)
    given = dict(constants or {})
    needed = list(model.get_constant_fqns())
    problems = []
    for name in needed:
        tensor = given.get(name)
        if tensor is None:
            problems.append(f"{name}: not given (a mapped engine holds no weights and must be handed each one)")
            continue
        want = described.get(name)
        if want is None:
            problems.append(f"{name}: the artifact asks for a tensor its build did not record")
            continue
        have = [_dtype(tensor), list(tensor.shape), list(tensor.stride())]
        if have != want:
            problems.append(f"{name}: built for dtype, shape, strides {want}, given {have}")
            continue
        if tensor.numel() and tensor.untyped_storage().nbytes() == 0:
            problems.append(
                f"{name}: its storage was released (resized to 0); a mapped engine runs on the tensors "
                "themselves, so release them with weightmap.release_mapped_storage, which only drops pages"
            )
            continue
        if tensor.device != dev and not (dev.type == tensor.device.type == "cuda" and dev.index is None):
            problems.append(f"{name}: on {tensor.device}, but the engine runs on {dev}")
    if problems:
        raise EngineLoadError(f"{path}: cannot hand the engine its weights: " + "; ".join(problems))
    handed = {name: given[name] for name in needed}
    model.load_constants(handed, check_full_update=True, user_managed=True)
    return LoadedEngine(path, weights, model, handed, layouts)
