"""The export phase: ``torch.export.export`` of a model whose weights are already in place.

Map first, then export: a model still on the meta device cannot be exported with real
inputs, and once its weights are mapped views, export traces with fake copies of them and
reads none of their bytes. The program it returns holds the model's own tensors in its
``state_dict`` and ``constants``: for a mapped model, the mapped views themselves.

:func:`export_mapped` measures what the phase cost, so that "export reads nothing and
copies nothing" is a figure, not an assumption:

* the checkpoint's pages this process has mapped (``/proc/self/smaps``, the ``Rss`` of the
  checkpoint's mappings) before and after: their growth is what export read through the views;
* the checkpoint's page-cache residency (``mincore``/``cachestat``) before and after: its
  growth is what anyone brought in; meaningful on a cold cache;
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
from harness.results.record import ExportRecord
from weightmap import collect_targets

__all__ = ["ExportResult", "export_mapped", "shared_with_model"]


@dataclass(frozen=True)
class ExportResult:
    """An exported program and what exporting it cost.

    ``record``: the figures, as the results keep them (:class:`~harness.results.record.ExportRecord`;
    byte figures None where they could not be measured: no checkpoint given, or the kernel refused the
    ``VmHWM`` reset). ``shared``: program tensors that are the model's tensor of the same name (same
    memory); ``not_shared``: program tensors whose memory is not the model's (copies, or tensors
    export made: lifted constants).
    """

    program: ExportedProgram
    record: ExportRecord
    shared: tuple[str, ...] = field(default_factory=tuple)
    not_shared: tuple[str, ...] = field(default_factory=tuple)


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
        record=ExportRecord(
            seconds=round(seconds, 3),
            nodes=len(program.graph.nodes),
            pages_read_bytes=None if ckpt_before is None or ckpt_after is None else ckpt_after - ckpt_before,
            residency_read_bytes=(None if resident_before is None or resident_after is None
                                  else resident_after - resident_before),
            rss_before_bytes=before.rss_bytes,
            rss_after_bytes=after.rss_bytes,
            hwm_bytes=hwm,
            anon_delta_bytes=after.anon_bytes - before.anon_bytes,
            not_shared=len(not_shared),
        ),
        shared=tuple(shared),
        not_shared=tuple(not_shared),
    )
