"""The ``openvino`` backend: scenario keys, the registry entry, layout 14, the floor, the compiler itself, a run.

Tests that build engines need the ``openvino`` package (the test extra installs it) and are
skipped, saying so, where it does not import. A compile takes about a second for the small
programs here; the supervised run (a tiny synthetic model, two engines, ``map`` and ``load``)
takes most of this file's time, about half a minute on two cores, its check processes
included. Checkpoints, engines and results go under temporary directories.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from harness.engines.compile.compiler import Artifact, EngineLoadError
from harness.engines.compile.handover import alias
from harness.engines.compile.openvino import (
    OpenVinoCompiler,
    blob_payload_offset,
    openvino_missing,
    without_telemetry,
)
from harness.engines.registry import BackendUnavailable, check_backend, make_builder
from harness.plan import make_plan
from harness.report import render_staged
from harness.results.metrics import floor_bytes, floor_formula
from harness.results.record import LAYOUT_VERSION, EngineRecord, StrategyRecord
from harness.run import run_scenario
from harness.scenario import ScenarioError, load_scenario
from harness.schema import at_layout
from harness.tests.fixtures import measured
from harness.tests.tiny_scenario import compiled_scenario
from harness.units import MIB
from weightmap import release_storage

needs_openvino = pytest.mark.skipif(
    openvino_missing() is not None,
    reason=f"the openvino backend cannot be tested here: {openvino_missing()}",
)

def _scenario(tmp_path: Path, *, weights: str | None = None, strategies: tuple[str, ...] = ("map",)) -> Path:
    return compiled_scenario(tmp_path, "openvino", name="tiny-openvino", weights=weights, strategies=strategies)


# --------------------------------------------------------------------------- scenario and registry


def test_a_scenario_gets_openvinos_only_weight_setting_and_no_other(tmp_path: Path) -> None:
    build = load_scenario(_scenario(tmp_path)).build  # left unsaid: the backend's only setting
    assert (build.backend, build.weights, build.compiler) == ("openvino", "packaged_compiler", True)
    assert load_scenario(_scenario(tmp_path, weights="packaged_compiler")).build.weights == "packaged_compiler"
    with pytest.raises(ScenarioError, match=r"build\.weights: backend 'openvino' builds engines with weights "
                                            r"'packaged_compiler', not 'mapped'"):
        load_scenario(_scenario(tmp_path, weights="mapped"))


def test_a_machine_without_openvino_is_refused_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino raises ImportError
    with pytest.raises(BackendUnavailable) as raised:
        check_backend("openvino")
    message = str(raised.value)
    assert message.startswith("backend 'openvino' needs OpenVINO: openvino is not importable here (ModuleNotFoundError")
    assert message.endswith("install it with pip install -e '.[openvino]'")
    with pytest.raises(BackendUnavailable, match="needs OpenVINO"):
        make_plan(load_scenario(_scenario(tmp_path)), name="tiny-openvino", workdir=tmp_path / "engines")
    assert not (tmp_path / "tiny.safetensors").exists()  # refused before the checkpoint was written


def test_the_compiler_builds_its_one_weight_setting_for_the_cpu_only() -> None:
    assert OpenVinoCompiler().weights == "packaged_compiler" and OpenVinoCompiler().name == "openvino"
    with pytest.raises(ValueError, match="weights packaged_compiler only, not 'mapped'"):
        OpenVinoCompiler(weights="mapped")
    with pytest.raises(ValueError, match="for the cpu here, not cuda"):
        OpenVinoCompiler(device="cuda")


@needs_openvino
def test_a_plan_for_a_gpu_gets_no_openvino_builder(tmp_path: Path) -> None:
    plan = make_plan(load_scenario(_scenario(tmp_path)), name="tiny-openvino", workdir=tmp_path / "engines")
    with pytest.raises(BackendUnavailable, match="builds engines for the cpu, not cuda"):
        make_builder(dataclasses.replace(plan, device="cuda"), tmp_path / "w")


# --------------------------------------------------------------------------- layout 14 and the floor


def _engine(index: int, weights: int, held: int | None) -> EngineRecord:
    return EngineRecord(index=index, weight_bytes=weights, start_s=1.0, end_s=2.0, host_hwm_bytes=900 * MIB,
                        released_bytes=weights, rss_after_bytes=400 * MIB, gpu_used_bytes=None, compile_s=1.0,
                        artifact_bytes=weights, rss_before_bytes=400 * MIB, compile_hwm_bytes=800 * MIB,
                        convert_s=0.5, convert_hwm_bytes=500 * MIB, compiler_read_bytes=weights,
                        compiler_held_bytes=held)


def test_the_floor_of_engines_whose_compiler_held_memory_is_each_engine_with_what_it_held() -> None:
    base = 300 * MIB
    engines = [_engine(0, 100 * MIB, 80 * MIB), _engine(1, 120 * MIB, 10 * MIB), _engine(2, 50 * MIB, -MIB)]
    # engine 0: 100 + 80 is more than engine 1's 120 + 10, though engine 1 is the largest
    assert floor_bytes(base, engines, on_gpu=False, compiler_weights="packaged_compiler") == base + 180 * MIB
    # a compiler that gave memory back holds nothing beside its weights: the engine alone
    assert floor_bytes(base, [engines[2]], on_gpu=False, compiler_weights="packaged_compiler") == base + 50 * MIB
    # where an engine does not record it, the copy floor (baseline + largest engine) as before
    unrecorded = [*engines[:2], dataclasses.replace(engines[2], compiler_held_bytes=None)]
    assert floor_bytes(base, unrecorded, on_gpu=False, compiler_weights="packaged_compiler") == base + 120 * MIB
    assert floor_formula(False, compiler_held=True) == (
        "baseline + max over k of (engine k + what the compiler held beside it)")
    assert floor_formula(False) == "baseline + largest engine"


def test_layout_14_fields_round_trip_and_layout_13_reads_them_as_none() -> None:
    record = StrategyRecord(status="ok", engines=(_engine(0, 100 * MIB, -2 * MIB),), compiler="openvino",
                            compiler_weights="packaged_compiler")
    data = json.loads(json.dumps(record.to_json()))
    again = StrategyRecord.from_json(data, "s.json", "x", LAYOUT_VERSION)
    assert again == record and again.engines[0].compiler_held_bytes == -2 * MIB  # a growth may be negative
    new = {"convert_s", "convert_hwm_bytes", "compiler_read_bytes", "compiler_held_bytes"}
    v13 = at_layout(StrategyRecord, data, 13)
    assert new <= set(at_layout(StrategyRecord, data, 14)["engines"][0]) and not new & set(v13["engines"][0])
    old = StrategyRecord.from_json(v13, "s.json", "x", 13)
    assert all(getattr(old.engines[0], k) is None for k in new)
    with pytest.raises(ValueError, match=r"engines\[0\]: unknown key 'compiler_held_bytes' \(and 3 more\)"):
        StrategyRecord.from_json(at_layout(StrategyRecord, data, 14), "s.json", "x", 13)


# --------------------------------------------------------------------------- what OpenVINO is handed and writes


def test_an_alias_shares_the_memory_and_leaves_the_original_storage_resizable() -> None:
    weight = nn.Parameter(torch.arange(12, dtype=torch.float32).reshape(3, 4), requires_grad=False)
    view = weight[1:]  # a view at an offset keeps its offset and strides
    shared = alias(weight)
    offset = alias(view)
    assert isinstance(shared, nn.Parameter) and not isinstance(offset, nn.Parameter)
    assert torch.equal(shared, weight) and torch.equal(offset, view) and offset.storage_offset() == 4
    assert shared.data_ptr() == weight.data_ptr()  # the same memory, no copy
    shared.detach().numpy()  # numpy's view makes a storage unresizable for good ...
    assert not shared.untyped_storage().resizable()
    assert weight.untyped_storage().resizable()  # ... the alias's, not the weight's
    with torch.no_grad():
        weight[0, 0] = 100.0
    assert shared[0, 0] == 100.0
    empty = torch.empty(0)
    assert alias(empty) is empty


HEADER = (b'<?xml version="1.0"?><compiled_blob ie_version="2026.4.1" file_info="1" runtime_info="{}" '
          b'header_size_alignment="0"/>\n')


def test_the_blobs_model_starts_past_openvinos_header_line(tmp_path: Path) -> None:
    path = tmp_path / "engine-000.blob"
    assert blob_payload_offset(path, HEADER + b"RR_UPCVO...") == len(HEADER)
    with pytest.raises(EngineLoadError, match=r"engine-000\.blob: not an OpenVINO compiled blob"):
        blob_payload_offset(path, b"RR_UPCVO" + HEADER)
    with pytest.raises(EngineLoadError, match=r"engine-000\.blob: its header pads the model to 64 bytes"):
        blob_payload_offset(path, HEADER.replace(b'alignment="0"', b'alignment="64"') + b"x")


@needs_openvino
def test_conversion_reports_to_openvinos_no_op_telemetry() -> None:
    from openvino.tools.ovc import convert_impl, telemetry_stub, telemetry_utils

    before = telemetry_utils.tm
    with without_telemetry():
        assert telemetry_utils.tm is telemetry_stub and convert_impl.tm is telemetry_stub
    assert telemetry_utils.tm is before


class _Mlp(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.up = nn.Linear(256, 512, dtype=dtype)
        self.down = nn.Linear(512, 128, dtype=dtype)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.down(torch.relu(self.up(x))) * scale, scale.sum()


@needs_openvino
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_engine_is_written_loaded_from_its_blob_and_computes_as_eager(tmp_path: Path, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = _Mlp(dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    inputs = (torch.randn(2, 8, 256, dtype=dtype), torch.rand(128, dtype=dtype) + 0.5)
    with torch.no_grad():
        program = torch.export.export(model, inputs)
        want = model(*inputs)
    compiler = OpenVinoCompiler()
    with compiler.session(tmp_path / "cache") as cache:
        artifact = compiler.compile(program, tmp_path / "engine-000")
    assert cache == tmp_path / "cache" and cache.is_dir()
    assert artifact.path == tmp_path / "engine-000.blob" and artifact.constants == {}
    assert artifact.path.read_bytes().startswith(b'<?xml version="1.0"?><compiled_blob')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "engine-000.blob"]  # its own cache removed
    weights = sum(t.numel() * t.element_size() for t in program.state_dict.values())
    assert artifact.path.stat().st_size > weights  # the blob holds the weights
    columns = measured(artifact.columns)
    assert columns["convert_s"] > 0 and columns["compile_hwm_bytes"] >= columns["convert_hwm_bytes"] > 0
    assert {"compiler_read_bytes", "compiler_held_bytes"} <= set(columns)
    # OpenVINO was handed aliases: the program's own storages can still be freed after the engine is built
    for tensor in program.state_dict.values():
        assert release_storage(tensor.untyped_storage(), resize=True)
    engine = compiler.load(Artifact(artifact.path, {}))
    got = engine(*inputs)
    assert [g.dtype for g in got] == [w.dtype for w in want] and [g.shape for g in got] == [w.shape for w in want]
    # float32 computed in float32 (OpenVINO's default here, bfloat16, is off by about 1e-3); bfloat16 as eager
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.float(), w.float(), atol=tolerance, rtol=tolerance)


@needs_openvino
def test_a_file_that_is_no_blob_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "engine-000.blob"
    path.write_bytes(HEADER + b"not an exported model")
    with pytest.raises(EngineLoadError, match=r"engine-000\.blob: OpenVINO cannot import it"):
        OpenVinoCompiler().load(Artifact(path, {}))


# --------------------------------------------------------------------------- the backend in a supervised run


@needs_openvino
def test_map_and_load_build_with_openvino_release_their_weights_and_equal_eager(tmp_path: Path) -> None:
    run = run_scenario(load_scenario(_scenario(tmp_path, strategies=("map", "load"))), results=tmp_path / "results",
                       workdir=tmp_path / "engines", render=render_staged)
    assert run.versions["openvino"] is not None
    for name in ("map", "load"):
        record = run.strategies[name]
        assert record.ok, record.error
        assert (record.compiler, record.compiler_weights) == ("openvino", "packaged_compiler")
        assert record.max_abs_diff is not None and record.max_abs_diff < 1e-4, record.check
        assert record.check_peak_bytes is not None and record.check_peak_bytes > 0
        # every weight released after its last engine: mapped pages dropped, load's storages resized
        assert record.released_bytes is not None and record.released_bytes >= run.model.bytes - MIB, name
        assert len(record.engines) >= 2
        for engine in record.engines:
            assert engine.convert_s is not None and engine.artifact_bytes is not None
            assert engine.artifact_bytes >= engine.weight_bytes  # each blob holds its weights
            assert engine.rss_before_bytes is not None and engine.convert_hwm_bytes is not None
            assert engine.compile_hwm_bytes is not None and engine.host_hwm_bytes is not None
            assert engine.rss_before_bytes <= engine.convert_hwm_bytes <= engine.compile_hwm_bytes
            assert engine.compiler_held_bytes is not None and engine.compiler_read_bytes is not None
        held = max(e.weight_bytes + max(0, e.compiler_held_bytes or 0) for e in record.engines)
        assert record.baseline_rss_bytes is not None
        assert floor_bytes(record.baseline_rss_bytes, record.engines, False, record.compiler_weights) == (
            record.baseline_rss_bytes + held)
    assert not any((tmp_path / "engines").rglob("*.blob"))  # every engine's file let go
    report = (tmp_path / "results" / "tiny-openvino.md").read_text(encoding="utf-8")
    assert "the floor is baseline + max over k of (engine k + what the compiler held beside it)" in report
    assert "Engines built by openvino (weights packaged_compiler)" in report
    assert "| convert peak | compile peak | weights read | held beside them |" in report
    assert (tmp_path / "results" / "tiny-openvino.compiler.png").is_file()


@needs_openvino
def test_openvino_is_imported_and_converts_without_its_telemetry(tmp_path: Path) -> None:
    """In a fresh process whose home is ``tmp_path``: importing and converting leave nothing there (OpenVINO's
    telemetry counts its uses in a file under the home and sends events from the same code)."""
    script = (
        "import torch\n"
        "from harness.engines.compile.openvino import import_openvino, without_telemetry\n"
        "openvino = import_openvino()\n"
        "from openvino.tools.ovc import telemetry_stub, telemetry_utils\n"
        "assert telemetry_utils.tm is telemetry_stub, telemetry_utils.tm\n"
        "program = torch.export.export(torch.nn.Linear(4, 4), (torch.ones(1, 4),))\n"
        "with without_telemetry():\n"
        "    openvino.convert_model(program)\n"
        "import openvino_telemetry  # hidden only while openvino was imported\n"
    )
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []
