"""Cutting an ExportedProgram into partitions (one engine each) under a per-engine weight cap.

The walk is over the program's graph in execution order. Each node is one of:

* a *weight*: a placeholder the graph signature maps to a parameter, a buffer or a lifted
  tensor constant (``inputs_to_parameters``, ``inputs_to_buffers``,
  ``inputs_to_lifted_tensor_constants``);
* a *user input*: any other placeholder;
* a *weight-only* computation: a call whose inputs are all weights or weight-only
  computations (a cast ``w.float()``, a transpose, ``arange``, rotary tables from a buffer);
* an *activation* computation: a call that depends on a user input.

The rule for what stays together: **partitions are cut only between activation
computations**. Every weight-only computation travels with the activation computation
that consumes it and is repeated in each partition that needs it, so no weight and nothing
derived from weights alone ever crosses a partition boundary: a boundary carries
activations only, and each engine holds the weights it reads as its own constants. A
weight-only computation nothing consumes (``_assert_tensor_metadata`` on a weight) goes
with the next activation computation.

Sizes: each activation computation brings the bytes of the weights its weight-only inputs
reach; a weight's bytes count once per partition, where it is first read, and a storage
with several names (a tied embedding and head) counts once. A partition is closed before
the computation that would take it over the cap, unless it holds no weight yet (a
partition is never cut off without weights), so a computation whose own weights exceed the
cap gets a partition of its own. A weight read by several partitions (a tied weight read by
the first and the last) is listed, and sized, in each of them.

:func:`subprogram` turns one partition into an ExportedProgram of its own, built from the
program's nodes and the ``node.meta["val"]`` that export recorded (no fake propagation, which
would read every weight): its weights are its parameters, buffers and constants (the same
tensor objects as the program's, so mapped views stay mapped) and its activations are its
user inputs and outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.export import ExportedProgram
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)
from torch.utils import _pytree as pytree

__all__ = [
    "GraphPartition",
    "PartitionError",
    "PartitionRule",
    "cap_for_program",
    "partition_program",
    "program_weight_bytes",
    "program_weights",
    "subprogram",
]

_WEIGHT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


class PartitionError(ValueError):
    """The program cannot be partitioned as asked; the message names the node and the rule."""


@dataclass(frozen=True)
class GraphPartition:
    """One engine's share of an ExportedProgram, in build order.

    ``nodes``: names of the program's call nodes it runs, in execution order (weight-only
    computations included; one may appear in several partitions). ``weights``: the
    state_dict / constants names it reads, in the order first read. ``weight_bytes``: their
    bytes, a storage with several names once. ``inputs``: names of the activations it takes
    (the program's user inputs, or nodes of earlier partitions); ``outputs``: names of its
    nodes that a later partition or the program's output needs.
    """

    index: int
    nodes: tuple[str, ...]
    weights: tuple[str, ...]
    weight_bytes: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _storage_key(t: torch.Tensor) -> tuple[Any, ...]:
    """One key per distinct weight storage: tied names share it, as weightmap's release plan sees it."""
    if t.device.type == "meta":
        return ("meta", id(t))
    return (str(t.device), t.data_ptr(), _nbytes(t))


def program_weights(program: ExportedProgram) -> dict[str, torch.Tensor]:
    """Every weight of the program by its state_dict / constants name."""
    out: dict[str, torch.Tensor] = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind in _WEIGHT_KINDS and spec.target is not None:
            out[spec.target] = _lookup(program, spec.target)
    return out


def program_weight_bytes(program: ExportedProgram) -> int:
    """Bytes of the program's distinct weight storages (a tied weight once)."""
    seen: dict[tuple[Any, ...], int] = {}
    for t in program_weights(program).values():
        seen[_storage_key(t)] = _nbytes(t)
    return sum(seen.values())


def cap_for_program(program: ExportedProgram, count: int) -> int:
    """The per-engine byte cap that splits the program's weights into about ``count`` engines."""
    if count < 1:
        raise ValueError(f"the engine count must be at least 1, not {count}")
    return max(1, math.ceil(program_weight_bytes(program) / count))


def _lookup(program: ExportedProgram, name: str) -> torch.Tensor:
    value = program.state_dict.get(name)
    if value is None:
        value = program.constants.get(name)
    if not isinstance(value, torch.Tensor):
        raise PartitionError(f"the graph signature names {name!r}, which the program holds no tensor for")
    return value


def _input_nodes(node: fx.Node) -> list[fx.Node]:
    return list(node.all_input_nodes)


@dataclass
class _Graph:
    """The program's graph classified: weights, user inputs, weight-only and activation calls."""

    order: dict[fx.Node, int]
    weight_name: dict[fx.Node, str]  # weight placeholder -> state_dict / constants name
    user_inputs: list[fx.Node]
    pure: set[fx.Node]
    activations: list[fx.Node]
    output: fx.Node


_METADATA_ONLY = frozenset({"aten::detach_"})
"""In-place ops whose schema says they write but which change only autograd metadata, never data
(``tensor.detach_()``, as ``torch.tensor(...)`` constants in a forward often get)."""


def _writes_data(schema: Any) -> bool:
    """Whether an op's schema lets it write to an input's data."""
    return bool(schema.is_mutable) and schema.name not in _METADATA_ONLY


def _classify(program: ExportedProgram) -> _Graph:
    sig = program.graph_signature
    kinds = {s.arg.name: s for s in sig.input_specs if isinstance(s.arg, TensorArgument)}
    for spec in sig.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            raise PartitionError(
                f"output {spec.arg} is a {spec.kind.name}: only programs without mutations or "
                "extra outputs can be partitioned"
            )
    graph = program.graph_module.graph
    order: dict[fx.Node, int] = {}
    weight_name: dict[fx.Node, str] = {}
    user_inputs: list[fx.Node] = []
    pure: set[fx.Node] = set()
    activations: list[fx.Node] = []
    output: fx.Node | None = None
    for i, node in enumerate(graph.nodes):
        order[node] = i
        if node.op == "placeholder":
            spec = kinds.get(node.name)
            if spec is None:
                raise PartitionError(f"input {node.name!r} is not a tensor: only tensor inputs can be partitioned")
            if spec.kind in _WEIGHT_KINDS:
                assert spec.target is not None
                weight_name[node] = spec.target
            elif spec.kind == InputKind.USER_INPUT:
                user_inputs.append(node)
            else:
                raise PartitionError(f"input {node.name!r} is a {spec.kind.name}: not supported by the partitioner")
        elif node.op == "call_function":
            if "val" not in node.meta:
                raise PartitionError(f"node {node.name!r} has no recorded value (node.meta['val'])")
            from_weights = [n for n in _input_nodes(node) if n in weight_name or n in pure]
            schema = getattr(node.target, "_schema", None)
            if from_weights and schema is not None and _writes_data(schema):
                raise PartitionError(
                    f"node {node.name!r} ({node.target}) writes in place to what it reads of "
                    f"{', '.join(weight_name.get(n, n.name) for n in from_weights)}: a weight that is written "
                    "cannot be split between engines"
                )
            if len(from_weights) == len(_input_nodes(node)):
                pure.add(node)
            else:
                activations.append(node)
        elif node.op == "output":
            output = node
        else:
            raise PartitionError(
                f"node {node.name!r} is a {node.op} ({node.target}): only flat graphs of calls can be partitioned"
            )
    assert output is not None, "an fx graph always has an output node"
    return _Graph(order, weight_name, user_inputs, pure, activations, output)


def _closure(node: fx.Node, g: _Graph) -> set[fx.Node]:
    """The weight-only computations and weights that ``node`` needs, transitively."""
    found: set[fx.Node] = set()
    stack = [n for n in _input_nodes(node) if n in g.pure or n in g.weight_name]
    while stack:
        n = stack.pop()
        if n in found:
            continue
        found.add(n)
        stack.extend(m for m in _input_nodes(n) if m in g.pure or m in g.weight_name)
    return found


def partition_program(
    program: ExportedProgram,
    *,
    cap_bytes: int | None = None,
    count: int | None = None,
) -> list[GraphPartition]:
    """Cut ``program`` into partitions in build order under a per-engine weight cap.

    Give exactly one of ``cap_bytes`` (a fixed cap) or ``count`` (the cap that splits the
    program's weights into about that many engines; see :func:`cap_for_program`). The rule
    for what stays together and how bytes are counted is in the module docstring. Raises
    :class:`PartitionError` for graphs it cannot cut (writes to weights or extra outputs,
    non-tensor inputs, ``get_attr`` or submodule calls) and ``ValueError`` for a bad cap.
    """
    if (cap_bytes is None) == (count is None):
        raise ValueError("give either cap_bytes or count")
    cap = cap_for_program(program, count) if count is not None else cap_bytes
    assert cap is not None
    if cap < 1:
        raise ValueError(f"the per-engine cap must be positive, not {cap}")
    g = _classify(program)
    weights = {node: _lookup(program, name) for node, name in g.weight_name.items()}

    # Units: each activation computation with the weight-only nodes it needs; a weight-only
    # node nothing consumes joins the next unit (the last one if none follows).
    units: list[tuple[fx.Node, set[fx.Node]]] = []
    orphans = sorted((n for n in g.pure if not n.users), key=g.order.__getitem__)
    taken = 0
    for node in g.activations:  # already in execution order
        needed = _closure(node, g)
        while taken < len(orphans) and g.order[orphans[taken]] < g.order[node]:
            needed |= {orphans[taken]} | _closure(orphans[taken], g)
            taken += 1
        units.append((node, needed))
    tail = orphans[taken:] + [n for n in _input_nodes(g.output) if n in g.pure]
    if tail:
        tail_needed: set[fx.Node] = set()
        for node in tail:
            tail_needed |= {node} | _closure(node, g)
        if units:
            last_node, last_needed = units[-1]
            units[-1] = (last_node, last_needed | tail_needed)
        else:
            raise PartitionError("the program computes nothing from its inputs: there is no activation to cut at")
    for n in _input_nodes(g.output):
        if n in g.weight_name:
            raise PartitionError(f"the program returns weight {g.weight_name[n]!r} itself: not supported")

    groups: list[list[tuple[fx.Node, set[fx.Node]]]] = []
    open_group: list[tuple[fx.Node, set[fx.Node]]] = []
    open_keys: dict[tuple[Any, ...], int] = {}
    for unit in units:
        extra: dict[tuple[Any, ...], int] = {}
        for n in unit[1]:
            if n in weights:
                key = _storage_key(weights[n])
                if key not in open_keys:
                    extra[key] = _nbytes(weights[n])
        held = sum(open_keys.values())
        if open_group and held > 0 and extra and held + sum(extra.values()) > cap:
            groups.append(open_group)
            open_group, open_keys = [], {}
            extra = {_storage_key(weights[n]): _nbytes(weights[n]) for n in unit[1] if n in weights}
        open_group.append(unit)
        open_keys.update(extra)
    if open_group:
        groups.append(open_group)

    return _describe(groups, g, weights)




@dataclass(frozen=True)
class PartitionRule:
    """Exactly one of ``count`` (about that many engines) or ``cap_bytes`` (per-engine weight cap)."""

    count: int | None = None
    cap_bytes: int | None = None

    def apply(self, program: ExportedProgram) -> list[GraphPartition]:
        return partition_program(program, count=self.count, cap_bytes=self.cap_bytes)


def _describe(
    groups: list[list[tuple[fx.Node, set[fx.Node]]]],
    g: _Graph,
    weights: dict[fx.Node, torch.Tensor],
) -> list[GraphPartition]:
    where: dict[fx.Node, int] = {}
    members: list[list[fx.Node]] = []
    for index, group in enumerate(groups):
        chosen: set[fx.Node] = set()
        for act, needed in group:
            chosen.add(act)
            chosen |= {n for n in needed if n not in weights}
            where[act] = index
        members.append(sorted(chosen, key=g.order.__getitem__))
    for user_input in g.user_inputs:
        where[user_input] = -1
    needed_later: dict[fx.Node, int] = {}  # activation -> last partition (len = output) that reads it
    for index, nodes in enumerate(members):
        for n in nodes:
            for m in _input_nodes(n):
                if m in where and where[m] != index:
                    needed_later[m] = max(needed_later.get(m, -1), index)
    last = len(members) - 1
    for m in _input_nodes(g.output):
        if m in where or m in g.pure:
            needed_later[m] = max(needed_later.get(m, -1), last + 1)

    parts = []
    for index, nodes in enumerate(members):
        node_set = set(nodes)
        read: list[fx.Node] = []
        for n in nodes:
            for m in _input_nodes(n):
                if m in weights and m not in read:
                    read.append(m)
        seen: dict[tuple[Any, ...], int] = {}
        for w in read:
            seen[_storage_key(weights[w])] = _nbytes(weights[w])
        inputs = [m for n in nodes for m in _input_nodes(n) if m in where and m not in node_set]
        outputs = [
            n
            for n in nodes
            if needed_later.get(n, -1) > index and (n in where or (n in g.pure and index == last))
        ]
        parts.append(
            GraphPartition(
                index=index,
                nodes=tuple(n.name for n in nodes),
                weights=tuple(g.weight_name[w] for w in read),
                weight_bytes=sum(seen.values()),
                inputs=tuple(dict.fromkeys(m.name for m in inputs)),
                outputs=tuple(n.name for n in outputs),
            )
        )
    return parts


def _example(val: Any, device: torch.device | None) -> torch.Tensor:
    """A zeroed tensor of the recorded value's shape, strides and dtype.

    Zeros, not uninitialised memory: a compiler that tunes its kernels by running the program on its example
    inputs (AOTInductor on a GPU) would otherwise gather with whatever indices the memory held, out of range.
    """
    if not isinstance(val, torch.Tensor):
        raise PartitionError(f"a partition boundary carries {type(val).__name__}: only tensors can cross one")
    target = device if device is not None else val.device
    return torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device=target).zero_()


