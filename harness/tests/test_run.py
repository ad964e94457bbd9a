"""End to end: a small scenario through every strategy, each in its own process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness.backends import ALIGN, CopyToDevice, CopyToFiles
from harness.models import SyntheticTransformer, fill_non_persistent
from harness.partition import cap_for, partition
from harness.record import RunRecord
from harness.run import run_scenario, worker_command
from harness.scenario import Scenario, load_scenario
from harness.strategies import load_map
from weightmap import save_weights_for_mapping

MiB = 2**20
SLACK = 24 * MiB  # allocator, sampler and interpreter noise around a page-exact figure

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


def write_scenario(tmp: Path) -> Scenario:
    path = tmp / "tiny.toml"
    path.write_text(SCENARIO.format(checkpoint=tmp / "tiny.safetensors"))
    return load_scenario(path)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunRecord, Path, Scenario]:
    tmp = tmp_path_factory.mktemp("run")
    scenario = write_scenario(tmp)
    summary = run_scenario(scenario, results=tmp / "results", plots=True)
    return summary, tmp / "results" / "tiny", scenario


def held_after(engines: list[list[int]], sizes: dict[int, int], i: int) -> int:
    """Bytes that must stay after engine i: tensors read by engine <= i and by a later one."""
    early = {t for e in engines[: i + 1] for t in e}
    late = {t for e in engines[i + 1:] for t in e}
    return sum(sizes[t] for t in early & late)


def test_every_strategy_runs_and_writes_its_files(tiny_run: tuple[RunRecord, Path, Scenario]) -> None:
    summary, out, _ = tiny_run
    assert set(summary.strategies) == {"map", "load", "load_file"}
    for name, entry in summary.strategies.items():
        assert entry.status == "ok", (name, entry.error)
        assert (out / f"samples-{name}.csv").stat().st_size > 0
        assert (out / f"events-{name}.csv").stat().st_size > 0
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["strategies"]["map"]["host_peak_bytes"] == summary.strategies["map"].host_peak_bytes
    for figure in ("timeline", "peaks", "engines"):
        assert (out.parent / f"tiny-{figure}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| map |" in (out.parent / "tiny.md").read_text()


def test_map_releases_each_engine_and_stays_near_the_floor(tiny_run: tuple[RunRecord, Path, Scenario]) -> None:
    summary, _, scenario = tiny_run
    entry = summary.strategies["map"]
    base, model_bytes = entry.baseline_rss_bytes, summary.model.bytes
    assert base is not None and entry.host_at_partitioning_bytes is not None
    assert entry.host_at_partitioning_bytes - base < SLACK, "mapping must not read the weights"
    with torch.device("meta"):
        model = SyntheticTransformer(layers=4, width=512, heads=8, vocab=8192)
    named = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    engines = [[id(named[n]) for n in e.names] for e in partition(model, cap_for(model, 4))]
    sizes = {id(t): t.numel() * t.element_size() for t in named.values()}  # a tied weight is one tensor
    assert len(entry.engines) == len(engines)
    for i, engine in enumerate(entry.engines):
        assert engine.rss_after_bytes is not None and engine.host_hwm_bytes is not None
        limit = base + held_after(engines, sizes, i) + SLACK
        assert engine.rss_after_bytes <= limit, f"engine {i}: {engine.rss_after_bytes} > {limit}"
        during = base + (held_after(engines, sizes, i - 1) if i else 0) + engine.weight_bytes + SLACK
        assert engine.host_hwm_bytes <= during, f"engine {i}: peak {engine.host_hwm_bytes} > {during}"
    assert entry.released_bytes is not None and entry.released_bytes >= 0.99 * model_bytes
    assert entry.unreleased_bytes == 0


def test_load_holds_everything_and_load_file_never_releases(tiny_run: tuple[RunRecord, Path, Scenario]) -> None:
    summary, out, _ = tiny_run
    model_bytes = summary.model.bytes
    load = summary.strategies["load"]
    assert load.host_at_partitioning_bytes is not None and load.baseline_rss_bytes is not None
    assert load.host_at_partitioning_bytes - load.baseline_rss_bytes >= 0.95 * model_bytes
    anon_baseline = pd.read_csv(out / "samples-load.csv")["anon_bytes"].iloc[0]
    assert load.anon_peak_bytes is not None
    assert load.anon_peak_bytes - anon_baseline >= 1.5 * model_bytes  # two copies at the peak
    load_file = summary.strategies["load_file"]
    assert load_file.released_bytes is not None and load_file.unreleased_bytes is not None
    assert load_file.released_bytes <= 4096  # only inv_freq, filled in ordinary memory by the harness
    assert load_file.unreleased_bytes >= 0.99 * model_bytes
    assert "not resizable" in load_file.release_note
    last = load_file.engines[-1]
    assert last.rss_after_bytes is not None and load_file.baseline_rss_bytes is not None
    assert last.rss_after_bytes - load_file.baseline_rss_bytes >= 0.9 * model_bytes
    map_peak = summary.strategies["map"].host_peak_bytes
    assert map_peak is not None and load.host_peak_bytes is not None and load_file.host_peak_bytes is not None
    assert map_peak < load.host_peak_bytes and map_peak < load_file.host_peak_bytes


def test_summary_agrees_with_the_samples(tiny_run: tuple[RunRecord, Path, Scenario]) -> None:
    summary, out, _ = tiny_run
    for name, entry in summary.strategies.items():
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


def test_a_strategy_that_dies_is_recorded_and_the_others_still_run(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path)

    def dying(s: Scenario, strategy: str, out: Path) -> list[str]:
        if strategy == "load":
            return [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
        return worker_command(s, strategy, out)

    summary = run_scenario(scenario, results=tmp_path / "results", command=dying, plots=False)
    load = summary.strategies["load"]
    assert load.status == "failed" and load.error is not None and "signal 9" in load.error
    assert summary.strategies["map"].status == "ok"
    assert summary.strategies["load_file"].status == "ok"
    on_disk = json.loads((tmp_path / "results" / "tiny" / "summary.json").read_text())
    assert on_disk["strategies"]["load"]["status"] == "failed"


def test_memory_limit_stops_a_strategy(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path)

    def hungry(s: Scenario, strategy: str, out: Path) -> list[str]:
        if strategy == "load":
            code = "import time; x = bytearray(3 * 2**30); time.sleep(30)"
            return [sys.executable, "-c", code]
        return worker_command(s, strategy, out)

    summary = run_scenario(scenario, results=tmp_path / "results", command=hungry, plots=False)
    error = summary.strategies["load"].error
    assert error is not None and "memory limit" in error
    assert summary.strategies["map"].status == "ok"


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


def test_copy_backend_built_model_matches_eager(tmp_path: Path) -> None:
    eager, mapped, named = eager_and_mapped(tmp_path)
    backend = CopyToFiles(tmp_path / "engines")
    for engine in partition(mapped, cap_for(mapped, 3)):
        backend.build_engine(engine, {n: named[n] for n in engine.names})
    built = backend.built_model(mapped)
    tokens = torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(built(tokens), eager(tokens))
    backend.close()
    assert not (tmp_path / "engines").exists()


def test_device_backend_packs_each_engine_into_one_buffer(tmp_path: Path) -> None:
    # The GPU path, run on the CPU: one buffer per engine, views into it, same output.
    eager, mapped, named = eager_and_mapped(tmp_path)
    backend = CopyToDevice(device="cpu")
    for engine in partition(mapped, cap_for(mapped, 3)):
        size = backend.build_engine(engine, {n: named[n] for n in engine.names})
        assert engine.nbytes <= size <= engine.nbytes + ALIGN * len(engine.names)
    for copies in backend.engines:
        storages = {t.untyped_storage().data_ptr() for t in copies.values()}
        assert len(storages) == 1, "an engine must be one allocation"
    tokens = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        torch.testing.assert_close(backend.built_model(mapped)(tokens), eager(tokens))


def test_tensorrt_backend_fails_fast_when_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "trt.toml"
    path.write_text(SCENARIO.format(checkpoint=tmp_path / "never.safetensors").replace('"copy"', '"tensorrt"'))
    done = subprocess.run([sys.executable, "-m", "harness", "run", str(path), "--results", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "tensorrt" in done.stderr and "torch_tensorrt" in done.stderr
    assert not (tmp_path / "never.safetensors").exists(), "nothing may run before the backend is checked"
