"""What a compiler backend adds: the export phase, and per engine its compile time, artifact and host cost.

Drawn and tabled only for runs of a compiler backend (records of layout 3 with
``compiler`` set); :func:`has_compiler` says which.

* :func:`compiler_figure`, ``<name>.compiler.png``: per engine, how far each strategy's host
  memory rose while it was built (the high-water mark minus RSS at its start) beside the
  engine's weights (what a build that copies them adds: the copy floor's share), and, where
  the weights were written into the artifact after the compile (``packaged``), the rise when
  the compiler was done and the largest while they were written; the compile time, and the
  artifact's bytes;
* :func:`compiler_lines`: the markdown section with the export phase per strategy (time,
  checkpoint pages read, host memory it cost, the built model against eager) and a row
  per engine and strategy, with the memory of the processes the compiler started: their summed
  PSS, or, in records before layout 13, their summed RSS, named as such. For a compiler that
  converts, then compiles (OpenVINO and IREE, layout 14), the row gives each call's peak, the weights it
  read and what it held beside them instead; its figure marks the conversion's peak too. For a run on a GPU that
  measured it (layout 16), each strategy's CUDA context, and per engine the GPU split: GPU in use at its start and
  at its peak, its weights' device copies, the caching allocator's peaks and the compiler's own device memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.backends import compiler_calls
from harness.report.style import figure_legend, new_figure, strategy_colour, styled
from harness.report.text import TableColumn, format_seconds, markdown_table
from harness.results.metrics import StrategyMetrics, compiler_gpu_own_bytes
from harness.results.reading import Results
from harness.results.record import EngineRecord, ExportRecord, StrategyRecord
from harness.units import DASH, MIB, format_mib

__all__ = ["compiler_figure", "compiler_lines", "has_compiler"]



def has_compiler(run: Results) -> bool:
    """Whether any strategy of the run built its engines with a compiler."""
    return any(r.compiler for r in run.strategies.values())


def _setting(run: Results) -> str:
    found = {f"{r.compiler} (weights {r.compiler_weights})" for r in run.strategies.values() if r.compiler}
    return ", ".join(sorted(found)) or run.record.backend


def _calls(run: Results) -> tuple[str, str] | None:
    """The two calls of the run's compiler as its spec names them (:func:`harness.backends.compiler_calls`), or None
    for a compiler that does not build in two calls, one not registered, or a run of several compilers."""
    names = {r.compiler for r in run.strategies.values() if r.compiler}
    return compiler_calls(names.pop()) if len(names) == 1 else None


def _compiled(record: StrategyRecord) -> list[EngineRecord]:
    return [e for e in record.engines if e.compile_s is not None]


def _growth(e: EngineRecord) -> int | None:
    """High-water mark while the engine was built minus RSS at its start."""
    if e.host_hwm_bytes is None or e.rss_before_bytes is None:
        return None
    return e.host_hwm_bytes - e.rss_before_bytes


def _compile_rise(e: EngineRecord) -> int | None:
    # shown where the build has two steps: compile then write (packaged), or convert then compile (OpenVINO)
    return e.compiler_own_bytes if e.write_peak_bytes is not None or e.convert_hwm_bytes is not None else None


def _convert_rise(e: EngineRecord) -> int | None:
    """The high-water mark when the conversion was done minus RSS at the engine's start (OpenVINO)."""
    if e.convert_hwm_bytes is None or e.rss_before_bytes is None:
        return None
    return e.convert_hwm_bytes - e.rss_before_bytes


def _write_rise(e: EngineRecord) -> int | None:
    """The largest RSS while the artifact's weights were written minus RSS at the engine's start."""
    if e.write_peak_bytes is None or e.rss_before_bytes is None:
        return None
    return e.write_peak_bytes - e.rss_before_bytes


_MARKERS = {"converted": "|", "compiled": "_", "written": "x"}
_SPLIT_LABELS = {
    "converted": "peak rise when the conversion was done",
    "compiled": "the compiler's own: its peak rise, or what it left when the weights' write began if more",
    "written": "largest rise while the weights were written into the artifact (weights read + write buffers)",
}


