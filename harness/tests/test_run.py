"""End to end: a small scenario through the planner, the supervised workers and the record.

One module-wide run measures all three strategies (their figures are compared with each
other); every other test runs one real strategy at most, with stand-in commands for the
processes whose failures it checks. Checkpoints and engine files go under temporary
directories, never under the repository's ``data/``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness.engines.partition import split_into
from harness.errors import OutputError
from harness.models import SyntheticTransformer
from harness.plan import make_plan, read_plan
from harness.report import render_staged
from harness.report.names import figure_name
from harness.results.record import PLAN, RunRecord
from harness.run import run_scenario
from harness.scenario import BuildConfig, CheckpointConfig, ModelConfig, RunConfig, Scenario, load_scenario
from harness.units import MIB
from harness.worker import FAILURE_PREFIX, worker_command

SLACK = 24 * MIB  # allocator, sampler and interpreter noise around a page-exact figure

SCENARIO = """
name = "tiny"
strategies = ["map", "load", "load_file"]
[model]
source = "synthetic"
layers = 4
width = 512
heads = 8
vocab = 8192
dtype = "float32"
[checkpoint]
path = "{checkpoint}"
seed = 1
generate = true
[build]
engines = 4
backend = "copy"
device = "cpu"
[run]
cache = "cold"
sample_interval_ms = 5.0
memory_limit_gib = 2.0
timeout_s = 300
"""

TINY = ModelConfig(source="synthetic", layers=4, width=512, heads=8, vocab=8192)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose checkpoint every test of this module reuses (generated once)."""
    return tmp_path_factory.mktemp("shared")


def tiny_scenario(shared: Path, *strategies: str) -> Scenario:
    """The tiny scenario built in code (no file), with the given strategies."""
    return Scenario(
        name="tiny",
        strategies=strategies,
        model=TINY,
        checkpoint=CheckpointConfig(path=shared / "tiny.safetensors", seed=1, generate=True),
        build=BuildConfig(engines=4, device="cpu"),
        run=RunConfig(sample_interval_ms=5.0, memory_limit_gib=2.0, timeout_s=300),
    )


@pytest.fixture(scope="module")
def tiny_run(shared: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[RunRecord, Path, Path]:
    tmp = tmp_path_factory.mktemp("run")
    path = tmp / "tiny.toml"
    path.write_text(SCENARIO.format(checkpoint=shared / "tiny.safetensors"))
    record = run_scenario(load_scenario(path), results=tmp / "results", workdir=tmp / "engines",
                          render=render_staged)
    return record, tmp / "results" / "tiny", tmp / "engines"


def held_after(engines: list[list[int]], sizes: dict[int, int], i: int) -> int:
    """Bytes that must stay after engine i: tensors read by engine <= i and by a later one."""
    early = {t for e in engines[: i + 1] for t in e}
    late = {t for e in engines[i + 1:] for t in e}
    return sum(sizes[t] for t in early & late)


def test_every_strategy_runs_and_writes_its_files(tiny_run: tuple[RunRecord, Path, Path]) -> None:
    record, out, engines = tiny_run
    assert list(record.strategies) == ["map", "load", "load_file"]
    for name, entry in record.strategies.items():
        assert entry.status == "ok", (name, entry.error)
        assert (out / f"samples-{name}.csv").stat().st_size > 0
        assert (out / f"events-{name}.csv").stat().st_size > 0
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == record.to_json()
    for figure in ("timeline", "peaks", "engines"):
        assert (out.parent / figure_name("tiny", figure)).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| map |" in (out.parent / "tiny.md").read_text()
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".")) == []  # no staging left
    assert not any(engines.rglob("*.safetensors")), "engine files are removed after each strategy"


def test_the_asked_number_of_engines_is_built_as_planned(tiny_run: tuple[RunRecord, Path, Path]) -> None:
    record, out, _ = tiny_run
    plan = read_plan(out / PLAN)
    assert record.engines == len(plan.engines) == 4
    for entry in record.strategies.values():
        assert [(e.index, e.weight_bytes) for e in entry.engines] == [(e.index, e.weight_bytes)
                                                                      for e in plan.engines]


def test_map_releases_each_engine_and_stays_near_the_floor(tiny_run: tuple[RunRecord, Path, Path]) -> None:
    record, _, _ = tiny_run
    entry = record.strategies["map"]
    base, model_bytes = entry.baseline_rss_bytes, record.model.bytes
    assert base is not None and entry.host_at_partitioning_bytes is not None
    assert entry.host_at_partitioning_bytes - base < SLACK, "mapping must not read the weights"
    with torch.device("meta"):
        model = SyntheticTransformer(layers=4, width=512, heads=8, vocab=8192)
    named = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    engines = [[id(named[n]) for n in e.names] for e in split_into(model, 4)[0]]
    sizes = {id(t): t.numel() * t.element_size() for t in named.values()}  # a tied weight is one tensor
    assert len(entry.engines) == len(engines)
    for i, engine in enumerate(entry.engines):
        assert engine.rss_after_bytes is not None and engine.host_hwm_bytes is not None
        limit = base + held_after(engines, sizes, i) + SLACK
        assert engine.rss_after_bytes <= limit, f"engine {i}: {engine.rss_after_bytes} > {limit}"
        during = base + (held_after(engines, sizes, i - 1) if i else 0) + engine.weight_bytes + SLACK
        assert engine.host_hwm_bytes <= during, f"engine {i}: peak {engine.host_hwm_bytes} > {during}"
    assert entry.released_bytes is not None and entry.released_bytes >= 0.99 * model_bytes
    # Only the non-persistent buffers (rotary frequencies: ordinary memory the model still reads) are kept.
    assert entry.unreleased_bytes == record.model.bytes_with_non_persistent_buffers - model_bytes


