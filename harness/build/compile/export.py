"""The export phase: ``torch.export.export`` of a model whose weights are already in place.

Map first, then export: a model still on the meta device cannot be exported with real
inputs, and once its weights are mapped views, export traces with fake copies of them and
reads none of their bytes. The program it returns holds the model's own tensors in its
``state_dict`` and ``constants``: for a mapped model, the mapped views themselves.

:func:`export_mapped` measures what the phase cost, so that "export reads nothing and
copies nothing" is a figure, not an assumption:

* the checkpoint's pages this process has mapped (``/proc/self/smaps``, the ``Rss`` of the
  checkpoint's mappings) before and after: pages export read through the views;
* the checkpoint's page-cache residency (``mincore``/``cachestat``) before and after:
  pages anyone brought in; meaningful on a cold cache;
* host memory: RSS and anonymous RSS before and after, and the kernel's high-water mark
  over the phase (``VmHWM`` reset at its start);
* whether each program tensor shares its memory with the model's tensor of that name.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from harness.measure.procfs import PeakTracker, mapping_rss, read_status
from harness.measure.residency import FileResidency
from weightmap.targets import collect_targets

__all__ = ["ExportResult", "export_mapped", "shared_with_model"]


@dataclass(frozen=True)
class ExportResult:
    """An exported program and what exporting it cost.

    Byte figures are None where they could not be measured (no checkpoint given, or the
    kernel refused the ``VmHWM`` reset). ``checkpoint_rss_*``: this process's resident pages
    of the checkpoint files; their growth is what export read through the mapped views.
    ``residency_*``: the files' page-cache residency. ``shared``: program tensors that are
    the model's tensor of the same name (same memory); ``not_shared``: program tensors whose
    memory is not the model's (copies, or tensors export made: lifted constants).
    """

    program: ExportedProgram
    seconds: float
    nodes: int
    rss_before_bytes: int
    rss_after_bytes: int
    anon_before_bytes: int
    anon_after_bytes: int
    hwm_bytes: int | None
    checkpoint_rss_before_bytes: int | None
    checkpoint_rss_after_bytes: int | None
    residency_before_bytes: int | None
    residency_after_bytes: int | None
    shared: tuple[str, ...] = field(default_factory=tuple)
    not_shared: tuple[str, ...] = field(default_factory=tuple)

    @property
    def pages_read_bytes(self) -> int | None:
        """Checkpoint bytes this process faulted in during export (growth of its mapped pages)."""
        if self.checkpoint_rss_before_bytes is None or self.checkpoint_rss_after_bytes is None:
            return None
        return self.checkpoint_rss_after_bytes - self.checkpoint_rss_before_bytes

    @property
    def peak_over_baseline_bytes(self) -> int | None:
        """How far RSS rose above its value at the start of export, at its highest."""
        return None if self.hwm_bytes is None else self.hwm_bytes - self.rss_before_bytes

    def summary(self) -> dict[str, Any]:
        """The figures as a flat dict (no program), for results files."""
        return {
            "seconds": round(self.seconds, 3),
            "nodes": self.nodes,
            "rss_before_bytes": self.rss_before_bytes,
            "rss_after_bytes": self.rss_after_bytes,
            "anon_delta_bytes": self.anon_after_bytes - self.anon_before_bytes,
            "hwm_bytes": self.hwm_bytes,
            "peak_over_baseline_bytes": self.peak_over_baseline_bytes,
            "pages_read_bytes": self.pages_read_bytes,
            "residency_before_bytes": self.residency_before_bytes,
            "residency_after_bytes": self.residency_after_bytes,
            "shared": len(self.shared),
            "not_shared": list(self.not_shared),
        }


def _model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: target.tensor for target in collect_targets(model) for name in target.names}


def shared_with_model(program: ExportedProgram, model: torch.nn.Module) -> tuple[list[str], list[str]]:
    """Split the program's tensors into those that are the model's memory and those that are not.

    A program tensor is *shared* when the model has a tensor of the same name with the same
    data pointer, storage size, dtype and shape (so writing one would write the other).
    """
    own = _model_tensors(model)
    shared: list[str] = []
    not_shared: list[str] = []
    tensors: dict[str, Any] = {**program.state_dict, **program.constants}
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            continue
        mine = own.get(name)
        same = (
            mine is not None
            and mine.device == tensor.device
            and mine.dtype == tensor.dtype
            and mine.shape == tensor.shape
            and mine.data_ptr() == tensor.data_ptr()
            and mine.untyped_storage().nbytes() == tensor.untyped_storage().nbytes()
        )
        (shared if same else not_shared).append(name)
    return shared, not_shared


def _checkpoint_rss(paths: list[Path]) -> int | None:
    return sum(mapping_rss(p) for p in paths) if paths else None


def export_mapped(
    model: torch.nn.Module,
    example_inputs: tuple[Any, ...],
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    checkpoint: Iterable[str | os.PathLike[str]] = (),
    strict: bool = False,
    track_peak: bool = True,
) -> ExportResult:
    """``torch.export.export(model, example_inputs)`` measured as a phase of its own.

    ``model`` must hold real tensors (mapped views, loaded weights): export a model on the
    meta device and torch refuses it; call ``weightmap.map_weights`` and fill the
    non-persistent buffers first. ``checkpoint`` names the files whose pages are counted
    (``MappedWeights.paths``); with none, the page figures are None. ``track_peak=False``
    leaves ``VmHWM`` alone (for a caller that measures the phase itself). Errors from
    export propagate unchanged; the model is not modified.
    """
    meta = [name for name, t in _model_tensors(model).items() if t.device.type == "meta"]
    if meta:
        shown = ", ".join(meta[:3]) + (f" and {len(meta) - 3} more" if len(meta) > 3 else "")
        raise ValueError(f"cannot export a model with tensors on the meta device ({shown}): map its weights first")
    paths = [Path(p) for p in checkpoint]
    residency = FileResidency(paths) if paths else None
    try:
        tracker = PeakTracker()
        before = read_status()
        ckpt_before = _checkpoint_rss(paths)
        resident_before = residency.resident_bytes() if residency else None
        if track_peak:
            tracker.begin()
        start = time.perf_counter()
        program = torch.export.export(model, tuple(example_inputs), dict(example_kwargs or {}), strict=strict)
        seconds = time.perf_counter() - start
        hwm = tracker.end() if track_peak else None
        after = read_status()
        ckpt_after = _checkpoint_rss(paths)
        resident_after = residency.resident_bytes() if residency else None
    finally:
        if residency is not None:
            residency.close()
    shared, not_shared = shared_with_model(program, model)
    return ExportResult(
        program=program,
        seconds=seconds,
        nodes=len(program.graph.nodes),
        rss_before_bytes=before.rss_bytes,
        rss_after_bytes=after.rss_bytes,
        anon_before_bytes=before.anon_bytes,
        anon_after_bytes=after.anon_bytes,
        hwm_bytes=hwm,
        checkpoint_rss_before_bytes=ckpt_before,
        checkpoint_rss_after_bytes=ckpt_after,
        residency_before_bytes=resident_before,
        residency_after_bytes=resident_after,
        shared=tuple(shared),
        not_shared=tuple(not_shared),
    )
