"""AOTInductor engines built partition by partition from a mapped model, both weight settings.

Each AOTInductor build costs seconds (a C++ compile), so the module builds few engines: two
``mapped`` ones and one of each packaged setting, sharing one compiler cache (the harness's own
packaging is tested further in ``test_compile_streamed``).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import harness.engines.compile.inductor as inductor
from harness.engines.builder import BuiltEngine
from harness.engines.compile.backend import CompilerBackend
from harness.engines.compile.check_process import CheckProcessError, check_in_processes
from harness.engines.compile.compare import compare_with_eager
from harness.engines.compile.compiler import EngineBuildError, EngineLoadError
from harness.engines.compile.entry import Entry
from harness.engines.compile.graph_partition import (
    GraphPartition,
    PartitionRule,
    program_weight_bytes,
    program_weights,
)
from harness.engines.compile.inductor import (
    InductorCompiler,
    LoadedEngine,
    _recorded,
    check_device,
    compile_engine,
    device_copy_bytes,
    free_device_copies,
    inductor_cache,
    load_engine,
    release_copied_sources,
    to_device,
)
from harness.engines.compile.input_strides import EngineInputError, InputLayout, conform, input_layouts
from harness.engines.compile.pipeline import CompiledPipeline, Routing
from harness.engines.compile.source import ModelSource
from harness.measure.procfs import PeakTracker
from harness.models import SyntheticTransformer, fill_non_persistent
from harness.models.checkpoints import ensure_checkpoint
from harness.scenario import ModelConfig
from harness.tests.fixtures import measured
from harness.tests.pages import PAGE, resident_pages
from harness.units import MIB
from weightmap import ReleasePlan, ReleaseStep, map_weights

# 3.5 MiB of bfloat16 weights: the tied embedding (2 MiB) and one layer (1.5 MiB).
SHAPE: dict[str, Any] = {"layers": 1, "width": 256, "heads": 4, "vocab": 4096, "dtype": torch.bfloat16}
TOKENS = torch.tensor([[7, 1, 4093, 12, 12, 600]])
def _mapped(path: Path) -> SyntheticTransformer:
    model = SyntheticTransformer(**SHAPE)
    map_weights(model, path, strict=True).close()
    fill_non_persistent(model)
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path, _ = ensure_checkpoint(SyntheticTransformer(**SHAPE), tmp_path_factory.mktemp("ckpt") / "m.safetensors",
                                seed=2, progress=False)
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("inductor-cache")


@dataclass
class Build:
    model: SyntheticTransformer
    parts: list[GraphPartition]
    backend: CompilerBackend
    built: list[BuiltEngine] = field(default_factory=list)
    hwm: list[int | None] = field(default_factory=list)
    events: list[tuple[str, int]] = field(default_factory=list)
    steps: list[ReleaseStep] = field(default_factory=list)
    env_during: list[str | None] = field(default_factory=list)

    def load(self) -> CompiledPipeline:
        """Every artifact loaded (``mapped`` ones with their weights) into a runnable pipeline."""
        backend = self.backend
        assert backend.program is not None
        engines = [backend.engine_compiler.load(backend.artifacts[p.index]) for p in self.parts]
        return CompiledPipeline(Routing.of(backend.program, self.parts), engines, backend.device)


def _build(path: Path, work: Path, cache: Path, compiler: InductorCompiler, resize: bool, **cut: int) -> Build:
    """The builder's steps as the worker takes them: export, cut, each engine built and its weights released."""
    model = _mapped(path)
    backend = CompilerBackend(compiler, work, PartitionRule(**cut), cache_dir=cache)
    program = backend.export_program(model, (TOKENS,), {}, checkpoint=[path]).program
    parts = backend.cut()
    plan = ReleasePlan.from_names(program, [p.weights for p in parts], resize=resize)
    build = Build(model, parts, backend)
    tensors = {**program.state_dict, **program.constants}
    tracker = PeakTracker()
    for part in parts:
        build.events.append(("start", part.index))
        tracker.begin()
        build.built.append(backend.build_engine(part.index, {n: tensors[n] for n in part.weights}))
        build.env_during.append(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
        build.hwm.append(tracker.end())
        build.events.append(("built", part.index))
        build.steps.append(plan.built(part.index))
    return build


@pytest.fixture(scope="module")
def mapped(checkpoint: Path, cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Build]:
    # The cap puts the embedding and the layer up to its up_proj in the first engine, down_proj, the
    # norm and the tied head in the second.
    yield _build(checkpoint, tmp_path_factory.mktemp("mapped"), cache, InductorCompiler(weights="mapped"),
                 False, cap_bytes=int(3.25 * MIB))


def test_mapped_engines_build_in_order_releasing_after_each(mapped: Build) -> None:
    assert len(mapped.parts) == 2
    assert mapped.events == [("start", 0), ("built", 0), ("start", 1), ("built", 1)]
    program = mapped.backend.program
    assert program is not None
    released = sum(s.released_bytes for s in mapped.steps)
    kept = sum(s.kept_bytes for s in mapped.steps)
    assert released + kept == program_weight_bytes(program)
    assert kept == mapped.model.inv_freq.numel() * 4  # the one tensor that is not a mapped view
    assert mapped.backend.compiler == "inductor" and mapped.backend.weights == "mapped"
    assert [b.artifact.name for b in mapped.built if b.artifact] == ["engine-000.pt2", "engine-001.pt2"]
    for built, hwm, part in zip(mapped.built, mapped.hwm, mapped.parts, strict=True):
        record = measured(built.columns)
        assert record["artifact_bytes"] == built.nbytes < part.weight_bytes  # the artifact holds none of its weights
        assert record["compile_s"] > 0 and record["cache_bytes"] > 0
        assert hwm is None or hwm >= record["rss_before_bytes"]
        assert record["children_peak_bytes"] > 0  # the compiler's subprocesses, sampled
        assert 0 < record["children_pss_bytes"] <= record["children_peak_bytes"]  # shared pages split among them
        assert built.artifact is not None and built.artifact.is_file()


def test_compiler_cache_lives_where_the_caller_says(mapped: Build, cache: Path) -> None:
    assert mapped.env_during == [str(cache.resolve())] * 2
    assert any(cache.iterdir())


def test_mapped_pipeline_runs_on_the_views_and_equals_eager(mapped: Build, checkpoint: Path) -> None:
    pipeline = mapped.load()
    assert mapped.backend.program is not None
    weights = program_weights(mapped.backend.program)
    for engine in pipeline.engines:
        assert isinstance(engine, LoadedEngine)
        assert engine.weights == "mapped" and engine.constants
        for name, tensor in engine.constants.items():
            assert tensor.data_ptr() == weights[name].data_ptr(), f"{name} was copied"
    comparison = compare_with_eager(pipeline, _mapped(checkpoint), (TOKENS,)).check()
    assert comparison.outputs == 1 and comparison.max_abs_diff < 1e-4


def test_a_mapped_engine_is_never_run_without_its_weights(mapped: Build) -> None:
    path = mapped.backend.artifacts[1].path
    given = dict(mapped.backend.artifacts[1].constants)
    with pytest.raises(EngineLoadError, match=r"engine-001\.pt2.*norm\.weight: not given"):
        load_engine(path)
    name = "norm.weight"
    with pytest.raises(EngineLoadError, match=r"norm\.weight: built for"):
        load_engine(path, constants={**given, name: torch.ones(given[name].numel() + 1, dtype=torch.bfloat16)})
    released = given[name].clone()
    released.untyped_storage().resize_(0)
    with pytest.raises(EngineLoadError, match=r"norm\.weight: its storage was released"):
        load_engine(path, constants={**given, name: released})


def test_the_check_loads_the_engines_in_processes_of_its_own(
        mapped: Build, checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = mapped.backend
    backend.source = ModelSource(ModelConfig(source="synthetic", layers=1, width=256, heads=4, vocab=4096,
                                             dtype="bfloat16"), checkpoint, (checkpoint,), tokens=TOKENS.shape[1],
                                 seed=0)
    backend.entry = Entry(mapped.model, (TOKENS,))
    request = backend.check_request()
    # the mapped engines are handed the re-mapped model's tensors by name: nothing of the weights is copied over
    assert [set(e.model_tensors) for e in request.engines] == [set(p.weights) for p in mapped.parts]
    assert all(not e.own for e in request.engines)

    def refuse(*args: Any) -> None:
        raise AssertionError("an engine was loaded in the measuring process")

    monkeypatch.setattr(InductorCompiler, "load", refuse)
    checked = check_in_processes(request, tmp_path)
    assert checked.comparison.ok, checked.comparison.detail
    assert checked.comparison.outputs == 1 and checked.comparison.max_abs_diff < 1e-4
    assert checked.peak_bytes is not None and checked.peak_bytes > 0
    assert list(tmp_path.iterdir()) == []  # the request and the outputs are removed
    missing = dataclasses.replace(request, engines=(dataclasses.replace(request.engines[0],
                                                                       path=tmp_path / "gone.pt2"),
                                                    *request.engines[1:]))
    with pytest.raises(CheckProcessError, match=r"the check's built process failed: .*gone\.pt2"):
        check_in_processes(missing, tmp_path)


@pytest.mark.parametrize("weights", ["packaged", "packaged_compiler"])
def test_packaged_engine_holds_its_weights(checkpoint: Path, cache: Path, tmp_path: Path, weights: str) -> None:
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    build = _build(checkpoint, tmp_path, cache, InductorCompiler(weights=weights), True, count=1)  # type: ignore[arg-type]
    (built,) = build.built
    (part,) = build.parts
    assert build.backend.weights == weights
    assert measured(built.columns)["artifact_bytes"] > part.weight_bytes  # the weights are in the artifact
    assert [a.constants for a in build.backend.artifacts.values()] == [{}]
    pipeline = build.load()
    # The mapped weights' pages were dropped after the build; the engine does not read them.
    compare_with_eager(pipeline, _mapped(checkpoint), (TOKENS,)).check()
    assert build.env_during == [str(cache.resolve())]
    build.backend.close()  # the builder leaves the compiler's session: the cache's variables are restored
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before


def test_only_artifacts_that_record_their_weight_setting_load(tmp_path: Path) -> None:
    with pytest.raises(EngineLoadError, match="does not record its weight setting"):
        _recorded(tmp_path / "x.pt2", {"AOTI_DEVICE_KEY": "cpu"})
    recorded = {"weightmap_harness.weights": "mapped", "weightmap_harness.constants": "{}"}
    with pytest.raises(EngineLoadError, match="does not record the layouts of its inputs"):
        _recorded(tmp_path / "x.pt2", recorded)
    assert _recorded(tmp_path / "x.pt2", {**recorded, "weightmap_harness.inputs": "[]"})[0] == "mapped"


def test_settings_and_devices_are_checked_before_building() -> None:
    with pytest.raises(ValueError, match="weights must be one of packaged, packaged_compiler, mapped"):
        InductorCompiler(weights="copied")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="package_constants_in_so is set by the weights setting"):
        InductorCompiler(configs={"aot_inductor.package_constants_in_so": False})
    with pytest.raises(EngineBuildError, match="cpu or cuda"):
        check_device("mps")
    if not torch.cuda.is_available():
        with pytest.raises(EngineBuildError, match="need a GPU"):
            check_device("cuda")


def test_inductor_cache_restores_the_environment(tmp_path: Path) -> None:
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with inductor_cache(tmp_path / "c") as path:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path) and path.is_dir()
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before


