"""The ``iree`` backend: scenario keys, the registry entry, the compiler's two weight settings, a supervised run.

Tests that build engines need IREE (the ``iree`` extra: iree-base-compiler, iree-base-runtime,
iree-turbine; not in the test extra) and are skipped, saying so, where it does not import. A
compile takes about a second for the small programs here; the supervised run (a tiny synthetic
model, two engines, ``map`` and ``load``, weights ``mapped``) takes most of this file's time,
its check processes included. Checkpoints, engines and results go under temporary directories.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from harness.engines.compile.compiler import Artifact, EngineBuildError, EngineLoadError
from harness.engines.compile.iree import IreeCompiler, iree_missing
from harness.engines.registry import BackendUnavailable, check_backend, make_builder
from harness.plan import make_plan
from harness.report import render_staged
from harness.report.compiler import compiler_figure
from harness.results.metrics import floor_bytes
from harness.results.reading import load_results
from harness.run import run_scenario
from harness.scenario import ScenarioError, load_scenario
from harness.tests.fixtures import measured
from harness.tests.tiny_scenario import compiled_scenario
from harness.units import MIB
from weightmap import release_storage

needs_iree = pytest.mark.skipif(
    iree_missing() is not None,
    reason=f"the iree backend cannot be tested here: {iree_missing()}",
)

def _scenario(tmp_path: Path, *, weights: str | None = "mapped", strategies: tuple[str, ...] = ("map",),
              device: str = "cpu") -> Path:
    return compiled_scenario(tmp_path, "iree", name="tiny-iree", weights=weights, strategies=strategies, device=device)


# --------------------------------------------------------------------------- scenario and registry


def test_a_scenario_takes_irees_two_weight_settings_and_no_other(tmp_path: Path) -> None:
    for weights in ("mapped", "packaged_compiler"):
        build = load_scenario(_scenario(tmp_path, weights=weights)).build
        assert (build.backend, build.weights, build.compiler) == ("iree", weights, True)
    with pytest.raises(ScenarioError, match=r"build\.weights: backend 'iree' builds engines with weights "
                                            r"'mapped' or 'packaged_compiler', not 'packaged'"):
        load_scenario(_scenario(tmp_path, weights="packaged"))


def test_a_machine_without_iree_is_refused_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "iree.turbine.aot", None)  # import iree.turbine.aot raises ImportError
    with pytest.raises(BackendUnavailable) as raised:
        check_backend("iree")
    message = str(raised.value)
    assert message.startswith("backend 'iree' needs IREE: iree is not importable here (ModuleNotFoundError")
    assert message.endswith("install it with pip install -e '.[iree]'")
    with pytest.raises(BackendUnavailable, match="needs IREE"):
        make_plan(load_scenario(_scenario(tmp_path)), name="tiny-iree", workdir=tmp_path / "engines")
    assert not (tmp_path / "tiny.safetensors").exists()  # refused before the checkpoint was written


def test_the_compiler_builds_two_weight_settings_for_the_cpu_only() -> None:
    assert IreeCompiler().weights == "mapped" and IreeCompiler().name == "iree"
    assert IreeCompiler(weights="packaged_compiler").weights == "packaged_compiler"
    with pytest.raises(ValueError, match="weights mapped or packaged_compiler, not 'packaged'"):
        IreeCompiler(weights="packaged")
    with pytest.raises(ValueError, match=r"for the cpu here \(llvm-cpu\), not cuda"):
        IreeCompiler(device="cuda")


@needs_iree
def test_a_plan_for_a_gpu_gets_no_iree_builder(tmp_path: Path) -> None:
    import dataclasses

    plan = make_plan(load_scenario(_scenario(tmp_path)), name="tiny-iree", workdir=tmp_path / "engines")
    with pytest.raises(BackendUnavailable, match="builds engines for the cpu, not cuda"):
        make_builder(dataclasses.replace(plan, device="cuda"), tmp_path / "w")


# --------------------------------------------------------------------------- the compiler


class _Mlp(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.up = nn.Linear(256, 512, dtype=dtype)
        self.down = nn.Linear(512, 128, dtype=dtype)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.down(torch.relu(self.up(x))) * scale, scale.sum()


def _program(dtype: torch.dtype) -> tuple[_Mlp, torch.export.ExportedProgram, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = _Mlp(dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    inputs = (torch.randn(2, 8, 256, dtype=dtype), torch.rand(128, dtype=dtype) + 0.5)
    with torch.no_grad():
        program = torch.export.export(model, inputs)
    return model, program, inputs


def _assert_as_eager(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], dtype: torch.dtype) -> None:
    assert [g.dtype for g in got] == [w.dtype for w in want] and [g.shape for g in got] == [w.shape for w in want]
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.float(), w.float(), atol=tolerance, rtol=tolerance)


@needs_iree
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_mapped_engine_holds_no_weight_and_reads_the_given_tensors_in_place(
        tmp_path: Path, dtype: torch.dtype) -> None:
    model, program, inputs = _program(dtype)
    with torch.no_grad():
        want = model(*inputs)
    compiler = IreeCompiler(weights="mapped")
    with compiler.session(tmp_path / "cache"):
        artifact = compiler.compile(program, tmp_path / "engine-000")
    assert artifact.path == tmp_path / "engine-000.vmfb"
    weights = sum(t.numel() * t.element_size() for t in program.state_dict.values())
    assert artifact.path.stat().st_size < weights / 4  # the module holds no weight
    assert set(artifact.constants) == set(program.state_dict)
    assert all(artifact.constants[n] is t for n, t in program.state_dict.items())  # the model's own tensors
    assert not any(hasattr(t, "_turbine_external_tensor_trait") for t in model.parameters())  # marks removed
    columns = measured(artifact.columns)
    assert columns["convert_s"] >= 0 and columns["compile_hwm_bytes"] >= columns["convert_hwm_bytes"] > 0
    assert {"compiler_read_bytes", "compiler_held_bytes"} <= set(columns)
    engine = compiler.load(artifact)
    _assert_as_eager(engine(*inputs), want, dtype)
    # read where they lie: a weight changed after the load is what the engine computes with
    with torch.no_grad():
        model.down.bias.add_(1.0)
        shifted = model(*inputs)
    _assert_as_eager(engine(*inputs), shifted, dtype)


@needs_iree
def test_a_mapped_engine_without_its_tensors_is_refused_by_name(tmp_path: Path) -> None:
    _, program, _ = _program(torch.float32)
    compiler = IreeCompiler(weights="mapped")
    artifact = compiler.compile(program, tmp_path / "engine-000")
    released = dict(artifact.constants)
    released["up.weight"] = released["up.weight"].clone()
    assert release_storage(released["up.weight"].untyped_storage(), resize=True)
    with pytest.raises(EngineLoadError, match=r"engine-000\.vmfb: parameter 'up\.weight': its storage was released"):
        compiler.load(Artifact(artifact.path, released))
    strided = {**artifact.constants, "up.weight": artifact.constants["up.weight"].t()}
    with pytest.raises(EngineLoadError, match=r"parameter 'up\.weight' must be a contiguous tensor on the cpu"):
        compiler.load(Artifact(artifact.path, strided))


@needs_iree
def test_a_packaged_compiler_engine_holds_its_weights_and_computes_as_eager(tmp_path: Path) -> None:
    model, program, inputs = _program(torch.float32)
    with torch.no_grad():
        want = model(*inputs)
    compiler = IreeCompiler(weights="packaged_compiler")
    artifact = compiler.compile(program, tmp_path / "engine-000")
    weights = sum(t.numel() * t.element_size() for t in program.state_dict.values())
    assert artifact.constants == {} and artifact.path.stat().st_size > weights  # the module holds the weights
    for tensor in program.state_dict.values():  # the engine needs none of the model's tensors
        assert release_storage(tensor.untyped_storage(), resize=True)
    _assert_as_eager(compiler.load(Artifact(artifact.path, {}))(*inputs), want, torch.float32)


@needs_iree
def test_a_bfloat16_weight_is_not_inlined_by_this_iree_and_the_engine_is_named(tmp_path: Path) -> None:
    _, program, _ = _program(torch.bfloat16)
    with pytest.raises(EngineBuildError, match=r"IREE failed to build engine-000\.vmfb: TypeError: Got unsupported "
                                               r"ScalarType BFloat16"):
        IreeCompiler(weights="packaged_compiler").compile(program, tmp_path / "engine-000")
    assert not (tmp_path / "engine-000.vmfb").exists()


@needs_iree
def test_a_file_that_is_no_module_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "engine-000.vmfb"
    path.write_bytes(b"not a vm flatbuffer" * 8)
    with pytest.raises(EngineLoadError, match=r"engine-000\.vmfb: IREE cannot load it"):
        IreeCompiler(weights="packaged_compiler").load(Artifact(path, {}))


# --------------------------------------------------------------------------- the backend in a supervised run


@needs_iree
def test_map_and_load_build_mapped_iree_engines_that_equal_eager(tmp_path: Path) -> None:
    run = run_scenario(load_scenario(_scenario(tmp_path, strategies=("map", "load"))), results=tmp_path / "results",
                       workdir=tmp_path / "engines", render=render_staged)
    assert run.versions["iree_turbine"] is not None and run.versions["iree_runtime"] is not None
    for name in ("map", "load"):
        record = run.strategies[name]
        assert record.ok, record.error
        assert (record.compiler, record.compiler_weights) == ("iree", "mapped")
        assert record.max_abs_diff is not None and record.max_abs_diff < 1e-4, record.check
        assert len(record.engines) >= 2
        for engine in record.engines:
            assert engine.convert_s is not None and engine.artifact_bytes is not None
            assert engine.artifact_bytes < engine.weight_bytes  # no module holds its weights
            assert engine.rss_before_bytes is not None and engine.convert_hwm_bytes is not None
            assert engine.compile_hwm_bytes is not None
            assert engine.rss_before_bytes <= engine.convert_hwm_bytes <= engine.compile_hwm_bytes
            assert engine.compiler_held_bytes is not None and engine.compiler_read_bytes is not None
        assert record.baseline_rss_bytes is not None
        # built without a weight resident: the floor is the baseline
        assert floor_bytes(record.baseline_rss_bytes, record.engines, False, record.compiler_weights) == (
            record.baseline_rss_bytes)
    # map drops the mapped pages after each engine and keeps the views the engines read
    assert run.strategies["map"].released_bytes is not None
    assert run.strategies["map"].released_bytes >= run.model.bytes - MIB
    assert not any((tmp_path / "engines").rglob("*.vmfb"))  # every engine's file let go
    report = (tmp_path / "results" / "tiny-iree.md").read_text(encoding="utf-8")
    assert "Engines built by iree (weights mapped)" in report
    assert "| convert peak | compile peak | weights read | held beside them |" in report
    # the compiler figure names IREE's two calls, not another compiler's
    figure = compiler_figure(load_results(tmp_path / "results" / "tiny-iree"))
    labels = [" ".join(t.get_text().split()) for legend in figure.legends for t in legend.get_texts()]
    assert "peak rise when the conversion was done (iree-turbine's import)" in labels, labels
    assert "peak rise when the compile was done (IREE's compile, its .vmfb written)" in labels, labels
    assert not any("OpenVINO" in label for label in labels), labels
