"""Cutting an exported, mapped model into engines: what each partition reads and what crosses a cut."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.export import ExportedProgram

from harness.engines.compile.graph_partition import (
    GraphPartition,
    PartitionError,
    cap_for_program,
    partition_program,
    program_weight_bytes,
    program_weights,
    subprogram,
)
from harness.models import SyntheticTransformer, fill_non_persistent
from harness.models.checkpoints import ensure_checkpoint
from weightmap import ReleasePlan, map_weights

SHAPE: dict[str, Any] = {"layers": 3, "width": 128, "heads": 4, "vocab": 1024, "dtype": torch.bfloat16}


@dataclass
class Exported:
    model: SyntheticTransformer
    program: ExportedProgram
    tokens: torch.Tensor
    checkpoint: Path


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exported]:
    path, _ = ensure_checkpoint(SyntheticTransformer(**SHAPE), tmp_path_factory.mktemp("ckpt") / "m.safetensors",
                                seed=3, progress=False)
    model = SyntheticTransformer(**SHAPE)
    map_weights(model, path, strict=True).close()
    fill_non_persistent(model)
    tokens = torch.tensor([[5, 17, 900, 3, 3, 64, 1000, 2]])
    yield Exported(model, torch.export.export(model, (tokens,)), tokens, path)


def _node_kinds(program: ExportedProgram) -> tuple[set[str], set[str]]:
    """(names of weight-only nodes, names of weight placeholders) of the program's graph."""
    sig = program.graph_signature
    weights = set(sig.inputs_to_parameters) | set(sig.inputs_to_buffers) | set(sig.inputs_to_lifted_tensor_constants)
    pure: set[str] = set()
    for node in program.graph.nodes:
        if node.op == "call_function" and all(n.name in weights or n.name in pure for n in node.all_input_nodes):
            pure.add(node.name)
    return pure, weights


def _run_eagerly(program: ExportedProgram, parts: list[GraphPartition], x: torch.Tensor) -> torch.Tensor:
    """Each partition's program run eagerly (``.module()``), in order, on the activations passed along."""
    (name,) = program.graph_signature.user_inputs
    env: dict[str, torch.Tensor] = {name: x}
    for part in parts:
        outs = subprogram(program, part).module()(*(env[n] for n in part.inputs))
        env.update(zip(part.outputs, outs, strict=True))
    output = next(n for n in program.graph.nodes if n.op == "output")
    return env[output.args[0][0].name]


def test_every_computation_runs_once_in_order_and_weights_stay_under_the_cap(exported: Exported) -> None:
    program = exported.program
    cap = cap_for_program(program, 4)
    parts = partition_program(program, cap_bytes=cap)
    pure, _ = _node_kinds(program)
    order = [n.name for n in program.graph.nodes if n.op == "call_function" and n.name not in pure]
    assert [n for p in parts for n in p.nodes if n not in pure] == order  # each once, execution order kept
    assert [p.index for p in parts] == list(range(len(parts)))
    weights = program_weights(program)
    for part in parts:
        assert len(set(part.weights)) == len(part.weights)
        distinct = {weights[n].data_ptr(): weights[n].numel() * weights[n].element_size() for n in part.weights}
        assert part.weight_bytes == sum(distinct.values())
        largest_op = max(weights[n].numel() * weights[n].element_size() for n in part.weights)
        assert part.weight_bytes <= cap or part.weight_bytes == largest_op, "only one op's own weights may pass it"
    read = {n for p in parts for n in p.weights}
    assert sum(p.weight_bytes for p in parts) >= program_weight_bytes(program)
    assert {weights[n].data_ptr() for n in read} == {t.data_ptr() for t in weights.values()}


def test_tied_embedding_is_read_by_the_first_and_the_last_partition(exported: Exported) -> None:
    parts = partition_program(exported.program, count=4)
    first, last = parts[0], parts[-1]
    tied = exported.model.embed.weight.data_ptr()
    weights = program_weights(exported.program)
    assert any(weights[n].data_ptr() == tied for n in first.weights)
    assert any(weights[n].data_ptr() == tied for n in last.weights)
    # Released once, after the last partition that reads it.
    plan = ReleasePlan.from_names(exported.program, [p.weights for p in parts])
    assert plan.last_use(exported.model.embed.weight) == last.index


def test_nothing_derived_from_weights_alone_crosses_a_cut(exported: Exported) -> None:
    pure, weight_inputs = _node_kinds(exported.program)
    parts = partition_program(exported.program, count=6)
    assert len(parts) >= 4
    for part in parts:
        crossing = set(part.inputs) | set(part.outputs[:-1] if part is parts[-1] else part.outputs)
        assert not crossing & (pure | weight_inputs), f"partition {part.index} passes weights: {crossing & pure}"
    # A weight's cast (w.float()) sits in the partition of the linear that consumes it.
    by_name = {n.name: n for n in exported.program.graph.nodes}
    for part in parts:
        for name in part.nodes:
            if name in pure:
                continue
            for arg in by_name[name].all_input_nodes:
                if arg.name in pure:
                    assert arg.name in part.nodes, f"{arg.name} (weight-only) not with its consumer {name}"


