"""The engine builders and their registry: the copy builders give back the model's tensors, every backend is
one registry entry, and the worker drives every builder through the same steps."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from harness.backends import BACKENDS, backend_names
from harness.backends.columns import CompileColumns, CopyColumns
from harness.engines.builder import BuildTarget, BuiltEngine, EngineBuilder, PhaseRecorder
from harness.engines.compile.compare import Checked, OutputMatch
from harness.engines.copy import ALIGN, CopyToDevice, CopyToFiles
from harness.engines.partition import split_into
from harness.engines.registry import BackendUnavailable, backend_problem, check_backend, make_builder
from harness.load.strategies import load_map
from harness.models import SyntheticTransformer, fill_non_persistent
from harness.plan import Plan, make_plan
from harness.results.record import ExportRecord
from harness.results.samples import read_events, read_samples
from harness.scenario import load_scenario
from harness.tests.tiny_scenario import tiny_scenario_text
from harness.worker import measure
from weightmap import save_weights_for_mapping


def eager_and_mapped(tmp_path: Path) -> tuple[torch.nn.Module, torch.nn.Module, dict[str, torch.Tensor]]:
    """A small synthetic model with random weights, and the same model mapped from its checkpoint."""
    torch.manual_seed(0)
    eager = SyntheticTransformer(layers=2, width=64, heads=4, vocab=256, device="cpu")
    with torch.no_grad():
        for t in eager.parameters():
            t.normal_(0, 0.05)
    path = save_weights_for_mapping(eager, tmp_path / "w.safetensors")
    with torch.device("meta"):
        model = SyntheticTransformer(layers=2, width=64, heads=4, vocab=256)
    mapped = load_map(model, path).model
    fill_non_persistent(mapped)
    named = dict(mapped.named_parameters(remove_duplicate=False)) | dict(mapped.named_buffers())
    return eager, mapped, named


def run_on(model: torch.nn.Module, named: dict[str, torch.Tensor], engines: list[dict[str, torch.Tensor]],
           tokens: torch.Tensor) -> torch.Tensor:
    """``model``'s forward with every tensor taken from ``engines``; a tied name takes the engine copy of the
    tensor object it shares (an engine holds each object once)."""
    built = {k: v for engine in engines for k, v in engine.items()}
    for name, t in named.items():
        if name not in built:
            built[name] = next(built[other] for other, o in named.items() if o is t and other in built)
    with torch.no_grad():
        return torch.func.functional_call(model, built, (tokens,), tie_weights=False)  # type: ignore[no-any-return]


def test_copy_backend_engines_give_back_the_model(tmp_path: Path) -> None:
    eager, mapped, named = eager_and_mapped(tmp_path)
    backend = CopyToFiles(tmp_path / "engines")
    engines, _ = split_into(mapped, 3)
    built = [backend.build_engine(e.index, {n: named[n] for n in e.names}) for e in engines]
    assert len(list((tmp_path / "engines").iterdir())) == 3
    assert all(b.artifact is not None and b.artifact.parent == tmp_path / "engines" for b in built)
    tokens = torch.randint(0, 256, (2, 7))
    files = [load_file(str(b.artifact)) for b in built]
    with torch.no_grad():
        torch.testing.assert_close(run_on(mapped, named, files, tokens), eager(tokens))
    backend.close()
    assert not (tmp_path / "engines").exists()


def test_device_backend_packs_each_engine_into_one_buffer(tmp_path: Path) -> None:
    # The GPU path, run on the CPU: one buffer per engine, views into it, same output.
    eager, mapped, named = eager_and_mapped(tmp_path)
    backend = CopyToDevice(device="cpu")
    engines, _ = split_into(mapped, 3)
    for engine in engines:
        size = backend.build_engine(engine.index, {n: named[n] for n in engine.names}).nbytes
        assert engine.nbytes <= size <= engine.nbytes + ALIGN * len(engine.names)
    for copies in backend.engines:
        storages = {t.untyped_storage().data_ptr() for t in copies.values()}
        assert len(storages) == 1, "an engine must be one allocation"
    tokens = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        torch.testing.assert_close(run_on(mapped, named, backend.engines, tokens), eager(tokens))


def test_tensorrt_fails_fast_through_its_registry_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = BACKENDS["tensorrt"]
    message = backend_problem(spec)
    assert message is not None and message.startswith("backend 'tensorrt'")
    if "not importable" in message:  # today's message, word for word
        assert "needs Torch-TensorRT: torch_tensorrt is not importable here (" in message
        assert message.endswith('. Use backend = "copy", or run on a machine where torch_tensorrt is installed.')
    else:
        assert message.endswith("is not implemented in this version of the harness; use backend = \"copy\".")
    with pytest.raises(BackendUnavailable) as raised:
        check_backend("tensorrt")
    assert str(raised.value) == message
    # its spec is all that refuses it: without a factory it is refused where its check passes, and a spec whose
    # check passes and that names a factory is accepted
    monkeypatch.setitem(BACKENDS, "tensorrt", dataclasses.replace(spec, missing=None))
    with pytest.raises(BackendUnavailable, match=r"^backend 'tensorrt': Torch-TensorRT is installed here, but building "
                                                 r"engines with it is not implemented in this version of the harness; "
                                                 r"use backend = \"copy\"\.$"):
        check_backend("tensorrt")
    monkeypatch.setitem(BACKENDS, "tensorrt", dataclasses.replace(spec, missing=None, factory=_TRACED))
    check_backend("tensorrt")


def test_packaged_inductor_engines_without_pyelftools_fail_before_any_strategy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    check_backend("inductor", "packaged")  # pyelftools is in the harness extra
    monkeypatch.setitem(sys.modules, "elftools.elf.elffile", None)  # as if it were not installed
    with pytest.raises(BackendUnavailable, match=r"^backend 'inductor' with weights = \"packaged\" needs pyelftools.*"
                                                 r"use weights = \"packaged_compiler\"$"):
        check_backend("inductor", "packaged")
    for weights in ("mapped", "packaged_compiler"):
        check_backend("inductor", weights)


def test_unknown_backends_are_named_with_the_registered_ones() -> None:
    *first, last = (repr(name) for name in BACKENDS)  # every registered one, in registry order
    with pytest.raises(BackendUnavailable) as raised:
        check_backend("onnx")
    assert str(raised.value) == f"unknown backend 'onnx': expected {', '.join(first)} or {last}"
    assert str(raised.value).startswith("unknown backend 'onnx': expected 'copy', 'inductor', 'openvino', 'iree'")


def test_the_registry_holds_one_spec_per_backend_name() -> None:
    assert backend_names() == tuple(BACKENDS)
    assert backend_names()[:5] == ("copy", "inductor", "openvino", "iree", "tensorrt")  # a new one comes after
    assert all(name == spec.name for name, spec in BACKENDS.items())


@pytest.fixture
def plan(tmp_path: Path) -> Plan:
    path = tmp_path / "s.toml"
    path.write_text(tiny_scenario_text(tmp_path / "c.safetensors", {"engines = 2": "engines = 3"}))
    return make_plan(load_scenario(path), name="t", workdir=tmp_path / "engines")


def test_a_copy_plan_gets_the_copy_builder_of_its_device(plan: Plan, tmp_path: Path) -> None:
    builder = make_builder(dataclasses.replace(plan, device="cpu"), tmp_path / "w")
    assert isinstance(builder, CopyToFiles) and builder.workdir == tmp_path / "w"
    assert isinstance(make_builder(dataclasses.replace(plan, device="cuda"), tmp_path / "w"), CopyToDevice)
    builder.close()


class _Traced(EngineBuilder):
    """A builder that takes every step a compiler takes (an export phase, its own cut, measured columns, a
    run of the built model and a check), around the copy builder's engines; it notes each call."""

    name, device, compiler, weights = "traced", "cpu", "tracer", "mapped"
    EXPORT = ExportRecord(seconds=0.5, nodes=7, pages_read_bytes=0, residency_read_bytes=0, rss_before_bytes=1,
                          rss_after_bytes=2, hwm_bytes=3, anon_delta_bytes=0, not_shared=0)

    def __init__(self, workdir: Path) -> None:
        self.copy = CopyToFiles(workdir)
        self.calls: list[Any] = []
        BUILT.append(self)

    def export(self, model: torch.nn.Module, phases: PhaseRecorder) -> tuple[torch.nn.Module, ExportRecord | None]:
        with phases.phase("export", "tracing") as end:
            end["rss_bytes"] = 2
            self.calls.append("export")
        return model, self.EXPORT

    def partition(self, planned: Any) -> None:
        self.calls.append(("partition", len(planned)))

    def build_engine(self, index: int, tensors: dict[str, torch.Tensor]) -> BuiltEngine:
        built = self.copy.build_engine(index, tensors)
        self.calls.append(("build", index))
        compiled = CompileColumns(compile_s=1.0 + index, artifact_bytes=built.nbytes, rss_before_bytes=0,
                                  children_peak_bytes=0, children_pss_bytes=0, cache_bytes=-5)
        return dataclasses.replace(built, columns=(*built.columns, compiled))

    def check(self, phases: PhaseRecorder) -> Checked | None:
        self.calls.append("check")
        return Checked(OutputMatch(ok=True, outputs=1, max_abs_diff=0.25, detail="within tolerance (traced)"),
                       peak_bytes=12345)

    def close(self) -> None:
        self.calls.append("close")
        self.copy.close()


