"""A scenario resolved into the predictor's inputs the way :func:`harness.plan.make_plan` resolves it, reading no
weight: the model on meta, its engines (in module order for the ``copy`` backend,
:func:`harness.engines.partition.module_engines`; a compiler's graph partitions,
:func:`~harness.engines.compile.graph_engines.plan_graph_engines`, which maps the checkpoint and exports without
reading a page), the checkpoint's headers where it exists. No checkpoint is generated, and neither
the read probe nor the read-ceiling sweep runs. Where the checkpoint is missing, the sizes are the model's tensors'
and a compiler's engines are cut in module order instead of from its graph; the inputs' ``source`` says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.engines.partition import module_engines
from harness.engines.registry import BackendUnavailable, resolve_device
from harness.errors import PlanError
from harness.measure.coldcache import drop_cached
from harness.measure.residency import FileResidency
from harness.models import build_model, fill_non_persistent
from harness.models.checkpoints import checkpoint_specs, describe_specs
from harness.predict.inputs import Baseline, PredictInputs
from harness.scenario import Scenario, validate_scenario
from weightmap import map_weights, open_checkpoint

__all__ = ["header_bytes", "inputs_of_scenario", "residency_kept"]


@contextmanager
def residency_kept(path: Path) -> Iterator[None]:
    """Leave a one-file checkpoint's page-cache residency as it was: where none of its pages was cached before the
    block, the pages it brought in (header reads, read-ahead) are dropped after it. A sharded checkpoint's files are
    known only from its index, so its residency is left to the reads themselves."""
    single = path.is_file() and path.suffix != ".json"
    residency = FileResidency([path]) if single else None
    try:
        cold = residency is not None and residency.page_cache_visible and residency.resident_bytes() == 0
        yield
        if cold:
            fd = os.open(path, os.O_RDONLY)
            try:
                drop_cached(fd)
            finally:
                os.close(fd)
    finally:
        if residency is not None:
            residency.close()


def header_bytes(path: Path) -> int:
    """The tensors' bytes as the checkpoint's headers state them (every header read and validated, no weight)."""
    return sum(entry.nbytes for _, entry in open_checkpoint(path).entries.values())


def inputs_of_scenario(scenario: Scenario, baseline: Baseline, *, device: str | None = None,
                       say: Callable[[str], None] = lambda message: None) -> PredictInputs:
    """The predictor's inputs for ``scenario`` on ``device`` (default: the scenario's, resolved on this machine)
    with ``baseline``; see the module docstring. Errors a user can fix are
    :class:`~harness.errors.HarnessError` s naming the scenario file and key."""
    from harness.engines.compile.entry import EntryError
    from harness.engines.compile.graph_engines import plan_graph_engines
    from harness.engines.compile.graph_partition import PartitionError

    validate_scenario(scenario)
    build = scenario.build
    if device is None:
        try:
            device = resolve_device(build.device)
        except BackendUnavailable as exc:
            raise BackendUnavailable(f"{scenario.where('build.device')}: {exc}") from exc
    info = build_model(scenario.model)
    sizes = describe_specs(checkpoint_specs(info.module))
    if sizes["nbytes"] == 0:
        raise PlanError(f"{scenario.where('model')}: {info.name} has no weight bytes: there is nothing to predict")
    path = Path(scenario.checkpoint.path)
    present = path.exists()
    if present:
        with residency_kept(path):
            model_bytes, source = header_bytes(path), f"the headers of {path}"
    else:
        model_bytes, source = sizes["nbytes"], f"the model's tensors ({path} does not exist)"
    if build.compiler and present:
        say(f"exporting the model's graph with {path} mapped, to cut its engines")
        try:
            with residency_kept(path):  # the graph is exported from the model with the checkpoint mapped
                map_weights(info.module, path, strict=True).close()
                fill_non_persistent(info.module)
                planned, _ = plan_graph_engines(info.module, scenario.model, build, scenario.checkpoint.seed)
        except EntryError as exc:
            raise PlanError(f"{scenario.where('model')}: {exc}") from exc
        except PartitionError as exc:
            raise PlanError(f"{scenario.where('build')}: the exported graph cannot be partitioned: {exc}") from exc
        engines = tuple(e.weight_bytes for e in planned)
        source += ", the exported graph's partitions"
    else:
        engines = tuple(e.nbytes for e in module_engines(info.module, build, scenario.where)[0])
        source += ", engines in module order" + (" (a compiler cuts its graph instead: no checkpoint to export "
                                                 "from)" if build.compiler else "")
    return PredictInputs(model_bytes=model_bytes, engine_bytes=engines, device=device, backend=build.backend,
                         compiler_weights=build.compiler_weights, strategies=tuple(scenario.strategies),
                         baseline=baseline, source=source)
