"""The prefetch and drop-cache settings chosen per run: the read probe and the rules that read it."""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path

import pytest

from harness.checkpoint_reading import WILLNEED_FLOOR, choose_reading, decide
from harness.measure.hostmemory import free_page_reporting
from harness.measure.probe import probe_bytes, read_probe
from harness.measure.residency import file_page_counts
from harness.report.markdown import render_report
from harness.results.disk import ReadProbe
from harness.results.reading import load_results
from harness.scenario import RunConfig
from harness.tests.fixtures import make_results
from harness.units import GIB, MIB

PAGE = mmap.ALLOCATIONGRANULARITY
def _probe(kept: float = 1.0, dropped: float = 1.0, faulted: float = 1.0, willneed: float = 1.0) -> ReadProbe:
    """A probe whose regions (1 MiB each) took these seconds each way."""
    return ReadProbe(cache_region_bytes=MIB, kept_s=(0.01, 0.01, kept, kept, kept), dropped_s=(dropped,) * 5,
                     advice_region_bytes=MIB, faulted_s=(faulted,) * 3, willneed_s=(willneed,) * 3)


BALLOON = "/sys/bus/virtio/devices/virtio0"


def test_drop_cache_is_chosen_where_the_kernel_reports_free_pages_to_a_host() -> None:
    on = decide(RunConfig(), _probe(), checkpoint_bytes=GIB, available=16 * GIB, reporting=BALLOON)
    assert on.drop_cache is True and BALLOON in on.drop_cache_why and "free page reporting" in on.drop_cache_why
    off = decide(RunConfig(), _probe(), checkpoint_bytes=GIB, available=16 * GIB, reporting=None)
    assert off.drop_cache is False and "reports no free pages" in off.drop_cache_why
    # the read probe's kept and dropped reads decide nothing (on both machines they read alike)
    slow_kept = decide(RunConfig(), _probe(kept=3.0, dropped=1.0), GIB, 16 * GIB, reporting=None)
    assert slow_kept.drop_cache is False


def _virtio(root: Path, name: str, device: str, features: str) -> None:
    entry = root / name
    entry.mkdir(parents=True)
    (entry / "device").write_text(device + "\n")
    (entry / "features").write_text(features + "\n")


def test_free_page_reporting_is_read_from_the_balloons_negotiated_features(tmp_path: Path) -> None:
    reporting = "0110010100000000"  # bit 5 set: VIRTIO_BALLOON_F_REPORTING
    _virtio(tmp_path, "virtio0", "0x0002", reporting)  # a block device: bit 5 means something else there
    _virtio(tmp_path, "virtio1", "zz", reporting)  # an id that is not hex is skipped
    assert free_page_reporting(tmp_path) is None
    _virtio(tmp_path, "virtio2", "0x0005", "0110000100000000")  # a balloon without reporting
    assert free_page_reporting(tmp_path) is None
    _virtio(tmp_path, "virtio3", "0x0005", reporting)
    assert free_page_reporting(tmp_path) == str(tmp_path / "virtio3")
    assert free_page_reporting(tmp_path / "absent") is None  # no virtio bus: not a virtual machine


def test_drop_cache_is_chosen_when_the_checkpoint_exceeds_available_memory() -> None:
    choice = decide(RunConfig(), _probe(), checkpoint_bytes=9 * GIB, available=8 * GIB)
    assert choice.drop_cache is True and "larger than the memory available" in choice.drop_cache_why


def test_prefetch_stays_on_unless_advice_reads_far_slower_than_faults() -> None:
    on = decide(RunConfig(), _probe(faulted=1.0, willneed=2.0), GIB, 16 * GIB)  # half the rate: overlap still pays
    assert on.prefetch == "madvise" and "0.50x" in on.prefetch_why
    off = decide(RunConfig(), _probe(faulted=1.0, willneed=1.01 / WILLNEED_FLOOR), GIB, 16 * GIB)
    assert off.prefetch is None and "chosen: off" in off.prefetch_why


def test_prefetch_is_off_where_no_engine_build_reads_the_weights(tmp_path: Path) -> None:
    choice = decide(RunConfig(), _probe(), GIB, 16 * GIB, reporting=BALLOON, builds_read_weights=False)
    assert choice.prefetch is None and "no build reads them" in choice.prefetch_why
    assert choice.drop_cache is True, "drop_cache is chosen as before"
    small = decide(RunConfig(), None, GIB, 16 * GIB, builds_read_weights=False)  # not probed: the same answer
    assert small.prefetch is None and "no build reads them" in small.prefetch_why
    forced = decide(RunConfig(prefetch="madvise"), _probe(), GIB, 16 * GIB, builds_read_weights=False)
    assert (forced.prefetch, forced.prefetch_why) == ("madvise", "set by the scenario")
    missing = tmp_path / "never-read.safetensors"  # nothing is left for the probe to decide
    missing.write_bytes(b"")
    chosen = choose_reading(RunConfig(drop_cache=True), [missing], builds_read_weights=False)
    assert chosen.probe is None and chosen.prefetch is None


