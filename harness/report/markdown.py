"""Markdown report of a results directory: context, the table, generated observations, and the notes.

Everything above the notes is generated from the record and :mod:`harness.results.metrics` on
every render, so it cannot go stale. Hand-written notes are kept in their own file,
``<name>.notes.md`` (:mod:`harness.report.notes`), and included under "Notes", with a
warning above them that lists the figures that changed since they were last checked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from harness.catalog import HEADLINE_STRATEGY, peers_of
from harness.fileio.atomic import FileBatch, write_atomic
from harness.fileio.codec import field_since
from harness.report.compiler import compiler_lines
from harness.report.notes import NEVER_CHECKED, Notes, check_notes, migrate_notes
from harness.report.prediction import finding_observations, prediction_detail, prediction_note
from harness.report.settings import settings_line
from harness.report.table import table_lines
from harness.report.text import (
    cell,
    format_seconds,
    gib_decimals,
    machine_text,
    phases_text,
    release_sentence,
    short_commit,
    status_text,
    versions_text,
)
from harness.results.metrics import (
    StrategyMetrics,
    best_ceiling,
    build_limit,
    ceiling_points_read,
    ceiling_settings,
    floor_formula,
)
from harness.results.reading import Results
from harness.results.record import CheckpointInfo, RunRecord, StrategyRecord
from harness.results.spread import median_spread, ratio_of_medians, strategy_rounds
from harness.units import MB, MIB, format_bytes, format_gib, format_mb_per_s

__all__ = ["render_report", "write_report"]


def checkpoint_clause(checkpoint: CheckpointInfo, decimals: int) -> str:
    """``; checkpoint in 3 files (4.00 GiB: bfloat16 3.50 GiB, float32 0.50 GiB)`` for a checkpoint held in
    several files; empty for one file (so reports of one-file checkpoints read as they always have)."""
    if not checkpoint.sharded:
        return ""
    dtypes = ", ".join(f"{dtype} {format_gib(n, decimals)}" for dtype, n in (checkpoint.dtype_bytes or {}).items())
    return f"; checkpoint in {checkpoint.files} files ({format_gib(checkpoint.bytes, decimals)}" + (
        f": {dtypes})" if dtypes else ")")


def context_paragraph(results: Results) -> str:
    """One paragraph on what was measured, where, and with what."""
    run = results.record
    model = run.model
    decimals = gib_decimals(model.bytes)
    about = [
        f"`{model.source}`" if model.source else None,
        f"{model.tensors} tensors" if model.tensors is not None else None,
        format_gib(model.bytes, decimals),
    ]
    text = f"Model **{model.name}** ({', '.join(a for a in about if a)})"
    if model.source_note:
        text += f", {model.source_note.rstrip('.')}"
    text += checkpoint_clause(run.checkpoint, decimals)
    machine = f"; machine: {machine_text(results)}"
    if run.machine.kernel:
        machine += f", kernel {run.machine.kernel}"
    engines = f"{run.engines} engines"
    if run.engine_cap_bytes:
        engines += f" (cap {format_gib(run.engine_cap_bytes, decimals)} each)"
    setup = [
        f"backend `{run.backend}`",
        f"device `{run.device}`",
        f"{run.cache} cache" if run.cache else None,
        engines,
        None if run.release is None else ("release on" if run.release else "release off"),
        f"sampled every {run.sample_interval_ms:g} ms" if run.sample_interval_ms else None,
        _prefetch_text(run.reading.prefetch if run.reading is not None else run.prefetch)
        if run.layout >= field_since(RunRecord, "prefetch") else None,
        _repeats_text(run),
        _warmup_text(run.warmup_rounds),
    ]
    text += machine + "; " + ", ".join(s for s in setup if s) + "."
    created = run.created or "at an unrecorded time"
    text += f" Commit {short_commit(run.commit)}, created {created}; {versions_text(results)}."
    return text


def _prefetch_text(prefetch: str | None) -> str:
    if prefetch is None:
        return "prefetch off"
    return f"prefetch `{prefetch}` one engine ahead for the strategies that map"


def _repeats_text(run: RunRecord) -> str | None:
    repeats = run.repeats
    if not repeats or repeats <= 1:
        return None
    which = ("times are the median run's (the figures show it)" if repeats % 2 else
             "times are the median of the runs, the mean of the middle two (the figures show the run the "
             "observations name)")
    order = ("in an order that changes from round to round (the round orders under the observations)"
             if run.order_changed else "in the same order every round")
    return (f"each strategy run {repeats} times, interleaved {order}, each run a fresh process on a {run.cache} "
            f"cache; {which}, with the range over the runs")


def round_order_observation(run: Results) -> list[str]:
    """The order the strategies ran in, round by round, where it changed from round to round."""
    if not run.record.order_changed:
        return []
    rounds = "; ".join(f"{i + 1}: {', '.join(order)}" for i, order in enumerate(run.record.round_orders))
    return [f"- **round orders** (each round after its cold read of the checkpoint; changed from round to round "
            f"so that no strategy always follows the same one, `harness/rounds.py`): {rounds}."]


def _warmup_text(rounds: int) -> str | None:
    if rounds < 1:
        return None
    return (f"after {rounds} warm-up round{'s' if rounds > 1 else ''} (each strategy once and the disk read, "
            f"discarded) that {'leave' if rounds > 1 else 'leaves'} the machine alike for every measured round")


def disk_observation(run: Results) -> list[str]:
    """The run's disk reads, and each finished strategy's build phase set against them; a read that failed, with
    its reason (none was taken after it)."""
    disk = run.disk
    failed = run.record.disk_read_error
    failure = [] if failed is None else [f"- **disk**: the cold sequential read of the checkpoint failed ({failed}); "
                                         f"{'none was' if disk is None else 'no more were'} taken after it."]
    rest = ceiling_observation(run) + shared_disk_observation(run) + limit_observation(run)
    if disk is None:
        return failure + rest if failure else []
    model = run.record.model.bytes
    read_s = disk.read_s(model)
    if disk.reads > 1:
        each = "one before each round of strategies" + (" until one failed" if failed else "")
        reads = (f"{disk.reads} cold sequential reads of the {format_gib(disk.bytes)} checkpoint (`read()` into a "
                 f"reused buffer, {each}): median {format_mb_per_s(disk.median_bytes_per_s)} "
                 f"({disk.min_bytes_per_s / MB:.0f}–{disk.max_bytes_per_s / MB:.0f}), "
                 f"{disk.median_cpu_seconds:.1f} CPU-s per read")
    else:  # one read: no median, no range
        before = "the first round" if failed else "the strategies ran"
        reads = (f"a cold sequential read of the {format_gib(disk.bytes)} checkpoint (`read()` into a reused "
                 f"buffer, before {before}): {format_mb_per_s(disk.median_bytes_per_s)}, "
                 f"{disk.median_cpu_seconds:.1f} CPU-s")
    text = f"- **disk**: {reads}; reading the model once at that rate takes {format_seconds(read_s)}."
    lines = [text, *failure]
    for s in run.metrics.values():
        rounds = strategy_rounds(s)
        if not s.record.ok or not rounds.build_s or not rounds.wall_s:
            continue
        lines.append(f"  - {s.name}: build phase {_times_of_read(rounds.build_s, read_s)}; "
                     f"wall {_times_of_read(rounds.wall_s, read_s)}.")
    return lines + rest


def ceiling_observation(run: Results) -> list[str]:
    """The disk's read ceiling (the best setting of the run's sweep, by the median of its reads where the sweep read
    its fastest settings again), and each finished strategy's build phase set against the model's read time at that
    rate."""
    points = run.record.read_ceiling
    best = best_ceiling(points)
    if run.record.read_ceiling_error is not None:
        return [f"- **disk ceiling**: not measured, the sweep failed ({run.record.read_ceiling_error})."]
    if best is None:
        return []
    model = run.record.model.bytes
    read_s = model / best.bytes_per_s
    settings = ceiling_settings(points)
    read = ceiling_points_read(points)
    amount = _extent([p.bytes for p in read], lambda b: format_bytes(int(b)))
    duration = _extent([p.seconds for p in read], lambda s: f"{s:.2f}")
    repeated = {k: v for k, v in settings.items() if len(v) > 1}
    if not repeated:  # a sweep without repeats: each setting read once
        sweep = ", ".join(f"{p.threads}×{p.request_bytes // MIB} MiB {p.bytes_per_s / MB:.0f}" for p in points)
        lines = [f"- **disk ceiling**: the best cold read of a sweep over reader threads × `pread` size (MB/s: "
                 f"{sweep}; each point read {amount} of the checkpoint, a part no other point read, in {duration} s) "
                 f"is {format_mb_per_s(best.bytes_per_s)} with {best.threads} reader(s) of "
                 f"{best.request_bytes // MIB} MiB; reading the model once at that rate takes "
                 f"{format_seconds(read_s)}."]
    else:
        sweep = ", ".join(f"{t}×{r // MIB} MiB " + " then ".join(f"{p.bytes_per_s / MB:.0f}" for p in reads)
                          for (t, r), reads in settings.items())
        again = max(len(v) for v in repeated.values()) - 1
        lines = [f"- **disk ceiling**: a cold read sweep over reader threads × `pread` size, its {len(repeated)} "
                 f"fastest settings read {again} time{'s' if again > 1 else ''} more "
                 f"(MB/s, a setting's reads in order: "
                 f"{sweep}; each read took {amount} of the checkpoint, a part no other read took, in {duration} s); "
                 f"the best setting by the median of its reads is {best.threads} reader(s) of "
                 f"{best.request_bytes // MIB} MiB at {format_mb_per_s(best.bytes_per_s)}; reading the model once at "
                 f"that rate takes {format_seconds(read_s)}."]
    for s in run.metrics.values():
        rounds = strategy_rounds(s)
        if s.record.ok and rounds.build_s:
            times = _times_of(rounds.build_s, read_s, "the model's read time at the ceiling")
            lines.append(f"  - {s.name}: build phase {times}.")
    return lines


def _extent(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """The smallest and largest of ``values`` formatted by ``fmt`` (``"0.38–0.53"``), or one of them where the
    two format the same (``"743.4 MiB"``)."""
    low, high = fmt(min(values)), fmt(max(values))
    return low if low == high else f"{low}–{high}"


def shared_disk_observation(run: Results) -> list[str]:
    """How the disk served the checkpoint's reads and engine-sized writes, alone and both at once, where the run
    measured it (its engines are written as files: after its last round)."""
    shared = [s for s in run.record.shared_disk if s.overlap is not None and s.one_at_a_time is not None]
    failed = run.record.shared_disk_error
    failure = [] if failed is None else [f"- **disk shared by reads and engine writes**: the measurement failed "
                                         f"({failed}); {len(shared) or 'no'} time{'s' if len(shared) != 1 else ''} "
                                         f"measured before it."]
    if not shared:
        return failure
    first = shared[0]
    times = f"{len(shared)} times" if len(shared) > 1 else "once"
    read, write, both = [s.read_s for s in shared], [s.write_s for s in shared], [s.both_s for s in shared]
    overlap = [s.overlap or 0.0 for s in shared]
    one_by_one = [s.one_at_a_time or 0.0 for s in shared]
    return [f"- **disk shared by reads and engine writes** (measured {times} after the last round): the "
            f"{format_gib(first.bytes)} checkpoint read cold alone, {spread_text(read, 'times')}; as many bytes "
            f"written alone as {format_gib(first.file_bytes)} files (each fsynced, dropped from the page cache and "
            f"removed), {spread_text(write, 'times')}; the two started together, {spread_text(both, 'times')}: "
            f"{_ratio_text(overlap)} × the longer alone, where 1 is reads and writes served side by side and "
            f"{_ratio_text(one_by_one)} one at a time."] + failure


def _ratio_text(values: Sequence[float]) -> str:
    """A ratio's median, with its interval over the rounds where there are several: ``1.32 (1.07–1.83)``."""
    spread = median_spread(values)
    if spread.low is None or spread.high is None:
        return f"{spread.median:.2f}"
    return f"{spread.median:.2f} ({spread.low:.2f}–{spread.high:.2f})"


