"""The engines of a compiler backend, planned once: graph partitions of the exported model.

For the ``copy`` backend the plan cuts the model in module order
(:mod:`harness.engines.partition`). A compiler backend builds from the exported program instead,
so its engines are the program's graph partitions
(:func:`~harness.engines.compile.graph_partition.partition_program`): :func:`plan_graph_engines`
takes the model built on meta with the checkpoint mapped into it (nothing is read), exports the
scenario's entry on its example inputs and partitions the program by the scenario's count or cap.
Every strategy's worker exports and partitions its own loaded model again and checks that
it got the same partitions (:func:`same_partitions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from harness.engines.compile.entry import export_entry
from harness.engines.compile.graph_partition import GraphPartition, PartitionRule, cap_for_program
from harness.scenario import BuildConfig, ModelConfig

__all__ = ["GraphEngine", "plan_graph_engines", "rule_for", "same_partitions"]


@dataclass(frozen=True)
class GraphEngine:
    """One planned engine: its partition's first and last node, the weight names it reads, their bytes."""

    index: int
    nodes: tuple[str, ...]
    names: tuple[str, ...]
    weight_bytes: int


def rule_for(engines: int | None, cap_bytes: int | None) -> PartitionRule:
    """The partition rule of a scenario's ``build.engines`` / ``build.engine_cap_mib``."""
    return PartitionRule(count=engines, cap_bytes=None if engines is not None else cap_bytes)


def plan_graph_engines(model: nn.Module, cfg: ModelConfig, build: BuildConfig, seed: int,
                       ) -> tuple[list[GraphEngine], int]:
    """The graph partitions of ``model`` (built from ``cfg``, its checkpoint mapped and its non-persistent
    buffers filled) exported on example inputs drawn from ``seed``, cut as ``build`` asks, and the per-engine
    cap they were cut at."""
    cap = build.engine_cap_bytes
    rule = rule_for(build.engines, cap)
    entry = export_entry(cfg, model, tokens=build.tokens, seed=seed)
    with torch.no_grad():
        program = torch.export.export(entry.module, entry.args, entry.kwargs, strict=False)
    parts = rule.apply(program)
    used = cap if cap is not None else cap_for_program(program, rule.count or 1)
    return [_engine(p) for p in parts], used


def _engine(part: GraphPartition) -> GraphEngine:
    ends = (part.nodes[0], part.nodes[-1]) if part.nodes else ()
    return GraphEngine(part.index, ends, part.weights, part.weight_bytes)


def same_partitions(planned: Sequence[Sequence[str]], got: list[GraphPartition]) -> str | None:
    """Why the worker's partitions differ from the planned ones (weight names per engine); None when equal."""
    if len(planned) != len(got):
        return f"the plan has {len(planned)} engines, the exported model cuts into {len(got)}"
    for names, part in zip(planned, got, strict=True):
        if tuple(names) != tuple(part.weights):
            return f"engine {part.index} reads other weights than planned"
    return None
