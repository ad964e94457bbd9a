"""What a prediction needs, and nothing that needs a weight: sizes, the device, the backend, the baseline.

:class:`PredictInputs` is what :func:`harness.predict.rules.predict` takes. It is made from a scenario resolved
without reading weights (:mod:`harness.predict.scenario`), or from a committed run or budget sweep
(:mod:`harness.predict.recorded`) to check the rules against what was measured.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.fileio.files import read_json_file
from harness.results.record import RecordError

__all__ = ["Baseline", "PredictInputs", "budget_plan_inputs"]


@dataclass(frozen=True)
class Baseline:
    """The process before it loads anything, in bytes: RSS (``rss_bytes``), its anonymous part (``anon_bytes``),
    and on a GPU the CUDA context (``gpu_context_bytes``, ``None`` off a GPU or where not measured)."""

    rss_bytes: int
    anon_bytes: int
    gpu_context_bytes: int | None = None


@dataclass(frozen=True)
class PredictInputs:
    """A plan's sizes: the model's bytes (``model_bytes``), each engine's weight bytes in build order
    (``engine_bytes``), the ``device`` engines are built on (``cpu``, ``cuda``...), the ``backend`` and its weight
    setting (``compiler_weights``, ``None`` for the ``copy`` backend), the ``strategies`` to predict, the
    ``baseline``, and where the sizes came from (``source``)."""

    model_bytes: int
    engine_bytes: tuple[int, ...]
    device: str
    backend: str
    compiler_weights: str | None
    strategies: tuple[str, ...]
    baseline: Baseline
    source: str = ""

    def __post_init__(self) -> None:
        if not self.engine_bytes:
            raise ValueError("no engines: nothing to predict")

    @property
    def largest_engine_bytes(self) -> int:
        return max(self.engine_bytes)

    def with_baseline(self, baseline: Baseline) -> PredictInputs:
        return replace(self, baseline=baseline)


def budget_plan_inputs(directory: Path) -> tuple[tuple[int, ...], str | None]:
    """A budget sweep's engines (weight bytes in build order) and its weight setting, from the ``plan.json`` it
    kept: the budget record states only their count and the largest. Read by key from every plan version written
    so far (each holds ``engines[].weight_bytes``; the weight setting under ``scenario.build.weights``, or none in
    version 1, which predates compiler backends); :class:`~harness.results.record.RecordError` naming the file and
    key otherwise."""
    path = Path(directory) / "plan.json"
    data: Any = read_json_file(path)
    engines = data.get("engines") if isinstance(data, dict) else None
    if not isinstance(engines, list) or not engines:
        raise RecordError(f"{path}: engines: expected a list of engines")
    sizes = []
    for i, engine in enumerate(engines):
        size = engine.get("weight_bytes") if isinstance(engine, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise RecordError(f"{path}: engines[{i}].weight_bytes: expected a whole number of bytes, got {size!r}")
        sizes.append(size)
    scenario = data.get("scenario")
    build = scenario.get("build") if isinstance(scenario, dict) else None
    weights = build.get("weights") if isinstance(build, dict) else None
    return tuple(sizes), weights if isinstance(weights, str) else None
