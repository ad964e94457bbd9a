"""The memory predictor: its rules on cases whose answer follows from the rule, its constants against the committed
runs they were measured on, the command's JSON, its reading no weight, the README's table, and bad inputs."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import fields
from pathlib import Path

import pytest

from harness.backends import BACKENDS
from harness.backends.spec import BackendMemory, OwnBytes, WeightCopies
from harness.budget.record import StrategyBudget, read_budget
from harness.cli import main
from harness.engines.registry import BackendUnavailable, check_backend
from harness.engines.staging import CHUNK_BYTES, SLOTS
from harness.measure.coldcache import write_back_and_drop
from harness.measure.residency import FileResidency
from harness.models import build_model
from harness.models.checkpoints import ensure_checkpoint
from harness.predict.check import CheckRow, check_markdown, check_results, constant_sources
from harness.predict.command import README_BEGIN, README_END
from harness.predict.inputs import Baseline, PredictInputs
from harness.predict.recorded import inputs_of_budget, inputs_of_run
from harness.predict.rules import (
    FIELDS,
    GPU_WORKSPACE_BYTES,
    INSTANT_DEFAULT_IO_BYTES,
    RECLAIM_FLOOR_BYTES,
    predict_strategy,
)
from harness.results.reading import load_results
from harness.results.record import StrategyRecord
from harness.scenario import load_scenario
from harness.tests.committed import ROOT, committed_copy
from harness.tests.tiny_scenario import compiled_scenario, tiny_scenario_text
from harness.units import GIB, MIB

B, A = 300 * MIB, 200 * MIB
ENGINES = (3 * MIB, 5 * MIB, 2 * MIB)
M = sum(ENGINES)


def inputs(strategy: str, *, engines: tuple[int, ...] = ENGINES, model: int = M, device: str = "cpu",
           backend: str = "copy", weights: str | None = None) -> PredictInputs:
    return PredictInputs(model, engines, device, backend, weights, (strategy,), Baseline(B, A))


def figures(strategy: str, **kwargs: object) -> tuple[int | None, ...]:
    return tuple(predict_strategy(inputs(strategy, **kwargs), strategy).figures().values())  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the rules


def test_map_and_stream_hold_the_engine_being_built() -> None:
    for strategy in ("map", "map_no_prefetch", "stream"):
        assert figures(strategy) == (B + 5 * MIB, B + 5 * MIB, A, None, A + RECLAIM_FLOOR_BYTES)


def test_load_holds_two_copies_until_loaded_then_the_model() -> None:
    assert figures("load") == (B + M, B + 2 * M, A + 2 * M, None, A + 2 * M + RECLAIM_FLOOR_BYTES)


def test_file_views_hold_the_whole_file_once_a_tied_weight_counts_once() -> None:
    assert figures("load_file") == (B + M, B + M, A, None, A + RECLAIM_FLOOR_BYTES)
    tied = (4 * MIB, 5 * MIB, 4 * MIB)  # the first engine's weight is the last one's too
    assert figures("torch_mmap", engines=tied, model=9 * MIB)[:2] == (B + 9 * MIB, B + 9 * MIB)


def test_read_file_holds_the_previous_engine_beside_the_next() -> None:
    pair = 3 * MIB + 5 * MIB
    assert figures("read_file") == (B + pair, B + pair, A + pair, None, A + pair + RECLAIM_FLOOR_BYTES)


def test_on_a_gpu_engines_stay_there_and_device_copies_leave_the_host() -> None:
    assert figures("map", device="cuda")[3] == M
    assert figures("fastsafetensors", device="cuda")[:4] == (B, B, A, None)
    assert figures("fastsafetensors")[0] == B + 8 * MIB  # on the host its copies are the host's


def test_compilers_add_their_own_memory_and_their_copies() -> None:
    memory = BACKENDS["inductor"].memory
    own = memory.own_bytes
    assert own > 0
    mapped = figures("load_file", backend="inductor", weights="mapped")
    assert mapped[:3] == (B + own, B + own, A + own)  # a mapped build on the host reads no weight
    copies = int(memory.copies_of("packaged_compiler") * 5 * MIB)
    assert copies > 0
    packaged = figures("map", backend="inductor", weights="packaged_compiler")
    assert packaged[:3] == (B + 5 * MIB + copies + own, B + 5 * MIB + copies + own, A + copies + own)
    assert figures("map", backend="inductor", weights="packaged", device="cuda")[3] == 5 * MIB + GPU_WORKSPACE_BYTES


def test_a_backend_is_predicted_with_the_memory_its_registration_states(monkeypatch: pytest.MonkeyPatch) -> None:
    stated = BackendMemory(OwnBytes(7 * MIB, "a figure of this test"),
                           (WeightCopies("packaged_compiler", 1.5, "a figure of this test"),))
    monkeypatch.setitem(BACKENDS, "fake", dataclasses.replace(BACKENDS["iree"], name="fake", memory=stated))
    mapped = figures("load_file", backend="fake", weights="mapped")
    assert mapped[:3] == (B + 7 * MIB, B + 7 * MIB, A + 7 * MIB)  # no copies stated for `mapped`
    copies = int(1.5 * 5 * MIB)
    packaged = figures("map", backend="fake", weights="packaged_compiler")
    assert packaged[:3] == (B + 5 * MIB + copies + 7 * MIB, B + 5 * MIB + copies + 7 * MIB, A + copies + 7 * MIB)


def test_a_backend_that_states_no_memory_is_predicted_none(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("inductor", "unregistered"):  # registered without figures; not registered at all
        if name in BACKENDS:
            monkeypatch.setitem(BACKENDS, name, dataclasses.replace(BACKENDS[name], memory=BackendMemory()))
        assert figures("map", backend=name, weights="packaged_compiler")[:3] == (B + 5 * MIB, B + 5 * MIB, A)
        assert figures("load_file", backend=name, weights="mapped")[:3] == (B, B, A)  # reads no weight


def test_a_registration_states_copies_only_for_a_weight_setting_it_builds() -> None:
    copies = (WeightCopies("packaged", 2.0, "a figure of this test"),)
    with pytest.raises(ValueError, match=r"^backend 'fake': memory states weight copies for 'packaged', which must "
                                         r"be one of its weight settings \('mapped', 'packaged_compiler'\), stated "
                                         r"once$"):
        dataclasses.replace(BACKENDS["iree"], name="fake", memory=BackendMemory(copies=copies))


def test_a_result_that_set_a_registered_figure_is_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    stated = BackendMemory(OwnBytes(7 * MIB, "a figure of this test", "fake-smoke"))
    monkeypatch.setitem(BACKENDS, "fake", dataclasses.replace(BACKENDS["iree"], name="fake", memory=stated))
    assert constant_sources()["fake-smoke"] == "fake's own bytes"
    row = CheckRow("fake-smoke", "map", "build_peak_bytes", 2 * MIB, MIB, GIB, True)
    assert row.sets_constant and not dataclasses.replace(row, result="fake-other").sets_constant


def test_a_strategy_without_a_rule_predicts_nothing_and_says_why() -> None:
    p = predict_strategy(inputs("instanttensor"), "instanttensor")
    assert set(p.figures().values()) == {None} and "no rule" in p.note
    p = predict_strategy(inputs("st_prefetch_whole", device="cuda"), "st_prefetch_whole")
    assert set(p.figures().values()) == {None} and p.note.startswith("no rule: how far safetensors' background reads")


def test_the_whole_checkpoint_peers_hold_no_weight_on_the_host_but_their_staging() -> None:
    assert figures("fastsafetensors_whole", device="cuda") == (B, B, A, None, A + RECLAIM_FLOOR_BYTES)
    staging = INSTANT_DEFAULT_IO_BYTES
    assert staging == 4 * GIB
    assert figures("instanttensor_whole", device="cuda") == (
        B + staging, B + staging, A + staging, None, A + staging + RECLAIM_FLOOR_BYTES), "whatever the model"
    for name in ("fastsafetensors_whole", "instanttensor_whole"):
        p = predict_strategy(inputs(name), name)
        assert set(p.figures().values()) == {None} and p.note.startswith("no rule off a GPU")


# --------------------------------------------------------------------------- the constants' sources


@pytest.fixture(scope="module")
def committed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return committed_copy(["results"], tmp_path_factory.mktemp("committed")) / "results"


def test_every_constant_is_what_its_committed_run_measured(committed: Path) -> None:
    def run(name: str, strategy: str = "map") -> tuple[int, int, int]:
        record = load_results(committed / name).record
        s = record.strategies[strategy]
        assert s.build_peak_bytes is not None and s.baseline_rss_bytes is not None
        return s.build_peak_bytes, s.baseline_rss_bytes, record.largest_engine_bytes

    own = {name: spec.memory.own_bytes for name, spec in BACKENDS.items()}
    peak, base, _ = run("smoke-compile")
    assert abs(own["inductor"] - (peak - base)) < MIB
    peak, base, _ = run("smoke-iree")
    assert abs(own["iree"] - (peak - base)) < MIB
    peak, base, largest = run("smoke-openvino")
    assert abs(own["openvino"] - (peak - base - 3 * largest)) < MIB
    peak, base, largest = run("smoke-iree-packaged-compiler")
    factor = (peak - base - own["iree"] - largest) / largest
    assert abs(BACKENDS["iree"].memory.copies_of("packaged_compiler") - factor) < 0.05
    record = load_results(committed / "lerobot-compile-packaged").record
    gpu = record.strategies["map"].gpu_peak_bytes
    assert gpu is not None and abs(GPU_WORKSPACE_BYTES - (gpu - record.largest_engine_bytes)) < MIB
    swept = read_budget(committed / "smoke-budget").strategies["map"]
    assert swept.minimum_bytes is not None and swept.baseline_anon_bytes is not None
    assert abs(RECLAIM_FLOOR_BYTES - (swept.minimum_bytes - swept.baseline_anon_bytes)) < MIB
    peak, base, _ = run("pi05-h200", "instanttensor_whole")  # its defaults, one open, the copy builder's ring beside
    assert abs(INSTANT_DEFAULT_IO_BYTES + SLOTS * CHUNK_BYTES - (peak - base)) < 32 * MIB
    assert set(constant_sources()) <= {p.name for p in committed.iterdir()}


def test_every_backend_figure_reproduces_the_run_it_was_set_on(committed: Path) -> None:
    """Where a registration names the result a figure was set on, that result is of its backend (and weight
    setting), and the rules predict its ``map`` build-phase peak within 1 MiB: the figure is that run's residual."""
    named = 0
    for name, spec in BACKENDS.items():
        stated = [(spec.memory.own, None)] + [(c, c.weights) for c in spec.memory.copies]
        for figure, weights in stated:
            if figure is None or figure.result is None:
                continue
            named += 1
            results = load_results(committed / figure.result)
            run = results.strategies["map"]
            assert results.record.backend == name, figure.result
            assert weights is None or run.compiler_weights == weights, figure.result
            predicted = predict_strategy(inputs_of_run(results, "map"), "map").build_peak_bytes
            assert run.build_peak_bytes is not None and predicted is not None
            assert abs(predicted - run.build_peak_bytes) < MIB, (name, figure)
    assert named >= 4


