"""The results layout: strict reading, versions, and every recorded run read at the layout it was written in."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from harness.catalog import is_gpu
from harness.results.checkpoint_reading import ReadingChoice
from harness.results.metrics import SampleColumns, StrategyMetrics, sampled_peaks
from harness.results.reading import load_results
from harness.results.record import LAYOUT_VERSION, SUMMARY, RecordError, RunRecord
from harness.results.samples import events_file, read_samples, samples_file
from harness.schema import at_layout
from harness.tests.fixtures import make_results
from harness.tests.recorded import COMMITTED, RECORDED, run_id
from harness.units import GIB, MIB


def _summary(directory: Path) -> dict[str, Any]:
    return json.loads((directory / SUMMARY).read_text())  # type: ignore[no-any-return]


def _rewrite(directory: Path, data: dict[str, Any]) -> None:
    (directory / SUMMARY).write_text(json.dumps(data))


def _before_22(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the keys layout 22 added (a run's Slurm jobs, per strategy and per repeat)."""
    jobs = ("job_ids", "node", "limit_enforcer")
    strategies = {name: {**{k: v for k, v in s.items() if k not in jobs},
                         "repeats": [{k: v for k, v in r.items() if k not in jobs} for r in s["repeats"]]}
                  for name, s in data["strategies"].items()}
    return {**data, "strategies": strategies}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return make_results(tmp_path / "results", device="cpu")


def test_committed_results_exist() -> None:
    assert {p.name for p in COMMITTED} >= {"smoke", "pi05", "pi05-h200"}


@pytest.mark.parametrize("directory", RECORDED, ids=run_id)
def test_recorded_results_read_with_their_version(directory: Path) -> None:
    data = _summary(directory)
    results = load_results(directory)
    version = data.get("layout", 1)
    assert results.record.layout == version
    for name, strategy in results.record.strategies.items():
        raw = data["strategies"][name]
        assert strategy.host_peak_bytes == raw["host_peak_bytes"]
        assert strategy.host_gpu_peak_bytes == raw["host_gpu_peak_bytes"]
        if version == 1 and results.record.on_gpu:
            assert strategy.build_peak_bytes == max(e["host_hwm_bytes"] for e in raw["engines"])
        elif version == 1:
            assert strategy.build_peak_bytes == raw["host_gpu_peak_bytes"]
        if version < 6 and raw.get("compiler_weights") == "packaged":  # written by the compiler, as they were
            assert strategy.compiler_weights == "packaged_compiler"
        # the derived copy in the file agrees with the one derivation, where it has not changed since: from
        # layout 5 on, engines compiled to run on the mapped weights in place have the baseline as their floor
        metrics = results.metrics[name]
        if version >= 5 or not results.engines_built_without_resident_weights:
            assert metrics.floor_bytes == raw["floor_bytes"], (name, metrics.floor_bytes, raw["floor_bytes"])
        else:
            assert metrics.floor_bytes == (raw["baseline_rss_bytes"] if strategy.ok else None), name
    if version < 9:  # before round orders were recorded every round ran the scenario's order
        assert results.record.round_orders == (tuple(data["strategies"]),) * max(1, data.get("repeats") or 1)
    else:
        assert results.record.round_orders == tuple(tuple(order) for order in data["round_orders"])


@pytest.mark.parametrize(("device", "gpu"), [("cpu", False), ("cuda", True), ("cuda:1", True)])
def test_a_device_is_a_gpu_by_one_rule_that_the_record_and_its_floor_follow(run_dir: Path, device: str,
                                                                           gpu: bool) -> None:
    run = load_results(run_dir).record.replace(device=device)
    assert is_gpu(device) is gpu and run.on_gpu is gpu
    assert StrategyMetrics.of("map", run.strategies["map"], run).on_gpu is gpu


@pytest.mark.parametrize(("config", "rounds"), [({"run": {"warmup": 2}}, 2), ({"run": {"warmup": 0}}, 0), ({}, 0),
                                               ({"run": {"warmup": True}}, 0), ({"run": {"warmup": "1"}}, 0)])
