"""What readers call each memory figure, declared once: the table's headers, the comparison's rows, the colours
of the comparison figure and the label of the peak compared with the floor all take their words from here.

Each is a figure of :mod:`harness.results.metrics` or of the measured record:

=============================  ==================================================================================
:data:`BUILD_HOST_PEAK`        ``StrategyRecord.build_peak_bytes``: the build phase's host peak
:data:`BUILD_HOST_GPU_PEAK`    ``StrategyRecord.host_gpu_peak_bytes``: the build phase's host + GPU peak
:data:`FLOOR`                  ``StrategyMetrics.floor_bytes``
:data:`EXCESS`                 the peak compared with the floor, less the floor (the comparison's row, in bytes and
                               as a share of the model); the table shows it as a share of the model only, under
                               :data:`EXCESS_SHARE`: this label with that unit
:data:`WHOLE_RUN_HOST_PEAK`    ``StrategyRecord.host_peak_bytes``: the whole run's host peak, the load included
:data:`ANON_ABOVE_BASELINE`    ``StrategyMetrics.anon_above_baseline_bytes``
:data:`WHOLE_RUN_GPU_PEAK`     ``StrategyRecord.gpu_peak_bytes``: the whole run's GPU peak
:data:`PREDICTED_BUILD_PEAK`   ``Prediction.build_peak_bytes`` (:mod:`harness.predict`), from the run's sizes and
                               baseline, beside :data:`BUILD_HOST_PEAK`
:data:`PREDICTION_ERROR`       (predicted − measured) build-phase host peak, as a share of the model, the sign of
                               ``predict --check``'s error
:data:`PREDICTED_GPU_PEAK`     ``Prediction.gpu_peak_bytes``, beside :data:`WHOLE_RUN_GPU_PEAK` (both above the GPU
                               baseline taken once the CUDA context exists)
:data:`GPU_PREDICTION_ERROR`   (predicted − measured) whole-run GPU peak, as a share of the model, the same sign
=============================  ==================================================================================
"""

from __future__ import annotations

__all__ = [
    "ANON_ABOVE_BASELINE",
    "BUILD_HOST_GPU_PEAK",
    "BUILD_HOST_PEAK",
    "EXCESS",
    "EXCESS_SHARE",
    "FLOOR",
    "GPU_PREDICTION_ERROR",
    "PREDICTED_BUILD_PEAK",
    "PREDICTED_GPU_PEAK",
    "PREDICTION_ERROR",
    "WHOLE_RUN_GPU_PEAK",
    "WHOLE_RUN_HOST_PEAK",
]

BUILD_HOST_PEAK = "build-phase host peak"
BUILD_HOST_GPU_PEAK = "build-phase host + GPU peak"
FLOOR = "floor"
EXCESS = "excess over floor"
EXCESS_SHARE = f"{EXCESS} (% of model)"
WHOLE_RUN_HOST_PEAK = "whole-run host peak"
ANON_ABOVE_BASELINE = "anonymous peak above baseline"
WHOLE_RUN_GPU_PEAK = "whole-run GPU peak"
PREDICTED_BUILD_PEAK = f"predicted {BUILD_HOST_PEAK}"
PREDICTION_ERROR = "predicted − measured (% of model)"
PREDICTED_GPU_PEAK = f"predicted {WHOLE_RUN_GPU_PEAK}"
GPU_PREDICTION_ERROR = f"GPU {PREDICTION_ERROR}"
