"""Markdown report of a results directory: context, one table row per strategy, observations.

The report is regenerated from the data every time; hand-written analysis goes after
:data:`NOTES_MARKER` and is carried over when the file is rewritten.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.atomic import write_atomic
from harness.metrics import StrategyMetrics
from harness.record import Reference
from harness.report.text import (
    DASH,
    cell,
    format_gib,
    format_percent,
    gib_decimals,
    machine_text,
    short_commit,
    status_text,
    versions_text,
)
from harness.results import Results

NOTES_MARKER = "<!-- notes: kept when this file is regenerated -->"
"""Everything from this line to the end of an existing report survives regeneration."""

TABLE_COLUMNS = (
    "strategy",
    "host at partitioning",
    "host peak",
    "anonymous peak",
    "host + GPU peak",
    "floor",
    "excess over floor (% of model)",
    "released",
    "wall time",
    "status",
)
_STATUS_CHARS = 160


def _gpu_cell(value: int | None, run: Results, decimals: int) -> str:
    if not run.gpu_measured:
        return f"{DASH} (no GPU)"
    return format_gib(value, decimals)


def strategy_row(run: Results, strategy: StrategyMetrics, decimals: int) -> list[str]:
    """The table cells of one strategy, in :data:`TABLE_COLUMNS` order."""
    status = status_text(strategy, _STATUS_CHARS)
    return [
        strategy.name,
        format_gib(strategy.host_at_partitioning_bytes, decimals),
        format_gib(strategy.run_host_peak_bytes, decimals),
        format_gib(strategy.run_anon_peak_bytes, decimals),
        _gpu_cell(run.record.strategies[strategy.name].host_gpu_peak_bytes, run, decimals),
        format_gib(strategy.floor_bytes, decimals),
        format_percent(strategy.excess),
        format_gib(strategy.released_bytes, decimals),
        DASH if strategy.wall_s is None else f"{strategy.wall_s:.1f} s",
        status if strategy.ok else f"**{status}**",
    ]


def _reference_gib(value: float | None) -> str:
    return DASH if value is None else f"{value:g} GiB"


def reference_row(reference: Reference) -> list[str]:
    """The table cells of a reference figure measured elsewhere; what it lacks is a dash."""
    return [
        f"reference: {reference.label} (reference, different setup)",
        _reference_gib(reference.host_at_partitioning_gib),
        _reference_gib(reference.host_peak_gib),
        DASH,
        _reference_gib(reference.host_gpu_peak_gib),
        DASH,
        DASH,
        DASH,
        DASH,
        "reference",
    ]


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    align = ["---"] + ["---:"] * (len(TABLE_COLUMNS) - 2) + ["---"]
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


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
    ]
    text += machine + "; " + ", ".join(s for s in setup if s) + "."
    created = run.created or "at an unrecorded time"
    text += f" Commit {short_commit(run.commit)}, created {created}; {versions_text(results)}."
    return text


def _floor_note(run: Results, decimals: int) -> str:
    if run.on_gpu:
        floor = (
            "on the GPU engines accumulate, so the floor is baseline + max over k of "
            "(engines 0..k + engine k), compared with the host + GPU peak"
        )
    else:
        floor = (
            "engines leave the process, so the floor is baseline + largest engine, compared with the "
            "build-phase host peak (the larger of the engines' high-water marks and the build-phase samples)"
        )
    gpu = "" if run.gpu_measured else " No GPU was measured: host + GPU figures do not apply."
    return (
        f"GiB = 2^30 bytes, rounded to {decimals} decimals; references are shown as published. "
        f"Floor: the lowest peak any loader can reach while an engine's weights and its copy coexist; "
        f"{floor}. Excess = (compared peak − floor) / model size. Failed strategies have no floor: "
        f"they built only part of the model.{gpu}"
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


def strategy_observations(run: Results, s: StrategyMetrics) -> list[str]:
    """Facts about one strategy, computed from its figures only: a headline and indented details."""
    decimals = gib_decimals(s.model_bytes)
    model = s.model_bytes
    r = run.record.strategies[s.name]
    headline: list[str] = []
    if not s.ok:
        headline.append(status_text(s))
    if s.host_at_partitioning_bytes is not None and s.baseline_bytes is not None:
        above = s.host_at_partitioning_bytes - s.baseline_bytes
        headline.append(
            f"host at partitioning {format_gib(above, decimals)} above the baseline of "
            f"{format_gib(s.baseline_bytes, decimals)}"
        )
    floor_fact = _above_floor(s, decimals)
    if floor_fact:
        headline.append(floor_fact)
    details: list[str] = []
    memory = []
    if s.run_anon_peak_bytes is not None and model > 0:
        share = s.run_anon_peak_bytes / model * 100
        memory.append(f"anonymous peak {format_gib(s.run_anon_peak_bytes, decimals)} ({share:.0f}% of the model)")
    if s.run_gpu_peak_bytes is not None:
        memory.append(f"GPU peak {format_gib(s.run_gpu_peak_bytes, decimals)}")
    if memory:
        details.append("; ".join(memory))
    release = []
    if s.released_bytes is not None and model > 0:
        share = s.released_bytes / model * 100
        release.append(f"released {format_gib(s.released_bytes, decimals)} ({share:.0f}% of the model)")
    if s.unreleased_bytes is not None:
        release.append(f"{format_gib(s.unreleased_bytes, decimals)} never released")
    if r.release_note:
        release.append(r.release_note.rstrip("."))
    if release:
        details.append("; ".join(release))
    sampling = []
    if r.peak_source:
        sampling.append(f"peaks from the {r.peak_source}")
    sampling.append(f"{r.samples} samples")
    if r.max_gap_ms is not None:
        sampling.append(f"longest gap between samples {r.max_gap_ms:.1f} ms")
    if r.mean_interval_ms is not None:
        sampling.append(f"mean interval {r.mean_interval_ms:.1f} ms")
    details.append(", ".join(sampling))
    if r.note:
        details.append(r.note.rstrip("."))
    if not s.ok:
        samples = run.samples[s.name]
        last = f" up to {samples['t_s'].max():.1f} s" if len(samples) else ""
        details.append(f"partial data: {len(samples)} samples{last}; {s.engines_built} of {run.record.engines} "
                       "engines built")
    lines = [f"- **{s.name}**: " + ("; ".join(headline) or "no figures recorded") + "."]
    return lines + [f"  - {d}." for d in details]


def comparison_observations(run: Results) -> list[str]:
    """Which finished strategy is lowest on host at partitioning and on the compared peak."""
    finished = [s for s in run.metrics.values() if s.ok]
    if len(finished) < 2:
        return []
    decimals = gib_decimals(run.record.model.bytes)
    lines = []
    figures = {
        "host at partitioning": {s.name: s.host_at_partitioning_bytes for s in finished},
        finished[0].compared_label: {s.name: s.compared_peak_bytes for s in finished},
    }
    for title, by_name in figures.items():
        known = [(v, name) for name, v in by_name.items() if v is not None]
        if len(known) < 2:
            continue
        known.sort()
        (low, low_name), (high, high_name) = known[0], known[-1]
        lines.append(
            f"- Lowest {title}: **{low_name}** ({format_gib(low, decimals)}), "
            f"{format_gib(high - low, decimals)} below the highest ({high_name})."
        )
    return lines


def render_report(run: Results, figures: Sequence[str] = (), notes: str | None = None) -> str:
    """The whole markdown text. ``figures`` are image paths relative to the report; ``notes`` is
    the kept tail of a previous report (from the marker on), or ``None`` for a fresh file."""
    record = run.record
    decimals = gib_decimals(record.model.bytes)
    rows = [strategy_row(run, s, decimals) for s in run.metrics.values()]
    rows += [reference_row(r) for r in record.references]
    lines = [f"# {run.name}: memory by loading strategy", ""]
    if record.description:
        lines += [f"*{' '.join(record.description.split())}*", ""]
    lines += [context_paragraph(run), ""]
    lines += _table(rows)
    lines += ["", _floor_note(run, decimals), ""]
    notes_on_refs = [f"- reference **{r.label}**: {r.note.rstrip('.')}." for r in record.references if r.note]
    lines += ["## Observations", ""]
    for strategy in run.metrics.values():
        lines += strategy_observations(run, strategy)
    lines += comparison_observations(run)
    lines += notes_on_refs
    if figures:
        lines += ["", "## Figures", ""]
        for figure in figures:
            lines += [f"![{Path(figure).stem}]({figure})", ""]
        lines.pop()
    lines.append("")
    text = "\n".join(lines) + "\n"
    return text + (notes if notes is not None else NOTES_MARKER + "\n")


def kept_notes(path: Path) -> str | None:
    """The tail of an existing report from :data:`NOTES_MARKER` on, or ``None`` (no file, no marker)."""
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    at = text.find(NOTES_MARKER)
    return None if at < 0 else text[at:]


def write_report(run: Results, path: Path, figures: Sequence[str] = ()) -> Path:
    """Render the report to ``path`` atomically, keeping the notes of the file it replaces."""
    path = Path(path)
    return write_atomic(path, render_report(run, figures, kept_notes(path)))