BUILT: list[_Traced] = []


def make_traced(plan: BuildTarget, workdir: Path) -> EngineBuilder:
    """The traced builder's factory, as a spec names it (:data:`_TRACED`)."""
    return _Traced(workdir)


_TRACED = f"{__name__}:make_traced"


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(BACKENDS, "copy", dataclasses.replace(BACKENDS["copy"], factory=_TRACED,
                                                             columns=(CopyColumns, CompileColumns)))
    BUILT.clear()
    yield
    BUILT.clear()


def test_the_worker_takes_every_builders_steps_the_same_way(plan: Plan, tmp_path: Path, traced: None) -> None:
    record = measure(plan, "map", tmp_path / "out")
    assert record.ok, record.error
    (builder,) = BUILT
    engines = len(plan.engines)
    assert builder.calls == ["export", ("partition", engines), *[("build", i) for i in range(engines)],
                             "check", "close"]
    # what the builder measured is what is stored, whatever the backend
    assert (record.compiler, record.compiler_weights, record.export) == ("tracer", "mapped", _Traced.EXPORT)
    assert record.phases.export_start_s is not None and record.phases.export_end_s is not None
    assert [e.compile_s for e in record.engines] == [1.0 + i for i in range(engines)]
    assert all(e.cache_bytes == -5 and e.pages_s is not None and e.copy_s is not None for e in record.engines)
    assert (record.max_abs_diff, record.check, record.check_peak_bytes) == (0.25, "within tolerance (traced)", 12345)
    events = (tmp_path / "out" / "events-map.csv").read_text()
    assert "export_start" in events and "export_end" in events