def limit_observation(run: Results) -> list[str]:
    """``map``'s build phase (and its variants') against the limit the run measured (:func:`build_limit`)."""
    limit = build_limit(run.record, run.metrics)
    if limit is None:
        return []
    terms = "; ".join(f"{what}, {format_seconds(seconds)}" for what, seconds in limit.terms)
    lines = [f"- **build phase against its limit**: {format_seconds(limit.seconds)}, the largest of ({terms}): how "
             f"long a build that reads the checkpoint would take with reading and building overlapped as well as "
             f"these measurements allow. Each is measured apart from the builds, so a round can come in under it."]
    peers = set(peers_of(HEADLINE_STRATEGY, list(run.metrics)))
    for s in run.metrics.values():
        rounds = strategy_rounds(s)
        if s.name not in peers and s.record.ok and rounds.build_s:
            lines.append(f"  - {s.name}: build phase {_times_of(rounds.build_s, limit.seconds, 'the limit')}.")
    return lines


def reading_observation(run: Results) -> list[str]:
    """The prefetch and drop-cache settings of the strategies that map, why, and the read probe they came from."""
    choice = run.record.reading
    if choice is None:
        return []
    lines = [settings_line(choice)]
    probe = choice.probe
    if choice.probe_error is not None:
        lines.append(f"  - read probe at the run's start: failed ({choice.probe_error}).")
    if probe is not None:
        kept = ", ".join(f"{probe.cache_region_bytes / s / MB:.0f}" for s in probe.kept_s)
        lines.append(f"  - read probe at the run's start (cold regions of the checkpoint, each read once): "
                     f"{len(probe.kept_s)} of {probe.cache_region_bytes / MIB:.0f} MiB kept in the page cache "
                     f"(MB/s in order: {kept}; the last three's median {probe.kept_bytes_per_s / MB:.0f}), "
                     f"{len(probe.dropped_s)} dropped behind the reader (median "
                     f"{probe.dropped_bytes_per_s / MB:.0f}); {len(probe.faulted_s)} of "
                     f"{probe.advice_region_bytes / MIB:.0f} MiB faulted in (median "
                     f"{probe.faulted_bytes_per_s / MB:.0f}), {len(probe.willneed_s)} after MADV_WILLNEED "
                     f"(median {probe.willneed_bytes_per_s / MB:.0f}).")
    return lines


