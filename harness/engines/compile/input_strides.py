"""The layout (dtype, shape, strides, device) each input of an engine was built for, and conforming inputs to it.

An AOTInductor engine reads each input with the strides it was compiled for and does not
check them at run time. Where a partition boundary carries a broadcast view (an ``expand``,
stride 0), the two sides can disagree: moving a program to a GPU
(``torch.export.passes.move_to_device_pass``) turns each recorded stride-0 value into a
contiguous one, because ``Tensor.to`` only preserves dense layouts. The engine built from
it then reads a broadcast ``(1, 256)`` mask of one byte as 256 contiguous bytes, the
neighbouring memory, and its outputs are wrong without any error.

So every artifact records its inputs' layouts (:func:`input_layouts`), and each input is
conformed to its layout before the engine runs (:func:`conform`): a tensor with the
recorded strides is passed as is; one laid out differently is copied into the recorded
layout (activations at a boundary, a few kilobytes to megabytes); a wrong dtype, shape or
device is an :class:`EngineInputError` naming the artifact and the input.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.export import ExportedProgram

__all__ = ["EngineInputError", "InputLayout", "conform", "input_layouts", "layouts_from_json", "layouts_to_json"]


class EngineInputError(ValueError):
    """An input an engine was not built for; the message names the artifact, the input and the rule."""


@dataclass(frozen=True)
class InputLayout:
    """One input as an engine was built to read it.

    ``dtype`` without its ``torch.`` prefix; ``device`` the device type (``cpu``, ``cuda``).
    Strides of dimensions of size 1 are never read, so they do not count.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    device: str

    def matches(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` can be handed to the engine as it is."""
        return self.same_kind(tensor) and all(
            n == 1 or s == want for n, s, want in zip(self.shape, tensor.stride(), self.stride, strict=True)
        )

    def same_kind(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` has this dtype, shape and device type (its strides aside)."""
        return _dtype(tensor) == self.dtype and tuple(tensor.shape) == self.shape and tensor.device.type == self.device

    def describe(self) -> str:
        return f"{self.dtype} {list(self.shape)} strides {list(self.stride)} on {self.device}"


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _describe(tensor: torch.Tensor) -> str:
    return f"{_dtype(tensor)} {list(tensor.shape)} strides {list(tensor.stride())} on {tensor.device.type}"


def input_layouts(program: ExportedProgram) -> list[InputLayout]:
    """The layouts of ``program``'s user inputs, in call order, as its graph records them.

    These are what AOTInductor compiles against (the graph's own values, not the example
    inputs): after a move to a GPU they are the moved, possibly re-strided, values.
    """
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    layouts = []
    for name in program.graph_signature.user_inputs:
        val = nodes[name].meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise EngineInputError(f"input {name} carries {type(val).__name__}: an engine takes tensors only")
        layouts.append(InputLayout(name, _dtype(val), tuple(val.shape), tuple(val.stride()), val.device.type))
    return layouts


def layouts_to_json(layouts: Sequence[InputLayout]) -> str:
    """``layouts`` as the JSON an artifact's metadata keeps."""
    return json.dumps([asdict(layout) for layout in layouts])


def layouts_from_json(text: str) -> list[InputLayout]:
    """The layouts :func:`layouts_to_json` wrote."""
    return [
        InputLayout(d["name"], d["dtype"], tuple(d["shape"]), tuple(d["stride"]), d["device"]) for d in json.loads(text)
    ]


def conform(path: Path, layouts: Sequence[InputLayout], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``inputs`` laid out as the engine at ``path`` was built to read them.

    A tensor that already has its layout is passed as is. One with other strides is copied
    into the recorded ones; where the engine reads a dimension broadcast (stride 0), the
    given values must be the same along it (the engine reads only the first), otherwise
    ``EngineInputError``. A wrong count, dtype, shape or device is an ``EngineInputError``.
    """
    if len(inputs) != len(layouts):
        raise EngineInputError(
            f"{path}: the engine takes {len(layouts)} inputs ({', '.join(lay.name for lay in layouts)}), "
            f"given {len(inputs)}"
        )
    out = []
    for layout, tensor in zip(layouts, inputs, strict=True):
        if not isinstance(tensor, torch.Tensor) or not layout.same_kind(tensor):
            given = _describe(tensor) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise EngineInputError(
                f"{path}: input {layout.name}: the engine was built for {layout.describe()}, given {given}; "
                "an engine is built for one dtype, shape and device per input"
            )
        out.append(tensor if layout.matches(tensor) else _relaid(path, layout, tensor))
    return out


def _relaid(path: Path, layout: InputLayout, tensor: torch.Tensor) -> torch.Tensor:
    broadcast = [d for d, (n, s) in enumerate(zip(layout.shape, layout.stride, strict=True)) if n != 1 and s == 0]
    source = tensor
    for d in broadcast:
        first = source.narrow(d, 0, 1)
        if not torch.equal(source, first.expand_as(source)):
            raise EngineInputError(
                f"{path}: input {layout.name}: the engine was built to read dimension {d} broadcast (stride 0), "
                f"so it reads only its first entry, but the given {_describe(tensor)} varies along it"
            )
        source = first
    compact = torch.empty_strided(tuple(source.shape), layout.stride, dtype=tensor.dtype, device=tensor.device)
    compact.copy_(source)
    return compact.expand(layout.shape)