def test_the_warm_up_rounds_are_read_from_the_scenario_the_record_keeps(run_dir: Path, config: dict[str, Any],
                                                                        rounds: int) -> None:
    assert load_results(run_dir).record.replace(scenario_config=config).warmup_rounds == rounds


def test_an_older_layout_states_prefetch_and_the_interval_apart_and_they_read_as_held_once(run_dir: Path) -> None:
    data = _summary(run_dir)
    assert "prefetch" not in data and "sample_interval_ms" not in data  # the writer never writes them
    interval = data["scenario_config"]["run"]["sample_interval_ms"]
    data.pop("reading", None)  # layouts before 21 held the settings as ``speed``
    data["speed"] = ReadingChoice(prefetch="madvise", drop_cache=True, prefetch_why="chosen",
                                  drop_cache_why="chosen").to_json()
    checkpoint = {k: v for k, v in data["checkpoint"].items() if k not in ("files", "dtype_bytes")}  # layout 19's
    older = {**_before_22(data), "layout": 17, "prefetch": "madvise", "sample_interval_ms": interval,
             "checkpoint": checkpoint}
    _rewrite(run_dir, older)
    record = load_results(run_dir).record
    assert (record.prefetch, record.sample_interval_ms) == ("madvise", interval)
    assert (record.earlier_prefetch, record.earlier_sample_interval_ms) == (None, None)  # held once
    assert "prefetch" not in record.to_json() and "sample_interval_ms" not in record.to_json()
    _rewrite(run_dir, {**older, "prefetch": None})
    with pytest.raises(RecordError, match=r'summary.json: prefetch: expected "madvise", the value speed.prefetch '
                                          r"records, got null"):
        load_results(run_dir)
    _rewrite(run_dir, {**older, "sample_interval_ms": interval + 1})
    with pytest.raises(RecordError, match=r"summary.json: sample_interval_ms: expected .*, the value "
                                          r"scenario_config.run.sample_interval_ms records"):
        load_results(run_dir)
    # where nothing else holds them (no speed before layout 7, a scenario_config without the interval), they read
    without = {**older, "speed": None, "scenario_config": {"name": "n"}, "prefetch": "fadvise",
               "sample_interval_ms": 7.0}
    _rewrite(run_dir, without)
    record = load_results(run_dir).record
    assert (record.prefetch, record.sample_interval_ms) == ("fadvise", 7.0)


@pytest.mark.parametrize("key", ["prefetch", "sample_interval_ms"])
def test_a_record_of_the_current_layout_holding_a_dropped_key_is_refused(run_dir: Path, key: str) -> None:
    data = _summary(run_dir)
    _rewrite(run_dir, {**data, key: data["scenario_config"]["run"]["sample_interval_ms"]})
    with pytest.raises(RecordError, match=rf"summary.json: <top level>: unknown key '{key}'"):
        load_results(run_dir)
    del data["scenario_config"]["run"]["sample_interval_ms"]
    _rewrite(run_dir, data)
    with pytest.raises(RecordError, match=r"summary.json: scenario_config.run.sample_interval_ms: missing"):
        load_results(run_dir)


def test_the_settings_read_as_reading_from_the_layouts_that_held_them_as_speed(run_dir: Path) -> None:
    data = _summary(run_dir)
    choice = ReadingChoice(prefetch="madvise", drop_cache=True, prefetch_why="chosen", drop_cache_why="chosen")
    data["reading"] = choice.to_json()
    _rewrite(run_dir, data)
    assert load_results(run_dir).record.reading == choice
    earlier = {**{k: v for k, v in _before_22(data).items() if k != "reading"}, "layout": 20,
               "speed": choice.to_json()}
    _rewrite(run_dir, earlier)
    record = load_results(run_dir).record
    assert (record.reading, record.earlier_speed, record.prefetch) == (choice, None, "madvise")  # held once
    assert "speed" not in record.to_json() and record.to_json()["reading"] == choice.to_json()
    _rewrite(run_dir, {**data, "speed": choice.to_json()})
    with pytest.raises(RecordError, match=r"summary.json: <top level>: unknown key 'speed'"):
        load_results(run_dir)


