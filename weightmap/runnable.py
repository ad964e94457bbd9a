"""Whether a model can run: no tensor of it left on the meta device.

:func:`weightmap.map_weights` (``strict=True`` included) accepts a non-persistent buffer
on meta that no checkpoint holds, as ``load_state_dict`` accepts a checkpoint without
non-persistent buffers. A model in that state cannot run; :func:`assert_runnable` is the
check a caller asks for when it wants to know before running it.
"""

from __future__ import annotations

from typing import Any

import torch

from weightmap.errors import MappingError
from weightmap.targets import collect_targets
from weightmap.text import counted, is_are, names_shown

__all__ = ["assert_runnable", "meta_buffer_problem"]

def meta_buffer_problem(names: list[str]) -> str:
    """What is wrong with non-persistent buffers left on meta, and the two ways out."""
    n = len(names)
    them = "it" if n == 1 else "them"
    return (
        f"{counted(n, 'non-persistent buffer')} {is_are(n)} on the meta device and no checkpoint holds "
        f"{them}, so the model cannot run: {names_shown(names)}. Build the model under "
        f"weightmap.init_empty_weights() so that its __init__ computes {them}, or fill {them} yourself"
    )


def _persistent_problem(names: list[str]) -> str:
    n = len(names)
    return (
        f"{counted(n, 'parameter or persistent buffer', 'parameters or persistent buffers')} {is_are(n)} on the "
        f"meta device, so the model cannot run: {names_shown(names)}. The checkpoint mapped did not hold "
        f"{'it' if n == 1 else 'them'} (see MappedWeights.missing); map or load a checkpoint that does"
    )


def assert_runnable(model: torch.nn.Module | Any) -> None:
    """Raise :class:`MappingError` unless no tensor of ``model`` is on the meta device.

    ``model`` is a ``torch.nn.Module`` or a ``torch.export.ExportedProgram``. Every
    parameter, buffer (persistent or not) and constant is looked at; ties count once.
    The message lists the tensors still on meta, non-persistent buffers and the rest
    apart, with what to do about each. Nothing is read or changed.

    Example::

        with init_empty_weights():
            model = MyModel()
        map_weights(model, "model.safetensors", strict=True)
        assert_runnable(model)   # raises if a buffer the checkpoint lacks is still on meta
    """
    on_meta = [target for target in collect_targets(model) if target.tensor.device.type == "meta"]
    if not on_meta:
        return
    buffers = [t.names[0] for t in on_meta if not t.persistent]
    persistent = [t.names[0] for t in on_meta if t.persistent]
    problems = ([meta_buffer_problem(buffers)] if buffers else []) + (
        [_persistent_problem(persistent)] if persistent else []
    )
    raise MappingError(f"{type(model).__name__}: " + "; ".join(problems))