def test_load_holds_everything_and_load_file_never_releases(tiny_run: tuple[RunRecord, Path, Path]) -> None:
    record, out, _ = tiny_run
    model_bytes = record.model.bytes
    load = record.strategies["load"]
    assert load.host_at_partitioning_bytes is not None and load.baseline_rss_bytes is not None
    assert load.host_at_partitioning_bytes - load.baseline_rss_bytes >= 0.95 * model_bytes
    anon_baseline = pd.read_csv(out / "samples-load.csv")["anon_bytes"].iloc[0]
    assert load.anon_peak_bytes is not None
    assert load.anon_peak_bytes - anon_baseline >= 1.5 * model_bytes  # two copies at the peak
    load_file = record.strategies["load_file"]
    assert load_file.released_bytes is not None and load_file.unreleased_bytes is not None
    assert load_file.released_bytes <= 4096  # only inv_freq, filled in ordinary memory by the harness
    assert load_file.unreleased_bytes >= 0.99 * model_bytes
    assert "not resizable" in load_file.release_note
    # what map and load keep is only the non-persistent buffers: their notes say every weight was released
    assert record.strategies["map"].release_note.startswith("every weight released after its last engine")
    assert load.release_note.startswith("every weight released after its last engine (storages resized to 0)")
    last = load_file.engines[-1]
    assert last.rss_after_bytes is not None and load_file.baseline_rss_bytes is not None
    assert last.rss_after_bytes - load_file.baseline_rss_bytes >= 0.9 * model_bytes
    map_peak = record.strategies["map"].host_peak_bytes
    assert map_peak is not None and load.host_peak_bytes is not None and load_file.host_peak_bytes is not None
    assert map_peak < load.host_peak_bytes and map_peak < load_file.host_peak_bytes


def test_record_agrees_with_the_samples(tiny_run: tuple[RunRecord, Path, Path]) -> None:
    record, out, _ = tiny_run
    for name, entry in record.strategies.items():
        samples = pd.read_csv(out / f"samples-{name}.csv")
        assert len(samples) == entry.samples
        assert entry.host_peak_bytes is not None and entry.host_peak_bytes >= samples["rss_bytes"].max()
        assert entry.anon_peak_bytes == samples["anon_bytes"].max()
        assert samples["gpu_used_bytes"].isna().all()
        assert entry.gpu_peak_bytes is None
        build = samples[samples["phase"] == "build"]
        assert entry.build_peak_bytes is not None and entry.build_peak_bytes >= build["rss_bytes"].max()
        assert entry.build_peak_bytes <= entry.host_peak_bytes
        assert entry.host_gpu_peak_bytes == entry.build_peak_bytes  # no GPU: nothing adds to the host
        assert entry.baseline_rss_bytes is not None
        assert entry.floor_bytes == entry.baseline_rss_bytes + max(e.weight_bytes for e in entry.engines)
        assert set(samples["engine"]) >= set(range(len(entry.engines)))


def test_a_scenario_built_in_code_runs_and_a_crashing_strategy_is_recorded(shared: Path, tmp_path: Path) -> None:
    def crashing(plan: Path, strategy: str, out: Path) -> list[str]:
        if strategy == "load":
            return [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
        return worker_command(plan, strategy, out)

    record = run_scenario(tiny_scenario(shared, "load", "map"), results=tmp_path / "results", command=crashing,
                          workdir=tmp_path / "engines")
    load = record.strategies["load"]
    assert load.status == "failed" and load.error == "killed by signal 11"
    assert record.strategies["map"].status == "ok", record.strategies["map"].error
    on_disk = json.loads((tmp_path / "results" / "tiny" / "summary.json").read_text())
    assert on_disk["strategies"]["load"]["status"] == "failed"
    assert on_disk["scenario_config"]["path"] is None


def test_memory_limit_stops_a_strategy(shared: Path, tmp_path: Path) -> None:
    def hungry(plan: Path, strategy: str, out: Path) -> list[str]:
        return [sys.executable, "-c", "import time; x = bytearray(3 * 2**30); time.sleep(30)"]

    record = run_scenario(tiny_scenario(shared, "load"), results=tmp_path / "results", command=hungry,
                          workdir=tmp_path / "engines")
    error = record.strategies["load"].error
    assert error is not None and "memory limit of 2.00 GiB" in error


def test_a_worker_that_cannot_write_its_record_says_why_and_the_run_is_not_published(
    shared: Path, tmp_path: Path
) -> None:
    message = "OutputError: samples-map.csv: cannot write (No space left on device)"
    code = f"import sys; print({FAILURE_PREFIX + message!r}, file=sys.stderr); sys.exit(1)"

    def full_disk(plan: Path, strategy: str, out: Path) -> list[str]:
        return [sys.executable, "-c", code]

    with pytest.raises(OutputError) as raised:
        run_scenario(tiny_scenario(shared, "map"), results=tmp_path / "results", command=full_disk,
                     workdir=tmp_path / "engines")
    assert str(raised.value) == (f"{tmp_path / 'results' / 'tiny'}: kept as it was, this run is not published: map "
                                 f"failed for a reason outside the strategy ({message})")
    assert not (tmp_path / "results" / "tiny").exists()


def test_the_plan_is_resolved_once_and_carries_the_engines(shared: Path, tmp_path: Path) -> None:
    plan = make_plan(tiny_scenario(shared, "map"), name="tiny", workdir=tmp_path)
    assert plan.device == "cpu" and len(plan.engines) == 4
    assert sum(len(e.names) for e in plan.engines) >= plan.model.tensors
    assert plan.checkpoint.path == str(shared / "tiny.safetensors")
