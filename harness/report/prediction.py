"""The prediction beside each measurement of a run's report: the table's two columns, a detail line per strategy
and the observation that names a finding.

Every figure here comes from :func:`harness.predict.recorded.run_prediction` at render time, so a committed result
gains it when re-rendered; where its record lacks what the rules need, the report says ``no prediction (why)``.
"""

from __future__ import annotations

from harness.predict.recorded import FINDING_SHARE, Recorded, is_finding, run_prediction
from harness.predict.rules import NO_GPU_RULE
from harness.report.text import format_percent, gib_decimals
from harness.results.labels import BUILD_HOST_PEAK, WHOLE_RUN_GPU_PEAK, WHOLE_RUN_HOST_PEAK
from harness.results.reading import Results
from harness.units import DASH, format_gib

__all__ = ["BUILD_PEAK", "GPU_PEAK", "GPU_PREDICTION_NOTE", "NO_PREDICTION", "PREDICTION_NOTE", "error_cell",
           "finding_observations", "finding_sentence", "predicted_cell", "prediction_detail", "prediction_note",
           "predictions"]

NO_PREDICTION = "no prediction"
"""The table's cell where there is none (the strategy's detail line says why)."""

PREDICTION_NOTE = ("Predicted: each strategy's build-phase host peak as `python -m harness predict` gives it before "
                   "a run, from this run's own engines and measured baseline, computed when the report is rendered "
                   "(rules in `harness/predict/rules.py`); predicted − measured as a share of the model, the sign of "
                   "the README's table of `predict --check`.")
"""The sentence under the table that says what the prediction columns hold."""

GPU_PREDICTION_NOTE = ("On a GPU, the predicted whole-run GPU peak beside the measured one, and predicted − measured "
                       "as a share of the model: the rule's figure and NVML `used` are both above the GPU baseline "
                       "the run takes once CUDA is initialised on the device (its context in neither), so neither is "
                       "converted.")
"""The sentence added to :data:`PREDICTION_NOTE` where the run measured the GPU."""

BUILD_PEAK = "build_peak_bytes"
"""The build-phase host peak, by its record name: the figure of the table's first pair of prediction columns."""

GPU_PEAK = "gpu_peak_bytes"
"""The whole-run GPU peak, by its record name: the figure of the prediction columns of a run that measured the GPU.
:class:`~harness.predict.rules.Prediction` and :class:`~harness.results.record.StrategyRecord` both hold it above
the GPU baseline taken once the CUDA context exists (every committed layout took that baseline after the context),
so the two are compared as they are."""

_FIGURES = {BUILD_PEAK: BUILD_HOST_PEAK, "host_peak_bytes": WHOLE_RUN_HOST_PEAK, GPU_PEAK: WHOLE_RUN_GPU_PEAK}
"""The measured figures a prediction is set beside, by their record names (``None`` in a record that did not
measure one, the GPU's off a GPU)."""


def prediction_note(run: Results) -> str:
    """The sentence under the table: :data:`PREDICTION_NOTE`, and :data:`GPU_PREDICTION_NOTE` where the run measured
    the GPU (its table then has the GPU's prediction columns)."""
    return PREDICTION_NOTE + (f" {GPU_PREDICTION_NOTE}" if run.gpu_measured else "")


def predictions(run: Results) -> dict[str, Recorded]:
    """Each strategy's prediction from the run's record, in the order they ran."""
    return {name: run_prediction(run, name) for name in run.record.strategies}


def _pairs(run: Results, name: str, recorded: Recorded) -> dict[str, tuple[int, int]]:
    """Figure -> (predicted, measured) for each figure both have; the whole-run peak only where it differs from the
    build phase's, predicted or measured (where the load holds no more than the build, it is the same pair)."""
    measured = run.record.strategies[name]
    if recorded.prediction is None or not measured.ok:  # a strategy that did not finish measured part of the build
        return {}
    pairs = {}
    for figure in _FIGURES:
        want, got = getattr(recorded.prediction, figure), getattr(measured, figure)
        if want is not None and got is not None:
            pairs[figure] = (want, got)
    if pairs.get("host_peak_bytes") == pairs.get("build_peak_bytes"):
        pairs.pop("host_peak_bytes", None)
    return pairs


