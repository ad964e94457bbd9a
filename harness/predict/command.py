"""``python -m harness predict``: each strategy's memory before any run, or the rules checked against results.

``predict SCENARIO`` (or ``predict --model SPEC --checkpoint PATH ...``, the flags of ``run``:
:mod:`harness.cli_scenario`) resolves the scenario without reading a weight (:mod:`harness.predict.scenario`), takes the
baseline measured here (:mod:`harness.predict.baseline`) or given (``--baseline-gib``, ``--device`` for another
machine), and prints per strategy the five figures of :class:`~harness.predict.rules.Prediction`; ``--json`` prints
them under ``strategies.<name>`` by their record names. ``predict --check RESULTS`` prints the error table of
:mod:`harness.predict.check`, the one the README holds between :data:`README_BEGIN` and :data:`README_END`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from harness.cli_scenario import add_model_flags, scenario_from_flags
from harness.errors import HarnessError
from harness.predict.inputs import Baseline, PredictInputs
from harness.predict.rules import FIELDS, Prediction, predict
from harness.units import GIB

__all__ = ["README_BEGIN", "README_END", "add_parser", "run"]

README_BEGIN = "<!-- predict-check:begin (python -m harness predict --check results/) -->"
README_END = "<!-- predict-check:end -->"

LABELS = {"build_peak_bytes": "build-phase host peak", "host_peak_bytes": "whole-run host peak",
          "anon_peak_bytes": "anonymous peak", "gpu_peak_bytes": "GPU peak",
          "minimum_bytes": "smallest cgroup limit"}


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``predict`` on the command line's subcommands."""
    parser = commands.add_parser(
        "predict", help="predict each strategy's memory from the checkpoint's headers and the plan, before any run",
        description="Predict each strategy's build-phase and whole-run host peaks, anonymous peak, GPU peak and "
                    "smallest memory-cgroup limit from the scenario's sizes, reading no weight; or, with --check, "
                    "print how the rules compare with every committed result.")
    parser.add_argument("scenario", type=Path, nargs="?", help="a scenario file, e.g. scenarios/pi05.toml")
    add_model_flags(parser, device=False)
    parser.add_argument("--check", type=Path, default=None, metavar="RESULTS",
                        help="check the rules against every results directory under RESULTS instead")
    parser.add_argument("--json", action="store_true", help="print JSON with the records' field names")
    parser.add_argument("--baseline-gib", type=float, default=None,
                        help="the process baseline RSS in GiB (default: measured here, a fresh Python with torch); "
                             "all of it is taken as anonymous, so the smallest limit predicted is on the safe side")
    parser.add_argument("--device", default=None,
                        help="the device engines are built on (default: the scenario's, resolved here)")


def _baseline(args: argparse.Namespace, device: str) -> Baseline:
    from harness.predict.baseline import measure_baseline

    if args.baseline_gib is None:
        return measure_baseline(device)
    value = args.baseline_gib
    if not (math.isfinite(value) and value > 0):
        raise HarnessError(f"--baseline-gib {value:g}: expected a positive number of GiB")
    rss = int(value * GIB)
    return Baseline(rss, rss)  # what the process holds before the load, none of it reclaimable for sure


def _text(inputs: PredictInputs, predictions: dict[str, Prediction]) -> str:
    gib = GIB
    lines = [f"model {inputs.model_bytes / gib:.3f} GiB in {len(inputs.engine_bytes)} engines (largest "
             f"{inputs.largest_engine_bytes / gib:.3f} GiB), backend {inputs.backend}"
             + (f" ({inputs.compiler_weights})" if inputs.compiler_weights else "") + f", device {inputs.device}",
             f"sizes from {inputs.source}",
             f"baseline {inputs.baseline.rss_bytes / gib:.3f} GiB RSS, {inputs.baseline.anon_bytes / gib:.3f} GiB "
             "anonymous" + (f", CUDA context {inputs.baseline.gpu_context_bytes / gib:.3f} GiB"
                            if inputs.baseline.gpu_context_bytes is not None else ""),
             "", "| strategy | " + " | ".join(f"{LABELS[f]} (GiB)" for f in FIELDS) + " |",
             "| --- |" + " --- |" * len(FIELDS)]
    for name, p in predictions.items():
        cells = ["-" if v is None else f"{v / gib:.3f}" for v in p.figures().values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |" + (f" {p.note}" if p.figures()["build_peak_bytes"]
                                                                  is None else ""))
    return "\n".join(lines) + "\n"


def _json(inputs: PredictInputs, predictions: dict[str, Prediction]) -> str:
    data = {
        "model_bytes": inputs.model_bytes, "engines": len(inputs.engine_bytes),
        "largest_engine_bytes": inputs.largest_engine_bytes, "backend": inputs.backend,
        "compiler_weights": inputs.compiler_weights, "device": inputs.device, "source": inputs.source,
        "baseline_rss_bytes": inputs.baseline.rss_bytes, "baseline_anon_bytes": inputs.baseline.anon_bytes,
        "gpu_context_bytes": inputs.baseline.gpu_context_bytes,
        "strategies": {name: {**p.figures(), "rule": p.note} for name, p in predictions.items()},
    }
    return json.dumps(data, indent=2) + "\n"


def run(args: argparse.Namespace) -> int:
    """Run ``predict`` with the parsed ``args``; a :class:`~harness.errors.HarnessError` for a bad input."""
    if args.check is not None:
        if (args.scenario is not None or args.model is not None or args.baseline_gib is not None
                or args.device is not None):
            raise HarnessError("--check RESULTS takes no scenario, --model, --baseline-gib or --device: each "
                               "result's own are used")
        if not args.check.is_dir():
            raise HarnessError(f"--check {args.check}: not a directory of results")
        from harness.predict.check import check_markdown, check_results

        print(check_markdown(check_results(args.check)), end="")
        return 0
    if args.scenario is None and args.model is None:
        raise HarnessError("predict: give a scenario file, or --check RESULTS, or --model SPEC and its flags")
    from harness.engines.registry import resolve_device
    from harness.predict.scenario import inputs_of_scenario
    from harness.scenario import load_scenario

    # --device is the device predicted for, not a key of the scenario: the flags' scenario leaves it to its default
    flags = scenario_from_flags(argparse.Namespace(**{**vars(args), "device": None, "name": None}))
    scenario = flags or load_scenario(args.scenario)
    device = args.device if args.device is not None else resolve_device(scenario.build.device)
    if not (device == "cpu" or device.startswith("cuda")):
        raise HarnessError(f"--device {device}: expected cpu, cuda or cuda:<n>")
    inputs = inputs_of_scenario(scenario, _baseline(args, device), device=device,
                                say=lambda message: print(f"[predict] {message}", file=sys.stderr, flush=True))
    predictions = predict(inputs)
    print(_json(inputs, predictions) if args.json else _text(inputs, predictions), end="")
    return 0