def test_a_built_model_that_differs_from_eager_is_an_error() -> None:
    x = (torch.ones(3),)
    close = compare_with_eager(lambda t: t * 1.00001, lambda t: t, x)
    assert close.ok and close.max_abs_diff == pytest.approx(1e-5, rel=1e-2)
    far = compare_with_eager(lambda t: t + 1e-3, lambda t: t, x)
    assert not far.ok and "beyond" in far.detail
    with pytest.raises(AssertionError, match="3 of 3 elements"):
        far.check()
    shape = compare_with_eager(lambda t: t[:2], lambda t: t, x)
    assert not shape.ok and "built" in shape.detail


class _MaskCount(torch.nn.Module):
    def forward(self, mask: torch.Tensor) -> tuple[torch.Tensor]:
        return (mask.to(torch.int32).cumsum(dim=1),)


def _strided_view(first: bool) -> torch.Tensor:
    """A ``(1, 256)`` broadcast of one entry (strides (1, 0)) whose storage continues with False."""
    base = torch.zeros(512, dtype=torch.bool)
    base[0] = first
    return base[:1].view(1, 1).expand(1, 256)


def test_an_engine_reads_a_broadcast_input_as_the_layout_it_was_built_for(cache: Path, tmp_path: Path) -> None:
    # Built for a contiguous mask (as a GPU engine is after the move re-strides a broadcast
    # boundary value): handed the broadcast view as it is, it would read the 255 False bytes
    # after the one True and count 1 instead of 256.
    program = torch.export.export(_MaskCount(), (torch.ones(1, 256, dtype=torch.bool),))
    compiler = InductorCompiler(weights="packaged")
    with compiler.session(cache):
        path = compile_engine(program, tmp_path / "mask.pt2", compiler).path
    engine = load_engine(path)
    assert engine.inputs == (InputLayout("mask", "bool", (1, 256), (256, 1), "cpu"),)
    view = _strided_view(True)
    (counts,) = engine(view)
    assert counts[0, -1].item() == 256
    assert torch.equal(counts, _MaskCount()(view)[0])
    with pytest.raises(EngineInputError, match=r"mask\.pt2: input mask: the engine was built for bool \[1, 256\]"):
        engine(torch.ones(1, 256, dtype=torch.int32))
    with pytest.raises(EngineInputError, match="takes 1 inputs"):
        engine(view, view)