def spread_text(values: Sequence[float], over: str = "rounds") -> str:
    """``median 10.9 s (9.9–13.3 s over 3 rounds)``, or ``10.9 s (one run)``: a time with its spread (``over``
    names what the values are one each of)."""
    spread = median_spread(values)
    if spread.low is None or spread.high is None:
        return f"{format_seconds(spread.median)} (one run)"
    span = f" {spread.span(over)}" if spread.k == 1 else f", {spread.span(over)}"
    return f"median {format_seconds(spread.median)} ({spread.low:.1f}–{spread.high:.1f} s{span})"


def _times_of_read(values: Sequence[float], read_s: float) -> str:
    """A time's median and range, and the same as multiples of the model's read time."""
    return _times_of(values, read_s, "the model's read time")


def _times_of(values: Sequence[float], reference_s: float, what: str) -> str:
    """A time's median and range, and the same as multiples of ``reference_s`` (``what`` names it)."""
    spread = median_spread(values)
    ratio = f"{spread.median / reference_s:.2f} ×"
    if spread.low is not None and spread.high is not None:
        ratio += f" ({spread.low / reference_s:.2f}–{spread.high / reference_s:.2f} ×)"
    return f"{spread_text(values)} = {ratio} {what}"


def _wall_comparison(first: str, first_w: Sequence[float], second: str, second_w: Sequence[float]) -> str:
    """Whether ``first``'s median interval lies below ``second``'s (or the other way), or they overlap; where both
    intervals are the range, in words of rounds: every round of one beat every round of the other."""
    ratio = ratio_of_medians(first_w, second_w)
    if ratio is None or ratio.low is None or ratio.high is None:
        runs = "one run each" if len(first_w) == 1 and len(second_w) == 1 else "one run of one of them"
        return f"{runs}, so no interval; a rerun may order them differently."
    ranges = ratio.base.k == 1 and ratio.new.k == 1
    if ratio.outside_noise:
        if ratio.value < 1:  # the second was the faster: say it the same way round
            return _wall_comparison(second, second_w, first, first_w)
        clear = (f"every round of {first} was faster than every round of {second}" if ranges else
                 f"the interval of {first}'s median lies below {second}'s, beyond the noise")
        return f"{clear} ({second} took {ratio.value:.2f} × as long, {ratio.low:.2f}–{ratio.high:.2f} ×)."
    overlap = "their rounds overlap" if ranges else "the intervals of their medians overlap"
    return (f"{overlap} ({second} {ratio.value:.2f} × the time, {ratio.low:.2f}–"
            f"{ratio.high:.2f} ×), so a rerun may order them differently.")


