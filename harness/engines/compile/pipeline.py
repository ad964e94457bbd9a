"""The engines of a partitioned program run as one model.

:class:`CompiledPipeline` is the built model: the loaded engines run in order, each on the
activations the earlier ones produced. :mod:`harness.engines.compile.compare` judges its outputs
against eager's; :class:`~harness.engines.compile.backend.CompilerBackend` builds the engines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.export.graph_signature import TensorArgument as _TensorArgument
from torch.utils import _pytree as pytree

from harness.engines.compile.graph_partition import GraphPartition

__all__ = ["CompiledPipeline"]


class CompiledPipeline:
    """The engines of a partitioned program, run in build order as the program's forward.

    Called like the exported model (same positional and keyword arguments); inputs are moved
    to the engines' device, and outputs come back as the model returns them (on that device).
    An activation is dropped as soon as no later engine reads it.
    """

    def __init__(
        self,
        program: ExportedProgram,
        parts: Sequence[GraphPartition],
        engines: Sequence[Callable[..., tuple[torch.Tensor, ...]]],
        device: str,
    ) -> None:
        if len(parts) != len(engines):
            raise ValueError(f"{len(parts)} partitions but {len(engines)} engines")
        self.parts = list(parts)
        self.engines = list(engines)
        self.device = torch.device(device)
        sig = program.graph_signature
        self._inputs = [s.arg.name for s in sig.input_specs if s.kind == InputKind.USER_INPUT
                        and isinstance(s.arg, _TensorArgument)]
        self._in_spec = program.call_spec.in_spec
        self._out_spec = program.call_spec.out_spec
        output = next(n for n in program.graph.nodes if n.op == "output")
        self._outputs: list[Any] = [a.name if isinstance(a, torch.fx.Node) else _Constant(a)
                                    for a in output.args[0]]
        kept = {o for o in self._outputs if isinstance(o, str)}
        self._last_read: dict[str, int] = {}
        for part in self.parts:
            for name in part.inputs:
                if name not in kept:
                    self._last_read[name] = part.index

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch.export._tree_utils import reorder_kwargs

        flat = pytree.tree_leaves((args, reorder_kwargs(kwargs, self._in_spec) if kwargs else {}))
        if len(flat) != len(self._inputs) or not all(isinstance(t, torch.Tensor) for t in flat):
            raise TypeError(f"the model takes {len(self._inputs)} tensors ({', '.join(self._inputs)}), "
                            f"got {len(flat)} values")
        env: dict[str, torch.Tensor] = {n: t.to(self.device) for n, t in zip(self._inputs, flat, strict=True)}
        for part, engine in zip(self.parts, self.engines, strict=True):
            outs = engine(*(env[name] for name in part.inputs))
            for name in part.inputs:
                if self._last_read.get(name) == part.index:
                    del env[name]
            env.update(zip(part.outputs, outs, strict=True))
        values = [env[o] if isinstance(o, str) else o.value for o in self._outputs]
        return pytree.tree_unflatten(values, self._out_spec)


@dataclass(frozen=True)
class _Constant:
    value: Any
