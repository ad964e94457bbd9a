"""Tests of the disk read and written at once (harness.measure.shared_disk), the build limit it enters
(harness.results.metrics.build_limit) and the report lines that show both."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.catalog import writes_weights_to_files
from harness.measure.residency import FileResidency
from harness.measure.shared_disk import shared_disk
from harness.report.markdown import limit_observation, shared_disk_observation
from harness.results.disk import CeilingPoint, SharedDisk
from harness.results.metrics import build_limit
from harness.results.reading import Results, load_results
from harness.tests.fixtures import make_results
from harness.tests.test_coldcache import synced_files
from harness.units import MIB

SIZE = 6 * MIB + 4321  # not a multiple of a written file or of a page


@pytest.fixture
def checkpoint(tmp_path: Path) -> list[Path]:
    return synced_files(tmp_path, ["a.safetensors", "b.safetensors"], SIZE)


def test_it_reads_every_file_writes_as_many_bytes_and_leaves_nothing_behind(tmp_path: Path,
                                                                           checkpoint: list[Path]) -> None:
    engines = tmp_path / "engines"
    shared = shared_disk(checkpoint, engines, 4 * MIB, chunk=MIB)
    assert (shared.bytes, shared.file_bytes) == (2 * SIZE, 4 * MIB)
    assert shared.read_s > 0 and shared.write_s > 0 and shared.both_s > 0
    assert list(engines.iterdir()) == []  # every written file removed, the directory made
    with FileResidency(checkpoint) as residency:
        assert residency.resident_bytes() <= 2 * 4096 * len(checkpoint)  # read cold and dropped behind the reader


def test_bad_settings_and_an_unwritable_directory_are_refused(tmp_path: Path, checkpoint: list[Path]) -> None:
    with pytest.raises(ValueError, match="checkpoint's files"):
        shared_disk([], tmp_path, MIB)
    with pytest.raises(ValueError, match="at least 1"):
        shared_disk(checkpoint, tmp_path, 0)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OSError, match=f"{blocker / 'engines'}: reading the checkpoint while writing"):
        shared_disk(checkpoint, blocker / "engines", MIB)


def test_overlap_runs_from_side_by_side_to_one_at_a_time() -> None:
    assert SharedDisk(10, 1, read_s=2.0, write_s=4.0, both_s=4.0).overlap == 1.0
    one_by_one = SharedDisk(10, 1, read_s=2.0, write_s=4.0, both_s=6.0)
    assert one_by_one.overlap == one_by_one.one_at_a_time == 1.5
    assert SharedDisk(0, 1, 0.0, 0.0, 0.0).overlap is None


def test_engines_are_written_as_files_on_the_host_and_where_they_hold_their_weights() -> None:
    assert writes_weights_to_files(on_gpu=False, compiler_weights=None)  # copy: engine files
    assert not writes_weights_to_files(on_gpu=True, compiler_weights=None)  # copy: device buffers
    assert writes_weights_to_files(on_gpu=True, compiler_weights="packaged")
    assert writes_weights_to_files(on_gpu=False, compiler_weights="packaged_compiler")
    assert not writes_weights_to_files(on_gpu=False, compiler_weights="mapped")


# --------------------------------------------------------------------------- the limit and the report


def test_the_limit_is_the_largest_of_ceiling_engines_and_shared_disk(tmp_path: Path) -> None:
    results = load_results(make_results(tmp_path / "results", failed=None))
    model = results.record.model.bytes
    load_build = results.metrics["load"].build_median_s
    assert load_build is not None
    assert build_limit(results.record, results.metrics) is None  # no ceiling swept: no limit
    slow = CeilingPoint(1, MIB, model, 10 * load_build)  # the model read at the ceiling takes 10 load builds
    limit = build_limit(results.record.replace(read_ceiling=(slow,)), results.metrics)
    assert limit is not None and limit.seconds == pytest.approx(10 * load_build)
    assert limit.bound_by == "the model's read time at the disk's ceiling"
    fast = CeilingPoint(1, MIB, model, load_build / 10)
    limit = build_limit(results.record.replace(read_ceiling=(fast,)), results.metrics)
    assert limit is not None and limit.seconds == load_build and limit.bound_by.startswith("load's build phase")
    # the shared disk is measured on the checkpoint's bytes and scaled to the model's; its median over the times
    shared = tuple(SharedDisk(2 * model, MIB, 1.0, 1.0, both_s=both * load_build) for both in (6, 100, 2))
    limit = build_limit(results.record.replace(read_ceiling=(fast,), shared_disk=shared), results.metrics)
    assert limit is not None and limit.seconds == pytest.approx(3 * load_build)
    assert limit.bound_by == "the model read while as many bytes are written as engine files, median"
    without_load = {n: m for n, m in results.metrics.items() if n != "load"}
    assert build_limit(results.record.replace(read_ceiling=(fast,)), without_load) is None
    # engines compiled to run on the mapped weights in place: no build reads them, so no limit applies
    in_place = {n: r.replace(compiler="inductor", compiler_weights="mapped") for n, r in results.strategies.items()}
    assert build_limit(results.record.replace(read_ceiling=(fast,), strategies=in_place), results.metrics) is None


def _with_shared(results: Results, shared: tuple[SharedDisk, ...]) -> Results:
    return dataclasses.replace(results, record=results.record.replace(shared_disk=shared))


def test_the_report_sets_map_against_the_limit_and_shows_the_shared_disk(tmp_path: Path) -> None:
    results = load_results(make_results(tmp_path / "results", failed=None))
    assert shared_disk_observation(results) == [] and limit_observation(results) == []
    model = results.record.model.bytes
    results.record = results.record.replace(read_ceiling=(CeilingPoint(1, MIB, model, 1.0),),
                                            shared_disk=(SharedDisk(model, MIB, 2.0, 4.0, 5.0),))
    (shared,) = shared_disk_observation(results)
    assert "(measured once after the last round)" in shared and "read cold alone, 2.0 s (one run)" in shared
    assert "alone as 0.00 GiB files" in shared and ", 4.0 s (one run);" in shared
    assert "together, 5.0 s (one run): 1.25 × the longer alone" in shared and "1.50 one at a time" in shared
    times = tuple(SharedDisk(model, MIB, 2.0, 4.0, both) for both in (5.0, 4.0, 6.0))
    (shared,) = shared_disk_observation(_with_shared(results, times))
    assert "(measured 3 times after the last round)" in shared and "median 5.0 s (4.0–6.0 s over 3 times)" in shared
    assert "1.25 (1.00–1.50) × the longer alone" in shared
    limit = build_limit(results.record, results.metrics)
    assert limit is not None
    head, *rows = limit_observation(results)
    assert head.startswith(f"- **build phase against its limit**: {limit.seconds:.1f} s, the largest of")
    assert [r.split(":")[0] for r in rows] == ["  - map"]  # map and its variants only, not its peers
    build = results.metrics["map"].build_median_s
    assert build is not None and f"= {build / limit.seconds:.2f} × the limit" in rows[0]
