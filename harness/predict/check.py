"""The rules checked against every committed result: ``python -m harness predict --check results/``.

For each results directory under the root, in name order: a run (``summary.json``) gives each finished strategy's
build-phase and whole-run host peaks; a budget sweep (``budget.json``) each swept strategy's minimum limit. Each
measured figure is predicted from that run's own sizes and its strategy's measured baseline
(:func:`~harness.predict.recorded.inputs_of_run`, :func:`~harness.predict.recorded.inputs_of_budget`), and the error
is given as a share of the model's bytes.

A figure is within its goal (:func:`goal_bytes`) when the error is at most 5 % of the model (a backend that is no
compiler, ``copy``) or 10 % (a compiler, as its registration says), or 64 MiB where that is larger; a budget
minimum when it is within 10 % of the minimum or 64 MiB, or inside the sweep's bracket (largest failing limit,
minimum], which is all a sweep measured. Results that set one of the rules' constants or a backend's memory figures
(:func:`constant_sources`) are marked, and left out of the goals' summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.backends import compiler_backends, memory_sources
from harness.budget.record import BUDGET_FILE, read_budget
from harness.predict.recorded import inputs_of_budget, inputs_of_run
from harness.predict.rules import predict_strategy
from harness.results.reading import load_results
from harness.results.record import SUMMARY
from harness.units import GIB, MIB, gib_number

__all__ = ["RULE_SOURCES", "CheckRow", "check_markdown", "check_results", "constant_sources", "goal_bytes"]

RULE_SOURCES: dict[str, str] = {
    "lerobot-compile-packaged": "GPU_WORKSPACE_BYTES",
    "smoke-budget": "RECLAIM_FLOOR_BYTES",
}
"""The committed results each constant of :mod:`harness.predict.rules` was measured on (its docstring says how)."""


def constant_sources() -> dict[str, str]:
    """Every committed result that set a constant, with what it set: the rules' own (:data:`RULE_SOURCES`) and the
    backends' memory figures, as their registrations state them (:func:`~harness.backends.memory_sources`)."""
    sources = memory_sources()
    for result, what in RULE_SOURCES.items():
        sources[result] = f"{sources[result]}; {what}" if result in sources else what
    return sources

FIGURES: dict[str, str] = {"build_peak_bytes": "build-phase peak", "host_peak_bytes": "whole-run peak",
                           "minimum_bytes": "budget minimum"}
"""The figures checked, as the table names them."""

FLOOR_BYTES = 64 * MIB
"""The smallest error a goal allows, whatever the model's size."""


@dataclass(frozen=True)
class CheckRow:
    """One figure of one strategy of one result: ``predicted`` and ``measured`` bytes, the model's bytes, whether
    a compiler built the engines, and for a budget minimum the largest limit it failed under (``failing_bytes``)."""

    result: str
    strategy: str
    figure: str
    predicted: int
    measured: int
    model_bytes: int
    compiler: bool
    failing_bytes: int | None = None

    @property
    def error(self) -> float:
        """(predicted − measured) / the model's bytes."""
        return (self.predicted - self.measured) / self.model_bytes

    @property
    def sets_constant(self) -> bool:
        return self.result in constant_sources()

    @property
    def in_bracket(self) -> bool:
        """For a budget minimum: the prediction lies in (largest failing limit, minimum]."""
        return self.failing_bytes is not None and self.failing_bytes < self.predicted <= self.measured

    @property
    def within_goal(self) -> bool:
        return abs(self.predicted - self.measured) <= goal_bytes(self) or self.in_bracket


def goal_bytes(row: CheckRow) -> int:
    """The error the goal allows ``row`` (see the module docstring)."""
    if row.figure == "minimum_bytes":
        return max(FLOOR_BYTES, int(0.10 * row.measured))
    return max(FLOOR_BYTES, int((0.10 if row.compiler else 0.05) * row.model_bytes))


