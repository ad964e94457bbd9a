"""The built model checked against eager in processes of their own, after the measured phases.

Run in the measuring process, the check's memory would be the build's: AOTInductor never
unloads a package it loaded, so every engine's weights stay until the process ends, and eager
(with its float32 reference for a bfloat16 model) comes on top of what the build left behind.
A strategy could then fail its check for memory its build no longer needed. So the check runs
in two processes started one after the other (:func:`check_in_processes`), each re-mapping
the checkpoint into a model built on the meta device:

1. ``built``: the engines loaded one at a time from their artifacts alone (an engine of
   ``mapped`` weights is handed the re-mapped model's tensors, as at its build), run on the
   entry's example inputs as one model (:class:`~harness.engines.compile.pipeline.CompiledPipeline`);
   its outputs are written for the next process;
2. ``eager``: eager on the same inputs, compared with those outputs
   (:func:`~harness.engines.compile.compare.compare_outputs`; a float32 run of eager judges
   both where a bfloat16 model differs beyond the outputs' tolerance).

Each process reports its host high-water mark (``VmHWM``, the checkpoint's mapped pages
included); the larger of the two is the check's peak (:attr:`Checked.peak_bytes`), recorded
beside the build's. The processes die with the one that started them (``PR_SET_PDEATHSIG``)
and run in its memory cgroup, if any.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

from harness.catalog import is_gpu
from harness.engines.compile.compare import Checked, OutputMatch, compare_outputs, upcast_reference
from harness.engines.compile.compiler import Artifact, EngineCompiler
from harness.engines.compile.pipeline import CompiledPipeline, Routing
from harness.engines.compile.source import ModelSource
from harness.fileio.atomic import atomic_file, write_atomic
from harness.measure.procfs import mapping_rss, read_peak, read_status
from harness.stopping import die_with_parent

__all__ = [
    "CheckProcessError",
    "CheckRequest",
    "EngineFiles",
    "check_in_processes",
    "compare_with_model",
    "engine_files",
    "model_tensors",
]

_STAGES = ("built", "eager")


class CheckProcessError(RuntimeError):
    """A check process failed (an error, a signal, no result); the message says which and why."""


@dataclass(frozen=True)
class EngineFiles:
    """What one engine is loaded from in a check process: its artifact ``path``; the names of the model's
    tensors it runs on (``model_tensors``, a ``mapped`` engine's weights, taken from the re-mapped model)
    and the program's own constants it runs on (``own``: lifted ``torch.tensor(...)`` values, small)."""

    path: Path
    model_tensors: tuple[str, ...] = ()
    own: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckRequest:
    """Everything the check processes need: the model ``source`` (re-mapped there), the ``compiler`` that
    loads the engines, the program's ``routing`` and the ``engines`` in build order."""

    source: ModelSource
    compiler: EngineCompiler
    routing: Routing
    engines: tuple[EngineFiles, ...]


def engine_files(artifact: Artifact, model_names: set[str]) -> EngineFiles:
    """How ``artifact`` is loaded elsewhere: the tensors it runs on named when they are the model's
    (``model_names``, the entry module's tensor names), copied when they are the program's own."""
    names = tuple(n for n in artifact.constants if n in model_names)
    own = {n: t.detach().to("cpu", copy=True) for n, t in artifact.constants.items() if n not in model_names}
    return EngineFiles(artifact.path, names, own)


def model_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s parameters and buffers by every name they have (a tied weight under each)."""
    named: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))
    return named


class _OnDemand:
    """An engine loaded when called, run once, and dropped (with its device copies of mapped weights)."""

    def __init__(self, compiler: EngineCompiler, files: EngineFiles, tensors: Mapping[str, torch.Tensor]) -> None:
        self.compiler, self.files, self.tensors = compiler, files, tensors

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        device = self.compiler.device
        constants = {n: self.tensors[n].to(device) for n in self.files.model_tensors}
        constants.update({n: t.to(device) for n, t in self.files.own.items()})
        engine = self.compiler.load(Artifact(self.files.path, constants))
        outputs = engine(*inputs)
        del engine, constants
        return outputs


def _mapped_reference(source: ModelSource) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """A fresh mapping of the checkpoint into the model built on meta; its entry module and inputs."""
    from harness.models import build_model, fill_non_persistent
    from weightmap import map_weights

    reference = build_model(source.config).module
    map_weights(reference, source.checkpoint, strict=True).close()
    fill_non_persistent(reference)
    entry = source.entry(reference)
    return entry.module, entry.args, entry.kwargs


def run_built(request: CheckRequest) -> Any:
    """The built model's outputs on the entry's example inputs, every engine loaded in turn from its artifact."""
    module, args, kwargs = _mapped_reference(request.source)
    tensors = model_tensors(module)
    missing = sorted({n for e in request.engines for n in e.model_tensors} - set(tensors))
    if missing:
        raise CheckProcessError(f"the re-mapped model has no tensor {missing[0]!r}, which an engine runs on")
    engines = [_OnDemand(request.compiler, files, tensors) for files in request.engines]
    pipeline = CompiledPipeline(request.routing, engines, request.compiler.device)
    with torch.no_grad():
        return pipeline(*args, **kwargs)


def compare_with_model(source: ModelSource, outputs: Any, device: str) -> OutputMatch:
    """``outputs`` against eager on a fresh mapping of ``source`` run on ``device``; where they differ beyond
    tolerance (a bfloat16 model), both judged against a float32 run of eager, if its copies fit."""
    from torch.utils import _pytree as pytree

    module, args, kwargs = _mapped_reference(source)
    if is_gpu(device):  # eager runs where the engines ran
        def move(value: Any) -> Any:
            return value.to(device) if isinstance(value, torch.Tensor) else value

        module = module.to(device)
        args, kwargs = pytree.tree_map(move, (args, kwargs))
    with torch.no_grad():
        want = module(*args, **kwargs)
    comparison = compare_outputs(outputs, want)
    if comparison.ok:
        return comparison
    upcast, why = upcast_reference(module, args, kwargs, free_bytes=_free_bytes(source, device))
    if upcast is None:
        return replace(comparison, detail=f"{comparison.detail}; {why}")
    return compare_outputs(outputs, want, upcast)


def _free_bytes(source: ModelSource, device: str) -> int:
    """Memory free for new tensors where eager runs: the GPU's free bytes, or the host's available memory,
    no more than the scenario's limit leaves above this process's RSS less the checkpoint's mapped pages."""
    if is_gpu(device):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    free = int(psutil.virtual_memory().available)
    if source.memory_limit_bytes is not None:  # the checkpoint's mapped pages leave RSS as the copies are made
        mapped = sum(mapping_rss(f) for f in source.files)
        free = min(free, source.memory_limit_bytes - (read_status().rss_bytes - mapped))
    return free


def check_in_processes(request: CheckRequest, workdir: Path) -> Checked:
    """Run the check's two processes (see the module docstring) with files under ``workdir``; the outcome.

    ``CheckProcessError`` where a process fails (its error, or the signal that ended it); the
    request and outputs files are removed either way.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    files = {name: workdir / f"check-{name}" for name in ("request.pt", "outputs.pt", "built.json", "eager.json")}
    try:
        with atomic_file(files["request.pt"]) as handle:
            torch.save(request, handle)
        peaks = []
        for stage in _STAGES:
            result = _run_stage(stage, files["request.pt"], files["outputs.pt"], files[f"{stage}.json"])
            peaks.append(int(result["peak_bytes"]))
        comparison = OutputMatch(max_abs_diff=float(result["max_abs_diff"]), outputs=int(result["outputs"]),
                                ok=bool(result["ok"]), detail=str(result["detail"]))
        return Checked(comparison, max(peaks))
    finally:
        for path in files.values():
            path.unlink(missing_ok=True)


def _run_stage(stage: str, request: Path, outputs: Path, result: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "harness.engines.compile.check_process", stage, str(request), str(outputs),
               str(result)]
    process = subprocess.run(command, preexec_fn=die_with_parent, check=False)  # noqa: PLW1509
    if process.returncode < 0:
        why = f"killed by signal {-process.returncode}" + (" (out of memory?)" if process.returncode == -9 else "")
        raise CheckProcessError(f"the check's {stage} process was {why}")
    try:
        answer: dict[str, Any] = json.loads(result.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckProcessError(f"the check's {stage} process exited with status {process.returncode} and "
                                f"left no result ({type(exc).__name__}: {exc})") from None
    if "error" in answer:
        raise CheckProcessError(f"the check's {stage} process failed: {answer['error']}")
    return answer


def _stage(stage: str, request_path: Path, outputs_path: Path) -> dict[str, Any]:
    request: CheckRequest = torch.load(request_path, weights_only=False)
    if stage == "built":
        outputs = run_built(request)
        with atomic_file(outputs_path) as handle:
            torch.save(outputs, handle)
        return {"peak_bytes": read_peak()}
    outputs = torch.load(outputs_path, weights_only=False)
    comparison = compare_with_model(request.source, outputs, request.compiler.device)
    gc.collect()
    return {"peak_bytes": read_peak(), "max_abs_diff": comparison.max_abs_diff, "outputs": comparison.outputs,
            "ok": comparison.ok, "detail": comparison.detail}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.engines.compile.check_process",
                                     description="One stage of the built model's check against eager.")
    parser.add_argument("stage", choices=_STAGES)
    parser.add_argument("request", type=Path)
    parser.add_argument("outputs", type=Path)
    parser.add_argument("result", type=Path)
    args = parser.parse_args(argv)
    try:
        answer = _stage(args.stage, args.request, args.outputs)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        answer = {"error": " ".join(f"{type(exc).__name__}: {exc}".split())}
    write_atomic(args.result, json.dumps(answer))
    return 1 if "error" in answer else 0


if __name__ == "__main__":
    sys.exit(main())