def test_a_build_measured_without_its_check_takes_every_step_but_the_check(plan: Plan, tmp_path: Path,
                                                                           traced: None) -> None:
    record = measure(plan, "map", tmp_path / "out", check=False)
    assert record.ok, record.error
    (builder,) = BUILT
    assert "check" not in builder.calls and builder.calls[-1] == "close"
    assert (record.max_abs_diff, record.check, record.check_peak_bytes) == (None, None, None)
    assert record.phases.check_start_s is None


def test_a_copy_builder_takes_no_compiler_step(plan: Plan, tmp_path: Path) -> None:
    record = measure(plan, "map", tmp_path / "out")
    assert record.ok, record.error
    assert (record.compiler, record.compiler_weights, record.export, record.max_abs_diff, record.check,
            record.check_peak_bytes) == (None, None, None, None, None, None)
    assert record.phases.export_start_s is None and record.phases.export_end_s is None
    assert all(e.compile_s is None and e.pages_s is not None and e.copy_s is not None for e in record.engines)
    assert "export" not in (tmp_path / "out" / "events-map.csv").read_text()
    # the record states the rows of both CSVs, which their readers hold the files to
    assert record.sample_rows == len(read_samples(tmp_path / "out" / "samples-map.csv")) > 0
    assert record.event_rows == len(read_events(tmp_path / "out" / "events-map.csv")) > 0



def test_inductor_is_unavailable_where_torch_inductor_does_not_import(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch._inductor", None)  # what a failed import leaves
    with pytest.raises(BackendUnavailable, match=r"backend 'inductor' needs AOTInductor: torch\._inductor is not "
                                                 r"importable \(ModuleNotFoundError"):
        check_backend("inductor")