def test_examples_moved_to_a_device_are_laid_out_as_its_graph_records_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # A partition's examples are made on the build's device with the recorded strides; the
    # move re-strides the graph's broadcast input to a dense one but leaves such an example
    # as it was, and AOTInductor tuning on a GPU runs the program on it against the graph's
    # layout ("expected size 256==256, stride 0==1"). "meta" stands in for the GPU here.
    monkeypatch.setattr(inductor, "check_device", lambda d: torch.device("meta"))
    program = torch.export.export(_MaskCount(), (_strided_view(True),))
    broadcast_example = torch.empty_strided((1, 256), (1, 0), dtype=torch.bool, device="meta")
    program.example_inputs = ((broadcast_example,), {})
    moved = to_device(program, "meta")
    (layout,) = input_layouts(moved)
    (example,) = moved.example_inputs[0]
    assert layout.stride == (256, 1) and layout.device == "meta"
    assert layout.matches(example) and example.stride() == (256, 1)


def test_inputs_are_laid_out_as_recorded(tmp_path: Path) -> None:
    path = tmp_path / "e.pt2"
    broadcast = InputLayout("m", "bool", (1, 256), (1, 0), "cpu")
    dense = InputLayout("m", "bool", (1, 256), (256, 1), "cpu")
    view = _strided_view(True)
    assert conform(path, [broadcast], [view])[0] is view  # already as recorded: not copied
    (laid,) = conform(path, [dense], [view])
    assert laid.stride() == (256, 1) and laid.all()
    (back,) = conform(path, [broadcast], [laid])
    assert back.stride()[1] == 0 and back.all()
    varying = torch.zeros(1, 256, dtype=torch.bool)
    varying[0, 3] = True
    with pytest.raises(EngineInputError, match=r"e\.pt2: input m: .*dimension 1 broadcast .* varies along it"):
        conform(path, [broadcast], [varying])
    with pytest.raises(EngineInputError, match=r"input m: the engine was built for bool \[1, 256\] strides \[1, 0\] "
                                               r"on cpu, given bool \[1, 128\]"):
        conform(path, [broadcast], [varying[:, :128]])


