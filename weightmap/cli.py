"""``python -m weightmap``: inspect a checkpoint, or convert it into one that maps without copies.

::

    python -m weightmap inspect PATH [--model MODULE:FACTORY] [--tensors] [--json]
    python -m weightmap convert SRC DST [--dtype bfloat16] [--model MODULE:FACTORY] [--max-shard-size 5GB]

``--model MODULE:FACTORY`` names a function that builds the model, called with no
arguments under :func:`weightmap.init_empty_weights` (parameters on meta, no
weight read): ``MODULE`` is an importable module (the current directory is on the
path) or a ``.py`` file, ``FACTORY`` a name in it (dots reach attributes:
``Model.tiny``).

A bad checkpoint, model or destination is one line on stderr, ``error: <file>:
<what is wrong>``, and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from weightmap.convert import convert_checkpoint, parse_size
from weightmap.empty import init_empty_weights
from weightmap.errors import MappingError
from weightmap.format import DTYPE_CODES, DTYPES
from weightmap.inspection import human, inspect_checkpoint
from weightmap.targets import is_exported_program
from weightmap.text import counted

__all__ = ["UsageError", "load_model", "main", "parse_dtype"]


class UsageError(Exception):
    """A command-line argument that cannot be used; the message says which and why."""


def parse_dtype(text: str) -> torch.dtype:
    """A dtype from a torch name (``bfloat16``, ``float16``, ``half``...), an alias (``bf16``, ``fp16``,
    ``fp32``) or a safetensors code (``BF16``, ``F32``)."""
    aliases = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}
    name = aliases.get(text.lower(), text)
    if name in DTYPES:
        return DTYPES[name]
    found = getattr(torch, name, None)
    if isinstance(found, torch.dtype) and found in DTYPE_CODES:
        return found
    known = ", ".join(sorted({str(d).removeprefix("torch.") for d in DTYPE_CODES if d.is_floating_point}))
    raise UsageError(f"--dtype {text}: not a dtype safetensors can store; floating-point ones: {known}")


def _import(module: str) -> Any:
    if module.endswith(".py") or "/" in module:
        path = Path(module)
        if not path.is_file():
            raise UsageError(f"--model {module}: no such file")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"--model {module}: cannot load it as Python")
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        return loaded
    return importlib.import_module(module)


def load_model(reference: str) -> torch.nn.Module | Any:
    """Build the model that ``MODULE:FACTORY`` names, under :func:`init_empty_weights` (see the module docstring)."""
    module_name, sep, factory_name = reference.rpartition(":")
    if not sep or not module_name or not factory_name:
        raise UsageError(f"--model {reference}: give MODULE:FACTORY, a module and a function in it that builds "
                         "the model (for example mypackage.models:tiny)")
    try:
        found: Any = _import(module_name)
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"--model {reference}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    for part in factory_name.split("."):
        if not hasattr(found, part):
            raise UsageError(f"--model {reference}: {module_name!r} has no {factory_name!r}")
        found = getattr(found, part)
    if not callable(found):
        raise UsageError(f"--model {reference}: {factory_name!r} is not callable")
    try:
        with init_empty_weights():
            model = found()
    except Exception as exc:
        raise UsageError(f"--model {reference}: building the model failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, torch.nn.Module) and not is_exported_program(model):
        raise UsageError(f"--model {reference}: returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def _inspect(args: argparse.Namespace) -> int:
    model = load_model(args.model) if args.model else None
    report = inspect_checkpoint(args.path, model, model_name=args.model)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.to_text(list_tensors=args.tensors))
    return 0


def _progress_bar(quiet: bool, label: str) -> tuple[Callable[[int, int], None] | None, Callable[[], None]]:
    """A ``progress(done, total)`` for convert (tqdm where installed, plain lines otherwise) and its closer."""
    if quiet:
        return None, lambda: None
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        bar = tqdm(unit="B", unit_scale=True, unit_divisor=1024, desc=label, file=sys.stderr, mininterval=0.5)

        def update(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        return update, bar.close
    state = {"shown": -1}

    def plain(done: int, total: int) -> None:
        tenth = done * 10 // total if total else 10
        if tenth != state["shown"]:
            state["shown"] = tenth
            print(f"{label}: {human(done)} of {human(total)}", file=sys.stderr)

    return plain, lambda: None


def _convert(args: argparse.Namespace) -> int:
    dtype = parse_dtype(args.dtype) if args.dtype else None
    try:
        shard = parse_size(args.max_shard_size) if args.max_shard_size else None
    except ValueError as exc:
        raise UsageError(f"--max-shard-size: {exc}") from exc
    model = load_model(args.model) if args.model else None
    update, close = _progress_bar(args.quiet, f"writing {Path(args.dst).name}")
    started = time.perf_counter()
    try:
        written = convert_checkpoint(args.src, args.dst, dtype=dtype, model=model, max_shard_size=shard,
                                     drop_cache=not args.keep_cache, progress=update)
    finally:
        close()
    files = [p for p in written if p.suffix == ".safetensors"]
    size = sum(p.stat().st_size for p in files)
    if not args.quiet:
        print(f"wrote {args.dst}: {counted(len(files), 'file')}, {human(size)} "
              f"in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m weightmap", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    inspect = commands.add_parser(
        "inspect", help="what a checkpoint holds and what mapping it costs, from its headers alone",
        description="Tensors, dtypes and bytes per dtype, alignment (which tensors would be copied), shards, "
                    "metadata and header size of a safetensors checkpoint; no weight is read.")
    inspect.add_argument("path", help="a .safetensors file, a sharded directory or its index")
    inspect.add_argument("--model", metavar="MODULE:FACTORY",
                         help="also say what map_weights would map, copy, miss or leave on meta for this model")
    inspect.add_argument("--tensors", action="store_true", help="list every tensor")
    inspect.add_argument("--json", action="store_true", help="print JSON instead (every tensor included)")
    inspect.set_defaults(run=_inspect)

    convert = commands.add_parser(
        "convert", help="rewrite a checkpoint aligned and in the dtypes it runs in, one tensor at a time",
        description="Write SRC as a checkpoint that maps without copies: aligned, each tensor cast to --dtype "
                    "(floating-point tensors) or to the model's dtype (--model), streamed tensor by tensor from "
                    "the mapped source, written atomically.")
    convert.add_argument("src", help="a .safetensors file, a sharded directory or its index")
    convert.add_argument("dst", help="the file to write (a directory with --max-shard-size)")
    convert.add_argument("--dtype", help="cast floating-point tensors to this dtype (bfloat16, float16, float32, ...)")
    convert.add_argument("--model", metavar="MODULE:FACTORY",
                         help="cast each tensor to the dtype of the model tensor it fills")
    convert.add_argument("--max-shard-size", metavar="SIZE",
                         help="write shards of at most SIZE (2GB, 500MiB, bytes) and an index into DST")
    convert.add_argument("--keep-cache", action="store_true",
                         help="leave the source's pages in the page cache (default: dropped once written)")
    convert.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no summary")
    convert.set_defaults(run=_convert)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for a bad checkpoint, model or argument)."""
    args = _parser().parse_args(argv)
    try:
        status: int = args.run(args)
    except (MappingError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    return status
