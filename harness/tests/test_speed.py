"""Prefetch, cache preparation, the disk-read reference, the engine-time split and repeats.

One module-wide run measures ``map`` and ``map_no_prefetch`` twice each on a small model
with a cold cache; the other tests are unit tests of the pieces. Checkpoints and engine
files go under temporary directories, never under the repository's ``data/``.
"""

from __future__ import annotations

import json
import mmap
import re
import signal
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from harness import stopping
from harness.checkpoint_reading import sized_to_ceiling
from harness.engines.copy import CopyToFiles, fault_in
from harness.load.strategies import _release_and_prefetch
from harness.measure.probe import probe_bytes
from harness.measure.procfs import read_status
from harness.plan import Plan, make_plan, read_plan
from harness.reference import SHARED_DISK_TIMES
from harness.report import render_staged
from harness.results.checkpoint_reading import EARLIER_REQUEST_BYTES, ReadingChoice
from harness.results.disk import CeilingPoint, DiskRead
from harness.results.metrics import StrategyMetrics, best_ceiling, disk_metrics
from harness.results.reading import load_results
from harness.results.record import RunRecord, StrategyRecord
from harness.results.repeats import combine_repeats, representative
from harness.run import run_scenario
from harness.scenario import (
    BuildConfig,
    CheckpointConfig,
    RunConfig,
    Scenario,
    ScenarioError,
    load_scenario,
)
from harness.tests.fixtures import make_results, measured
from harness.tests.test_run import TINY
from harness.units import MIB, format_bytes
from harness.watch import Outcome, Supervisor, watch_here
from weightmap import map_weights, save_weights_for_mapping