@styled
def compiler_figure(run: Results) -> Figure:
    """Per engine and strategy: host peak over the copy floor, compile time, artifact size."""
    names = list(run.strategies)
    fig = new_figure(12.0, 9.6, run)
    top, middle, bottom = fig.subplots(3, 1, sharex=True)
    width = 0.8 / max(1, len(names))
    handles: list[Any] = []
    indices: set[int] = set()
    weights: dict[int, int] = {}
    split: set[str] = set()
    for i, name in enumerate(names):
        record = run.strategies[name]
        engines = _compiled(record)
        if not engines:
            continue
        colour = strategy_colour(name, names)
        xs = np.asarray([e.index for e in engines], dtype=float) + (-0.4 + width * (i + 0.5))
        indices.update(e.index for e in engines)
        for e in engines:
            weights.setdefault(e.index, e.weight_bytes)
        growth = [(_growth(e) or 0) / MIB for e in engines]
        top.bar(xs, growth, width, color=colour, zorder=2, gid=f"growth:{name}")
        for what, rise in (("converted", _convert_rise), ("compiled", _compile_rise), ("written", _write_rise)):
            marked = [(x, r) for x, e in zip(xs, engines, strict=True) if (r := rise(e)) is not None]
            if marked:
                top.scatter([x for x, _ in marked], [r / MIB for _, r in marked], marker=_MARKERS[what], s=60,
                            color="#000000", linewidths=1.6, zorder=4, gid=f"{what}:{name}")
                split.add(what)
        seconds = [e.compile_s or 0.0 for e in engines]
        middle.bar(xs, seconds, width, color=colour, zorder=2, gid=f"compile-s:{name}")
        artifact = [(e.artifact_bytes or 0) / MIB for e in engines]
        bottom.bar(xs, artifact, width, color=colour, zorder=2, gid=f"artifact:{name}")
        label = name if record.ok else f"{name} (FAILED, partial)"
        label += f": compiled in {sum(seconds):.0f} s, largest rise {max(growth):,.0f} MiB"
        handles.append(Patch(color=colour, label=label))
    calls = _calls(run)
    for what in sorted(split):
        label = _SPLIT_LABELS[what]
        if what == "converted" and calls:
            label += f" ({calls[0]})"
        if what == "compiled" and "converted" in split and "written" not in split:  # one call compiles and writes
            label = "peak rise when the compile was done" + (f" ({calls[1]})" if calls else ", its artifact written")
        handles.append(Line2D([], [], color="#000000", marker=_MARKERS[what], linestyle="none", markersize=8,
                              markeredgewidth=1.6, label=label))
    if weights:
        ticks = sorted(weights)
        top.hlines([weights[t] / MIB for t in ticks], np.asarray(ticks) - 0.45, np.asarray(ticks) + 0.45,
                   color="#000000", linewidth=1.4, linestyles="dashed", zorder=3)
        handles.append(Line2D([], [], color="#000000", linestyle="dashed",
                              label="the engine's weights: a build that reads or copies them rises this much"))
    top.set_ylabel("host rise while\nbuilt (MiB)")
    top.set_ylim(bottom=0)
    top.set_title("host high-water mark while each engine was built minus RSS at its start (bars); "
                  "above the dashed line is what the compiler adds over a copy", loc="left")
    middle.set_ylabel("compile time (s)")
    middle.set_ylim(bottom=0)
    middle.set_title("time to compile each engine", loc="left")
    bottom.set_ylabel("artifact (MiB)")
    bottom.set_ylim(bottom=0)
    bottom.set_title("bytes of each engine's artifact on disk", loc="left")
    bottom.set_xlabel("engine (build order)")
    for ax in (top, middle, bottom):
        ax.grid(axis="y", color="#E5E5E5", zorder=0)
    if indices:
        ticks = sorted(indices)
        bottom.set_xticks(ticks, [str(t) for t in ticks])
    else:
        top.text(0.5, 0.5, "no engine was built by a compiler", transform=top.transAxes, ha="center",
                 color="#777777")
    figure_legend(fig, handles, f"{run.name}: the compiler's cost engine by engine, {_setting(run)}")
    return fig


def _check_text(record: StrategyRecord) -> str:
    if record.max_abs_diff is not None:
        return f"{record.max_abs_diff:.3g}" + ("" if record.ok else " (mismatch)")
    return record.check or DASH


def _export_cell(shown: Callable[[ExportRecord], str]) -> Callable[[StrategyMetrics], str]:
    return lambda m: DASH if m.record.export is None else shown(m.record.export)


def _compile_total(record: StrategyRecord) -> str:
    engines = _compiled(record)
    return format_seconds(sum(e.compile_s or 0.0 for e in engines)) if engines else DASH


_STRATEGY_COLUMNS: list[TableColumn[StrategyMetrics]] = [
    TableColumn("strategy", lambda m: m.name, text=True),
    TableColumn("export time", lambda m: format_seconds(m.export_s) if m.export_s is not None else DASH),
    TableColumn("graph nodes", _export_cell(lambda x: f"{x.nodes:,}")),
    TableColumn("checkpoint pages read", _export_cell(lambda x: format_mib(x.pages_read_bytes, 2))),
    TableColumn("page cache change", _export_cell(lambda x: format_mib(x.residency_read_bytes, 2))),
    TableColumn("host cost (peak over its start)", _export_cell(lambda x: format_mib(x.host_cost_bytes))),
    TableColumn("anonymous growth", _export_cell(lambda x: format_mib(x.anon_delta_bytes))),
    TableColumn("engines compiled", lambda m: str(len(_compiled(m.record)))),
    TableColumn("compile time", lambda m: _compile_total(m.record)),
    TableColumn("built vs eager (max abs diff)", lambda m: _check_text(m.record)),
    TableColumn("check's host peak", lambda m: format_mib(m.record.check_peak_bytes)),
]
"""The export table: a row per strategy."""