def _run_rows(directory: Path) -> list[CheckRow]:
    results = load_results(directory)
    rows = []
    for name, run in results.strategies.items():
        if not run.ok or run.baseline_rss_bytes is None or not run.engines:
            continue
        predicted = predict_strategy(inputs_of_run(results, name), name)
        for figure in ("build_peak_bytes", "host_peak_bytes"):
            want, got = getattr(predicted, figure), getattr(run, figure)
            if want is not None and got is not None:
                rows.append(CheckRow(results.name, name, figure, want, got, results.record.model.bytes,
                                     results.record.backend in compiler_backends()))
    return rows


def _budget_rows(directory: Path) -> list[CheckRow]:
    record = read_budget(directory)
    rows = []
    for name, swept in record.strategies.items():
        if swept.minimum_bytes is None or swept.baseline_rss_bytes is None or swept.baseline_anon_bytes is None:
            continue
        predicted = predict_strategy(inputs_of_budget(directory, record, name), name).minimum_bytes
        if predicted is not None:
            rows.append(CheckRow(record.name, name, "minimum_bytes", predicted, swept.minimum_bytes,
                                 record.model_bytes, record.backend in compiler_backends(),
                                 swept.largest_failing_bytes))
    return rows


def check_results(root: Path) -> list[CheckRow]:
    """Every checked figure of every results directory under ``root``, directories in name order; a run's staging
    (``.<name>.partial``, :mod:`harness.results.publish`) and other hidden directories are not results."""
    rows: list[CheckRow] = []
    for directory in sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith(".")):
        if (directory / SUMMARY).is_file():
            rows.extend(_run_rows(directory))
        if (directory / BUDGET_FILE).is_file():
            rows.extend(_budget_rows(directory))
    return rows


def _summary(rows: list[CheckRow]) -> list[str]:
    lines = []
    groups = (("copy backend, build-phase and whole-run peaks (goal: 5 % of the model or 64 MiB)",
               lambda r: not r.compiler and r.figure != "minimum_bytes"),
              ("compiler backends, build-phase and whole-run peaks (goal: 10 % of the model or 64 MiB)",
               lambda r: r.compiler and r.figure != "minimum_bytes"),
              ("budget minimums (goal: 10 % or 64 MiB, or inside the sweep's bracket)",
               lambda r: r.figure == "minimum_bytes"))
    for label, chosen in groups:
        group = [r for r in rows if chosen(r) and not r.sets_constant]
        if not group:
            continue
        worst = max(group, key=lambda r: abs(r.error))
        widest = max(group, key=lambda r: abs(r.predicted - r.measured))
        near = sum(abs(r.predicted - r.measured) <= goal_bytes(r) for r in group)
        bracketed = sum(r.within_goal for r in group) - near
        lines.append(f"- {label}: {near} of {len(group)} within the goal's error"
                     + (f", {bracketed} more inside the sweep's bracket" if bracketed else "")
                     + f"; largest error {worst.error:+.1%} of the model ({worst.result}, {worst.strategy}, "
                     f"{FIGURES[worst.figure]}), largest in bytes {(widest.predicted - widest.measured) / GIB:+.3f} "
                     f"GiB ({widest.result}, {widest.strategy}, {FIGURES[widest.figure]})")
    return lines


def check_markdown(rows: list[CheckRow]) -> str:
    """The error table and the goals' summary, as markdown (what ``predict --check`` prints and the README holds)."""
    lines = ["| result | strategy | figure | predicted (GiB) | measured (GiB) | error (% of model) | within goal |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        goal = "yes" if row.within_goal else "no"
        if row.in_bracket and abs(row.predicted - row.measured) > goal_bytes(row):
            goal = "yes (in bracket)"
        result = f"`{row.result}`" + (" (sets a constant)" if row.sets_constant else "")
        lines.append(f"| {result} | {row.strategy} | {FIGURES[row.figure]} | {gib_number(row.predicted)} | "
                     f"{gib_number(row.measured)} | {row.error:+.1%} | {goal} |")
    summary = _summary(rows)
    return "\n".join(lines) + "\n" + ("\nResults that set no constant:\n\n" + "\n".join(summary) + "\n"
                                      if summary else "")