def test_writes_the_current_version_and_reads_it_back(run_dir: Path) -> None:
    data = _summary(run_dir)
    assert data["layout"] == LAYOUT_VERSION
    record = RunRecord.from_json(data, "summary.json")
    assert record.to_json() == data


def test_unknown_key_is_an_error_naming_its_path(run_dir: Path) -> None:
    data = _summary(run_dir)
    data["strategies"]["map"]["host_peek_bytes"] = 1
    _rewrite(run_dir, data)
    with pytest.raises(RecordError, match=r"summary.json: strategies.map: unknown key 'host_peek_bytes'"):
        load_results(run_dir)


def test_missing_key_is_an_error_naming_its_path(run_dir: Path) -> None:
    data = _summary(run_dir)
    del data["strategies"]["load"]["engines"][1]["end_s"]
    _rewrite(run_dir, data)
    with pytest.raises(RecordError, match=r"strategies.load.engines\[1\]: missing key 'end_s'"):
        load_results(run_dir)


def test_wrong_type_is_an_error(run_dir: Path) -> None:
    data = _summary(run_dir)
    data["strategies"]["map"]["samples"] = "120"
    _rewrite(run_dir, data)
    with pytest.raises(RecordError, match=r"strategies.map.samples: expected an integer, got \"120\""):
        load_results(run_dir)


def test_a_version_1_file_may_not_hold_later_keys(run_dir: Path) -> None:
    data = _summary(run_dir)
    del data["layout"]
    _rewrite(run_dir, data)
    with pytest.raises(RecordError, match="unknown key"):
        load_results(run_dir)


def test_a_newer_version_is_refused(run_dir: Path) -> None:
    data = _summary(run_dir)
    data["layout"] = LAYOUT_VERSION + 1
    _rewrite(run_dir, data)
    with pytest.raises(RecordError, match=f"reads layout versions 1 to {LAYOUT_VERSION}"):
        load_results(run_dir)


def test_corrupt_json_and_csv_are_errors_naming_the_file(run_dir: Path) -> None:
    samples = run_dir / samples_file("map")
    samples.write_text("t_s,rss\n0,1\n")
    with pytest.raises(RecordError, match="samples-map.csv: expected the columns"):
        read_samples(samples)
    (run_dir / SUMMARY).write_text('{"scenario": ')
    with pytest.raises(RecordError, match=r"summary.json: not valid JSON \(line 1"):
        load_results(run_dir)


def test_a_finished_strategy_needs_its_samples(run_dir: Path) -> None:
    (run_dir / samples_file("map")).unlink()
    with pytest.raises(RecordError, match="samples-map.csv: missing, but strategy 'map' finished"):
        load_results(run_dir)
    (run_dir / samples_file("load_file")).unlink()  # failed: it may have written none


def test_stored_peaks_are_the_derivation_of_the_samples(run_dir: Path) -> None:
    results = load_results(run_dir)
    for name, record in results.strategies.items():
        peaks = sampled_peaks(record, SampleColumns.of(results.samples[name]))
        assert {k: getattr(record, k) for k in peaks} == peaks, name
        metrics = StrategyMetrics.of(name, record, results.record)
        assert metrics.floor_bytes == record.floor_bytes
        assert metrics.compared_peak_bytes == record.build_peak_bytes  # no GPU: the build-phase host peak


@pytest.mark.parametrize(("repeats", "orders", "problem"), [
    (2, [["map", "load", "load_file"]] * 3, "expected one order per measured round, 2 (repeats = 2), got 3"),
    (None, [["map", "load", "load_file"]] * 2, "expected one order per measured round, 1 (repeats = None), got 2"),
    (3, [], "expected one order per measured round, 3 (repeats = 3), got 0"),
])
def test_round_orders_hold_one_order_per_round(run_dir: Path, repeats: int | None, orders: list[list[str]],
                                               problem: str) -> None:
    data = _summary(run_dir)
    data["repeats"], data["round_orders"] = repeats, orders
    _rewrite(run_dir, data)
    with pytest.raises(RecordError, match=rf"summary.json: round_orders: {re.escape(problem)}$"):
        load_results(run_dir)


def _cut_at_a_row(path: Path, rows_kept: int) -> None:
    """``path`` cut at the end of data row ``rows_kept``: a whole CSV to look at, header and rows complete."""
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:1 + rows_kept]))