def fastest_observation(run: Results) -> list[str]:
    """Which finished strategy has the lowest median wall, and whether its rounds beat the next one's all the way
    (the ranges do not overlap) or a rerun may order them differently; then the same for the headline strategy
    against the fastest of its peers (its own variants aside), where both finished."""
    walls = {s.name: strategy_rounds(s).wall_s for s in run.metrics.values() if s.record.ok}
    walls = {name: w for name, w in walls.items() if w}
    if len(walls) < 2:
        return []

    def median(name: str) -> float:
        return median_spread(walls[name]).median

    best, second = sorted(walls, key=median)[:2]
    lines = [f"- Lowest median wall: **{best}**, {spread_text(walls[best])}; next: {second}, "
             f"{spread_text(walls[second])}: {_wall_comparison(best, walls[best], second, walls[second])}"]
    peer = min(peers_of(HEADLINE_STRATEGY, list(walls)), key=median, default=None)
    if HEADLINE_STRATEGY in walls and peer is not None and {best, second} != {HEADLINE_STRATEGY, peer}:
        head = walls[HEADLINE_STRATEGY]
        lines.append(f"- **{HEADLINE_STRATEGY}** against the fastest other way of loading (its variants aside): "
                     f"{spread_text(head)}; {peer}, {spread_text(walls[peer])}: "
                     f"{_wall_comparison(HEADLINE_STRATEGY, head, peer, walls[peer])}")
    return lines