class _Layer(torch.nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.proj(x).relu(),)


def test_a_built_program_is_not_kept_alive_by_the_compiler(cache: Path, tmp_path: Path) -> None:
    # On a GPU the program's weights are the engine's device copies: a packaged engine no longer
    # needs them once written, and the next engine's build should not start with them allocated.
    program = torch.export.export(_Layer(), (torch.randn(2, 64),))
    weight = weakref.ref(program.state_dict["proj.weight"])
    compiler = InductorCompiler(weights="packaged")
    with compiler.session(cache):
        path = compile_engine(program, tmp_path / "layer.pt2", compiler).path
    del program
    gc.collect()
    assert weight() is None, "the compiled program's weights are still referenced after its build"
    assert path.is_file()


def test_device_copies_are_freed_and_the_callers_tensors_kept() -> None:
    source, shared = torch.randn(64, 64), torch.randn(8)
    copy = source.clone()  # what to_device makes on a GPU
    freed = free_device_copies({"w": copy, "b": shared}, {"w": source, "b": shared})
    assert freed == 64 * 64 * 4
    assert copy.untyped_storage().nbytes() == 0
    assert source.untyped_storage().nbytes() == 64 * 64 * 4 and shared.untyped_storage().nbytes() == 8 * 4


@pytest.mark.parametrize("drop_host_pages", [True, False])
def test_a_packaged_build_frees_the_copies_it_moved_and_the_engine_still_runs(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, drop_host_pages: bool) -> None:
    # On a GPU the compiler builds from device copies of the weights; a packaged engine holds its
    # own, so the copies are freed once it is written, whoever inside torch still refers to them;
    # and nothing of the build reads the mapped weights' pages once copied, so they are dropped
    # where the compiler is asked to. Here a "move" to the CPU that copies every weight stands in
    # for the move to a GPU.
    made: list[torch.Tensor] = []

    def copying_move(program: torch.export.ExportedProgram, device: str) -> torch.export.ExportedProgram:
        for name, value in list(program.state_dict.items()):
            moved = torch.nn.Parameter(value.detach().clone(), requires_grad=False)
            program._state_dict[name] = moved
            made.append(moved)
        return program

    checkpoint = tmp_path / "layer.safetensors"
    save_file(_Layer(1024).state_dict(), str(checkpoint))  # a 4 MiB weight
    layer = _Layer(1024)
    map_weights(layer, checkpoint, strict=True).close()
    x = torch.randn(2, 1024)
    want = layer(x)[0]  # reads every page of the mapped weights
    program = torch.export.export(layer, (x,))
    originals = [t for t in program.state_dict.values()]
    weight = layer.proj.weight
    assert resident_pages(weight) >= weight.nbytes // PAGE - 1
    monkeypatch.setattr(inductor, "to_device", copying_move)
    compiler = InductorCompiler(weights="packaged", drop_host_pages=drop_host_pages)
    with compiler.session(cache):
        artifact = compiler.compile(program, tmp_path / "layer")
        assert made and all(t.untyped_storage().nbytes() == 0 for t in made), "the moved copies were kept"
        assert all(t.untyped_storage().nbytes() > 0 for t in originals), "the caller's weights were freed"
        # only the partial pages at the weight's ends, shared with its neighbours in the file, may stay
        assert (resident_pages(weight) <= 2) is drop_host_pages, resident_pages(weight)
        engine = compiler.load(artifact)
        torch.testing.assert_close(engine(x)[0], want)
    torch.testing.assert_close(layer(x)[0], want)  # the dropped pages come back from the file


