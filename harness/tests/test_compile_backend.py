"""The ``inductor`` backend in the harness: scenario keys, graph-partition plans, the v3 record, real builds.

The builds use a tiny synthetic model (about 10 MiB of weights) in one or two engines;
each AOTInductor build costs tens of seconds on a small machine, so one test compiles,
through the whole supervised run (weights mapped; ``packaged`` engines are built in
``test_compile_inductor``); the check against eager is also tested on its own. Checkpoints
and engines go under temporary directories.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.engines.builder import BuiltEngine, EngineBuilder, PhaseRecorder
from harness.engines.compile.backend import CompilerBackend, release_device_cache
from harness.engines.compile.check_process import CheckProcessError, compare_with_model
from harness.engines.compile.compare import Checked, MismatchError, OutputMatch
from harness.engines.compile.entry import export_entry
from harness.engines.registry import BackendUnavailable, make_builder
from harness.models import SyntheticTransformer, fill_non_persistent
from harness.plan import Plan, make_plan, read_plan, write_plan
from harness.report import render_all, render_staged
from harness.results.record import (
    LAYOUT_VERSION,
    SUMMARY,
    EngineRecord,
    ExportRecord,
    RunRecord,
    StrategyRecord,
)
from harness.run import run_scenario
from harness.scenario import ScenarioError, load_scenario
from harness.schema import at_layout
from harness.tests.fixtures import measured
from harness.tests.tiny_scenario import compiled_scenario
from harness.units import MIB
from harness.worker import StrategyRun
from weightmap import map_weights


def _scenario(tmp_path: Path, *, engines: int = 1, weights: str = "mapped", extra: str = "") -> Path:
    return compiled_scenario(tmp_path, "inductor", name="tiny-compile", engines=engines, weights=weights, extra=extra)


def _replace(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


def test_scenario_takes_the_inductor_backend_and_its_weight_setting(tmp_path: Path) -> None:
    build = load_scenario(_scenario(tmp_path, weights="packaged")).build
    assert (build.backend, build.weights, build.tokens, build.compiler) == ("inductor", "packaged", 8, True)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('weights = "mapped"', 'weights = "folded"',
         "build.weights: expected one of 'packaged', 'packaged_compiler', 'mapped', got 'folded'"),
        ('backend = "inductor"', 'backend = "copy"', "build.weights: applies to compiler backends only"),
        ("tokens = 8", "tokens = 0", "build.tokens: expected an integer >= 1"),
    ],
)
def test_scenario_rejects_bad_compiler_settings(tmp_path: Path, old: str, new: str, message: str) -> None:
    path = _scenario(tmp_path)
    path.write_text(_replace(path.read_text(), old, new), encoding="utf-8")
    with pytest.raises(ScenarioError, match=message):
        load_scenario(path)


def test_a_spec_model_cannot_be_compiled(tmp_path: Path) -> None:
    path = tmp_path / "spec-compile.toml"
    spec = Path(__file__).resolve().parents[1] / "specs" / "pi05.json"
    path.write_text(
        f'name = "x"\n[model]\nsource = "spec"\nspec = "{spec}"\n[build]\nengines = 2\nbackend = "inductor"\n',
        encoding="utf-8",
    )
    with pytest.raises(ScenarioError, match="a spec model has no forward"):
        load_scenario(path)


def test_each_backend_makes_its_own_builder(tmp_path: Path) -> None:
    from harness.engines.compile.backend import CompilerBackend
    from harness.engines.copy import CopyToFiles

    plan = make_plan(load_scenario(_scenario(tmp_path)), name="tiny-compile", workdir=tmp_path / "engines")
    compiler = make_builder(plan, tmp_path / "inductor")

    assert isinstance(compiler, CompilerBackend) and (compiler.compiler, compiler.weights) == ("inductor", "mapped")
    def built_with(**build: Any) -> Plan:
        return dataclasses.replace(plan, scenario=dataclasses.replace(
            plan.scenario, build=dataclasses.replace(plan.scenario.build, **build)))

    # a scenario that releases nothing keeps the host pages of weights a GPU build copied, too
    assert compiler.engine_compiler.drop_host_pages  # type: ignore[attr-defined]
    keeping = make_builder(built_with(release=False), tmp_path / "keeping")
    assert not keeping.engine_compiler.drop_host_pages  # type: ignore[attr-defined]
    keeping.close()
    copy = make_builder(built_with(backend="copy"), tmp_path / "copy")
    assert isinstance(copy, CopyToFiles) and copy.compiler is None  # a copy builder is no compiler
    with pytest.raises(BackendUnavailable, match="weights must be one of packaged, packaged_compiler, mapped"):
        make_builder(built_with(weights="copied"), tmp_path / "inductor")
    compiler.close()
    copy.close()


def test_compiler_engines_are_the_exported_graphs_partitions(tmp_path: Path) -> None:
    scenario = load_scenario(_scenario(tmp_path, engines=2))
    plan = make_plan(scenario, name="tiny-compile", workdir=tmp_path / "engines")
    assert plan.compiler and plan.scenario.build.weights == "mapped" and plan.scenario.build.engines == 2
    names = [n for e in plan.engines for n in e.names]
    # every weight the forward reads is in an engine; export names the tied embedding and head once
    assert "lm_head.weight" in names and "layers.1.down_proj.weight" in names and "inv_freq" in names
    assert "lm_head.weight" in plan.engines[0].names and "lm_head.weight" in plan.engines[-1].names
    assert all(not e.modules or len(e.modules) == 2 for e in plan.engines)  # first and last graph node
    # no weight is built twice: only a weight read in two places of the graph is in two engines
    seen: dict[str, int] = {}
    for e in plan.engines:
        for n in e.names:
            assert n not in seen or n in {"lm_head.weight", "inv_freq"}, (n, seen.get(n), e.index)
            seen[n] = e.index
    assert len(plan.engines) >= 2
    assert sum(e.weight_bytes for e in plan.engines) >= plan.model.bytes
    again = read_plan(write_plan(tmp_path / "plan.json", plan))
    assert again == plan


@pytest.mark.parametrize(("weights", "prefetch"), [("mapped", None), ("packaged", "madvise")])
def test_prefetch_is_chosen_off_for_engines_whose_builds_never_read_their_weights(
        tmp_path: Path, weights: str, prefetch: str | None) -> None:
    plan = make_plan(load_scenario(_scenario(tmp_path, weights=weights)), name="tiny-compile",
                     workdir=tmp_path / "engines")
    assert plan.prefetch == prefetch, plan.reading.prefetch_why
    assert ("no build reads them" in plan.reading.prefetch_why) == (prefetch is None)


def test_compiler_fields_round_trip_and_v2_reads_them_as_none() -> None:
    engine = EngineRecord(index=0, weight_bytes=10 * MIB, start_s=1.0, end_s=2.0, host_hwm_bytes=500 * MIB,
                          released_bytes=10 * MIB, rss_after_bytes=400 * MIB, gpu_used_bytes=None, tensors=3,
                          compile_s=30.5, artifact_bytes=2 * MIB, rss_before_bytes=480 * MIB,
                          children_peak_bytes=300 * MIB, cache_bytes=MIB, compile_hwm_bytes=495 * MIB,
                          write_rss_bytes=482 * MIB, write_peak_bytes=500 * MIB, write_read_bytes=16 * MIB,
                          children_pss_bytes=120 * MIB)
    assert engine.compiler_over_floor_bytes == 10 * MIB
    # the split of a packaged build: the compiler's own rise, the weights read and the write's own buffers
    assert (engine.compiler_own_bytes, engine.write_read_bytes, engine.write_buffers_bytes) == (
        15 * MIB, 16 * MIB, 2 * MIB)
    # where the write sets the peak, the three add up to the engine's host rise
    written = dataclasses.replace(engine, compile_hwm_bytes=481 * MIB)
    assert written.compiler_own_bytes == 2 * MIB  # what compiling and packaging left when the write began
    assert (written.compiler_own_bytes + written.write_read_bytes + written.write_buffers_bytes  # type: ignore[operator]
            == engine.host_hwm_bytes - engine.rss_before_bytes)  # type: ignore[operator]
    export = ExportRecord(seconds=1.5, nodes=100, pages_read_bytes=0, residency_read_bytes=0,
                          rss_before_bytes=400 * MIB, rss_after_bytes=405 * MIB, hwm_bytes=410 * MIB,
                          anon_delta_bytes=4 * MIB, not_shared=0)
    record = StrategyRecord(status="ok", engines=(engine,), compiler="inductor", compiler_weights="mapped",
                            export=export, max_abs_diff=1e-7, check="within tolerance", check_peak_bytes=900 * MIB)
    data = json.loads(json.dumps(record.to_json()))
    assert StrategyRecord.from_json(data, "s.json", "x", LAYOUT_VERSION) == record
    six = StrategyRecord.from_json(at_layout(StrategyRecord, data, 6), "s.json", "x", 6)
    assert six.check_peak_bytes is None and six.engines[0].compiler_own_bytes is None
    assert six.engines[0].write_buffers_bytes is None and six.engines[0].compiler_over_floor_bytes == 10 * MIB
    assert six.engines[0].children_pss_bytes is None and six.engines[0].children_peak_bytes == 300 * MIB
    v2 = at_layout(StrategyRecord, data, 2)
    old = StrategyRecord.from_json(v2, "s.json", "x", 2)
    assert old.export is None and old.compiler is None and old.engines[0].compile_s is None
    assert old.engines[0].compiler_over_floor_bytes is None
    with pytest.raises(ValueError, match=r"engines\[0\]: unknown key 'artifact_bytes'"):
        StrategyRecord.from_json({**v2, "engines": data["engines"]}, "s.json", "x", 2)


def test_map_with_mapped_engines_reads_nothing_to_export_and_equals_eager(tmp_path: Path) -> None:
    run = run_scenario(load_scenario(_scenario(tmp_path)), results=tmp_path / "results",
                       workdir=tmp_path / "engines", render=render_staged)
    record = run.strategies["map"]
    assert record.ok, record.error
    assert record.compiler == "inductor" and record.compiler_weights == "mapped"
    export = record.export
    assert export is not None and export.nodes > 10
    assert export.pages_read_bytes is not None and export.pages_read_bytes <= MIB
    assert record.phases.export_start_s is not None and record.phases.export_end_s is not None
    assert record.phases.load_end_s <= record.phases.export_start_s <= record.phases.partition_s  # type: ignore[operator]
    assert len(record.engines) == 1
    engine = record.engines[0]
    assert engine.compile_s is not None and engine.compile_s > 0
    # a mapped engine holds no weights: its artifact is code, smaller than the weights it runs on
    assert engine.artifact_bytes is not None and 0 < engine.artifact_bytes < engine.weight_bytes / 2
    assert engine.compiler_over_floor_bytes is not None
    assert record.max_abs_diff is not None and record.max_abs_diff < 1e-4
    assert "within tolerance" in (record.check or "")
    # the check ran in processes of its own, which re-mapped the checkpoint and loaded the engine from its file
    assert record.check_peak_bytes is not None and record.check_peak_bytes > 0
    phases = record.phases  # the check runs after the build, as a phase of its own outside the wall
    assert phases.check_start_s is not None and phases.check_end_s is not None and phases.build_end_s is not None
    assert phases.build_end_s <= phases.check_start_s < phases.check_end_s
    assert record.released_bytes and record.released_bytes >= run.model.bytes - MIB
    again = RunRecord.from_json(json.loads((tmp_path / "results" / "tiny-compile" / SUMMARY).read_text()), "s")
    assert again.strategies["map"].export == export
    figure = tmp_path / "results" / "tiny-compile.compiler.png"
    assert figure.is_file() and figure.stat().st_size > 10_000
    report = (tmp_path / "results" / "tiny-compile.md").read_text(encoding="utf-8")
    assert "## Compiler" in report and "| map | 0 |" in report
    assert "then the check against eager" in report and "+ export " in report
    rendered = render_all(tmp_path / "results" / "tiny-compile")
    assert figure in rendered.paths


def test_a_built_model_that_differs_from_eager_fails_its_check(tmp_path: Path) -> None:
    plan = make_plan(load_scenario(_scenario(tmp_path)), name="tiny-compile", workdir=tmp_path / "engines")
    builder = make_builder(plan, tmp_path / "engines")
    assert isinstance(builder, CompilerBackend) and builder.source is not None
    eager = SyntheticTransformer(layers=2, width=256, heads=4, vocab=4096, device="cpu")
    reference = export_entry(plan.scenario.model, eager, tokens=8, seed=0)
    map_weights(eager, plan.checkpoint.path, strict=True).close()
    fill_non_persistent(eager)
    with torch.no_grad():
        right = eager(*reference.args)
    same = compare_with_model(builder.source, right.clone(), "cpu")  # eager on a fresh mapping, same inputs
    assert same.ok and same.max_abs_diff == 0.0
    wrong = compare_with_model(builder.source, right + 1.0, "cpu")
    assert not wrong.ok and abs(wrong.max_abs_diff - 1.0) < 1e-3
    assert "largest difference 1" in wrong.detail
    with pytest.raises(MismatchError, match="differ beyond"):
        wrong.check()
    builder.close()


class _Checks(EngineBuilder):
    """A builder whose check gives ``checked`` (or raises it)."""

    name, device = "checks", "cpu"

    def __init__(self, checked: Checked | Exception) -> None:
        self.checked = checked

    def build_engine(self, index: int, tensors: dict[str, torch.Tensor]) -> BuiltEngine:
        raise AssertionError("not built here")

    def check(self, phases: PhaseRecorder) -> Checked | None:
        if isinstance(self.checked, Exception):
            raise self.checked
        return self.checked

    def close(self) -> None:
        pass


def test_the_worker_records_the_check_and_fails_the_strategy_on_a_mismatch(tmp_path: Path) -> None:
    plan = make_plan(load_scenario(_scenario(tmp_path)), name="tiny-compile", workdir=tmp_path / "engines")
    run = StrategyRun(plan, "map", tmp_path / "out", 0.0)
    detail = "output 0: 3 of 4 elements differ beyond 0.0001 + 0.0001*|eager| (largest difference 1)"
    run.builder = _Checks(Checked(OutputMatch(1.0, 1, False, detail), peak_bytes=5 * MIB))
    with pytest.raises(MismatchError, match="differ beyond"):
        run.check()
    record = run.record
    assert (record.max_abs_diff, record.check, record.check_peak_bytes) == (1.0, detail, 5 * MIB)
    assert record.phases.check_start_s is not None and record.phases.check_end_s is not None
    run.builder = _Checks(CheckProcessError("the check's built process was killed by signal 9 (out of memory?)"))
    again = StrategyRun(plan, "map", tmp_path / "out2", 0.0)
    again.builder = run.builder
    with pytest.raises(CheckProcessError, match="killed by signal 9"):
        again.check()
    assert again.record.phases.check_end_s is not None  # a failed check still took its time


class _WithConstant(torch.nn.Module):
    """A forward that makes a tensor constant, which export lifts into the program (not the model)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.tensor([2.0])
        scale.detach_()
        return (x @ self.weight) * scale