_ENGINE_COLUMNS: list[TableColumn[tuple[str, EngineRecord]]] = [
    TableColumn("strategy", lambda row: row[0], text=True),
    TableColumn("engine", lambda row: str(row[1].index)),
    TableColumn("weights", lambda row: format_mib(row[1].weight_bytes)),
    TableColumn("compile time", lambda row: format_seconds(row[1].compile_s)),
    TableColumn("artifact", lambda row: format_mib(row[1].artifact_bytes)),
    TableColumn("host rise", lambda row: format_mib(_growth(row[1]))),
    TableColumn("over copy floor", lambda row: format_mib(row[1].compiler_over_floor_bytes)),
    TableColumn("compiler's own", lambda row: format_mib(row[1].compiler_own_bytes)),
    TableColumn("weights read", lambda row: format_mib(row[1].write_read_bytes)),
    TableColumn("artifact write", lambda row: format_mib(row[1].write_buffers_bytes)),
    TableColumn("cache growth", lambda row: format_mib(row[1].cache_bytes)),
]
"""The per-engine table's columns before the compiler processes' (:func:`_children_column`, last): a row per engine a
compiler built, per strategy."""

_TWO_CALL_COLUMNS: list[TableColumn[tuple[str, EngineRecord]]] = [
    *_ENGINE_COLUMNS[:7],
    TableColumn("convert time", lambda row: format_seconds(row[1].convert_s)),
    TableColumn("convert peak", lambda row: format_mib(_convert_rise(row[1]))),
    TableColumn("compile peak", lambda row: format_mib(row[1].compiler_own_bytes)),
    TableColumn("weights read", lambda row: format_mib(row[1].compiler_read_bytes)),
    TableColumn("held beside them", lambda row: format_mib(row[1].compiler_held_bytes)),
]
"""The per-engine columns for a compiler that converts, then compiles and writes its artifact in one call (OpenVINO,
IREE):
what each call cost, the weights it read and what it held of its own beside them, in place of the columns of a
harness-written artifact and a compiler cache."""

_TWO_CALL_TEXT = (
    "Per engine (host rise = high-water mark while it was built − RSS at its start; over copy floor = "
    "high-water mark − (RSS at its start + its weights); compile time = the whole build, the conversion "
    "included; convert peak and compile peak = the high-water mark when the conversion, and then the compile "
    "with its artifact written, were done − RSS at its start (the compile's includes the conversion's, whose model "
    "it holds); weights read = the rise of file-backed RSS from the start to the end of the compile (the mapped "
    "weights' pages the compiler read, with its code's on a first engine); held beside them = the rise of "
    "anonymous memory over the same span, both models held (the compiler's own: its graph and what it "
    "copied of the weights: OpenVINO's repacked for its kernels, IREE's inlined), which sets the floor with the "
    "weights; artifact = the compiled file on disk)"
)


_GPU_COLUMNS: list[TableColumn[tuple[str, EngineRecord]]] = [
    TableColumn("GPU at start", lambda row: format_mib(row[1].gpu_start_bytes)),
    TableColumn("GPU peak", lambda row: format_mib(row[1].gpu_peak_bytes)),
    TableColumn("weights on GPU", lambda row: format_mib(row[1].gpu_weights_bytes)),
    TableColumn("allocator peak (reserved)", lambda row: format_mib(row[1].gpu_reserved_peak_bytes)),
    TableColumn("allocator peak (allocated)", lambda row: format_mib(row[1].gpu_allocated_peak_bytes)),
    TableColumn("compiler's own on GPU", lambda row: format_mib(compiler_gpu_own_bytes(row[1]))),
]
"""The per-engine GPU split, after the other columns, for runs that measured it (on a GPU, layout 16)."""

_GPU_TEXT = (
    "on the GPU (NVML `used` above the strategy's baseline, which holds the CUDA context): GPU at start = when the "
    "engine's build began (what earlier engines left), GPU peak = the largest sampled while it was built (device-"
    "wide: processes the compiler started count), weights on GPU = the device copies of its weights the build made, "
    "allocator peak = torch's caching allocator's reserved and allocated high-water marks in this process over the "
    "build, compiler's own on GPU = GPU peak − weights on GPU − GPU at start"
)