def test_only_the_mapped_pages_of_copied_weights_are_dropped(tmp_path: Path) -> None:
    checkpoint = tmp_path / "w.safetensors"
    save_file({"copied": torch.randn(MIB), "kept": torch.randn(MIB)}, str(checkpoint))  # 4 MiB each
    holder = torch.nn.Module()
    for name in ("copied", "kept"):
        holder.register_buffer(name, torch.empty(MIB, device="meta"))
    map_weights(holder, checkpoint, strict=True).close()
    copied, kept = holder.get_buffer("copied"), holder.get_buffer("kept")
    want = copied.clone()
    kept.sum()
    plain = torch.randn(MIB)
    # "kept" shares its source's storage (nothing was moved), "plain" is no mapped storage
    moved = {"copied": want.clone(), "tied": want.clone(), "kept": kept, "plain": plain.clone()}
    sources = {"copied": copied, "tied": copied, "kept": kept, "plain": plain}
    assert release_copied_sources(moved, sources) == 4 * MIB  # the tied name's storage counted once
    assert resident_pages(copied) <= 2
    assert resident_pages(kept) >= MIB * 4 // PAGE - 1
    assert resident_pages(plain) >= MIB * 4 // PAGE
    torch.testing.assert_close(copied, want)


def test_a_gpu_build_tunes_its_kernels_on_its_own_weights_unless_told_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # AOTInductor's default tunes a GPU engine's Triton kernels on random tensors, a copy of each weight
    # a kernel reads among them; a GPU build here runs the engine on its own weights instead.
    given: list[dict[str, Any]] = []

    class Stop(EngineBuildError):  # passed on as it is
        pass

    def capture(program: torch.export.ExportedProgram, configs: dict[str, Any]) -> list[str]:
        # the run that tunes them must not record autograd: weights that require grad made it fail
        given.append({**configs, "grad enabled": torch.is_grad_enabled()})
        raise Stop

    monkeypatch.setattr(inductor, "compile_without_weights", capture)
    program = torch.export.export(_Layer(), (torch.randn(2, 64),))
    for device, configs in (("cpu", {}), ("cuda", {}), ("cuda", {"triton.autotune_at_compile_time": True})):
        monkeypatch.setattr(inductor, "check_device", lambda d, device=device: torch.device(device))
        with pytest.raises(Stop):
            compile_engine(program, tmp_path / "e.pt2", InductorCompiler(weights="packaged", configs=configs))
    assert "triton.autotune_at_compile_time" not in given[0]
    assert given[1]["triton.autotune_at_compile_time"] is False
    assert given[2]["triton.autotune_at_compile_time"] is True
    assert not any(g["grad enabled"] for g in given)


def test_the_device_copies_a_build_made_are_counted_once_and_none_on_the_cpu(mapped: Build) -> None:
    source, shared = torch.randn(64, 64), torch.randn(8)
    copy = source.clone()  # what to_device makes on a GPU
    tied = copy.view(-1)  # a second name for the same copy
    moved, sources = {"w": copy, "t": tied, "b": shared}, {"w": source, "t": source, "b": shared}
    assert device_copy_bytes(moved, sources) == 64 * 64 * 4
    assert device_copy_bytes({"b": shared}, {"b": shared}) == 0
    # built on the CPU, an engine records no weights on a GPU
    assert mapped.built and all("gpu_weights_bytes" not in measured(b.columns) for b in mapped.built)
