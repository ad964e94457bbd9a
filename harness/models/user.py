"""What the sources of a user's own model share: importing ``package.module:function``, and building the model
empty.

:func:`import_function` imports as ``python -m harness`` finds modules: from the directory the harness runs in (the
current directory, which a strategy's process inherits), then the installed packages; so a factory the user
wrote beside where they run the harness imports in every process the run starts.

:func:`build_empty` calls a builder under :func:`weightmap.init_empty_weights`, then leaves every tensor on the meta
device, as every model the harness measures is: parameters and persistent buffers get their values from the
checkpoint; the non-persistent buffers the model's own code computed (rotary frequencies, position ids, masks) are
kept aside and given back by :func:`harness.models.fill_non_persistent` (through a
``reset_non_persistent_buffers`` put on the module that holds them), so that every strategy's model runs on the
values the model's code computes, whatever the strategy allocates.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.models.base import ModelError
from weightmap import init_empty_weights

__all__ = ["RestoreBuffers", "build_empty", "import_function"]

_LISTED = 5


def import_function(spec: str, what: str) -> Callable[..., Any]:
    """The function ``spec`` (``package.module:function``) names; :class:`ModelError` starting with ``what`` and
    ``spec`` where the module cannot be imported (its error quoted), lacks the function, or it is not callable."""
    module_name, _, function = spec.partition(":")
    here = str(Path.cwd())
    if here not in sys.path:  # as ``python -m`` puts it first: the user's module beside where they run
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or whatever the module's own code raises
        raise ModelError(f"{what} {spec}: cannot import {module_name} from {here} or the installed packages "
                         f"({type(exc).__name__}: {exc})") from exc
    found = getattr(module, function, None)
    if found is None:
        raise ModelError(f"{what} {spec}: module {module_name} ({getattr(module, '__file__', '?')}) has no "
                         f"{function!r}")
    if not callable(found):
        raise ModelError(f"{what} {spec}: {function} is a {type(found).__name__}, not a function")
    return found  # type: ignore[no-any-return]


class RestoreBuffers:
    """A module's ``reset_non_persistent_buffers``: gives back the values its non-persistent buffers had when it
    was built (kept on the CPU), as :func:`harness.models.fill_non_persistent` asks every module to."""

    def __init__(self, owner: nn.Module, values: dict[str, torch.Tensor]) -> None:
        self.owner = owner
        self.values = values

    def __call__(self) -> None:
        for leaf, value in self.values.items():
            self.owner._buffers[leaf] = value.clone()


def _on_meta(model: nn.Module) -> None:
    """Every buffer to meta; the non-persistent ones' values kept for :class:`RestoreBuffers`."""
    for sub in model.modules():
        kept: dict[str, torch.Tensor] = {}
        for leaf, buffer in list(sub._buffers.items()):
            if buffer is None or buffer.is_meta:
                continue
            if leaf in sub._non_persistent_buffers_set:
                kept[leaf] = buffer.detach().to("cpu", copy=True)
            sub._buffers[leaf] = torch.empty_like(buffer, device="meta")
        if kept and not callable(getattr(sub, "reset_non_persistent_buffers", None)):
            object.__setattr__(sub, "reset_non_persistent_buffers", RestoreBuffers(sub, kept))


def build_empty(build: Callable[[], Any], what: str) -> nn.Module:
    """``build()`` called under :func:`weightmap.init_empty_weights`, checked and put on meta (see the module
    docstring). :class:`ModelError` starting with ``what`` where it raises, returns something not an
    ``nn.Module``, or leaves parameters off meta (made outside the call: the error names them)."""
    try:
        with init_empty_weights():
            model = build()
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"{what} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise ModelError(f"{what} returned {type(model).__module__}.{type(model).__qualname__}, not a "
                         "torch.nn.Module")
    real = [name for name, p in model.named_parameters(remove_duplicate=False) if not p.is_meta]
    if real:
        shown = ", ".join(real[:_LISTED]) + (f" and {len(real) - _LISTED} more" if len(real) > _LISTED else "")
        raise ModelError(f"{what} returned a model whose parameters {shown} are not on the meta device: they were "
                         "made outside the call (a model built once and kept, or moved with .to()); build it "
                         "inside the function")
    _on_meta(model)
    return model
