"""A scenario resolved once, in the parent, into what every strategy's process runs.

:func:`make_plan` checks the backend, resolves the device (``auto`` to ``cuda`` or
``cpu``; ``cuda`` without one is an error before anything is written), builds the model
on the meta device, splits it into engines (each engine a list of tensor names, in
build order: module order for the ``copy`` backend, the exported program's graph
partitions for a compiler backend, :mod:`harness.engines.compile.graph_engines`), makes sure
the checkpoint exists (generating it only where the scenario allows), and decides how the
strategies that map read it (:mod:`harness.checkpoint_reading`): the disk's read-ceiling sweep where the
scenario has a cold cache and ``read_ceiling`` on, the read probe where a setting is left to
it, and prefetch sized to the sweep's fastest point. The :class:`Plan` it returns is the run's
single resolution, never changed after: written once to ``plan.json`` before any round (warm-up
rounds included) and handed to each worker (:mod:`harness.worker`), which rebuilds the model on
meta from the plan's model configuration, checks it against the plan, and measures with the
plan's settings alone; it never reads the scenario file, so a
:class:`~harness.scenario.Scenario` built in code runs as well as one read from TOML. ``harness
run`` and ``harness budget`` both make their plan here.

Errors a user can cause are :class:`~harness.errors.HarnessError`\\ s that start with
the scenario file and key: ``scenarios/x.toml: build.engines: 12 engines asked for, ...``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.catalog import builds_read_weights, is_gpu, writes_weights_to_files
from harness.checkpoint_reading import resolve_reading
from harness.engines.partition import Engine, model_bytes, module_engines
from harness.engines.registry import BackendUnavailable, check_backend, resolve_device
from harness.errors import PlanError
from harness.fileio.atomic import write_json
from harness.fileio.codec import decode, encode
from harness.fileio.files import read_json_file
from harness.load.gpu_loaders import check_loaders
from harness.load.gpu_peers import LoaderUnavailable
from harness.models import build_model, fill_non_persistent
from harness.models.checkpoints import checkpoint_specs, describe_specs
from harness.models.user_checkpoint import resolve_checkpoint
from harness.results.checkpoint_reading import ReadingChoice
from harness.results.disk import CeilingPoint
from harness.results.record import LAYOUT_VERSION, CheckpointInfo, ModelInfo, RecordError
from harness.scenario import Scenario, validate_scenario
from harness.units import GIB
from weightmap import map_weights

__all__ = ["PLAN_VERSION", "EnginePlan", "Plan", "make_plan", "read_plan", "write_plan"]

PLAN_VERSION = 6
"""The version of ``plan.json``'s own keys (the :class:`Plan`'s fields), written under its ``"plan"`` key; a worker
refuses a plan of another version. It counts apart from the results layout: the records a plan holds
(:class:`~harness.results.record.ModelInfo`, :class:`~harness.results.record.CheckpointInfo`,
:class:`~harness.results.checkpoint_reading.ReadingChoice`, :class:`~harness.results.disk.CeilingPoint`) are results
records, whose fields' ``since`` and ``absent_until`` are :data:`~harness.results.record.LAYOUT_VERSION` numbers;
``plan.json`` holds them at the layout its ``"layout"`` key states, which must be this code's. Version 4 wrote
paths relative to the repository root where inside it (:mod:`harness.fileio.paths`); version 5 adds
``read_ceiling`` and ``read_ceiling_error`` and the ``"layout"`` key, and holds ``speed`` as sized to the sweep;
version 6 names it ``reading``."""


@dataclass(frozen=True)
class EnginePlan:
    """One engine to build: the modules it covers and the tensor names it reads, in build order.

    For a graph partition (compiler backends) ``modules`` holds the partition's first and
    last graph node instead.
    """

    index: int
    modules: tuple[str, ...]
    names: tuple[str, ...]
    weight_bytes: int

    @classmethod
    def of(cls, engine: Engine) -> EnginePlan:
        return cls(engine.index, engine.modules, engine.names, engine.nbytes)


@dataclass(frozen=True)
class Plan:
    """Everything a strategy's process needs, resolved once and never changed after; see the module docstring.

    ``scenario`` is the validated scenario, every setting as given or as its default
    (declared in :mod:`harness.scenario` only); the other fields are what :func:`make_plan`
    resolved from it: the results' ``name``, the ``model`` and ``checkpoint`` measured and
    the checkpoint's files, the ``device`` engines are built on, the per-engine weight cap and
    the ``engines`` in build order, the ``workdir`` engines are written under, the ``reading``
    settings of the strategies that map (the scenario's, or chosen by a read probe, with prefetch
    sized to the read-ceiling sweep: :mod:`harness.checkpoint_reading`), and that sweep's points,
    ``read_ceiling`` (empty where none was made), or why it failed, ``read_ceiling_error``.
    ``plan.json`` holds every field, written and read by :mod:`harness.fileio.codec`: its paths (the scenario's,
    the checkpoint's, ``checkpoint_files`` and ``workdir``) relative to the repository root where inside it,
    read back absolute (:mod:`harness.fileio.paths`).
    """

    scenario: Scenario
    name: str
    model: ModelInfo
    checkpoint: CheckpointInfo
    checkpoint_files: tuple[str, ...] = field(metadata={"path": True})
    device: str
    engine_cap_bytes: int
    engines: tuple[EnginePlan, ...]
    workdir: str = field(metadata={"path": True})
    reading: ReadingChoice
    read_ceiling: tuple[CeilingPoint, ...] = ()
    read_ceiling_error: str | None = None

    @property
    def compiler(self) -> bool:
        """Whether the backend exports the model and builds from its graph partitions."""
        return self.scenario.build.compiler

    @property
    def memory_limit_bytes(self) -> int | None:
        """The scenario's per-strategy memory limit in bytes; ``None``: no limit."""
        limit = self.scenario.run.memory_limit_gib
        return int(limit * GIB) if limit else None

    @property
    def prefetch(self) -> str | None:
        """The method strategies with a prefetch plan warm the page cache with; ``None`` when off."""
        return self.reading.prefetch

    @property
    def drop_cache(self) -> bool:
        """Whether strategies with a prefetch plan drop released weights from the page cache."""
        return self.reading.drop_cache

    @property
    def writes_weights_to_files(self) -> bool:
        """Whether the engine builds write their weights' bytes into files
        (:func:`harness.catalog.writes_weights_to_files`)."""
        return writes_weights_to_files(on_gpu=is_gpu(self.device),
                                       compiler_weights=self.scenario.build.compiler_weights)

    @property
    def largest_engine_bytes(self) -> int:
        return max(e.weight_bytes for e in self.engines)

    def to_json(self) -> dict[str, Any]:
        """``plan.json``: ``"plan"`` (:data:`PLAN_VERSION`), ``"layout"`` (the results layout of the records it holds,
        :data:`~harness.results.record.LAYOUT_VERSION`), then every field (:func:`~harness.fileio.codec.encode`)."""
        return {"plan": PLAN_VERSION, "layout": LAYOUT_VERSION, **encode(self)}

    @classmethod
    def from_json(cls, data: Any, source: str) -> Plan:
        """The plan in ``data`` (:func:`~harness.fileio.codec.decode`, its records read at the results layout
        :data:`~harness.results.record.LAYOUT_VERSION`); :class:`~harness.results.record.RecordError` naming
        ``source`` and the key when it is not a plan of :data:`PLAN_VERSION` holding records of that layout."""
        if not isinstance(data, dict) or data.get("plan") != PLAN_VERSION:
            raise RecordError(f"{source}: not a plan of version {PLAN_VERSION}")
        if data.get("layout") != LAYOUT_VERSION:
            raise RecordError(f"{source}: layout: expected {LAYOUT_VERSION}, the results layout this harness writes, "
                              f"got {data.get('layout')!r}")
        fields = {k: v for k, v in data.items() if k not in ("plan", "layout")}
        return decode(cls, fields, source=source, version=LAYOUT_VERSION)


def write_plan(path: Path, plan: Plan) -> Path:
    """Write ``plan`` as JSON (atomically)."""
    data = plan.to_json()
    return write_json(path, data)


def read_plan(path: Path) -> Plan:
    """The plan at ``path``; :class:`~harness.results.record.RecordError` when it is not one."""
    return Plan.from_json(read_json_file(Path(path)), str(path))


def make_plan(scenario: Scenario, *, name: str, workdir: Path, progress: Any = None) -> Plan:
    """Resolve ``scenario`` into a :class:`Plan` (see the module docstring); ``progress`` gets one line per step.

    Raises a :class:`~harness.errors.HarnessError` naming the scenario file and key for
    a number out of its range or a model too large to represent
    (:func:`~harness.scenario.validate_scenario`, first), a backend or device this machine
    lacks, a GPU loader peer whose package or device it lacks
    (:func:`~harness.load.gpu_loaders.check_loaders`), a model with no weight bytes, more
    engines than the model has units, and a checkpoint path that is a FIFO or another file that is not a
    regular one (found by ``stat``, never opened), a directory where one is to be generated, one to generate
    that does not fit on its disk, or, without ``checkpoint.generate``, a checkpoint (a file, a sharded folder or
    its index) that is missing, unreadable or does not fit the model
    (:func:`~harness.models.user_checkpoint.resolve_checkpoint`); nothing is written before
    these checks except the checkpoint itself.
    """
    from harness.engines.compile.entry import EntryError
    from harness.engines.compile.graph_engines import plan_graph_engines
    from harness.engines.compile.graph_partition import PartitionError
    from harness.load.strategies import STRATEGIES

    say = progress or (lambda message: None)
    where = scenario.where
    build = scenario.build
    validate_scenario(scenario)  # one built in code never went through the loader's checks
    info = build_model(scenario.model)  # first: a model that cannot be built here says why
    specs = checkpoint_specs(info.module)  # persistent tensors, a tied one once
    sizes = describe_specs(specs)
    if sizes["nbytes"] == 0:
        raise PlanError(f"{where('model')}: {info.name} has no weight bytes "
                        f"({sizes['tensors']} tensors, all empty): there is nothing to measure")
    with_buffers = model_bytes(info.module)
    if not build.compiler:  # before the checkpoint is generated: too many engines is the user's to fix
        parts, cap = module_engines(info.module, build, where)
        engines = [EnginePlan.of(e) for e in parts]
    try:  # what this machine lacks, before anything is written: the backend, the device, a GPU loader peer's
        check_backend(build.backend, build.weights)
    except BackendUnavailable as exc:
        raise BackendUnavailable(f"{where('build.backend')}: {exc}") from exc
    try:
        device = resolve_device(build.device)
    except BackendUnavailable as exc:
        raise BackendUnavailable(f"{where('build.device')}: {exc}") from exc
    try:
        check_loaders(scenario.strategies, device)  # a GPU loader peer's package and device, as for a backend
    except LoaderUnavailable as exc:
        raise LoaderUnavailable(f"{where('strategies')}: {exc}") from exc
    say(f"model {info.name} ({info.source}); {info.source_note}".rstrip("; "))
    checkpoint = resolve_checkpoint(info.module, scenario.checkpoint, where)  # errors name checkpoint.path
    path = checkpoint.path
    say(("generated " if checkpoint.info.generated else "reusing ") + str(path)
        + (f" ({checkpoint.info.files} files)" if checkpoint.info.sharded else ""))
    if build.compiler:  # the graph is exported from the model with the checkpoint mapped (nothing is read)
        map_weights(info.module, path, strict=True).close()
        fill_non_persistent(info.module)
        try:
            planned, cap = plan_graph_engines(info.module, scenario.model, build, scenario.checkpoint.seed)
        except EntryError as exc:
            raise PlanError(f"{where('model')}: {exc}") from exc
        except PartitionError as exc:
            raise PlanError(f"{where('build')}: the exported graph cannot be partitioned: {exc}") from exc
        engines = [EnginePlan(e.index, e.nodes, e.names, e.weight_bytes) for e in planned]
        say(f"exported the model and cut its graph into {len(engines)} partitions")
    for strategy_name in scenario.strategies:  # each one-off step (a ``.pt`` conversion), before any measured run
        strategy = STRATEGIES[strategy_name]
        if strategy.prepare is None:
            continue
        say(f"{strategy_name}: preparing (once, outside the measured runs)")
        try:
            done = strategy.prepare(path)
        except OSError as exc:
            raise PlanError(f"{where('strategies')}: {strategy_name}: cannot prepare its files from {path} "
                            f"({exc.strerror or exc})") from exc
        read = ", ".join(str(f) for f in strategy.files_read(path))
        say(f"{strategy_name}: {'converted to' if done else 'reusing'} {read}")
    files = tuple(str(f) for f in checkpoint.files)
    settings = resolve_reading(scenario.run, files, builds_read_weights(
        on_gpu=is_gpu(device), compiler_weights=build.compiler_weights), say)
    return Plan(
        scenario=scenario,
        name=name,
        model=ModelInfo(name=info.name, source=info.source, source_note=info.source_note,
                        tensors=sizes["tensors"], bytes=sizes["nbytes"],
                        bytes_with_non_persistent_buffers=with_buffers),
        checkpoint=checkpoint.info,
        checkpoint_files=files,
        device=device,
        engine_cap_bytes=cap,
        engines=tuple(engines),
        workdir=str(workdir),
        reading=settings.choice,
        read_ceiling=settings.ceiling,
        read_ceiling_error=settings.ceiling_error,
    )
