"""Each strategy's memory predicted before any run, from sizes alone: :func:`predict` takes a plan's sizes and the
baseline (:class:`PredictInputs`) and returns a :class:`Prediction` per strategy. The rules are in
:mod:`harness.predict.rules`, checked against the committed results by :mod:`harness.predict.check`; the command is
:mod:`harness.predict.command`."""

from harness.predict.inputs import Baseline, PredictInputs
from harness.predict.rules import Prediction, predict, predict_strategy

__all__ = ["Baseline", "PredictInputs", "Prediction", "predict", "predict_strategy"]