def _scenario(tmp: Path, **run: object) -> Scenario:
    return Scenario(
        name="speedy",
        strategies=("map", "map_no_prefetch"),
        model=TINY,
        checkpoint=CheckpointConfig(path=tmp / "tiny.safetensors", seed=1, generate=True),
        build=BuildConfig(engines=4, device="cpu"),
        run=RunConfig(sample_interval_ms=5.0, memory_limit_gib=2.0, timeout_s=300, **run),  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def repeated(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunRecord, Path]:
    tmp = tmp_path_factory.mktemp("speed")
    record = run_scenario(_scenario(tmp, repeats=2), results=tmp / "results", workdir=tmp / "engines",
                          render=render_staged)
    return record, tmp / "results" / "speedy"


# --------------------------------------------------------------------------- scenario and plan


def _toml(tmp: Path, run: str) -> Path:
    path = tmp / "s.toml"
    path.write_text(f"""
name = "s"
[model]
source = "synthetic"
layers = 1
width = 64
heads = 4
vocab = 64
[checkpoint]
path = "{tmp / 'c.safetensors'}"
[build]
engines = 1
[run]
{run}
""")
    return path


def test_prefetch_and_drop_cache_are_chosen_per_run_by_default_and_can_be_set(tmp_path: Path) -> None:
    default = load_scenario(_toml(tmp_path, "")).run
    assert (default.prefetch, default.drop_cache) == ("auto", None)
    assert load_scenario(_toml(tmp_path, "")).run.repeats == 1
    scenario = load_scenario(_toml(tmp_path, 'prefetch = "off"\nrepeats = 3\ndrop_cache = true'))
    assert (scenario.run.prefetch, scenario.run.repeats, scenario.run.drop_cache) == ("off", 3, True)
    with pytest.raises(ScenarioError, match=r"run\.prefetch: expected one of 'auto', 'off', 'fadvise', 'madvise'"):
        load_scenario(_toml(tmp_path, 'prefetch = "willneed"'))
    with pytest.raises(ScenarioError, match=r"run\.repeats: expected an integer >= 1"):
        load_scenario(_toml(tmp_path, "repeats = 0"))


def test_the_plan_carries_prefetch_and_repeats(tmp_path: Path) -> None:
    plan = make_plan(_scenario(tmp_path, prefetch="off", drop_cache=True, repeats=3), name="p", workdir=tmp_path)
    assert (plan.prefetch, plan.drop_cache, plan.scenario.run.repeats) == (None, True, 3)
    assert plan.reading.prefetch_why == plan.reading.drop_cache_why == "set by the scenario"
    assert plan.reading.probe is None  # nothing left to choose: nothing probed
    plan = make_plan(_scenario(tmp_path), name="p", workdir=tmp_path)  # auto, a checkpoint too small to probe
    assert (plan.prefetch, plan.drop_cache, plan.scenario.run.repeats) == ("madvise", False, 1)
    assert "not probed" in plan.reading.prefetch_why and "not probed" in plan.reading.drop_cache_why
    assert json.loads(json.dumps(plan.to_json()))["reading"]["prefetch"] == "madvise"


# --------------------------------------------------------------------------- the repeated run


def test_prefetch_is_recorded_and_changes_nothing_that_is_released(repeated: tuple[RunRecord, Path]) -> None:
    record, _ = repeated
    assert record.prefetch == "madvise"
    on, off = record.strategies["map"], record.strategies["map_no_prefetch"]
    assert on.ok and off.ok, (on.error, off.error)
    assert (on.prefetch, off.prefetch) == ("madvise", None)
    assert on.prefetch_warmed_bytes and on.prefetch_warmed_bytes >= record.model.bytes // 2
    assert off.prefetch_warmed_bytes is None
    # where the prefetch thread's time went: asking for pages, and (drop_cache is off here) no evicting
    assert on.prefetch_busy_s is not None and on.prefetch_busy_s > 0 and on.prefetch_evict_s == 0.0
    assert off.prefetch_busy_s is None and off.prefetch_evict_s is None
    assert on.released_bytes == off.released_bytes == record.model.bytes
    assert [e.released_bytes for e in on.engines] == [e.released_bytes for e in off.engines]


def test_a_small_checkpoint_records_its_ceiling_sweep_but_prefetch_is_not_sized_to_it(
        repeated: tuple[RunRecord, Path]) -> None:
    record, out = repeated
    assert record.reading is not None and best_ceiling(record.read_ceiling) is not None  # swept, as a reference
    assert (record.reading.prefetch_readers, record.reading.prefetch_request_bytes) == (1, EARLIER_REQUEST_BYTES)
    assert record.reading.prefetch_sizing_why and "not sized" in record.reading.prefetch_sizing_why
    plan = read_plan(out / "plan.json")  # what the rounds' workers read
    assert plan.reading == record.reading
    report = (out.parent / "speedy.md").read_text()
    assert f"1 reader(s) asking at once in requests of {EARLIER_REQUEST_BYTES / MIB:g} MiB (not sized" in report


def test_sizing_to_the_ceiling_takes_its_fastest_point_and_leaves_prefetch_off_alone() -> None:
    points = [CeilingPoint(1, MIB, 100 * MIB, 1.0), CeilingPoint(4, 8 * MIB, 100 * MIB, 0.5),
              CeilingPoint(2, 32 * MIB, 100 * MIB, 0.7)]
    large = probe_bytes()
    on = ReadingChoice(prefetch="madvise", drop_cache=False, prefetch_why="set", drop_cache_why="set")
    sized = sized_to_ceiling(on, points, large)
    assert (sized.prefetch_readers, sized.prefetch_request_bytes) == (4, 8 * MIB)
    assert sized.prefetch_sizing_why == "the read-ceiling sweep's fastest setting (4 reader(s) of 8 MiB, 210 MB/s)"
    assert sized_to_ceiling(on, [], large) == on  # nothing swept: one reader, weightmap's requests
    off = ReadingChoice(prefetch=None, drop_cache=False, prefetch_why="set", drop_cache_why="set")
    assert sized_to_ceiling(off, points, large) == off
    plan = _release_and_prefetch(torch.nn.Linear(2, 2), [["weight"]], "madvise", False, 3, 4 * MIB)
    try:
        assert "prefetch_readers=3" in repr(plan)
    finally:
        plan.close()


def test_a_small_checkpoints_settings_do_not_depend_on_the_sweeps_points() -> None:
    on = ReadingChoice(prefetch="madvise", drop_cache=False, prefetch_why="set", drop_cache_why="set")
    one = [CeilingPoint(1, MIB, 20 * MIB, 0.010), CeilingPoint(4, MIB, 20 * MIB, 0.009)]
    other = [CeilingPoint(1, MIB, 20 * MIB, 0.009), CeilingPoint(4, MIB, 20 * MIB, 0.010)]
    small = probe_bytes() - 1
    assert sized_to_ceiling(on, one, small) == sized_to_ceiling(on, other, small)
    sized = sized_to_ceiling(on, one, small)
    assert (sized.prefetch_readers, sized.prefetch_request_bytes) == (1, EARLIER_REQUEST_BYTES)
    assert sized.prefetch_sizing_why == ("not sized to the read-ceiling sweep: the checkpoint's largest file "
                                         f"({small / 2**30:.2f} GiB) is under the 2.4 GiB the read probe needs, "
                                         "and a sweep of it reads too little to tell its points apart")
    # at the probe's size the sweep sizes it, so the two sweeps would differ there
    assert sized_to_ceiling(on, one, probe_bytes()) != sized_to_ceiling(on, other, probe_bytes())


def test_each_run_starts_cold_and_says_how(repeated: tuple[RunRecord, Path]) -> None:
    record, _ = repeated
    for name, entry in record.strategies.items():
        cache = entry.cache
        assert cache is not None, name
        assert (cache.state, cache.flushed, cache.dropped) == ("cold", True, True)
        assert cache.resident_at_load_bytes is not None and cache.resident_at_load_bytes <= MIB
        assert cache.total_bytes == record.checkpoint.bytes
        assert all(r.resident_at_load_bytes is not None and r.resident_at_load_bytes <= MIB for r in entry.repeats)


def test_the_disk_is_read_once_per_round(repeated: tuple[RunRecord, Path]) -> None:
    record, out = repeated
    assert [d.before for d in record.disk_reads] == [0, 1]
    # the read ceiling is swept once, before the first round: every point read the checkpoint; the sweep's 12
    # settings, then its 3 fastest read twice more, in turn
    assert len(record.read_ceiling) == 12 + 3 * 2 and all(p.bytes > 0 for p in record.read_ceiling)
    sweep, again = record.read_ceiling[:12], record.read_ceiling[12:]
    fastest = [(p.threads, p.request_bytes) for p in sorted(sweep, key=lambda p: -p.bytes_per_s)[:3]]
    assert [(p.threads, p.request_bytes) for p in again] == fastest * 2
    # the engines are files on the host: the disk read and written at once after the last round too, leaving nothing
    assert len(record.shared_disk) == SHARED_DISK_TIMES
    for shared in record.shared_disk:
        assert shared.bytes == record.checkpoint.bytes and shared.file_bytes == record.largest_engine_bytes
        assert min(shared.read_s, shared.write_s, shared.both_s) > 0
    assert not list((out.parent.parent / "engines").glob("shared-disk-*"))
    for disk in record.disk_reads:
        assert disk.bytes == record.checkpoint.bytes
        # the stored rate is the stored bytes over the stored time (a time rounded apart once disagreed by 1%)
        assert disk.bytes_per_s == pytest.approx(disk.bytes / disk.seconds, rel=1e-9)
        assert disk.resident_at_start_bytes <= MIB


def test_repeats_keep_every_run_and_show_the_median_one(repeated: tuple[RunRecord, Path]) -> None:
    record, out = repeated
    assert record.repeats == 2
    for name, entry in record.strategies.items():
        assert [r.repeat for r in entry.repeats] == [0, 1]
        assert entry.repeat in (0, 1)
        walls = sorted(r.wall_s for r in entry.repeats if r.wall_s is not None)
        assert entry.wall_s == walls[0]  # the lower middle of two
        # the representative's files are at the top; each round keeps its events and record
        top = json.loads((out / f"strategy-{name}.json").read_text())["record"]
        assert top["wall_s"] == entry.wall_s
        for r in (0, 1):
            assert (out / f"repeat-{r}" / f"events-{name}.csv").exists()
            assert (out / f"repeat-{r}" / f"strategy-{name}.json").exists()
            assert not (out / f"repeat-{r}" / f"samples-{name}.csv").exists()
        assert (out / f"samples-{name}.csv").exists()
    assert json.loads((out / "summary.json").read_text()) == record.to_json()


def test_engine_builds_are_split_into_pages_and_copy(repeated: tuple[RunRecord, Path]) -> None:
    record, _ = repeated
    for entry in record.strategies.values():
        for e in entry.engines:
            assert e.pages_s is not None and e.copy_s is not None and e.major_faults is not None
            assert e.start_s is not None and e.end_s is not None
            assert 0 < e.pages_s + e.copy_s <= e.end_s - e.start_s


def test_the_report_shows_the_disk_row_runs_and_engine_times(repeated: tuple[RunRecord, Path]) -> None:
    record, out = repeated
    text = (out.parent / "speedy.md").read_text()
    assert "| disk: cold sequential read() of the checkpoint, this run |" in text
    assert "- **disk ceiling**: a cold read sweep over reader threads × `pread` size, its 3 fastest settings read 2 " \
        "times more" in text
    # the ceiling says how much each point read and how long it took, so a reader can judge one sample's weight
    read = [p for p in record.read_ceiling if p.bytes > 0]
    fastest, slowest = f"{min(p.seconds for p in read):.2f}", f"{max(p.seconds for p in read):.2f}"
    took = fastest if fastest == slowest else f"{fastest}–{slowest}"
    least, most = format_bytes(min(p.bytes for p in read)), format_bytes(max(p.bytes for p in read))
    amount = least if least == most else f"{least}–{most}"
    assert f"each read took {amount} of the checkpoint, a part no other read took, in {took} s); the best " \
        "setting by the median of its reads is " in text
    assert f"- **disk shared by reads and engine writes** (measured {SHARED_DISK_TIMES} times after the last round)" \
        in text
    assert "the model's read time at the ceiling" in text
    assert "each strategy run 2 times" in text
    row = next(line for line in text.splitlines() if line.startswith("| map |"))
    assert "| madvise |" in row and "| 2: " in row
    assert "bringing weights' pages in" in text
    readers = record.reading.prefetch_readers if record.reading else 1
    calls = "s of the thread's calls" if readers == 1 else f"s of calls summed over its {readers} readers"
    assert "prefetch `madvise` one engine ahead" in text and calls in text
    assert (out.parent / "speedy.engine-times.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = load_results(out)
    assert results.disk is not None and results.disk.reads == 2


# --------------------------------------------------------------------------- pieces


def _record(repeat: int, wall: float | None, status: str = "ok") -> StrategyRecord:
    return StrategyRecord(status=status, wall_s=wall, repeat=repeat)


def test_the_representative_is_the_median_finished_run() -> None:
    runs = [_record(0, 30.0), _record(1, 10.0), _record(2, 20.0)]
    assert representative(runs).repeat == 2
    runs = [_record(0, 5.0, "failed"), _record(1, 40.0), _record(2, 10.0), _record(3, 30.0)]
    assert representative(runs).repeat == 3  # median of 10, 30, 40; the failed run does not count
    assert representative([_record(0, None, "failed"), _record(1, None, "failed")]).repeat == 1


def test_wall_spread_and_disk_medians(tmp_path: Path) -> None:
    runs = [_record(0, 30.0), _record(1, 27.0), _record(2, 36.0)]
    combined = combine_repeats(runs)
    assert combined.repeat == 0
    run = load_results(make_results(tmp_path)).record  # a small run to derive metrics against
    metrics = StrategyMetrics.of("map", combined, run)
    assert (metrics.runs, metrics.wall_median_s, metrics.wall_min_s, metrics.wall_max_s) == (3, 30.0, 27.0, 36.0)
    assert metrics.wall_spread == pytest.approx(0.2)
    reads = [DiskRead(i, 1000, s, 1000 / s, 0.5, "read()", 0) for i, s in enumerate((1.0, 4.0, 2.0))]
    disk = disk_metrics(reads)
    assert disk is not None
    assert (disk.reads, disk.median_seconds, disk.median_bytes_per_s) == (3, 2.0, 500.0)
    assert disk.read_s(2000) == pytest.approx(4.0)
    assert disk_metrics([]) is None


def test_fault_in_reads_only_the_tensors_own_pages(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    module = torch.nn.Module()
    module.register_buffer("big", torch.ones(64 * MIB // 4))
    save_weights_for_mapping(module, path)
    meta = torch.nn.Module()
    meta.register_buffer("big", torch.empty(64 * MIB // 4, device="meta"))
    map_weights(meta, path, strict=True).close()
    before = read_status().file_bytes
    big = meta.get_buffer("big")
    piece = big[: 8 * MIB // 4]  # an eighth of the storage
    pages = fault_in([piece])
    grown = read_status().file_bytes - before
    assert pages >= 8 * MIB // mmap.PAGESIZE
    assert 7 * MIB <= grown <= 12 * MIB, grown / MIB  # the slice's pages (and fault-around), not the storage's


def test_the_copy_backend_times_both_parts(tmp_path: Path) -> None:
    backend = CopyToFiles(tmp_path / "engines")
    split = measured(backend.build_engine(0, {"w": torch.ones(1024)}).columns)
    assert set(split) == {"pages_s", "copy_s"}  # no other column of the engine's record
    assert split["pages_s"] >= 0 and split["copy_s"] > 0
    backend.close()


def test_map_keep_cache_is_map_without_drop_cache(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, drop_cache=True)
    scenario = Scenario(name=scenario.name, strategies=("map", "map_keep_cache"), model=scenario.model,
                        checkpoint=scenario.checkpoint, build=scenario.build, run=scenario.run)
    record = run_scenario(scenario, results=tmp_path / "results", workdir=tmp_path / "engines")
    dropped, kept = record.strategies["map"], record.strategies["map_keep_cache"]
    assert dropped.ok and kept.ok, (dropped.error, kept.error)
    assert (dropped.drop_cache, kept.drop_cache) == (True, False)
    assert dropped.prefetch == kept.prefetch == "madvise"  # prefetch still follows the scenario
    assert dropped.released_bytes == kept.released_bytes == record.model.bytes


def test_warmup_rounds_run_first_and_leave_nothing(tmp_path: Path) -> None:
    assert load_scenario(_toml(tmp_path, "")).run.warmup == 0
    assert load_scenario(_toml(tmp_path, "warmup = 1")).run.warmup == 1
    with pytest.raises(ScenarioError, match=r"run\.warmup: expected an integer >= 0"):
        load_scenario(_toml(tmp_path, "warmup = -1"))
    scenario = _scenario(tmp_path, warmup=1)
    assert make_plan(scenario, name="p", workdir=tmp_path).scenario.run.warmup == 1
    seen: list[str] = []

    def counting(plan_path: Path, strategy: str, out: Path) -> list[str]:
        seen.append(out.name)
        from harness.worker import worker_command
        return worker_command(plan_path, strategy, out)

    record = run_scenario(scenario, results=tmp_path / "results", workdir=tmp_path / "engines", command=counting,
                          render=render_staged)
    assert seen == ["warmup-0", "warmup-0", ".speedy.partial", ".speedy.partial"]  # warm-ups first, then the runs
    assert len(record.disk_reads) == 1  # the warm-up's disk read is not recorded
    out = tmp_path / "results" / "speedy"
    assert not list(out.glob("warmup-*"))
    assert all(entry.ok for entry in record.strategies.values())
    assert "after 1 warm-up round" in (tmp_path / "results" / "speedy.md").read_text()


def _warm_ups_faked(names: list[str], failing: str = "", interrupting: str = "",
                    seen: list[Path] | None = None) -> Supervisor:
    """A supervisor that notes each worker's name, runs measured workers here, and ends warm-up workers at once:
    ``failing``'s with status 1, ``interrupting``'s with SIGINT on its way up (the files of the rounds so far in
    ``seen``)."""

    def supervise(plan: Plan, command: Sequence[str], files: Path, name: str) -> Outcome:
        names.append(name)
        if "-w" not in name:
            return watch_here(plan, command, files, name)
        if name == interrupting:
            assert seen is not None
            seen.extend(sorted(Path(command[-1]).parent.glob("warmup-*")))  # the worker's out directory
            raise stopping.Interrupted(signal.SIGINT, "the running strategy's process was stopped")
        return Outcome(returncode=1 if name == failing else 0, reason=None, peak_rss_bytes=0)

    return supervise


def test_warm_up_rounds_say_what_they_ran_in_the_scenarios_order_and_keep_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    names: list[str] = []
    scenario = _scenario(tmp_path, warmup=2)
    record = run_scenario(scenario, results=tmp_path / "results", workdir=tmp_path / "engines",
                          supervisor=_warm_ups_faked(names, failing="speedy-w1-map"))
    warm_ups = [f"speedy-w{w}-{s}" for w in range(2) for s in scenario.strategies]
    assert names == [*warm_ups, *(f"speedy-r0-{s}" for s in record.round_orders[0])]
    lines = [line.removeprefix("[harness] ") for line in capsys.readouterr().err.splitlines()]
    said = [line.split(" — ")[0] for line in lines if "warm-up" in line]
    assert said == [
        said[0], "run 1 of 6: map, warm-up 1 of 2", "warm-up round 1/2 (discarded): map ran",
        "run 2 of 6: map_no_prefetch, warm-up 1 of 2", "warm-up round 1/2 (discarded): map_no_prefetch ran",
        said[5], "run 3 of 6: map, warm-up 2 of 2", "warm-up round 2/2 (discarded): map failed",
        "run 4 of 6: map_no_prefetch, warm-up 2 of 2", "warm-up round 2/2 (discarded): map_no_prefetch ran"]
    assert said[0].startswith("warm-up round 1/2 (discarded): disk: cold sequential read of ")
    assert said[5].startswith("warm-up round 2/2 (discarded): disk: cold sequential read of ")
    assert [d.before for d in record.disk_reads] == [0]  # the warm-ups' reads are not recorded
    assert all(entry.ok and entry.repeat == 0 for entry in record.strategies.values())  # nor their failure
    assert not list((tmp_path / "results" / "speedy").glob("warmup-*"))


def test_an_interrupt_in_a_warm_up_round_names_the_strategy_and_the_round(tmp_path: Path) -> None:
    names: list[str] = []
    seen: list[Path] = []
    supervisor = _warm_ups_faked(names, interrupting="speedy-w1-map_no_prefetch", seen=seen)
    with pytest.raises(stopping.RunInterrupted, match=re.escape(
            "interrupted by SIGINT; the running strategy's process was stopped "
            "(map_no_prefetch, warm-up round 2/2 (discarded)); ")):
        run_scenario(_scenario(tmp_path, warmup=2), results=tmp_path / "results", workdir=tmp_path / "engines",
                     supervisor=supervisor)
    assert names == ["speedy-w0-map", "speedy-w0-map_no_prefetch", "speedy-w1-map", "speedy-w1-map_no_prefetch"]
    assert [path.name for path in seen] == ["warmup-1"]  # the round that ended is gone when the next runs
    assert not seen[0].exists()
    assert not (tmp_path / "results" / "speedy").exists()


def test_each_round_runs_the_strategies_in_its_recorded_order(tmp_path: Path) -> None:
    ran: list[tuple[str, str]] = []

    def counting(plan_path: Path, strategy: str, out: Path) -> list[str]:
        ran.append((out.name, strategy))
        from harness.worker import worker_command
        return worker_command(plan_path, strategy, out)

    record = run_scenario(_scenario(tmp_path, repeats=2), results=tmp_path / "results",
                          workdir=tmp_path / "engines", command=counting, render=render_staged)
    assert record.round_orders == (("map", "map_no_prefetch"), ("map_no_prefetch", "map"))
    assert ran == [("repeat-0", "map"), ("repeat-0", "map_no_prefetch"),
                   ("repeat-1", "map_no_prefetch"), ("repeat-1", "map")]
    assert list(record.strategies) == ["map", "map_no_prefetch"], "the record keeps the scenario's order"
    assert load_results(tmp_path / "results" / "speedy").record.round_orders == record.round_orders