@pytest.mark.parametrize(("file", "rows"), [(samples_file, "sample_rows"), (events_file, "event_rows")])
def test_a_csv_cut_at_a_row_boundary_is_refused_by_the_rows_its_record_states(run_dir: Path, file: Any,
                                                                               rows: str) -> None:
    stated = _summary(run_dir)["strategies"]["map"][rows]
    assert stated > 2
    _cut_at_a_row(run_dir / file("map"), stated - 2)
    with pytest.raises(RecordError, match=rf"{file('map')}: {stated - 2} data rows, but the strategy's record "
                                          rf"states {stated} were written \(it was cut short\)$"):
        load_results(run_dir)


def test_a_csv_whose_record_states_no_rows_reads_without_the_check(run_dir: Path) -> None:
    # as every layout before 11 reads (the committed runs of those layouts: test_recorded_results_read_with_their_
    # version), and the record the harness makes for a worker that wrote none; set at the current layout, so that
    # the test does not follow each later layout's keys
    data = _summary(run_dir)
    data["strategies"]["map"].update(sample_rows=None, event_rows=None)
    _rewrite(run_dir, data)
    _cut_at_a_row(run_dir / samples_file("map"), 3)
    assert len(load_results(run_dir).samples["map"]) == 3


_GPU_SPLIT = {"gpu_start_bytes": 100 * MIB, "gpu_peak_bytes": 1600 * MIB, "gpu_weights_bytes": GIB,
              "gpu_reserved_peak_bytes": 1400 * MIB, "gpu_allocated_peak_bytes": 1300 * MIB}


def test_the_gpu_split_reads_back_as_written(tmp_path: Path) -> None:
    directory = make_results(tmp_path / "results", device="cuda")
    data = _summary(directory)
    for strategy in data["strategies"].values():
        strategy["gpu_context_bytes"] = 500 * MIB
        for engine in strategy["engines"]:
            engine.update(_GPU_SPLIT, gpu_start_bytes=-4096)  # above the baseline: below it where use fell
    record = RunRecord.from_json(data, "summary.json")
    assert record.to_json() == data
    strategy = record.strategies["map"]
    assert strategy.gpu_context_bytes == 500 * MIB
    assert {k: getattr(strategy.engines[0], k) for k in _GPU_SPLIT} == {**_GPU_SPLIT, "gpu_start_bytes": -4096}


def test_records_before_layout_16_read_the_gpu_split_as_none(run_dir: Path) -> None:
    data = {**at_layout(RunRecord, _summary(run_dir), 15), "layout": 15}  # as layout 15 wrote it
    for strategy in data["strategies"].values():
        assert "gpu_context_bytes" not in strategy
        assert not any(key in engine for engine in strategy["engines"] for key in _GPU_SPLIT)
    _rewrite(run_dir, data)
    run = load_results(run_dir).record
    assert run.layout == 15
    for strategy in run.strategies.values():
        assert strategy.gpu_context_bytes is None
        assert all(getattr(e, k) is None for e in strategy.engines for k in _GPU_SPLIT)


@pytest.mark.parametrize("directory", RECORDED, ids=run_id)
def test_recorded_results_hold_the_gpu_split_where_their_layout_and_device_have_one(directory: Path) -> None:
    record = load_results(directory).record
    split = record.layout >= 16 and record.on_gpu
    for strategy in record.strategies.values():
        if not split:
            assert strategy.gpu_context_bytes is None
            assert all(e.gpu_peak_bytes is None and e.gpu_weights_bytes is None for e in strategy.engines)
            continue
        assert strategy.gpu_context_bytes is not None and strategy.gpu_context_bytes > 0  # taken before the load
        assert all(e.gpu_peak_bytes is not None and e.gpu_start_bytes is not None for e in strategy.engines)
        if record.backend == "copy":  # no compiler: the copies are the build itself
            assert all(e.gpu_weights_bytes is None for e in strategy.engines)
        else:  # a compiled engine's build copies each of its partition's weights to the device once
            assert all(e.gpu_weights_bytes == e.weight_bytes for e in strategy.engines)