def test_the_scenarios_settings_win_and_nothing_is_probed(tmp_path: Path) -> None:
    run = RunConfig(prefetch="fadvise", drop_cache=False)
    choice = decide(run, _probe(kept=3.0, willneed=100.0), GIB, GIB // 2)
    assert (choice.prefetch, choice.drop_cache) == ("fadvise", False)
    assert choice.prefetch_why == choice.drop_cache_why == "set by the scenario"
    missing = tmp_path / "never-read.safetensors"  # choose_reading would fail on it if it probed
    missing.write_bytes(b"")
    assert choose_reading(RunConfig(prefetch="off", drop_cache=True), [missing]).probe is None


def test_a_checkpoint_smaller_than_the_probe_is_not_probed(tmp_path: Path) -> None:
    path = tmp_path / "small.bin"
    path.write_bytes(b"\0" * (4 * MIB))
    assert read_probe([path]) is None  # under probe_bytes()
    choice = choose_reading(RunConfig(), [path])
    assert choice.probe is None and (choice.prefetch, choice.drop_cache) == ("madvise", False)
    assert f"{probe_bytes() / GIB:.1f} GiB" in choice.drop_cache_why


def test_the_probe_reads_each_region_once_and_leaves_nothing_cached(tmp_path: Path) -> None:
    cache_region, advice_region = 64 * PAGE, 32 * PAGE
    size = probe_bytes(cache_region, advice_region) + 2 * cache_region  # room for ten cache regions
    assert probe_bytes(cache_region, advice_region) == 8 * 64 * PAGE + 6 * 32 * PAGE
    path = tmp_path / "ckpt.bin"
    with path.open("wb") as f:
        f.write(os.urandom(size))
        os.fsync(f.fileno())  # clean pages: the probe can drop them
    small = tmp_path / "other.bin"
    small.write_bytes(b"\0" * PAGE)  # the largest file is probed
    probe = read_probe([small, path], cache_region_bytes=cache_region, advice_region_bytes=advice_region)
    assert probe is not None
    # every fourth cache region dropped behind the reader, the rest kept
    assert (len(probe.kept_s), len(probe.dropped_s), len(probe.faulted_s), len(probe.willneed_s)) == (8, 2, 3, 3)
    assert (probe.cache_region_bytes, probe.advice_region_bytes) == (cache_region, advice_region)
    assert all(t > 0 for t in probe.kept_s + probe.dropped_s + probe.faulted_s + probe.willneed_s)
    fd = os.open(path, os.O_RDONLY)
    try:
        counts = file_page_counts(fd)
    finally:
        os.close(fd)
    if counts is not None:
        assert counts.cached == 0  # the kept pages too, once the probe ended
    capped = read_probe([path], cache_bytes=9 * cache_region, cache_region_bytes=cache_region,
                        advice_region_bytes=advice_region)
    assert capped is not None and len(capped.kept_s) + len(capped.dropped_s) == 9
    assert read_probe([path], cache_region_bytes=2 * cache_region,
                      advice_region_bytes=advice_region) is None  # room for five regions: under eight


def test_bad_probe_sizes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="whole pages"):
        read_probe([tmp_path / "x"], cache_region_bytes=PAGE + 1)


def test_the_report_says_what_was_chosen_why_and_from_which_rates(tmp_path: Path) -> None:
    directory = make_results(tmp_path, failed=None)
    summary_path = directory / "summary.json"
    summary = json.loads(summary_path.read_text())
    assert "reading" not in summary or summary["reading"] is None  # a record without the choice renders without it
    assert "settings of the strategies that map" not in render_report(load_results(directory))
    choice = decide(RunConfig(prefetch="off"), _probe(kept=3.0, dropped=1.0), GIB, 16 * GIB, reporting=BALLOON)
    summary["reading"] = choice.to_json()
    summary_path.write_text(json.dumps(summary))
    report = render_report(load_results(directory))
    line = next(x for x in report.splitlines() if "settings of the strategies that map" in x)
    assert "prefetch off (set by the scenario)" in line and "drop_cache on (chosen: " in line
    probe_line = next(x for x in report.splitlines() if "read probe at the run's start" in x)
    assert "the last three's median 0" in probe_line and "dropped behind the reader (median 1)" in probe_line
