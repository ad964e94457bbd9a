"""A scenario from the command line's flags: ``python -m harness run --model SPEC --checkpoint PATH ...``.

:func:`scenario_from_flags` turns the flags into the tables of a scenario file and reads them with
:func:`harness.scenario.parse_scenario`, the loader's own validation: a flag left out is a key left out, so every
default is the scenario schema's (:mod:`harness.scenario`), never a second copy here. ``--model`` takes a factory
(``package.module:function``) or a transformers model (a folder holding ``config.json``, or the file); ``--name``
defaults to the factory function's name or the config's ``model_type``, made a valid results name.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from harness.catalog import ENGINE_WEIGHTS
from harness.errors import HarnessError
from harness.results.names import reserved_problem
from harness.results.publish import MAX_NAME_CHARS
from harness.scenario import (
    DEVICES,
    BuildConfig,
    RunConfig,
    Scenario,
    config_identity,
    config_problem,
    parse_scenario,
)
from harness.scenario_rules import CALLABLE

__all__ = ["MODEL_FLAGS", "add_model_flags", "default_name", "model_table", "scenario_from_flags"]

SHOWN = "the command line"
"""What errors about a scenario made from flags start with."""

MODEL_FLAGS: dict[str, tuple[str, str]] = {
    "checkpoint": ("checkpoint", "path"),
    "inputs": ("model", "inputs"),
    "engines": ("build", "engines"),
    "engine_cap_mib": ("build", "engine_cap_mib"),
    "backend": ("build", "backend"),
    "weights": ("build", "weights"),
    "device": ("build", "device"),
    "repeats": ("run", "repeats"),
}
"""Each flag that sets one key of the scenario (its ``argparse`` destination): the table and the key it sets."""


def add_model_flags(parser: argparse.ArgumentParser, *, device: bool = True) -> None:
    """The flags that describe a scenario without a file (``--model`` and those that go with it); without
    ``device``, all but ``--device``, for a command with a ``--device`` of its own (``predict``'s: the device it
    predicts for), which then passes :func:`scenario_from_flags` ``device`` ``None``."""
    from harness.backends import backend_names

    group = parser.add_argument_group("a model of your own, without a scenario file (instead of SCENARIO)")
    group.add_argument("--model", metavar="SPEC",
                       help="package.module:function returning your nn.Module (imported from the current directory), "
                            "or a transformers folder holding config.json (or the file)")
    group.add_argument("--checkpoint", metavar="PATH",
                       help="its safetensors checkpoint (default for a transformers folder: the folder)")
    group.add_argument("--inputs", metavar="MODULE:FUNCTION",
                       help="returns the example inputs a compiler backend exports the model with (called with the "
                            "model: a tensor, a tuple or a dict of tensors); default: token ids where it takes them")
    group.add_argument("--strategies", metavar="A,B,...", help="the strategies to run, in order (default: all)")
    group.add_argument("--engines", type=int, metavar="N", help="build exactly N engines")
    group.add_argument("--engine-cap-mib", type=float, metavar="M", help="at most M MiB of weights per engine")
    group.add_argument("--backend", choices=backend_names(),
                       help=f"how engines are built (default: {BuildConfig.backend})")
    group.add_argument("--weights", choices=ENGINE_WEIGHTS,
                       help="compiler backends: whose weights engines run on (default: the backend's own, else "
                            f"{BuildConfig.weights})")
    if device:
        group.add_argument("--device", choices=DEVICES,
                           help=f"where engines are built (default: {BuildConfig.device})")
    group.add_argument("--repeats", type=int, metavar="N",
                       help=f"cold runs of each strategy (default: {RunConfig.repeats})")


def model_table(spec: str) -> dict[str, Any]:
    """The ``[model]`` table ``--model SPEC`` means: a factory where SPEC reads ``package.module:function`` and no
    such path exists, else a transformers config."""
    if CALLABLE.fullmatch(spec) and not Path(spec).exists():
        return {"source": "factory", "factory": spec}
    return {"source": "transformers", "config": spec}


def default_name(model: dict[str, Any]) -> str:
    """The results' name for ``model`` (a ``[model]`` table of :func:`model_table`): the factory function's name
    or the config's ``model_type``, lower-cased, other characters than ``[a-z0-9_-]`` made ``_``, and not a name
    the harness reserves (:func:`harness.results.names.reserved_problem`)."""
    if model["source"] == "factory":
        raw = str(model["factory"]).rpartition(":")[2]
    else:
        found = config_problem(Path(model["config"]).expanduser(), (Path.cwd(),))
        raw = config_identity(found)[0] if isinstance(found, Path) else "model"
    name = re.sub(r"[^a-z0-9_-]+", "_", raw.lower())[:MAX_NAME_CHARS] or "model"
    return name.replace("-", "_") if reserved_problem(name) else name


def _contradictions(args: argparse.Namespace) -> None:
    given = [f"--{dest.replace('_', '-')}" for dest in (*MODEL_FLAGS, "strategies") if getattr(args, dest) is not None]
    if args.scenario is not None:
        if args.model is not None:
            raise HarnessError(f"{args.scenario} and --model: give a scenario file or --model, not both")
        if given:
            raise HarnessError(f"{given[0]}: goes with --model; {args.scenario} sets it in its own file")
        return
    if args.model is None:
        raise HarnessError("give a scenario file (e.g. scenarios/smoke.toml) or --model SPEC")
    if args.engines is not None and args.engine_cap_mib is not None:
        raise HarnessError("--engines and --engine-cap-mib: give one of them (how many engines, or the most MiB "
                           "of weights per engine), not both")
    if args.engines is None and args.engine_cap_mib is None:
        raise HarnessError("--model needs --engines N or --engine-cap-mib M: how many engines to build the model "
                           "in, or the most MiB of weights per engine")


def scenario_from_flags(args: argparse.Namespace) -> Scenario | None:
    """The scenario ``--model`` and its flags describe (see the module docstring); None where the command line
    names a scenario file instead. :class:`~harness.errors.HarnessError` in one line for flags that contradict
    (a file and ``--model``, ``--engines`` and ``--engine-cap-mib``) and for any setting the loader refuses."""
    _contradictions(args)
    if args.scenario is not None:
        return None
    model = model_table(args.model)
    data: dict[str, Any] = {"name": args.name or default_name(model), "model": model}
    if args.strategies is not None:
        data["strategies"] = [s.strip() for s in args.strategies.split(",")]
    for dest, (table, key) in MODEL_FLAGS.items():
        value = getattr(args, dest)
        if value is not None:
            data.setdefault(table, {})[key] = value
    return parse_scenario(data, shown=SHOWN, base=Path.cwd())
