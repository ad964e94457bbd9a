"""Turning each strategy's raw files into the figures of ``summary.json``.

Every peak is the larger of what the sampler saw and what the kernel's
high-water marks say, so a spike between two samples still counts:

* ``host_peak_bytes``: the whole run: samples, the VmHWM of the load phase
  (read at partitioning) and each engine's VmHWM;
* ``anon_peak_bytes``: samples of ``RssAnon`` (the kernel keeps no anonymous
  high-water mark);
* ``host_gpu_peak_bytes``: the build phase only, from partitioning to the end
  of the last engine: samples of RSS + GPU, and each engine's VmHWM plus the
  GPU memory in use at its end (GPU use only grows while an engine is built);
* ``floor_bytes`` and ``excess_over_floor``: see :mod:`harness.floor`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from harness.floor import floor_bytes


def _max(*values: Any) -> int | None:
    present = [int(v) for v in values if v is not None and not pd.isna(v)]
    return max(present) if present else None


def _samples(path: Path) -> pd.DataFrame | None:
    if not path.exists() or path.stat().st_size == 0:
        return None
    frame = pd.read_csv(path)
    return frame if len(frame) else None


def _build_phase(frame: pd.DataFrame, phases: dict[str, float]) -> pd.DataFrame:
    start, end = phases.get("partition_s"), phases.get("build_end_s")
    if start is None:
        return frame.iloc[0:0]
    if end is None:
        return frame[frame["t_s"] >= start]
    return frame[(frame["t_s"] >= start) & (frame["t_s"] <= end)]


def strategy_summary(raw: dict[str, Any], samples: pd.DataFrame | None, device: str,
                     model_bytes: int) -> dict[str, Any]:
    """One strategy's entry of ``summary.json`` from its record and its samples."""
    engines = raw.get("engines", [])
    hwms = [e.get("host_hwm_bytes") for e in engines]
    gpu_at_end = [e.get("gpu_used_bytes") for e in engines]
    has_gpu = samples is not None and samples["gpu_used_bytes"].notna().any()
    host_peak = _max(raw.get("load_hwm_bytes"), *hwms,
                     samples["rss_bytes"].max() if samples is not None else None)
    anon_peak = _max(samples["anon_bytes"].max()) if samples is not None else None
    gpu_peak = _max(samples["gpu_used_bytes"].max()) if has_gpu and samples is not None else None

    build = _build_phase(samples, raw.get("phases", {})) if samples is not None else None
    if build is not None and len(build):
        gpu_column = build["gpu_used_bytes"].fillna(0) if has_gpu else 0
        sampled = (build["rss_bytes"] + gpu_column).max()
    else:
        sampled = None
    kernel = [h + (g or 0) for h, g in zip(hwms, gpu_at_end, strict=False) if h is not None]
    host_gpu_peak = _max(sampled, *kernel)

    phases = raw.get("phases", {})
    wall = None
    if "load_start_s" in phases and "build_end_s" in phases:
        wall = phases["build_end_s"] - phases["load_start_s"]
    entry: dict[str, Any] = {
        "status": raw.get("status", "failed"),
        "error": raw.get("error"),
        "note": raw.get("note", ""),
        "baseline_rss_bytes": raw.get("baseline_rss_bytes"),
        "host_at_partitioning_bytes": raw.get("host_at_partitioning_bytes"),
        "host_peak_bytes": host_peak,
        "anon_peak_bytes": anon_peak,
        "gpu_peak_bytes": gpu_peak,
        "host_gpu_peak_bytes": host_gpu_peak,
        "wall_s": round(wall, 3) if wall is not None else None,
        "process_wall_s": round(raw.get("process_wall_s", 0.0), 3),
        "phases": {k: round(v, 6) for k, v in phases.items()},
        "samples": raw.get("samples", 0),
        "mean_interval_ms": raw.get("mean_interval_ms"),
        "max_gap_ms": raw.get("max_gap_ms"),
        "peak_source": raw.get("peak_source"),
        "engine_cap_bytes": raw.get("engine_cap_bytes"),
        "released_bytes": raw.get("released_bytes", 0),
        "unreleased_bytes": raw.get("unreleased_bytes", 0),
        "release_note": raw.get("release_note", ""),
        "engines": [
            {k: e.get(k) for k in ("index", "weight_bytes", "start_s", "end_s", "host_hwm_bytes",
                                   "released_bytes", "rss_after_bytes", "gpu_used_bytes")}
            for e in engines
        ],
    }
    entry["floor_bytes"] = None
    entry["excess_over_floor"] = None
    if entry["status"] == "ok" and engines and entry["baseline_rss_bytes"] is not None:  # partial builds: no floor
        floor = floor_bytes(entry, device)
        entry["floor_bytes"] = floor
        compared = host_gpu_peak
        if compared is not None and model_bytes:
            entry["excess_over_floor"] = round((compared - floor) / model_bytes, 6)
    return entry


def failed_entry(reason: str) -> dict[str, Any]:
    """The entry of a strategy that left no record (killed before it could write one)."""
    return strategy_summary({"status": "failed", "error": reason}, None, "cpu", 0)


def load_raw(out: Path, strategy: str) -> tuple[dict[str, Any] | None, pd.DataFrame | None]:
    """A strategy's record (None when it never wrote one) and its samples (None when none)."""
    record = out / f"strategy-{strategy}.json"
    raw = json.loads(record.read_text()) if record.exists() else None
    return raw, _samples(out / f"samples-{strategy}.csv")