def _cache_text(r: StrategyRecord, decimals: int) -> str | None:
    cache = r.cache
    if cache is None:
        return None
    steps = []
    if cache.state == "cold":
        steps.append("flushed" if cache.flushed else "not flushed")
        if cache.settled is not None:
            steps.append("machine's writeback settled" if cache.settled else "machine's writeback not settled")
        steps.append("dropped")
    else:
        steps.append("read once")
    text = (f"cache {cache.state} ({', '.join(steps)}; {format_gib(cache.resident_before_bytes, decimals)} resident "
            f"before, {format_gib(cache.resident_after_bytes, decimals)} after, in {cache.seconds:.1f} s)")
    if cache.resident_at_load_bytes is not None:
        text += f"; checkpoint resident at load start: {format_gib(cache.resident_at_load_bytes, decimals)}"
    if cache.notes:
        text += "; " + "; ".join(n.rstrip(".") for n in cache.notes)
    return text


def _prefetch_detail(r: StrategyRecord, decimals: int, readers: int) -> str | None:
    if r.prefetch is None and not r.drop_cache:
        return None
    parts = []
    if r.prefetch is not None:
        warmed = "" if r.prefetch_warmed_bytes is None else f", {format_gib(r.prefetch_warmed_bytes, decimals)} warmed"
        if r.prefetch_busy_s is not None:
            calls = "the thread's calls" if readers == 1 else f"calls summed over its {readers} readers"
            warmed += f" in {r.prefetch_busy_s:.2f} s of {calls}"
        parts.append(f"prefetch `{r.prefetch}` one engine ahead{warmed}")
    if r.drop_cache:
        evict = ""
        if r.prefetch is not None and r.prefetch_evict_s is not None:
            evict = f" ({r.prefetch_evict_s:.2f} s of calls on a thread beside the prefetch one)"
        parts.append(f"released weights dropped from the page cache too{evict}")
    return "; ".join(parts)