def test_engines_can_be_handed_the_programs_own_constants(tmp_path: Path) -> None:
    from harness.engines.compile.backend import CompilerBackend
    from harness.engines.compile.graph_partition import PartitionRule
    from harness.engines.compile.inductor import InductorCompiler

    model = _WithConstant()
    backend = CompilerBackend(InductorCompiler(weights="mapped"), tmp_path, PartitionRule(count=1))
    assert backend.constants() == {}
    backend.export_program(model, (torch.randn(2, 8),), {}, checkpoint=())
    (part,) = backend.cut()
    constants = backend.constants()
    model_names = {n for n, _ in model.named_parameters()}
    lifted = set(part.weights) - model_names
    assert lifted and lifted == set(constants)  # what the partition reads besides the model's tensors
    assert all(torch.equal(t, torch.tensor([2.0])) for t in constants.values())


def test_the_device_cache_is_released_after_an_engine_on_a_gpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    emptied: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append("emptied"))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert release_device_cache("cpu") is False and emptied == []  # the CPU path: nothing changes
    assert release_device_cache("cuda:0") is True and emptied == ["emptied"]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # no CUDA yet: no cache to release
    assert release_device_cache("cuda") is False and emptied == ["emptied"]


def test_a_cpu_build_never_touches_the_device_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.engines.compile.graph_partition import PartitionRule
    from harness.engines.compile.inductor import InductorCompiler

    def refuse() -> None:
        raise AssertionError("a build on the CPU emptied the CUDA cache")

    monkeypatch.setattr(torch.cuda, "empty_cache", refuse)
    backend = CompilerBackend(InductorCompiler(weights="packaged"), tmp_path, PartitionRule(count=1))
    backend.export_program(_WithConstant(), (torch.randn(2, 8),), {}, checkpoint=())
    (part,) = backend.cut()
    assert backend.program is not None
    named = {**backend.program.state_dict, **backend.constants()}
    built = backend.build_engine(0, {n: named[n] for n in part.weights})
    assert built.artifact is not None and built.artifact.is_file()
    assert "gpu_weights_bytes" not in measured(built.columns)  # built on the CPU: no weight on a GPU
    backend.close()
