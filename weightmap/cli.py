"""``python -m weightmap``: inspect a checkpoint, or convert it into one that maps without copies.

::

    python -m weightmap inspect PATH [--model MODULE:FACTORY] [--tensors] [--json]
    python -m weightmap convert SRC DST [--dtype bfloat16] [--model MODULE:FACTORY] [--max-shard-size 5GB]

``--model MODULE:FACTORY`` names a function that builds the model, called with no
arguments under :func:`weightmap.init_empty_weights` (parameters on meta, no
weight read): ``MODULE`` is an importable module (the current directory is on the
path) or a ``.py`` file, ``FACTORY`` a name in it (dots reach attributes:
``Model.tiny``).

A bad checkpoint, model, argument or destination is one line on stderr, ``error:
<file>: <what is wrong>``, and exit status 2 (argparse's own usage errors too).
Ctrl-C (``SIGINT``) is one line, ``interrupted``, and exit status 130; a conversion
interrupted leaves its destination as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch

from weightmap.checkpoint import INDEX_NAME
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
    """A floating-point dtype from a torch name (``bfloat16``, ``float16``, ``half``...), an alias
    (``bf16``, ``fp16``, ``fp32``) or a safetensors code (``BF16``, ``F32``); anything else,
    an integer, boolean or complex dtype included, is a :class:`UsageError`."""
    aliases = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}
    name = aliases.get(text.lower(), text)
    found = DTYPES.get(name)
    if found is None and name.isidentifier():
        attribute = getattr(torch, name, None)
        found = attribute if isinstance(attribute, torch.dtype) and attribute in DTYPE_CODES else None
    known = ", ".join(sorted({str(d).removeprefix("torch.") for d in DTYPE_CODES if d.is_floating_point}))
    if found is None:
        raise UsageError(f"--dtype {text!r}: not a dtype safetensors can store; floating-point ones: {known}")
    if not found.is_floating_point:
        raise UsageError(f"--dtype {text!r}: {found} is not floating-point; floating-point tensors are cast to "
                         f"it, so it must be one of: {known}")
    return found


class _FactoryExit(Exception):
    """The model's module or factory tried to end the process."""


@contextlib.contextmanager
def _no_exit(reference: str) -> Iterator[None]:
    """Turn an attempt of ``--model``'s code to end the process (``sys.exit``, ``os._exit``) into an error.

    ``os._exit`` is replaced while the code runs (a call through the ``os`` module is caught;
    a copy of the function taken before cannot be).
    """
    real_exit = os._exit

    def refuse(status: int) -> NoReturn:
        raise _FactoryExit(f"os._exit({status})")

    os._exit = refuse
    try:
        yield
    except SystemExit as exc:
        raise UsageError(f"--model {reference}: the model's code called sys.exit({exc.code!r}) instead of "
                         "returning a model") from None
    except _FactoryExit as exc:
        raise UsageError(f"--model {reference}: the model's code called {exc} instead of returning a model") from None
    finally:
        os._exit = real_exit


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
        with _no_exit(reference):
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
        with _no_exit(reference), init_empty_weights():
            model = found()
    except UsageError:
        raise
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


class _Progress:
    """``progress(done, total)`` for convert: a tqdm bar (plain lines without tqdm), made on the first call.

    Nothing is shown before the conversion starts writing (a bad source or destination is
    one error line); :meth:`close` with ``failed=True`` clears the bar so that the error
    line stands alone.
    """

    def __init__(self, quiet: bool, label: str) -> None:
        self._quiet = quiet
        self._label = label
        self._bar: Any = None
        self._shown = -1

    def __call__(self, done: int, total: int) -> None:
        if self._quiet:
            return
        if self._bar is None:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            self._bar = False if tqdm is None else tqdm(
                unit="B", unit_scale=True, unit_divisor=1024, desc=self._label, file=sys.stderr, mininterval=0.5
            )
        if self._bar is False:
            tenth = done * 10 // total if total else 10
            if tenth != self._shown:
                self._shown = tenth
                print(f"{self._label}: {human(done)} of {human(total)}", file=sys.stderr)
            return
        self._bar.total = total
        self._bar.update(done - self._bar.n)

    def close(self, *, failed: bool) -> None:
        if self._bar:
            self._bar.leave = not failed
            self._bar.close()


def _convert(args: argparse.Namespace) -> int:
    dtype = parse_dtype(args.dtype) if args.dtype is not None else None
    try:
        shard = parse_size(args.max_shard_size) if args.max_shard_size else None
    except ValueError as exc:
        raise UsageError(f"--max-shard-size: {exc}") from exc
    model = load_model(args.model) if args.model else None
    progress = _Progress(args.quiet, f"writing {Path(args.dst).name}")
    started = time.perf_counter()
    try:
        written = convert_checkpoint(args.src, args.dst, dtype=dtype, model=model, max_shard_size=shard,
                                     drop_cache=not args.keep_cache, progress=progress)
    except BaseException:
        progress.close(failed=True)
        raise
    progress.close(failed=False)
    files = [p for p in written if p.name != INDEX_NAME]
    size = sum(p.stat().st_size for p in files)
    if not args.quiet:
        print(f"wrote {args.dst}: {counted(len(files), 'file')}, {human(size)} "
              f"in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


def _plain(text: str) -> str:
    """A docstring's text for the terminal: its markup (double backquotes, ``:role:`` references) removed."""
    return re.sub(r"(?::[a-z]+:)?`+([^`]+)`+", r"\1", text)


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are a :class:`UsageError` (one line, exit 2) instead of usage text."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m weightmap", description=_plain(__doc__.split("\n\n")[0]))
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
    """Run the command line; returns the exit status (2 for a bad checkpoint, model or argument, 130 when
    interrupted)."""
    try:
        args = _parser().parse_args(argv)
        status: int = args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (MappingError, UsageError) as exc:
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {_one_line(where + str(exc.strerror or exc))}", file=sys.stderr)
        return 2
    return status


def _one_line(message: str) -> str:
    """A message on one line: a strict error's list of problems joined with "; "."""
    return "; ".join(part.strip() for part in message.splitlines() if part.strip())