def _floor_note(run: Results, decimals: int) -> str:
    formula = floor_formula(run.on_gpu, run.engines_accumulate, run.engines_built_without_resident_weights,
                            run.engines_hold_compiler_memory)
    if run.engines_hold_compiler_memory and not run.engines_built_without_resident_weights:
        floor = ("the compiler reads every weight of an engine within calls no loader can split and holds memory "
                 "of its own beside them (its models, weights repacked for its kernels) until the engine is "
                 f"written, measured per engine, so the floor is {formula}")
    elif run.engines_built_without_resident_weights:
        floor = ("engines compiled to run on the mapped weights where they lie (weights \"mapped\"), or whose "
                 "weights are streamed into the artifact a chunk at a time (weights \"packaged\"), are built "
                 f"with none of their weights resident, so the floor is the {formula}; every weight page a build "
                 "keeps resident counts in its excess")
    elif run.on_gpu and not run.engines_accumulate:
        floor = (
            f"on the GPU engines that hold their weights leave it once built, so the floor is {formula} "
            "(its weights on the host and their device copy), compared with the build-phase host + GPU peak"
        )
    elif run.on_gpu:
        floor = (f"on the GPU engines accumulate, so the floor is {formula}, "
                 "compared with the build-phase host + GPU peak")
    else:
        floor = f"engines leave the process, so the floor is {formula}"
    gpu = "" if run.gpu_measured else " No GPU was measured."
    return (
        f"GiB = 2^30 bytes, rounded to {decimals} decimals; references are shown as published. "
        f"Floor: the lowest peak any loader can reach while every engine is built; "
        f"{floor}. The {run.compared_label} covers partitioning to the end of the last engine (the larger of "
        f"the engines' kernel high-water marks and the samples); excess = ({run.compared_label} − floor) / "
        f"model size. Whole-run peaks include the load. A failed strategy has no floor or excess: it may "
        f"have built only part of the model.{gpu}"
    )


def _above_floor(s: StrategyMetrics, decimals: int) -> str | None:
    floor, peak, fraction = s.floor_bytes, s.compared_peak_bytes, s.excess
    if floor is None or peak is None or fraction is None:
        return None
    label = s.compared_label
    if fraction < 0:
        return (
            f"{label} {format_gib(peak, decimals)} is {format_gib(floor - peak, decimals)} below the floor "
            f"of {format_gib(floor, decimals)}: the measurement missed memory that must have been there"
        )
    return (
        f"{label} {format_gib(peak, decimals)}: {format_gib(peak - floor, decimals)} "
        f"({fraction * 100:.1f}% of the model) above the floor of {format_gib(floor, decimals)}"
    )


def _when_whole_run_peak(run: Results, name: str, whole: int) -> str:
    """When the whole-run host peak was reached: by the kernel's mark at partitioning, else by the samples."""
    record, samples = run.record.strategies[name], run.samples[name]
    if record.load_hwm_bytes is not None:
        return "during the load" if record.load_hwm_bytes >= whole else "after the build phase"
    partition = record.phases.partition_s
    if partition is None or not len(samples) or samples["rss_bytes"].isna().all():
        return "outside it"
    at = float(samples.loc[samples["rss_bytes"].idxmax(), "t_s"])
    return "during the load, by the samples" if at < partition else "after the build phase, by the samples"