def _gpu_split(run: Results) -> bool:
    """Whether the run measured the GPU split of its engines (a run on a GPU, layout 16 on)."""
    return any(e.gpu_peak_bytes is not None or e.gpu_reserved_peak_bytes is not None
               for r in run.strategies.values() for e in _compiled(r))


def _context_lines(run: Results) -> list[str]:
    """A line per strategy that measured its CUDA context (layout 16 on a GPU); none otherwise."""
    return [f"- **{name}**: CUDA context {format_mib(r.gpu_context_bytes)} as the first allocation created it, "
            f"part of the GPU baseline of {format_mib(r.gpu_baseline_bytes)} (NVML `used` when sampling began) and "
            "so in no GPU figure below" for name, r in run.strategies.items() if r.gpu_context_bytes is not None]


def _two_calls(run: Results) -> bool:
    """Whether the run's engines were built by a compiler that converts, then compiles (OpenVINO, layout 14)."""
    return any(e.convert_hwm_bytes is not None for r in run.strategies.values() for e in _compiled(r))


def _children_measured_pss(run: Results) -> bool:
    """Whether the run measured its compilers' processes by summed PSS (layout 13 on); older records hold their
    summed RSS only."""
    return any(e.children_pss_bytes is not None for r in run.strategies.values() for e in _compiled(r))


def _children_column(run: Results) -> TableColumn[tuple[str, EngineRecord]]:
    """The compiler processes' column, named for what the run measured: summed PSS, or, in older records, summed
    RSS."""
    if _children_measured_pss(run):
        return TableColumn("compiler processes (summed PSS)", lambda row: format_mib(row[1].children_pss_bytes))
    return TableColumn("compiler processes (summed RSS)", lambda row: format_mib(row[1].children_peak_bytes))


def _children_text(run: Results) -> str:
    """What the compiler processes' column holds, in words."""
    measured = ("the largest summed PSS of the processes the build started (the C++ compiler, the linker, the "
                "compiler's worker processes), sampled: each page they share split among the processes that map "
                "it, so a shared library counts once across them; what they add to the machine's memory, outside "
                "this process" if _children_measured_pss(run) else
                "the largest summed RSS of the processes the build started (the C++ compiler, the linker, the "
                "compiler's worker processes), sampled, as this run's record holds it: it counts every page they "
                "share (the shared libraries each maps, what a worker shares with the process it was forked from) "
                "once per process, so it overstates what they add to the machine's memory, by gigabytes where "
                "workers import torch; records from layout 13 on hold their summed PSS instead")
    return f"compiler processes: {measured}"


def compiler_lines(run: Results) -> list[str]:
    """The report's compiler section (empty for a run without a compiler)."""
    if not has_compiler(run):
        return []
    lines = ["## Compiler", "",
             f"Engines built by {_setting(run)} from the graph partitions of the exported model, "
             f"on `{run.record.device}`.", "",
             "Export phase (`torch.export.export` of the loaded model) and the built model against eager:", "",
             *markdown_table(_STRATEGY_COLUMNS, run.metrics.values())]
    checks = [f"- **{name}**: {record.check}" for name, record in run.strategies.items() if record.check]
    if checks:
        lines += ["", "The built model against eager, on the scenario's input:", "", *checks]
    contexts = _context_lines(run)
    if contexts:
        lines += ["", "GPU memory before the build:", "", *contexts]
    if _two_calls(run):
        return lines + ["", f"{_TWO_CALL_TEXT}:", "",
                        *markdown_table(_TWO_CALL_COLUMNS,
                                        ((name, e) for name, r in run.strategies.items() for e in _compiled(r))),
                        ""]
    gpu = _gpu_split(run)
    lines += ["", "Per engine (host rise = high-water mark while it was built − RSS at its start; over copy "
              "floor = high-water mark − (RSS at its start + its weights), negative where the build did not "
              "bring its weights in; compiler's own = high-water mark when the compiler was done − RSS at its "
              "start; for engines whose weights the harness writes into the artifact (`packaged`), the larger "
              "of that and RSS when the write began (what compiling and packaging left) − RSS at its start, "
              "weights read = the largest rise of file-backed RSS while they were written (the source's pages "
              "resident at once) and artifact write = the largest RSS meanwhile − RSS when the write began − "
              f"weights read: where the write sets the peak, the three add up to the host rise; "
              f"{_children_text(run)}{'; ' + _GPU_TEXT if gpu else ''}):", "",
              *markdown_table([*_ENGINE_COLUMNS, _children_column(run), *(_GPU_COLUMNS if gpu else [])],
                              ((name, e) for name, r in run.strategies.items() for e in _compiled(r)))]
    return lines + [""]
