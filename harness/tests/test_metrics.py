"""The derived figures: each defined once in harness.results.metrics, and adding up."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from harness.report.text import phases_text, release_sentence
from harness.results.metrics import (
    SampleColumns,
    StrategyMetrics,
    baseline_anon_bytes,
    compiler_gpu_own_bytes,
    engine_gpu_peaks,
    floor_bytes,
    sampled_peaks,
)
from harness.results.reading import load_results
from harness.results.record import EngineRecord, Phases, RunRecord, StrategyRecord
from harness.tests.fixtures import make_results
from harness.units import GIB, MIB


def _engines(*sizes: int) -> tuple[EngineRecord, ...]:
    return tuple(EngineRecord(index=i, weight_bytes=s, start_s=None, end_s=None, host_hwm_bytes=None,
                              released_bytes=None, rss_after_bytes=None, gpu_used_bytes=None)
                 for i, s in enumerate(sizes))


def test_engines_built_with_no_weight_resident_have_the_baseline_as_their_floor() -> None:
    engines = _engines(3 * GIB, 5 * GIB, 2 * GIB)
    assert floor_bytes(GIB, engines, on_gpu=False, compiler_weights="mapped") == GIB
    # weights streamed into the artifact a chunk at a time: none need stay resident
    assert floor_bytes(GIB, engines, on_gpu=False, compiler_weights="packaged") == GIB
    # the compiler's own packaging holds a copy of the engine's weights while it writes it
    assert floor_bytes(GIB, engines, on_gpu=False, compiler_weights="packaged_compiler") == 6 * GIB
    assert floor_bytes(GIB, engines, on_gpu=False) == 6 * GIB  # a copy per engine: baseline + largest
    # on a GPU the mapped engines' device copies accumulate, as before; packaged ones leave it once written
    assert floor_bytes(GIB, engines, on_gpu=True, compiler_weights="mapped") == GIB + 8 * GIB + 5 * GIB
    assert floor_bytes(GIB, engines, on_gpu=True, compiler_weights="packaged") == GIB + 2 * 5 * GIB


def test_the_baseline_anonymous_memory_is_the_last_sample_before_the_load() -> None:
    samples = SampleColumns(t_s=np.array([0.0, 0.1, 0.2, 0.3]), rss_bytes=np.full(4, np.nan),
                            anon_bytes=np.array([10.0, 20.0, 500.0, 900.0]), gpu_used_bytes=np.full(4, np.nan))
    assert baseline_anon_bytes(samples, Phases(load_start_s=0.15)) == 20
    assert baseline_anon_bytes(samples, Phases(load_start_s=None)) == 10
    empty = SampleColumns(t_s=np.array([0.0]), rss_bytes=np.array([np.nan]), anon_bytes=np.array([np.nan]),
                          gpu_used_bytes=np.array([np.nan]))
    assert baseline_anon_bytes(empty, Phases(load_start_s=0.0)) is None


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RunRecord:
    return load_results(make_results(tmp_path_factory.mktemp("run"))).record


def _metrics(run: RunRecord, record: StrategyRecord, samples: SampleColumns | None = None) -> StrategyMetrics:
    return StrategyMetrics.of("map", record, run, samples)


def test_the_wall_is_the_sum_of_its_phases_and_the_check_lies_outside_it(run: RunRecord) -> None:
    phases = Phases(load_start_s=1.0, load_end_s=3.0, export_start_s=3.5, export_end_s=8.0, partition_s=8.25,
                    build_end_s=20.0, check_start_s=20.5, check_end_s=26.0)
    m = _metrics(run, StrategyRecord(status="ok", phases=phases, wall_s=19.0))
    assert (m.load_s, m.export_s, m.build_s, m.check_s) == (2.0, 4.5, 11.75, 5.5)
    parts = (m.load_s, m.export_s, m.build_s, m.between_s)
    assert all(p is not None for p in parts) and sum(p or 0.0 for p in parts) == pytest.approx(19.0)
    text = phases_text(m)
    assert text.startswith("load 2.0 s + export 4.5 s + build 11.8 s + 0.8 s between them")
    assert "check against eager 5.5 s, outside the wall" in text


def test_the_phase_spans_are_the_record_s_own_and_none_where_a_phase_was_not_reached() -> None:
    phases = Phases(load_start_s=1.0, load_end_s=3.0, export_start_s=3.5, export_end_s=8.0, partition_s=8.25,
                    build_end_s=20.0, check_start_s=20.5, check_end_s=26.0)
    assert (phases.load_s, phases.export_s, phases.build_s, phases.check_s, phases.wall_s) == (
        2.0, 4.5, 11.75, 5.5, 19.0)
    unfinished = Phases(load_start_s=1.0, load_end_s=3.0, partition_s=8.25)
    assert (unfinished.load_s, unfinished.export_s, unfinished.build_s, unfinished.check_s,
            unfinished.wall_s) == (2.0, None, None, None, None)
    samples = SampleColumns(t_s=np.array([0.0]), rss_bytes=np.array([1.0]), anon_bytes=np.array([1.0]),
                            gpu_used_bytes=np.array([np.nan]))
    walls = [sampled_peaks(StrategyRecord(status="ok", phases=p), samples)["wall_s"] for p in (phases, unfinished)]
    assert walls == [19.0, None]  # the stored wall is the phases' own, to the millisecond


def test_the_engines_page_and_copy_times_are_read_from_the_record_in_build_order(run: RunRecord) -> None:
    engines = tuple(dataclasses.replace(e, pages_s=p, copy_s=c)
                    for e, p, c in zip(_engines(GIB, GIB, GIB), (0.5, 0.25, None), (1.0, 2.0, None), strict=True))
    m = _metrics(run, StrategyRecord(status="ok", engines=engines[::-1]))
    assert (m.engine_pages_s, m.engine_copy_s, m.pages_s, m.copy_s) == (
        ((0, 0.5), (1, 0.25)), ((0, 1.0), (1, 2.0)), 0.75, 3.0)
    # measured values are the record's, never a copy of them: the metrics of another record read that one's
    other = dataclasses.replace(m, record=StrategyRecord(status="ok", engines=engines[2:]))
    assert (other.engine_pages_s, other.pages_s, other.copy_s) == ((), None, None)


def test_anonymous_memory_is_reported_above_the_baseline(run: RunRecord) -> None:
    samples = SampleColumns(t_s=np.array([0.0, 2.0]), rss_bytes=np.full(2, np.nan),
                            anon_bytes=np.array([200.0, 900.0]), gpu_used_bytes=np.full(2, np.nan))
    m = _metrics(run, StrategyRecord(status="ok", anon_peak_bytes=1000, phases=Phases(load_start_s=1.0)), samples)
    assert m.anon_above_baseline_bytes == 800
    assert _metrics(run, StrategyRecord(status="ok", anon_peak_bytes=1000)).anon_above_baseline_bytes is None


def test_released_counts_each_weight_once_and_names_what_was_kept(run: RunRecord) -> None:
    model, buffers = run.model.bytes, run.model.bytes_with_non_persistent_buffers - run.model.bytes
    everything = _metrics(run, StrategyRecord(status="ok", released_bytes=model, unreleased_bytes=buffers))
    text = release_sentence(everything, run.model.bytes_with_non_persistent_buffers)
    assert text is not None and text.startswith("released every weight of the checkpoint")
    assert buffers and "kept 4.0 KiB: non-persistent buffers" in text
    nothing = _metrics(run, StrategyRecord(status="ok", released_bytes=0, unreleased_bytes=model,
                                           release_note="nothing could be released."))
    kept = f"{model / GIB:.2f}" if model >= GIB else f"{model / GIB:.3f}"
    assert release_sentence(nothing, model) == (
        f"released no weight of the checkpoint ({kept} GiB kept): nothing could be released")
    unread = _metrics(run, StrategyRecord(status="ok", released_bytes=0, unreleased_bytes=model // 4,
                                          release_note="kept."))
    assert (release_sentence(unread, model) or "").endswith(
        "of the checkpoint belongs to no engine (weights the built model never reads), neither released nor kept "
        "by the plan")
    part = _metrics(run, StrategyRecord(status="ok", released_bytes=model // 2,
                                        unreleased_bytes=model - model // 2, release_note="some could not."))
    assert "(50.0% of the model)" in (release_sentence(part, model) or "")


def _engine(**gpu: int | None) -> EngineRecord:
    return EngineRecord(index=0, weight_bytes=GIB, start_s=0.0, end_s=1.0, host_hwm_bytes=None, released_bytes=None,
                        rss_after_bytes=None, gpu_used_bytes=None, **gpu)


def test_the_compiler_s_own_gpu_memory_is_its_peak_less_its_weights_and_what_earlier_engines_left() -> None:
    engine = _engine(gpu_start_bytes=300 * MIB, gpu_peak_bytes=3000 * MIB, gpu_weights_bytes=1024 * MIB)
    assert compiler_gpu_own_bytes(engine) == (3000 - 1024 - 300) * MIB
    for missing in ("gpu_start_bytes", "gpu_peak_bytes", "gpu_weights_bytes"):  # the CPU, or an older layout
        assert compiler_gpu_own_bytes(dataclasses.replace(engine, **{missing: None})) is None  # type: ignore[arg-type]


def test_an_engine_s_gpu_peak_is_the_largest_sample_labelled_with_it_or_its_start() -> None:
    engines = (_engine(gpu_start_bytes=50), dataclasses.replace(_engine(gpu_start_bytes=900), index=1),
               dataclasses.replace(_engine(), index=2))
    labels = np.asarray([-1, 0, 0, -1, 1, 1, 2])
    used = np.asarray([5000.0, 100.0, 700.0, 9000.0, 800.0, np.nan, np.nan])
    peaks = engine_gpu_peaks(engines, labels, used)
    assert [e.gpu_peak_bytes for e in peaks] == [700, 900, None]  # engine 2: no GPU figure at all
    assert peaks[2] is engines[2]
    no_gpu = np.full(labels.shape, np.nan)  # the CPU: nothing changes
    assert engine_gpu_peaks((_engine(),), labels, no_gpu) == (_engine(),)
