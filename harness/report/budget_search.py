"""The prediction beside a budget sweep's measured minimum, and what starting from it saved.

:func:`predictions` gives each strategy's predicted minimum (:func:`harness.predict.recorded.budget_prediction`, at
render time, so a committed sweep gains it when re-rendered); :func:`minimum_cell` is the table's cell beside the
measured minimum; :func:`search_lines` say per swept strategy how many runs its search made
(:data:`~harness.budget.sweep.SEARCH_PHASES`: the unconstrained run and the curve's extra points aside) and how many
the sweep's own arithmetic (:func:`~harness.budget.sweep.search_runs`) makes from the other start, from the
prediction where it started from the baseline and the other way round, on the verdicts the sweep recorded (a limit
it never tried completes where at or above its minimum); :func:`finding_lines` name a minimum more than
:data:`~harness.predict.recorded.FINDING_SHARE` of the model from its prediction.
"""

from __future__ import annotations

from pathlib import Path

from harness.budget.record import BudgetRecord, StrategyBudget
from harness.budget.sweep import SEARCH_PHASES, search_runs
from harness.predict.recorded import Recorded, budget_prediction, is_finding
from harness.report.prediction import finding_sentence
from harness.report.text import format_percent, gib_decimals
from harness.units import format_gib

__all__ = ["finding_lines", "minimum_cell", "predictions", "search_lines", "started_from_prediction"]


def predictions(directory: Path | None, record: BudgetRecord) -> dict[str, Recorded]:
    """Each strategy's predicted minimum from the sweep in ``directory`` (none without one: a record alone does
    not hold the plan's engines)."""
    if directory is None:
        return {name: Recorded(None, "rendered without its results directory") for name in record.strategies}
    return {name: budget_prediction(directory, record, name) for name in record.strategies}


def _predicted(recorded: Recorded) -> int | None:
    return None if recorded.prediction is None else recorded.prediction.minimum_bytes


def minimum_cell(record: BudgetRecord, strategy: StrategyBudget, recorded: Recorded) -> str:
    """The predicted minimum, with (predicted − measured) as a share of the model where a minimum was measured;
    ``no prediction (why)`` without one."""
    want = _predicted(recorded)
    if want is None:
        return recorded.text_without
    text = format_gib(want, gib_decimals(record.model_bytes))
    if strategy.status == "ok" and strategy.minimum_bytes is not None:
        text += f" ({format_percent((want - strategy.minimum_bytes) / record.model_bytes)})"
    return text


def started_from_prediction(record: BudgetRecord) -> bool:
    """Whether any strategy's search started from its predicted minimum (a run of phase ``predicted``)."""
    return any(a.phase == "predicted" for s in record.strategies.values() for a in s.attempts)


def _search_count(strategy: StrategyBudget) -> int:
    return sum(1 for a in strategy.attempts if a.phase in SEARCH_PHASES)


def _verdicts(strategy: StrategyBudget) -> dict[int, bool]:
    runs: dict[int, list[bool]] = {}
    for a in strategy.attempts:
        if a.phase in SEARCH_PHASES:
            runs.setdefault(a.limit_bytes, []).append(a.completed)
    return {limit: 2 * sum(outcomes) > len(outcomes) for limit, outcomes in runs.items()}


def search_lines(record: BudgetRecord, found: dict[str, Recorded]) -> list[str]:
    """Per swept strategy: the search's runs, and the count from the other start (see the module docstring)."""
    lines = []
    for name, s in record.strategies.items():
        minimum, lower, upper = s.minimum_bytes, s.lower_bytes, s.upper_bytes
        if s.status != "ok" or minimum is None or lower is None or upper is None:
            continue
        used = _search_count(s)
        known = _verdicts(s)
        want = _predicted(found[name])

        def completes(limit: int, known: dict[int, bool] = known, minimum: int = minimum) -> bool:
            return known.get(limit, limit >= minimum)

        from_prediction = any(a.phase == "predicted" for a in s.attempts)
        d = gib_decimals(record.model_bytes)
        if from_prediction:
            other = search_runs(completes, lower, upper, record.precision_bytes)
            lines.append(f"- {name}: {used} search runs, starting from the predicted minimum "
                         f"({format_gib(want, d) if want is not None else 'its prediction'}); without a prediction "
                         f"the sweep would have made {other}.")
        elif want is None:
            lines.append(f"- {name}: {used} search runs, without a prediction ({found[name].text_without}).")
        else:
            other = search_runs(completes, lower, upper, record.precision_bytes, start=want)
            why = ("the sweep predates starting from one" if lower < want < upper
                   else "it lies outside the search's bounds")
            lines.append(f"- {name}: {used} search runs, without a prediction ({why}); from the predicted minimum "
                         f"({format_gib(want, d)}) the sweep would have made {other}.")
    return lines


def finding_lines(record: BudgetRecord, found: dict[str, Recorded]) -> list[str]:
    """A measured minimum more than :data:`~harness.predict.recorded.FINDING_SHARE` of the model from its prediction:
    a finding."""
    model = record.model_bytes
    lines = []
    for name, s in record.strategies.items():
        want = _predicted(found[name])
        if want is None or s.status != "ok" or s.minimum_bytes is None:
            continue
        if is_finding(want, s.minimum_bytes, model):
            lines.append(finding_sentence(name, "smallest limit", want, s.minimum_bytes, model))
    return lines