def test_whether_a_compiler_built_a_result_is_what_its_backends_registration_says(
        committed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend registered as no compiler, of a name other than ``copy``: its results take the copy backend's goal
    and its sweeps no weight setting."""
    monkeypatch.setitem(BACKENDS, "fake", dataclasses.replace(BACKENDS["copy"], name="fake"))
    for name, record in (("smoke", "summary.json"), ("smoke-budget", "budget.json")):
        shutil.copytree(committed / name, tmp_path / name)
        path = tmp_path / name / record
        data = json.loads(path.read_text())
        assert data["backend"] == "copy"
        path.write_text(json.dumps({**data, "backend": "fake"}))
    rows = check_results(tmp_path)
    assert {r.result for r in rows} == {"smoke", "smoke-budget"} and not any(r.compiler for r in rows)
    budget = tmp_path / "smoke-budget"
    assert inputs_of_budget(budget, read_budget(budget), "map").compiler_weights is None


def test_a_runs_staging_is_not_a_result_the_check_reads(committed: Path, tmp_path: Path) -> None:
    shutil.copytree(committed / "smoke", tmp_path / "smoke")
    alone = check_results(tmp_path)
    assert alone  # the result's own rows
    shutil.copytree(committed / "smoke", tmp_path / ".smoke-b.partial")  # a run of another name, still staging
    assert check_results(tmp_path) == alone


# --------------------------------------------------------------------------- the README's table


def test_readme_table_is_what_the_check_prints_for_the_committed_results(committed: Path) -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.count(README_BEGIN) == 1 and text.count(README_END) == 1
    quoted = text.split(README_BEGIN, 1)[1].split(README_END, 1)[0].lstrip("\n")
    assert quoted == check_markdown(check_results(committed)), (
        "README.md's predict table differs from `python -m harness predict --check results/`: paste its output "
        "between the markers")


# --------------------------------------------------------------------------- the command


def tiny(tmp_path: Path, generate: bool) -> tuple[Path, Path]:
    checkpoint = tmp_path / "c.safetensors"
    path = tmp_path / "s.toml"
    path.write_text(tiny_scenario_text(checkpoint))
    if generate:
        ensure_checkpoint(build_model(load_scenario(path).model).module, checkpoint, 0, generate=True)
    return path, checkpoint


def test_json_names_the_record_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario, _ = tiny(tmp_path, generate=False)
    assert main(["predict", str(scenario), "--json", "--baseline-gib", "0.25"]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert set(data["strategies"]) == {"map"}
    assert set(FIELDS) <= set(data["strategies"]["map"])
    recorded = {f.name for f in fields(StrategyRecord)} | {f.name for f in fields(StrategyBudget)}
    assert set(FIELDS) <= recorded  # the records' own names for what they measure
    assert data["strategies"]["map"]["build_peak_bytes"] == int(0.25 * GIB) + data["largest_engine_bytes"]
    assert "does not exist" in data["source"] and not (tmp_path / "c.safetensors").exists()


def test_the_text_says_each_line_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario, _ = tiny(tmp_path, generate=False)
    assert main(["predict", str(scenario), "--baseline-gib", "0.25"]) == 0
    out = capsys.readouterr()
    said = [line.removeprefix("[predict] ") for line in out.err.splitlines() + out.out.splitlines() if line]
    assert any(line.startswith("sizes from ") for line in said)
    assert len(said) == len(set(said)), said


@pytest.mark.parametrize("backend", ["copy", "inductor"])
def test_predicting_reads_no_weight(tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str) -> None:
    """The checkpoint's page-cache residency is what it was: the copy backend reads its headers, a compiler also
    maps it and exports the model to cut its graph."""
    if backend == "copy":
        scenario, checkpoint = tiny(tmp_path, generate=True)
    else:
        try:
            check_backend(backend, "packaged_compiler")
        except BackendUnavailable as exc:
            pytest.skip(str(exc))
        scenario = compiled_scenario(tmp_path, backend, name="c", weights="packaged_compiler")
        checkpoint = tmp_path / "tiny.safetensors"
        ensure_checkpoint(build_model(load_scenario(scenario).model).module, checkpoint, 0, generate=True)
    write_back_and_drop(checkpoint)
    residency = FileResidency([checkpoint])
    try:
        if not residency.page_cache_visible or residency.resident_bytes() != 0:
            pytest.skip("this kernel does not show (or drop) the checkpoint's page cache")
        assert main(["predict", str(scenario), "--json", "--baseline-gib", "0.25"]) == 0
        assert residency.resident_bytes() == 0
    finally:
        residency.close()
    data = json.loads(capsys.readouterr().out)
    assert data["source"].startswith("the headers of") and data["model_bytes"] > 0
    assert os.path.getsize(checkpoint) > data["model_bytes"]
    if backend != "copy":
        assert "the exported graph's partitions" in data["source"]


@pytest.mark.parametrize("argv, words", [
    ([], "give a scenario file, or --check"),
    (["--check", "results", "scenarios/smoke.toml"], "takes no scenario"),
    (["--check", "no-such-dir"], "not a directory of results"),
    (["S", "--baseline-gib", "-1"], "--baseline-gib -1: expected a positive"),
    (["S", "--baseline-gib", "nan"], "--baseline-gib nan: expected a positive"),
    (["S", "--device", "tpu"], "--device tpu: expected cpu, cuda"),
    (["missing.toml"], "missing.toml"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                          words: str) -> None:
    scenario, _ = tiny(tmp_path, generate=False)
    argv = [str(scenario) if a == "S" else str(tmp_path / a) if a == "missing.toml" else a for a in argv]
    assert main(["predict", *argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
