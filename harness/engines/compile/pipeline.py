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

__all__ = ["CompiledPipeline", "Routing"]


@dataclass(frozen=True)
class Routing:
    """How activations flow through a partitioned program's engines: plain data, so that a process of
    its own (:mod:`harness.engines.compile.check_process`) runs the engines without the program.

    ``inputs``: the program's tensor inputs, flattened, by name; ``in_spec``, ``out_spec``: the
    program's input and output trees; ``outputs``: per output, the activation's name or a constant;
    ``parts``: per engine in build order, its index and the names of its inputs and outputs.
    """

    inputs: tuple[str, ...]
    in_spec: Any
    out_spec: Any
    outputs: tuple[Any, ...]
    parts: tuple[tuple[int, tuple[str, ...], tuple[str, ...]], ...]

    @classmethod
    def of(cls, program: ExportedProgram, parts: Sequence[GraphPartition]) -> Routing:
        """The routing of ``program`` cut into ``parts``."""
        sig = program.graph_signature
        inputs = tuple(s.arg.name for s in sig.input_specs if s.kind == InputKind.USER_INPUT
                       and isinstance(s.arg, _TensorArgument))
        output = next(n for n in program.graph.nodes if n.op == "output")
        outputs = tuple(a.name if isinstance(a, torch.fx.Node) else _Constant(a) for a in output.args[0])
        return cls(inputs, program.call_spec.in_spec, program.call_spec.out_spec, outputs,
                   tuple((p.index, tuple(p.inputs), tuple(p.outputs)) for p in parts))


class CompiledPipeline:
    """The engines of a partitioned program, run in build order as the program's forward.

    Called like the exported model (same positional and keyword arguments); inputs are moved
    to the engines' device, and outputs come back as the model returns them (on that device).
    An activation is dropped as soon as no later engine reads it. ``routing``: the program's
    :class:`Routing` (``Routing.of(program, parts)``); ``engines``: one per partition, in order.
    """

    def __init__(
        self,
        routing: Routing,
        engines: Sequence[Callable[..., tuple[torch.Tensor, ...]]],
        device: str,
    ) -> None:
        if len(routing.parts) != len(engines):
            raise ValueError(f"{len(routing.parts)} partitions but {len(engines)} engines")
        self.routing = routing
        self.engines = list(engines)
        self.device = torch.device(device)
        kept = {o for o in routing.outputs if isinstance(o, str)}
        self._last_read: dict[str, int] = {}
        for index, inputs, _ in routing.parts:
            for name in inputs:
                if name not in kept:
                    self._last_read[name] = index

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch.export._tree_utils import reorder_kwargs

        routing = self.routing
        flat = pytree.tree_leaves((args, reorder_kwargs(kwargs, routing.in_spec) if kwargs else {}))
        if len(flat) != len(routing.inputs) or not all(isinstance(t, torch.Tensor) for t in flat):
            raise TypeError(f"the model takes {len(routing.inputs)} tensors ({', '.join(routing.inputs)}), "
                            f"got {len(flat)} values")
        env: dict[str, torch.Tensor] = {n: t.to(self.device) for n, t in zip(routing.inputs, flat, strict=True)}
        for (index, inputs, outputs), engine in zip(routing.parts, self.engines, strict=True):
            outs = engine(*(env[name] for name in inputs))
            for name in inputs:
                if self._last_read.get(name) == index:
                    del env[name]
            env.update(zip(outputs, outs, strict=True))
        values = [env[o] if isinstance(o, str) else o.value for o in routing.outputs]
        return pytree.tree_unflatten(values, routing.out_spec)


@dataclass(frozen=True)
class _Constant:
    value: Any