def _predicted(recorded: Recorded, figure: str) -> int | None:
    return None if recorded.prediction is None else getattr(recorded.prediction, figure)


def predicted_cell(recorded: Recorded, decimals: int, figure: str = BUILD_PEAK) -> str:
    """The predicted ``figure`` (:data:`BUILD_PEAK` or :data:`GPU_PEAK`), or :data:`NO_PREDICTION` (the strategy's
    detail line says why)."""
    predicted = _predicted(recorded, figure)
    return NO_PREDICTION if predicted is None else format_gib(predicted, decimals)


def error_cell(run: Results, name: str, recorded: Recorded, figure: str = BUILD_PEAK) -> str:
    """(predicted − measured) ``figure`` as a signed share of the model; a dash without both."""
    pair = _pairs(run, name, recorded).get(figure)
    if pair is None:
        return DASH
    return format_percent((pair[0] - pair[1]) / run.record.model.bytes)


def prediction_detail(run: Results, name: str) -> str:
    """The strategy's detail line: each predicted figure beside the measured one, or why there is none."""
    recorded = run_prediction(run, name)
    if recorded.prediction is None:
        return recorded.text_without
    d, model = gib_decimals(run.record.model.bytes), run.record.model.bytes
    if not run.record.strategies[name].ok:
        return ("predicted from this run's sizes and the baseline of a strategy of it that finished (`python -m "
                f"harness predict`, rule `{recorded.prediction.note}`), what it would have needed to finish: "
                + "; ".join(f"{label} {format_gib(getattr(recorded.prediction, figure), d)}"
                            for figure, label in _FIGURES.items()
                            if getattr(recorded.prediction, figure) is not None))
    parts = [f"{_FIGURES[f]} {format_gib(want, d)} (measured {format_gib(got, d)}, "
             f"{format_percent((want - got) / model)} of the model)"
             for f, (want, got) in _pairs(run, name, recorded).items()]
    if run.record.strategies[name].gpu_peak_bytes is not None and recorded.prediction.gpu_peak_bytes is None:
        parts.append(f"{WHOLE_RUN_GPU_PEAK}: {NO_PREDICTION} ({NO_GPU_RULE})")
    return ("predicted before the run from its plan's sizes and its baseline (`python -m harness predict`, rule "
            f"`{recorded.prediction.note}`): " + ("; ".join(parts) or "no figure of it was measured"))


def finding_sentence(name: str, figure: str, predicted: int, measured: int, model_bytes: int) -> str:
    """The observation that ``name``'s ``figure`` was measured more than
    :data:`~harness.predict.recorded.FINDING_SHARE` of the model from its prediction, and which way."""
    d, gap = gib_decimals(model_bytes), abs(measured - predicted)
    why = ("the run held memory the rules of `harness/predict/rules.py` do not describe" if measured > predicted
           else "the rules of `harness/predict/rules.py` count memory the run did not hold")
    return (f"- **{name}**'s {figure} {format_gib(measured, d)} lies {format_gib(gap, d)} ({gap / model_bytes:.1%} "
            f"of the model) {'above' if measured > predicted else 'below'} its prediction of "
            f"{format_gib(predicted, d)}, more than {FINDING_SHARE:.0%}: a finding, not a failure ({why}).")


def finding_observations(run: Results) -> list[str]:
    """One observation per measured figure more than :data:`~harness.predict.recorded.FINDING_SHARE` of the model
    from its prediction (none where every figure lies within it)."""
    model = run.record.model.bytes
    lines = []
    for name, recorded in predictions(run).items():
        for figure, (want, got) in _pairs(run, name, recorded).items():
            if is_finding(want, got, model):
                lines.append(finding_sentence(name, _FIGURES[figure], want, got, model))
    return lines