def test_partitions_run_in_sequence_equal_the_model(exported: Exported) -> None:
    parts = partition_program(exported.program, count=3)
    with torch.no_grad():
        got = _run_eagerly(exported.program, parts, exported.tokens)
        want = exported.model(exported.tokens)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_subprograms_hold_the_mapped_views_themselves(exported: Exported) -> None:
    program = exported.program
    part = partition_program(program, count=3)[1]
    sub = subprogram(program, part)
    held = {**sub.state_dict, **sub.constants}
    assert set(held) == set(part.weights)
    weights = program_weights(program)
    for name, tensor in held.items():
        assert tensor.data_ptr() == weights[name].data_ptr(), f"{name} was copied"
    assert [s.arg.name for s in sub.graph_signature.input_specs if s.target is None] == list(part.inputs)


def test_subprogram_examples_are_zeros_a_gather_can_run_on(exported: Exported) -> None:
    # A compiler may tune its kernels by running the program on its example inputs (AOTInductor on a GPU):
    # token ids must be valid indices, not whatever memory held.
    first = partition_program(exported.program, count=3)[0]
    sub = subprogram(exported.program, first)
    (tokens,), _ = sub.example_inputs
    assert tokens.dtype == exported.tokens.dtype and tokens.shape == exported.tokens.shape
    assert not tokens.any()
    (out, *_) = sub.module()(tokens)
    assert torch.isfinite(out).all()


def test_one_engine_reads_everything(exported: Exported) -> None:
    parts = partition_program(exported.program, count=1)
    assert len(parts) == 1
    assert parts[0].weight_bytes == program_weight_bytes(exported.program)
    assert parts[0].inputs == ("tokens",)


def test_cap_is_given_once_and_positive(exported: Exported) -> None:
    with pytest.raises(ValueError, match="either"):
        partition_program(exported.program)
    with pytest.raises(ValueError, match="either"):
        partition_program(exported.program, cap_bytes=10, count=2)
    with pytest.raises(ValueError, match="positive"):
        partition_program(exported.program, cap_bytes=0)


class _Scaled(torch.nn.Module):
    """A lifted tensor constant (a plain tensor attribute) and a parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16, 16))
        self.scale = torch.linspace(0.5, 2.0, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.weight) * self.scale


def test_lifted_constants_are_weights_and_become_named_buffers() -> None:
    program = torch.export.export(_Scaled(), (torch.randn(2, 16),))
    (constant,) = program.graph_signature.inputs_to_lifted_tensor_constants.values()
    parts = partition_program(program, cap_bytes=16 * 16 * 4)
    assert sorted(n for p in parts for n in p.weights) == sorted(["weight", constant])
    assert [p.weights for p in parts] == [("weight",), (constant,)]  # 1 KiB, then 64 B: over the cap
    sub = subprogram(program, parts[1])
    kinds = {s.target: (s.kind.name, s.persistent) for s in sub.graph_signature.input_specs if s.target}
    assert kinds == {constant: ("BUFFER", False)}
    assert sub.constants[constant] is program.constants[constant]
    x = torch.randn(2, 16)
    torch.testing.assert_close(_run_eagerly(program, parts, x), program.module()(x), rtol=0, atol=0)


class _Counter(torch.nn.Module):
    calls: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return x * 2


def test_programs_that_mutate_state_are_refused() -> None:
    program = torch.export.export(_Counter(), (torch.randn(3),))
    with pytest.raises(PartitionError, match="add_.*calls"):
        partition_program(program, count=1)
    functional = program.run_decompositions()  # the write becomes an extra output
    with pytest.raises(PartitionError, match="BUFFER_MUTATION"):
        partition_program(functional, count=1)


class _Detached(torch.nn.Module):
    """A forward that makes a constant and detaches it in place, as lerobot's pi0.5 does."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.tensor([2.0])
        scale.detach_()
        return (x @ self.weight) * scale


def test_detach_in_place_writes_no_data_and_is_partitioned() -> None:
    program = torch.export.export(_Detached(), (torch.randn(2, 16),))
    assert any(n.target == torch.ops.aten.detach_.default for n in program.graph.nodes)
    parts = partition_program(program, cap_bytes=16 * 16 * 4)
    x = torch.randn(2, 16)
    torch.testing.assert_close(_run_eagerly(program, parts, x), program.module()(x), rtol=0, atol=0)
