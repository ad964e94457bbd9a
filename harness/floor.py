"""The floor under each strategy's peak, and how far above it a strategy lands.

While an engine is built its weights are resident in host memory and the engine's own copy of
them exists too. That gives every strategy a peak it cannot go under, whatever its loader does:

* Engines written to files (no GPU): only one engine is held at a time, so the build-phase host
  peak is at least ``baseline + largest engine``.
* Engines built on the GPU accumulate there. While engine ``k`` is built, engines ``0..k-1`` sit in
  GPU memory, engine ``k``'s copy is being made and its weights are in host memory, so host + GPU
  is at least ``baseline + (e_0 + ... + e_k) + e_k``. The floor is the largest of these over ``k``.
  It is the tight form of the simple bound ``baseline + model + largest engine``: never above it,
  and equal to it when the largest engine is built last.

Engines are taken in index order, which is build order. Everything here is a pure function of the
figures passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate
from typing import Any

from harness.results import StrategyResult


def host_floor_bytes(baseline_bytes: int, engine_bytes: Sequence[int]) -> int:
    """Lowest possible build-phase host peak when engines leave the process (written to files)."""
    if not engine_bytes:
        raise ValueError("no engines: the floor is undefined")
    return int(baseline_bytes) + max(int(e) for e in engine_bytes)


def gpu_floor_bytes(baseline_bytes: int, engine_bytes: Sequence[int]) -> int:
    """Lowest possible build-phase host + GPU peak when engines accumulate in GPU memory.

    ``baseline + max over k of (e_0 + ... + e_k + e_k)``, with engines in build order.
    """
    if not engine_bytes:
        raise ValueError("no engines: the floor is undefined")
    sizes = [int(e) for e in engine_bytes]
    held_while_building = (total + size for total, size in zip(accumulate(sizes), sizes, strict=True))
    return int(baseline_bytes) + max(held_while_building)


def _baseline_and_engines(strategy: StrategyResult | Mapping[str, Any]) -> tuple[int | None, list[int]]:
    """The baseline RSS and engine sizes in build order, from a result or a summary mapping."""
    if isinstance(strategy, StrategyResult):
        ordered = sorted(strategy.engines, key=lambda e: e.index)
        return strategy.baseline_rss_bytes, [e.weight_bytes for e in ordered]
    items = sorted(strategy.get("engines") or [], key=lambda e: int(e["index"]))
    baseline = strategy.get("baseline_rss_bytes")
    return (None if baseline is None else int(baseline)), [int(e.get("weight_bytes") or 0) for e in items]


def floor_bytes(strategy: StrategyResult | Mapping[str, Any], device: str) -> int:
    """The floor for one strategy: :func:`gpu_floor_bytes` on a CUDA device, else :func:`host_floor_bytes`.

    ``strategy`` is a :class:`StrategyResult` or that strategy's mapping from ``summary.json``.
    Raises ``ValueError`` when the baseline or the engines are missing.
    """
    baseline, engines = _baseline_and_engines(strategy)
    if baseline is None:
        raise ValueError("no baseline RSS: the floor is undefined")
    if device.startswith("cuda"):
        return gpu_floor_bytes(baseline, engines)
    return host_floor_bytes(baseline, engines)


def floor_or_none(strategy: StrategyResult, device: str) -> int | None:
    """The floor of a strategy that ran to the end, else ``None``.

    A failed strategy built only some engines, so a floor over them would not be comparable.
    """
    if not strategy.ok:
        return None
    try:
        return floor_bytes(strategy, device)
    except ValueError:
        return None


def compared_peak_label(device: str) -> str:
    """Name of the figure that is compared to the floor on ``device``."""
    return "host + GPU peak" if device.startswith("cuda") else "build-phase host peak"


def build_peak_of(engine_hwm_bytes: Iterable[int | None], build_rss_bytes: Iterable[float]) -> int | None:
    """The larger of the engines' high-water marks and the RSS samples taken during the build phase.

    ``None`` entries and NaN samples are skipped; ``None`` when nothing is left.
    """
    values = [int(v) for v in engine_hwm_bytes if v is not None]
    values += [int(v) for v in build_rss_bytes if not math.isnan(v)]
    return max(values) if values else None


def build_host_peak_bytes(strategy: StrategyResult) -> int | None:
    """Host peak during the build phase: the engines' high-water marks and the samples marked ``build``."""
    samples = strategy.samples
    in_build = samples.loc[samples["phase"] == "build", "rss_bytes"] if len(samples) else []
    return build_peak_of((e.host_hwm_bytes for e in strategy.engines), (float(v) for v in in_build))


def compared_peak_bytes(strategy: StrategyResult, device: str) -> int | None:
    """The figure compared to the floor: ``host_gpu_peak_bytes`` on CUDA, else the build-phase host peak."""
    if device.startswith("cuda"):
        return strategy.host_gpu_peak_bytes
    return build_host_peak_bytes(strategy)


def excess_fraction(value: int | float, floor: int | float, model_bytes: int | float) -> float:
    """How far ``value`` is above ``floor``, as a fraction of the model: ``(value - floor) / model``.

    Negative when the value is under the floor, which points at a measurement that missed something.
    """
    if model_bytes <= 0:
        raise ValueError(f"model size must be positive, got {model_bytes}")
    return (float(value) - float(floor)) / float(model_bytes)