def subprogram(
    program: ExportedProgram,
    part: GraphPartition,
    *,
    example_device: torch.device | str | None = None,
) -> ExportedProgram:
    """One partition as an ExportedProgram of its own.

    Its parameters and buffers are the partition's weights under their program names, as
    the same tensor objects (no copy, nothing read); lifted tensor constants become
    non-persistent buffers, so that a compiler keeps their names; its user inputs are
    ``part.inputs`` and it returns ``part.outputs`` as a tuple, in that order. Example
    inputs (needed by AOTInductor) are zeroed tensors shaped like the values export
    recorded, on ``example_device`` (default: where export recorded them).
    """
    graph_module = program.graph_module
    by_name = {n.name: n for n in graph_module.graph.nodes}
    sig = program.graph_signature
    wanted = set(part.weights)
    device = torch.device(example_device) if example_device is not None else None

    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    input_specs: list[InputSpec] = []
    state_dict: dict[str, torch.Tensor] = {}
    constants: dict[str, Any] = {}
    for spec in sig.input_specs:  # weights keep the program's order: parameters, buffers, constants
        if spec.kind not in _WEIGHT_KINDS or spec.target not in wanted:
            continue
        assert isinstance(spec.arg, TensorArgument) and spec.target is not None
        node = by_name[spec.arg.name]
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
        tensor = _lookup(program, spec.target)
        if spec.kind == InputKind.PARAMETER or spec.kind == InputKind.BUFFER and spec.persistent:
            input_specs.append(InputSpec(spec.kind, TensorArgument(node.name), spec.target, spec.persistent))
            state_dict[spec.target] = tensor
        else:
            # A lifted constant becomes a non-persistent buffer: AOTInductor keeps a buffer's
            # name, but renames plain constants _tensor_constantN in the order it traces them.
            input_specs.append(InputSpec(InputKind.BUFFER, TensorArgument(node.name), spec.target, False))
            constants[spec.target] = tensor
    examples = []
    for name in part.inputs:
        node = by_name[name]
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
        input_specs.append(InputSpec(InputKind.USER_INPUT, TensorArgument(node.name), None))
        examples.append(_example(node.meta.get("val"), device))
    for name in part.nodes:
        node = by_name[name]
        env[node] = graph.node_copy(node, lambda n: env[n])
    outs = tuple(env[by_name[name]] for name in part.outputs)
    out_node = graph.output(outs)
    out_node.meta["val"] = tuple(o.meta.get("val") for o in outs)
    graph.lint()

    # The call spec AOTInductor flattens inputs and outputs with: f(*inputs) -> tuple(outputs).
    in_spec = pytree.tree_structure((tuple(examples), {}))
    out_spec = pytree.tree_structure(tuple(range(len(outs))))
    signature = ExportGraphSignature(
        input_specs=input_specs,
        output_specs=[OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(o.name), None) for o in outs],
    )
    call = ModuleCallEntry("", ModuleCallSignature(inputs=[], outputs=[], in_spec=in_spec, out_spec=out_spec))
    return ExportedProgram(
        root=torch.nn.Module(),
        graph=graph,
        graph_signature=signature,
        state_dict=state_dict,
        range_constraints=dict(program.range_constraints),
        module_call_graph=[call],
        example_inputs=(tuple(examples), {}),
        constants=constants,
        verifiers=list(program.verifiers),
    )
