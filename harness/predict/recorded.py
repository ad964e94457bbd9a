"""The prediction beside a measurement: what :func:`~harness.predict.rules.predict_strategy` gives for a run or a
budget sweep from what it recorded (the plan's sizes, the baseline it measured), computed when a report is rendered.

:func:`inputs_of_run` and :func:`inputs_of_budget` turn a record into the predictor's inputs; :func:`run_prediction`
and :func:`budget_prediction` give a :class:`Recorded`: the prediction, or why there is none (a record of a layout
that lacks what the rules need, a strategy no rule covers, one that did not finish). A figure measured more than
:data:`FINDING_SHARE` of the model away from its prediction is a finding (:func:`is_finding`): the run held
something the rules do not describe, which the report says, not a failure of the run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.backends import compiler_backends
from harness.budget.record import BudgetRecord
from harness.fileio.codec import RecordError
from harness.predict.inputs import Baseline, PredictInputs, budget_plan_inputs
from harness.predict.rules import Prediction, predict_strategy
from harness.results.metrics import SampleColumns, baseline_anon_bytes
from harness.results.reading import Results

if TYPE_CHECKING:
    from harness.plan import Plan

__all__ = ["FINDING_SHARE", "Recorded", "budget_prediction", "inputs_of_budget", "inputs_of_plan", "inputs_of_run",
           "is_finding", "predicted_minimum", "run_prediction"]

FINDING_SHARE = 0.10
"""How far, as a share of the model, a measurement may lie from its prediction before the report calls it a
finding."""


def is_finding(predicted: int, measured: int, model_bytes: int) -> bool:
    """Whether ``measured`` lies more than :data:`FINDING_SHARE` of the model from ``predicted``."""
    return abs(measured - predicted) > FINDING_SHARE * model_bytes


@dataclass(frozen=True)
class Recorded:
    """A strategy's prediction from its record (``prediction``), or ``None`` and why not (``why``)."""

    prediction: Prediction | None
    why: str = ""

    @property
    def text_without(self) -> str:
        """``no prediction (why)``."""
        return f"no prediction ({self.why})"


def inputs_of_run(results: Results, strategy: str) -> PredictInputs:
    """A finished strategy of a run as the predictor's inputs: the run's engines in build order, its model, device
    and backend, and that strategy's own measured baseline (RSS from its record, anonymous from its samples)."""
    record = results.record
    run = record.strategies[strategy]
    assert run.baseline_rss_bytes is not None
    columns = SampleColumns.of(results.samples[strategy])
    anon = baseline_anon_bytes(columns, run.phases)
    engines = tuple(e.weight_bytes for e in sorted(run.engines, key=lambda e: e.index))
    return PredictInputs(
        model_bytes=record.model.bytes, engine_bytes=engines, device=record.device, backend=record.backend,
        compiler_weights=run.compiler_weights, strategies=(strategy,),
        baseline=Baseline(run.baseline_rss_bytes, anon if anon is not None else run.baseline_rss_bytes),
        source=f"results/{record.name}")


def inputs_of_budget(directory: Path, record: BudgetRecord, strategy: str) -> PredictInputs:
    """A swept strategy as the predictor's inputs: the sweep's plan's engines and weight setting
    (:func:`~harness.predict.inputs.budget_plan_inputs`), and that strategy's unconstrained baseline."""
    swept = record.strategies[strategy]
    engines, weights = budget_plan_inputs(directory)
    assert swept.baseline_rss_bytes is not None and swept.baseline_anon_bytes is not None
    return PredictInputs(
        model_bytes=record.model_bytes, engine_bytes=engines, device=record.device, backend=record.backend,
        compiler_weights=weights if record.backend in compiler_backends() else None, strategies=(strategy,),
        baseline=Baseline(swept.baseline_rss_bytes, swept.baseline_anon_bytes), source=f"results/{record.name}")


def inputs_of_plan(plan: Plan, strategy: str, baseline: Baseline) -> PredictInputs:
    """A budget sweep's strategy as the predictor's inputs while the sweep runs, before its record exists: the same
    sizes :func:`inputs_of_budget` reads back from the ``plan.json`` it keeps, and the unconstrained run's
    ``baseline``."""
    build = plan.scenario.build
    return PredictInputs(
        model_bytes=plan.model.bytes, engine_bytes=tuple(e.weight_bytes for e in plan.engines), device=plan.device,
        backend=build.backend, compiler_weights=build.compiler_weights,
        strategies=(strategy,), baseline=baseline, source=f"the plan of {plan.name}")


def predicted_minimum(plan: Plan, strategy: str, baseline_rss_bytes: int, baseline_anon_bytes: int) -> int | None:
    """``strategy``'s predicted smallest memory limit from a budget sweep's ``plan`` and its unconstrained run's
    baseline: where budget mode starts its bisection (:data:`harness.budget.mode.StartOf`)."""
    inputs = inputs_of_plan(plan, strategy, Baseline(baseline_rss_bytes, baseline_anon_bytes))
    return predict_strategy(inputs, strategy).minimum_bytes


def _covered(prediction: Prediction) -> Recorded:
    if prediction.build_peak_bytes is None:
        return Recorded(None, prediction.note)
    return Recorded(prediction)


def run_prediction(results: Results, strategy: str) -> Recorded:
    """``strategy``'s prediction from what ``results`` recorded (see the module docstring)."""
    run = results.record.strategies[strategy]
    if not run.ok:  # what it would have needed: the sizes and baseline of a strategy of the same run that finished
        finished = next((name for name, other in results.record.strategies.items()
                         if other.ok and other.baseline_rss_bytes is not None and other.engines), None)
        if finished is None:
            return Recorded(None, "it did not finish, and no strategy of this run finished to give its engines and "
                                  "baseline")
        inputs = dataclasses.replace(inputs_of_run(results, finished), strategies=(strategy,))
        return _covered(predict_strategy(inputs, strategy))
    if run.baseline_rss_bytes is None:
        return Recorded(None, f"layout {results.record.layout} records no baseline RSS")
    if not run.engines:
        return Recorded(None, f"layout {results.record.layout} records no engine's weights")
    return _covered(predict_strategy(inputs_of_run(results, strategy), strategy))


def budget_prediction(directory: Path, record: BudgetRecord, strategy: str) -> Recorded:
    """``strategy``'s prediction from what the sweep in ``directory`` recorded (its ``plan.json`` and the
    unconstrained run's baseline)."""
    swept = record.strategies[strategy]
    if swept.baseline_rss_bytes is None or swept.baseline_anon_bytes is None:
        return Recorded(None, "the unconstrained run recorded no baseline")
    try:
        inputs = inputs_of_budget(directory, record, strategy)
    except (RecordError, OSError) as exc:
        return Recorded(None, f"the sweep's plan cannot be read: {exc}")
    return _covered(predict_strategy(inputs, strategy))