def strategy_observations(run: Results, s: StrategyMetrics) -> list[str]:
    """Facts about one strategy, computed from its figures only: a headline and indented details."""
    decimals = gib_decimals(s.model_bytes)
    model = s.model_bytes
    r = run.record.strategies[s.name]
    headline: list[str] = []
    if not s.record.ok:
        headline.append(status_text(s))
    if s.record.host_at_partitioning_bytes is not None and s.record.baseline_rss_bytes is not None:
        above = s.record.host_at_partitioning_bytes - s.record.baseline_rss_bytes
        headline.append(
            f"host at partitioning {format_gib(above, decimals)} above the baseline of "
            f"{format_gib(s.record.baseline_rss_bytes, decimals)}"
        )
    floor_fact = _above_floor(s, decimals)
    if floor_fact:
        headline.append(floor_fact)
    details: list[str] = []
    memory = []
    whole, build = s.record.host_peak_bytes, s.record.build_peak_bytes
    if whole is not None and build is not None and format_gib(whole, decimals) != format_gib(build, decimals):
        memory.append(f"whole-run host peak {format_gib(whole, decimals)}, above the build phase's, reached "
                      f"{_when_whole_run_peak(run, s.name, whole)}")
    if s.anon_above_baseline_bytes is not None and model > 0:
        share = s.anon_above_baseline_bytes / model * 100
        memory.append(f"anonymous memory peaked {format_gib(s.anon_above_baseline_bytes, decimals)} above its "
                      f"baseline ({share:.0f}% of the model)")
    elif s.record.anon_peak_bytes is not None:
        memory.append(f"anonymous peak {format_gib(s.record.anon_peak_bytes, decimals)}, the baseline's included")
    if s.record.gpu_peak_bytes is not None:
        memory.append(f"GPU peak {format_gib(s.record.gpu_peak_bytes, decimals)}")
    if memory:
        details.append("; ".join(memory))
    release = release_sentence(s, run.record.model.bytes_with_non_persistent_buffers)
    if release:
        details.append(release)
    details.append(prediction_detail(run, s.name))
    if s.record.wall_s is not None:
        timing = f"wall {format_seconds(s.record.wall_s)} = {phases_text(s)}"
        if s.pages_s is not None and s.copy_s is not None:
            timing += (f" (engines: {format_seconds(s.pages_s)} bringing weights' pages in, "
                       f"{format_seconds(s.copy_s)} copying and flushing)")
        if s.engine_s:
            index, seconds = max(s.engine_s, key=lambda item: item[1])
            timing += f"; slowest engine {index} ({format_seconds(seconds)})"
        details.append(timing)
    rounds = strategy_rounds(s)
    if s.runs > 1 and rounds.wall_s:
        times = "; ".join(f"{name} {spread_text(values)}" for name, values in rounds.times().items() if values)
        details.append(f"{s.runs_finished} of {s.runs} runs finished, medians over the rounds: {times}; the "
                       f"table's times, the memory and the phases above are round {(r.repeat or 0) + 1}'s, the run "
                       "with the median wall time, which the figures show (a phase's median over the rounds need "
                       "not be that run's)")
    cache = _cache_text(r, decimals)
    if cache:
        details.append(cache)
    prefetch = _prefetch_detail(r, decimals, 1 if run.record.reading is None else run.record.reading.prefetch_readers)
    if prefetch:
        details.append(prefetch)
    sampling = []
    if r.peak_source:
        sampled = "anonymous and GPU peaks" if s.gpu_measured else "anonymous peak"
        sampling.append(f"host peaks from the {r.peak_source}, {sampled} from the samples alone")
    sampling.append(f"{r.samples} samples")
    if r.max_gap_ms is not None:
        sampling.append(f"longest gap between samples {r.max_gap_ms:.1f} ms")
    if r.mean_interval_ms is not None:
        sampling.append(f"mean interval {r.mean_interval_ms:.1f} ms")
    details.append(", ".join(sampling))
    if r.note:
        details.append(r.note.rstrip("."))
    if not s.record.ok:
        samples = run.samples[s.name]
        last = f" up to {samples['t_s'].max():.1f} s" if len(samples) else ""
        details.append(f"partial data: {len(samples)} samples{last}; {s.engines_built} of {run.record.engines} "
                       "engines built")
    lines = [f"- **{s.name}**: " + ("; ".join(headline) or "no figures recorded") + "."]
    return lines + [f"  - {d}." for d in details]


