"""Each backend is described once, by its spec (:mod:`harness.backends`): the code it names exists, the columns it
records are the engine record's, and what a registration says is what the scenario's choices, the engine registry,
the machine line and the report read."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest

from harness.backends import BACKENDS, BackendSpec
from harness.backends.columns import EngineColumns
from harness.backends.spec import resolve
from harness.engines.registry import BackendUnavailable, declared_columns
from harness.results.record import EngineRecord

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spec", BACKENDS.values(), ids=list(BACKENDS))
def test_every_spec_names_code_that_exists(spec: BackendSpec) -> None:
    for ref in (spec.factory, spec.missing, spec.weights_missing):
        if ref is not None:
            assert callable(resolve(ref)), ref
    assert spec.devices and set(spec.devices) <= {"cpu", "cuda"}
    assert spec.compiler == bool(spec.weights)


def test_a_reference_that_names_nothing_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match=r"^'harness\.backends:no_such': module harness\.backends has no callable "
                                         r"no_such$"):
        resolve("harness.backends:no_such")
    with pytest.raises(ValueError, match="expected 'module:attribute'"):
        resolve("harness.backends")


def _arms(tp: object) -> set[object]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return set(typing.get_args(tp))
    return {tp}


@pytest.mark.parametrize("spec", BACKENDS.values(), ids=list(BACKENDS))
def test_each_column_a_spec_declares_is_an_engine_record_field_of_its_type(spec: BackendSpec) -> None:
    record = typing.get_type_hints(EngineRecord)
    assert spec.columns, f"{spec.name} records no column of its own"
    for group in spec.columns:
        assert issubclass(group, EngineColumns) and dataclasses.is_dataclass(group)
        for name, tp in typing.get_type_hints(group).items():
            assert name in record, f"{group.__name__}.{name} is no field of EngineRecord"
            assert _arms(tp) <= _arms(record[name]), f"{group.__name__}.{name}: {tp} is not {record[name]}"


def test_a_record_refuses_a_column_it_does_not_declare() -> None:
    @dataclasses.dataclass(frozen=True)
    class Stray(EngineColumns):
        stray_bytes: int

    engine = EngineRecord(index=0, weight_bytes=1, start_s=0.0, end_s=1.0, host_hwm_bytes=None, released_bytes=None,
                          rss_after_bytes=None, gpu_used_bytes=None)
    with pytest.raises(TypeError, match=r"^Stray\.stray_bytes: not a field of EngineRecord"):
        engine.with_columns(Stray(stray_bytes=3))
    with pytest.raises(RuntimeError, match=r"^backend 'copy': its builder recorded Stray, which its spec does not "
                                           r"declare \(it declares CopyColumns\)$"):
        declared_columns("copy", [Stray(stray_bytes=3)])


def test_a_compiler_builds_the_weights_and_devices_its_spec_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.engines.registry import make_builder

    spec = dataclasses.replace(BACKENDS["iree"], name="fake", title="Fake", missing=None, devices=("cpu",),
                               weights=("packaged_compiler",))
    monkeypatch.setitem(BACKENDS, "fake", spec)
    build = types.SimpleNamespace(backend="fake", weights="mapped", release=True)
    plan = types.SimpleNamespace(scenario=types.SimpleNamespace(build=build), device="cpu")
    with pytest.raises(BackendUnavailable, match=r"^backend 'fake': weights must be packaged_compiler, not 'mapped'$"):
        make_builder(plan, Path("unused"))  # type: ignore[arg-type]
    build.weights, plan.device = "packaged_compiler", "cuda"
    with pytest.raises(BackendUnavailable, match=r"^backend 'fake' builds engines for the cpu, not cuda: "
                                                 r"set \[build\] device = \"cpu\"$"):
        make_builder(plan, Path("unused"))  # type: ignore[arg-type]


_REGISTERED = """
import itertools, json, sys
from pathlib import Path

from harness.backends import BACKENDS, BackendSpec
from harness.backends.columns import CompileColumns, TwoCallColumns
from harness.backends.spec import Package, TwoCalls

BACKENDS["fake"] = BackendSpec(
    "fake", "Fake", "harness.tests.test_backends:make_traced", (CompileColumns, TwoCallColumns), ("cpu",),
    packages=(Package("fake_psutil", ("no-such-distribution", "psutil")),), compiler=True,
    weights=("packaged_compiler",), two_calls=TwoCalls("Fake's conversion", "Fake's compile"))

from harness.engines.registry import check_backend
from harness.measure.machine import versions
from harness.report.compiler import compiler_figure
from harness.results.reading import load_results
from harness.scenario import BuildConfig
from harness.schema import scenario_schema
from harness.tests.fixtures import make_results

check_backend("fake", "packaged_compiler")
directory = make_results(Path(sys.argv[1]), name="fake", failed=None)
path = directory / "summary.json"
data = json.loads(path.read_text())
for strategy in data["strategies"].values():
    strategy.update(compiler="fake", compiler_weights="packaged_compiler")
    for engine in strategy["engines"]:
        start = engine["host_hwm_bytes"] // 2
        engine.update(compile_s=1.0, artifact_bytes=1, rss_before_bytes=start, children_peak_bytes=0,
                      children_pss_bytes=0, cache_bytes=0, convert_s=0.5, convert_hwm_bytes=start + 1,
                      compile_hwm_bytes=start + 2, compiler_read_bytes=0, compiler_held_bytes=0)
path.write_text(json.dumps(data))
figure = compiler_figure(load_results(directory))
lines = scenario_schema().splitlines()
at = next(i for i, line in enumerate(lines) if line.startswith("build.backend"))
entry = [lines[at], *itertools.takewhile(lambda line: line.startswith(" "), lines[at + 1:])]  # wrapped or not
print(json.dumps({
    "schema": " ".join(" ".join(entry).split()),
    "compiler": BuildConfig(backend="fake").compiler,
    "version": versions().get("fake_psutil"),
    "labels": [" ".join(t.get_text().split()) for legend in figure.legends for t in legend.get_texts()],
}))
"""


def test_a_registered_backend_is_read_by_every_consumer(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _REGISTERED, str(tmp_path)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    import psutil

    choices = " | ".join(f'"{name}"' for name in (*BACKENDS, "fake"))  # every registered backend, the new one last
    assert seen["schema"] == f'build.backend {choices} ["copy"]', seen["schema"]  # the scenario's choices
    assert seen["compiler"] is True
    assert seen["version"] == psutil.__version__  # the machine line, from the first distribution installed
    assert "peak rise when the conversion was done (Fake's conversion)" in seen["labels"], seen["labels"]