def comparison_observations(run: Results) -> list[str]:
    """Which finished strategy is lowest on host at partitioning and on the compared peak."""
    finished = [s for s in run.metrics.values() if s.record.ok]
    if len(finished) < 2:
        return []
    decimals = gib_decimals(run.record.model.bytes)
    lines = []
    figures = {
        "host at partitioning": {s.name: s.record.host_at_partitioning_bytes for s in finished},
        finished[0].compared_label: {s.name: s.compared_peak_bytes for s in finished},
    }
    for title, by_name in figures.items():
        known = [(v, name) for name, v in by_name.items() if v is not None]
        if len(known) < 2:
            continue
        known.sort()
        (low, _), (high, high_name) = known[0], known[-1]
        shown = format_gib(low, decimals)
        tied = [name for v, name in known if format_gib(v, decimals) == shown]  # equal as the table shows them
        names = ", ".join(f"**{name}**" for name in tied)
        lines.append(
            f"- Lowest {title}: {names} ({shown}{', equal at this precision' if len(tied) > 1 else ''}), "
            f"{format_gib(high - low, decimals)} below the highest ({high_name})."
        )
    return lines


def _notes_section(run: Results, notes: Notes) -> list[str]:
    changes = check_notes(notes, run)
    lines = ["## Notes", ""]
    command = f"python -m harness plot {run.directory} --notes-checked"
    if changes == [NEVER_CHECKED]:
        lines += [f"> **Check these notes**: they are kept in `{notes.path.name}` and have not been checked "
                  f"against these figures. Re-read them against the table, then run `{command}`.", ""]
    elif changes:
        lines += [f"> **Check these notes**: they are kept in `{notes.path.name}` and were written for other "
                  f"figures. Re-read them against the table, then run `{command}`. Stale since they were "
                  "last checked:", ">", *[f"> - {cell(line)}" for line in changes], ""]
    else:
        lines += [f"*Hand-written, kept in `{notes.path.name}`; checked against the figures above.*", ""]
    return lines + [notes.text.strip("\n"), ""]


def render_report(run: Results, figures: Sequence[str] = (), notes: Notes | None = None) -> str:
    """The whole markdown text. ``figures`` are image paths relative to the report; ``notes`` the run's notes."""
    record = run.record
    decimals = gib_decimals(record.model.bytes)
    lines = [f"# {run.name}: memory by loading strategy", ""]
    if record.description:
        lines += [f"*{' '.join(record.description.split())}*", ""]
    lines += [context_paragraph(run), ""]
    lines += table_lines(run)
    lines += ["", _floor_note(run, decimals), "", prediction_note(run), ""]
    notes_on_refs = [f"- reference **{r.label}**: {r.note.rstrip('.')}." for r in record.references if r.note]
    lines += ["## Observations", ""]
    for strategy in run.metrics.values():
        lines += strategy_observations(run, strategy)
    lines += comparison_observations(run)
    lines += finding_observations(run)
    lines += fastest_observation(run)
    lines += disk_observation(run)
    lines += reading_observation(run)
    lines += round_order_observation(run)
    lines += notes_on_refs
    compiled = compiler_lines(run)
    if compiled:
        lines += [""] + compiled[:-1]
    if figures:
        lines += ["", "## Figures", ""]
        for figure in figures:
            lines += [f"![{Path(figure).stem}]({figure})", ""]
        lines.pop()
    lines.append("")
    if notes is not None:
        lines += _notes_section(run, notes)
    return "\n".join(lines)


def write_report(run: Results, path: Path, figures: Sequence[str] = (),
                 batch: FileBatch | None = None) -> tuple[Path, list[str]]:
    """Render the report to ``path`` atomically (into ``batch`` when given, to go in place with it);
    returns it and what changed since its notes were checked.

    The notes come from ``<name>.notes.md`` beside ``path``; notes still kept at the end of
    an earlier report are first moved into that file.
    """
    path = Path(path)
    notes = migrate_notes(path)
    (batch.write if batch is not None else write_atomic)(path, render_report(run, figures, notes))
    return path, (check_notes(notes, run) if notes is not None else [])
