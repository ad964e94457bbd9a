"""Benchmark scenarios: TOML files under ``scenarios/`` loaded into frozen dataclasses.

:func:`load_scenario` validates the whole file before anything runs. An unknown key,
a value of the wrong type, a value outside its allowed set or range, or a file that
does not exist raises :class:`ScenarioError` (a :class:`ValueError`) whose message
starts with the scenario file and the dotted key, e.g.
``scenarios/smoke.toml: build.engines: expected an integer >= 1 and <= 4096, got "8" (str)``.

Numbers
    Every number has a range (:data:`~harness.scenario_rules.LIMITS`), checked when the file is loaded and again by
    :func:`validate_scenario` for a scenario built in code, before anything runs; the error
    says the range. Floats must be finite; integers must fit the range whatever their size
    in the file. The model's weights, computed from its settings without building it,
    must come to at most :data:`MAX_MODEL_BYTES` (16 TiB); a spec lists at most
    :data:`MAX_SPEC_TENSORS` tensors and nests at most :data:`MAX_SPEC_NESTING` levels; a
    scenario file nests at most :data:`MAX_NESTING` levels. Whether the checkpoint fits on
    its disk, and its largest tensor in memory, is checked before it is generated
    (:func:`harness.models.checkpoints.ensure_checkpoint`).

Paths
    The repository root is the current working directory: run the harness from a
    checkout. ``checkpoint.path`` resolves against it. ``model.spec`` resolves
    against the scenario file's directory first and, when nothing is there, against
    the repository root (so ``spec = "harness/specs/pi05.json"`` works from
    ``scenarios/``). All paths in a loaded :class:`Scenario` are absolute. A scenario
    file, a spec or a checkpoint path that is there but is not a regular file (a FIFO, a
    socket, a device; a directory for a checkpoint to generate) is refused before anything opens it.
    Without ``checkpoint.generate``, ``checkpoint.path`` may also name a folder holding a checkpoint (one
    ``model.safetensors``, or shards and ``model.safetensors.index.json``) or that index:
    :mod:`harness.models.user_checkpoint` reads it. With ``checkpoint.generate`` and ``checkpoint.max_shard_size``
    it names the folder the harness writes shards into (:mod:`harness.models.sharded`).

Schema: one line per key, ``key  what it takes [default]``, as ``python -m harness schema scenario`` prints it
from the fields of :class:`Scenario` and of its tables (:data:`TABLES`), with what each key means and the rules
it follows beside the others indented under it (``harness/tests/test_schema.py`` checks these lines against the
fields); where a registry keeps a key's choices, these lines name the registry and the command lists the choices
registered now (:func:`harness.schema.scenario_schema`); ``reference.*`` are the keys of each ``[[reference]]``
table; see ``scenarios/*.toml`` for examples::

    name                                string [required]
        results go under results/<name>/: [a-z0-9_-]+, not ending in "-budget" nor holding "-vs-", which the
        names of budget sweeps' results and of comparisons' files are made with (:mod:`harness.results.names`)
    description                         string [""]
    strategies                          list of strings [["map", "load", "load_file", "torch_mmap",
                                        "stream", "read_file", "map_no_prefetch", "map_keep_cache"]]
        names of :data:`harness.catalog.STRATEGY_LISTINGS`, at least one, none twice, run in the order given
    model.source                        "synthetic" | "spec" | "lerobot" | "factory" | "transformers"
                                        ["synthetic"]
        which keys apply: synthetic: layers, width, heads, vocab, ffn_mult, dtype; spec: spec, trim; lerobot:
        spec, trim, fallback; factory: factory, inputs; transformers: config, inputs; any other key of [model] is
        an error
    model.layers                        an integer >= 1 and <= 1024 [absent]
        required for a synthetic model, as are width and vocab
    model.width                         an integer >= 1 and <= 65536 [absent]
    model.heads                         an integer >= 1 and <= 4096 [8]
        width must be a multiple of heads, with an even head size
    model.vocab                         an integer >= 1 and <= 16777216 [absent]
    model.ffn_mult                      an integer >= 1 and <= 64 [4]
    model.dtype                         "float32" | "bfloat16" | "float16" ["float32"]
    model.spec                          path [absent]
        a weight-spec JSON, required for spec and lerobot (the model lerobot's is checked against): it must
        exist and be UTF-8 JSON with a "tensors" list of at most :data:`MAX_SPEC_TENSORS` tensors and buffers
    model.fallback                      "spec" [absent]
        lerobot only: build from the spec where lerobot cannot be imported (recorded); absent, that is an error
        at run time
    model.trim                          list of strings [[]]
        tensor names left out of the model; each must be in the spec
    model.factory                       string [absent]
        factory only, required: "package.module:function", a function of no arguments returning the user's
        nn.Module, imported as python -m imports from the current directory and called under
        weightmap.init_empty_weights (:mod:`harness.models.factory`)
    model.config                        path [absent]
        transformers only, required: a folder holding config.json (a hub snapshot) or the file, resolved as spec
        is; the model is the class its "architectures" names, built empty (:mod:`harness.models.hf`)
    model.inputs                        string [absent]
        factory and transformers: "package.module:function" called with the model, returning the example
        inputs a compiler backend exports it with (a tensor, a tuple of tensors or a dict of them); absent:
        build.tokens token ids, for a model that takes them (:mod:`harness.engines.compile.entry`)
    checkpoint.path                     path [data/<model key>.safetensors; transformers: the config's
                                        folder]
        a path that does not exist is an error unless generate is true
    checkpoint.seed                     an integer >= 0 and <= 9223372036854775807 [0]
        the seed of the generated values
    checkpoint.generate                 true | false [true without a path, false with one or for factory and
                                        transformers]
        write the checkpoint (seeded values) when the file is missing or was generated for another model or seed
    checkpoint.max_shard_size           string [absent]
        only with generate: path is a folder, written as transformers' save_pretrained(max_shard_size=...)
        writes it ("5GB", "500MB": weightmap.parse_size): model-00001-of-0000N.safetensors and an index
    build.engines                       an integer >= 1 and <= 4096 [absent]
        exactly one of engines and engine_cap_mib: exactly that many engines (the model needs at least as many
        weight units) / at most that many MiB of weights per engine, at least one byte
    build.engine_cap_mib                a number > 0 and <= 16777216 (MiB, 16 TiB) [absent]
    build.backend                       one of the backends registered in harness.backends ["copy"]
        a compiler backend (:func:`harness.backends.compiler_backends`) exports the model, so it takes neither
        model.source = "spec" nor a model.fallback
    build.device                        "auto" | "cpu" | "cuda" ["auto"]
    build.release                       true | false [true]
    build.weights                       "packaged" | "packaged_compiler" | "mapped" ["mapped"]
        compiler backends only: whether each engine runs on the model's own (mapped) tensors or holds a copy of
        its weights, written into it by the harness from the model's tensors (packaged) or by the compiler
        (packaged_compiler); each compiler backend builds the settings its spec gives it
        (:attr:`harness.backends.spec.BackendSpec.weights`), the only one its default where it has one
    build.tokens                        an integer >= 1 and <= 8192 [16]
        compiler backends only: the length of the example input the model is exported and checked with
    run.cache                           "cold" | "warm" ["cold"]
    run.sample_interval_ms              a number >= 0.1 and <= 60000 (ms) [10.0]
    run.residency_every                 an integer >= 1 and <= 100000 [1]
    run.memory_limit_gib                a number >= 0.0009765625 and <= 1048576 (GiB, 1 MiB to 1 PiB)
                                        [absent]
        absent: no limit; a worker past the limit, or past timeout_s, is stopped and recorded as failed
    run.timeout_s                       a number > 0 and <= 604800 (s, a week) [1800.0]
    run.prefetch                        "auto" | "off" | "fadvise" | "madvise" | "read" ["auto"]
        how strategies that map (map) warm the page cache for the next engine while one builds (map_no_prefetch
        never does); auto: chosen per run by a read probe of the checkpoint (:mod:`harness.checkpoint_reading`), and the
        results say what was chosen and why
    run.drop_cache                      true | false [absent]
        such strategies also drop released weights from the page cache (map_keep_cache never does); absent:
        chosen per run as prefetch is
    run.repeats                         an integer >= 1 and <= 100 [1]
        cold runs of each strategy, each in a fresh process, interleaved in an order that changes from round to
        round (:mod:`harness.rounds`); the report shows the median wall time and the spread
    run.warmup                          an integer >= 0 and <= 100 [0]
        rounds run first and discarded (each strategy once, and the disk read), so that what a cold guest cache
        does not reset (a virtual disk's host cache, memory the host must back again) is alike for every
        measured round
    run.read_ceiling                    true | false [true]
        a cold run sweeps the disk's read ceiling (reader threads by request sizes) before its first round
    run.shared_disk                     true | false [true]
        where engines are files, a cold run times the disk read and written at once after its last round
    reference.label                     string [required]
        a [[reference]] table: figures measured on another setup, shown beside the run's own and marked as such
    reference.host_at_partitioning_gib  a number >= 0 and <= 1048576 (GiB) [absent]
    reference.host_gpu_peak_gib         a number >= 0 and <= 1048576 (GiB) [absent]
    reference.host_peak_gib             a number >= 0 and <= 1048576 (GiB) [absent]
    reference.note                      string [""]
    cluster.partition                   string [absent]
        the Slurm partition of each job of ``--executor slurm`` (:mod:`harness.scenario_cluster`)
    cluster.account                     string [absent]
    cluster.time                        string [absent]
        a job's time limit in Slurm's format; absent: the attempt's timeout plus a minute
    cluster.gpus                        integer [0]
    cluster.cpus                        integer [1]
    cluster.sbatch_options              list of strings [[]]
        more sbatch options, as they are; never --mem (the limit being measured) nor one the harness sets
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.backends import BACKENDS, backend_names, compiler_backends
from harness.catalog import DEFAULT_STRATEGIES, ENGINE_WEIGHTS
from harness.errors import HarnessError
from harness.fileio.codec import TABLE_STYLE, Limit, decode, decode_fields, describe_typed, encode
from harness.fileio.files import not_regular
from harness.results.record import Reference
from harness.scenario_cluster import ClusterSettings
from harness.scenario_rules import (
    callable_problem,
    limit,
    name_problem,
    one_of,
    repeats,
    size_problem,
    strategies_problem,
)
from harness.units import MIB
from harness.weightspec import (
    MAX_MODEL_BYTES,
    MAX_SPEC_NESTING,
    MAX_SPEC_TENSORS,
    SpecFileError,
    dtype_itemsize,
    model_bytes_problem,
    read_spec,
    read_spec_data,
    spec_problem,
)
from weightmap import PREFETCH_METHODS, parse_size

__all__ = [
    "CACHES",
    "ENGINE_WEIGHTS",
    "DEVICES",
    "MODEL_DTYPES",
    "PREFETCH",
    "SOURCES",
    "USER_SOURCES",
    "TABLES",
    "TOP_KEYS",
    "MAX_MODEL_BYTES",
    "MAX_NESTING",
    "MAX_SPEC_NESTING",
    "MAX_SPEC_TENSORS",
    "BuildConfig",
    "CheckpointConfig",
    "Limit",
    "ModelConfig",
    "Reference",
    "RunConfig",
    "Scenario",
    "ScenarioError",
    "checkpoint_path_problem",
    "config_identity",
    "config_problem",
    "default_generate",
    "default_checkpoint_for",
    "load_scenario",
    "parse_scenario",
    "synthetic_numel",
    "validate_scenario",
]

SOURCES: tuple[str, ...] = ("synthetic", "spec", "lerobot", "factory", "transformers")
USER_SOURCES: tuple[str, ...] = ("factory", "transformers")
"""The sources that build a model the user brings: its checkpoint is theirs, so ``checkpoint.generate`` defaults to
false (:func:`default_generate`)."""
CONFIG_FILE = "config.json"
"""The file a ``transformers`` source's ``model.config`` folder holds."""
MODEL_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
CACHES: tuple[str, ...] = ("cold", "warm")
PREFETCH_OFF = "off"
"""The ``[run] prefetch`` setting that turns prefetching off."""
PREFETCH_AUTO = "auto"
"""The ``[run] prefetch`` setting that leaves the choice to the run's read probe (:mod:`harness.checkpoint_reading`)."""
PREFETCH: tuple[str, ...] = (PREFETCH_AUTO, PREFETCH_OFF, *PREFETCH_METHODS)
DEFAULT_PREFETCH = PREFETCH_AUTO
FALLBACKS: tuple[str, ...] = ("spec",)

DATA_DIR = Path("data")
"""Where default checkpoints go, relative to the repository root."""

MAX_NESTING = 8
"""How deep a scenario file may nest arrays and tables (the schema needs 3)."""


_SYNTHETIC_KEYS = frozenset({"layers", "width", "heads", "vocab", "ffn_mult", "dtype"})
_SPEC_KEYS = frozenset({"spec", "trim"})
_MODEL_KEYS = {
    "synthetic": frozenset({"source"}) | _SYNTHETIC_KEYS,
    "spec": frozenset({"source"}) | _SPEC_KEYS,
    "lerobot": frozenset({"source", "fallback"}) | _SPEC_KEYS,
    "factory": frozenset({"source", "factory", "inputs"}),
    "transformers": frozenset({"source", "config", "inputs"}),
}


class ScenarioError(HarnessError, ValueError):
    """A scenario file is missing, is not UTF-8 TOML, or breaks the schema.

    The message starts with the file and, where there is one, the dotted key.
    """


_STYLE = dataclasses.replace(TABLE_STYLE, error=ScenarioError)
"""How :func:`harness.fileio.codec.decode` reports a scenario table's errors."""


# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class ModelConfig:
    """What model to build (see :mod:`harness.models`).

    ``layers``/``width``/``vocab`` are ``None`` unless the source is synthetic (where
    ``heads``/``ffn_mult``/``dtype`` also apply; elsewhere they keep their defaults
    and are ignored). ``spec``/``fallback``/``trim`` apply to spec and lerobot only;
    ``spec`` is an absolute path after :func:`load_scenario`. ``factory`` (``"module:function"``) applies to the
    factory source, ``config`` (the ``config.json`` file, absolute after loading) to transformers, ``inputs``
    (``"module:function"``) to both.
    """

    source: str = field(default="synthetic", metadata=one_of(SOURCES))
    layers: int | None = field(default=None, metadata=limit("model.layers"))
    width: int | None = field(default=None, metadata=limit("model.width"))
    heads: int = field(default=8, metadata=limit("model.heads"))
    vocab: int | None = field(default=None, metadata=limit("model.vocab"))
    ffn_mult: int = field(default=4, metadata=limit("model.ffn_mult"))
    dtype: str = field(default="float32", metadata=one_of(MODEL_DTYPES))
    spec: Path | None = None
    fallback: str | None = field(default=None, metadata=one_of(FALLBACKS))
    trim: tuple[str, ...] = field(default=(), metadata={"check": repeats})
    factory: str | None = field(default=None, metadata={"check": callable_problem})
    config: Path | None = None
    inputs: str | None = field(default=None, metadata={"check": callable_problem})

    @property
    def key(self) -> str:
        """A file-name-safe name that differs whenever the model's tensors differ.

        Synthetic: ``synthetic-l<layers>-w<width>-h<heads>-v<vocab>-f<ffn_mult>-<dtype>``.
        Spec and lerobot (which must equal its spec): the spec file's stem, plus
        ``-trim<count>-<crc32 of the sorted names>`` when tensors are trimmed.
        Factory: ``factory-<function>-<crc32 of "module:function">``. Transformers: ``<model_type>-<crc32 of
        config.json's bytes>`` (``model`` where the file names no ``model_type`` or cannot be read).
        """
        if self.source == "factory":
            spec = self.factory or ""
            return f"factory-{_file_safe(spec.rpartition(':')[2])}-{zlib.crc32(spec.encode()) & 0xFFFFFFFF:08x}"
        if self.source == "transformers":
            kind, digest = config_identity(self.config)
            return f"{_file_safe(kind)}-{digest:08x}"
        if self.source == "synthetic":
            return (
                f"synthetic-l{self.layers}-w{self.width}-h{self.heads}-v{self.vocab}"
                f"-f{self.ffn_mult}-{self.dtype}"
            )
        stem = _file_safe(self.spec.stem if self.spec else "model")
        if not self.trim:
            return stem
        digest = zlib.crc32("\n".join(sorted(self.trim)).encode()) & 0xFFFFFFFF
        return f"{stem}-trim{len(self.trim)}-{digest:08x}"


def _file_safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text) or "model"


def config_identity(config: Path | None) -> tuple[str, int]:
    """A transformers config's ``model_type`` (``"model"`` where it names none) and the crc32 of its bytes."""
    try:
        data = b"" if config is None else config.read_bytes()
        kind = json.loads(data).get("model_type") if data else None
    except (OSError, ValueError, AttributeError):
        kind = None
    return (kind if isinstance(kind, str) and kind else "model"), zlib.crc32(data) & 0xFFFFFFFF


def default_generate(model: ModelConfig, path_given: bool) -> bool:
    """``checkpoint.generate`` where a scenario leaves it out: true for a model of the harness's own without a
    path; false with a path, or for a model the user brings (:data:`USER_SOURCES`): its checkpoint is theirs."""
    return not path_given and model.source not in USER_SOURCES


@dataclass(frozen=True)
class CheckpointConfig:
    """Where the checkpoint lives (absolute after loading), the seed of its values, and whether
    the harness may write it (``generate``)."""

    path: Path
    seed: int = field(default=0, metadata=limit("checkpoint.seed"))
    generate: bool = False
    max_shard_size: str | None = field(default=None, metadata={"check": size_problem})

    @property
    def max_shard_bytes(self) -> int | None:
        """``max_shard_size`` in bytes (:func:`weightmap.parse_size`); ``None``: one file, not shards."""
        return None if self.max_shard_size is None else parse_size(self.max_shard_size)

    def problem(self) -> tuple[str, str] | None:
        """The key and the rule broken where these settings cannot go together (shards only of a checkpoint the
        harness generates; a folder for shards, one file otherwise), found with ``stat`` alone; None when fine."""
        if self.max_shard_size is not None and not self.generate:
            return "max_shard_size", ("only with generate = true: the harness writes shards of a checkpoint it "
                                      "generates; a checkpoint of yours is read as it is (a sharded folder too)")
        problem = checkpoint_path_problem(self.path, generate=self.generate, sharded=self.max_shard_size is not None)
        return None if problem is None else ("path", problem)


@dataclass(frozen=True)
class BuildConfig:
    """How the model is partitioned and built: exactly one of ``engines`` / ``engine_cap_mib``.

    ``weights`` and ``tokens`` apply to compiler backends (:func:`~harness.backends.compiler_backends`) only.
    """

    engines: int | None = field(default=None, metadata=limit("build.engines"))
    engine_cap_mib: float | None = field(default=None, metadata=limit("build.engine_cap_mib"))
    backend: str = field(default="copy",
                         metadata=one_of(backend_names(), registry="the backends registered in harness.backends"))
    device: str = field(default="auto", metadata=one_of(DEVICES))
    release: bool = True
    weights: str = field(default="mapped", metadata=one_of(ENGINE_WEIGHTS))
    tokens: int = field(default=16, metadata=limit("build.tokens"))

    @property
    def compiler(self) -> bool:
        """Whether the backend exports the model and partitions its graph."""
        return BACKENDS[self.backend].compiler

    @property
    def compiler_weights(self) -> str | None:
        """The compiler's weight setting (``weights``); ``None`` for a backend that is no compiler."""
        return self.weights if self.compiler else None

    @property
    def engine_cap_bytes(self) -> int | None:
        """``engine_cap_mib`` in whole bytes; ``None`` when the scenario asks for a number of engines."""
        return None if self.engine_cap_mib is None else int(self.engine_cap_mib * MIB)


@dataclass(frozen=True)
class RunConfig:
    """How a strategy run is sampled and bounded. ``memory_limit_gib=None``: no limit."""

    cache: str = field(default="cold", metadata=one_of(CACHES))
    sample_interval_ms: float = field(default=10.0, metadata=limit("run.sample_interval_ms"))
    residency_every: int = field(default=1, metadata=limit("run.residency_every"))
    memory_limit_gib: float | None = field(default=None, metadata=limit("run.memory_limit_gib"))
    timeout_s: float = field(default=1800.0, metadata=limit("run.timeout_s"))
    prefetch: str = field(default=DEFAULT_PREFETCH, metadata=one_of(PREFETCH))
    drop_cache: bool | None = None  # None: chosen per run (harness.checkpoint_reading)
    repeats: int = field(default=1, metadata=limit("run.repeats"))
    warmup: int = field(default=0, metadata=limit("run.warmup"))
    read_ceiling: bool = True  # a cold run sweeps the disk's read ceiling before its first round
    shared_disk: bool = True  # where engines are files, a cold run times the disk read and written at once at its end


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A validated scenario: from :func:`load_scenario`, or built in code (fields are keyword-only).

    ``path`` is the file it was read from, ``None`` for one built in code.
    """

    name: str = field(metadata={"check": name_problem})
    description: str = ""
    path: Path | None = None
    strategies: tuple[str, ...] = field(default=DEFAULT_STRATEGIES, metadata={"check": strategies_problem})
    model: ModelConfig
    checkpoint: CheckpointConfig
    build: BuildConfig
    run: RunConfig = field(default_factory=RunConfig)
    references: tuple[Reference, ...] = ()
    cluster: ClusterSettings = field(default_factory=ClusterSettings)

    @property
    def source(self) -> str:
        """What errors name this scenario by: its file, or ``scenario '<name>'`` for one built in code."""
        return _show_path(self.path) if self.path else f"scenario {self.name!r}"

    def where(self, key: str) -> str:
        """``<file>: <key>``, how an error about ``key`` of this scenario starts."""
        return f"{self.source}: {key}"

    def to_dict(self) -> dict[str, Any]:
        """The scenario as JSON-able data, for the results.

        Paths are strings, relative to the repository root where inside it; ``model``
        holds the fields of its source only, plus its ``key``.
        """
        return {
            "name": self.name,
            "description": self.description,
            "path": None if self.path is None else _show_path(self.path),
            "strategies": list(self.strategies),
            "model": {
                **{k: v for k, v in _fields(self.model).items() if k in _MODEL_KEYS[self.model.source]},
                "key": self.model.key,
            },
            "checkpoint": _fields(self.checkpoint),
            "build": _fields(self.build),
            "run": _fields(self.run),
            "references": [_fields(r) for r in self.references],
        }


def _show_path(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _fields(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in obj.__dataclass_fields__:
        value = getattr(obj, name)
        if isinstance(value, Path):
            value = _show_path(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[name] = value
    return out


def default_checkpoint_for(model: ModelConfig) -> Path:
    """The checkpoint path when a scenario names none: a transformers model's config folder (a hub snapshot holds
    its weights beside ``config.json``), else ``<root>/data/<model key>.safetensors``."""
    if model.source == "transformers" and model.config is not None:
        return model.config.parent
    return Path.cwd() / DATA_DIR / f"{model.key}.safetensors"


# --------------------------------------------------------------------------- sizes and files


def synthetic_numel(*, layers: int, width: int, vocab: int, ffn_mult: int) -> int:
    """Elements in a synthetic model's state dict with its tied embedding counted once
    (:class:`harness.models.SyntheticTransformer`), computed without building it."""
    per_layer = 2 * width + 4 * width * width + 2 * ffn_mult * width * width
    return vocab * width + layers * per_layer + width


def _synthetic_problem(layers: int, width: int, vocab: int, ffn_mult: int, dtype: str) -> str | None:
    numel = synthetic_numel(layers=layers, width=width, vocab=vocab, ffn_mult=ffn_mult)
    return model_bytes_problem(f"layers {layers}, width {width}, vocab {vocab}, ffn_mult {ffn_mult} in {dtype}",
                      numel * (dtype_itemsize(dtype) or 4))


def _nesting(data: Any, limit: int) -> str | None:
    """The dotted key of the first place where ``data`` nests deeper than ``limit`` levels, walked
    without recursion; None when it does not."""
    stack: list[tuple[Any, str, int]] = [(data, "", 1)]
    while stack:
        value, where, depth = stack.pop()
        items: Iterator[tuple[str, Any]]
        if isinstance(value, dict):
            items = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
        else:
            continue
        if depth > limit:
            return where or "<top level>"
        stack.extend((v, w, depth + 1) for w, v in items)
    return None


def checkpoint_path_problem(path: Path, *, generate: bool = True, sharded: bool = False) -> str | None:
    """Why ``path`` cannot be a checkpoint (a FIFO, a device, ...: anything there but a regular file, or a
    directory where the harness is to ``generate`` one file), found with ``stat`` alone, so a FIFO is never
    opened; None when it may be one. Without ``generate`` a directory may be a sharded checkpoint (what it holds
    is read later: :mod:`harness.models.user_checkpoint`). ``sharded`` (``max_shard_size``: the harness
    generates shards into a folder): the path must be a folder or nothing yet."""
    kind = not_regular(path)
    if sharded:
        if kind == "a directory" or (kind is None and not path.exists()):
            return None
        if kind is not None and kind.startswith("cannot"):
            return f"{path}: {kind}"
        what = "a file" if kind is None else kind
        return (f"{path}: is {what}; with checkpoint.max_shard_size the harness writes shards and their index "
                "into a folder: name a folder (or a path that does not exist yet)")
    if kind is None:
        return None
    if kind.startswith("cannot"):
        return f"{path}: {kind}"
    if kind == "a directory":
        if not generate:
            return None
        return (f"{path}: is a directory; the harness reads and writes one .safetensors file (set "
                "checkpoint.max_shard_size to generate shards into a folder)")
    return f"{path}: is {kind}, not a regular file; the harness reads and writes one .safetensors file"


def validate_scenario(scenario: Scenario) -> None:
    """Check what :func:`load_scenario` checks of numbers and files on a scenario however it was
    made (one built in code never went through the loader): every setting of :data:`~harness.scenario_rules.LIMITS`, the
    model's weight bytes, the checkpoint path's type. Raises :class:`ScenarioError` naming
    ``scenario.where(key)``; reads the spec, opens nothing else."""
    m, b = scenario.model, scenario.build
    # every field's rules (ranges, choices, names), read by the codec as the loader reads a file
    decode(Scenario, encode(scenario), source=scenario.source, style=_STYLE)
    if m.source == "synthetic":
        for key in _REQUIRED_MODEL_KEYS["synthetic"]:
            if getattr(m, key) is None:
                raise ScenarioError(f"{scenario.where('model.' + key)}: required for a synthetic model")
    if b.engine_cap_bytes is not None and b.engine_cap_bytes < 1:
        raise ScenarioError(f"{scenario.where('build.engine_cap_mib')}: {b.engine_cap_mib:g} MiB is less than one "
                            "byte")
    if m.source == "synthetic":
        assert m.layers is not None and m.width is not None and m.vocab is not None
        problem = _synthetic_problem(m.layers, m.width, m.vocab, m.ffn_mult, m.dtype)
        if problem:
            raise ScenarioError(f"{scenario.where('model')}: {problem}")
    # then the files, each found with stat, and the spec read: the checkpoint path's type, the spec's model
    broken = scenario.checkpoint.problem()
    if broken:
        raise ScenarioError(f"{scenario.where('checkpoint.' + broken[0])}: {broken[1]}")
    if m.source != "synthetic" and m.spec is not None:
        try:
            data = read_spec(m.spec)
        except (OSError, ValueError) as exc:
            raise ScenarioError(f"{scenario.where('model.spec')}: cannot read {m.spec} ({exc})") from exc
        problem = spec_problem(data if isinstance(data, dict) else {}, m.trim)
        if problem:
            raise ScenarioError(f"{scenario.where('model.spec')}: {m.spec} {problem}")


# --------------------------------------------------------------------------- reading

_Fail = Callable[[str | None, str], ScenarioError]
"""Makes the error ``<file>: <table>.<key>: <problem>`` (the table itself for key None)."""


def _failer(file: Path, table: str) -> _Fail:
    def fail(key: str | None, problem: str) -> ScenarioError:
        where = (f"{table}.{key}" if table else key) if key is not None else (table or "<top level>")
        return ScenarioError(f"{file}: {where}: {problem}")
    return fail


def _table(cls: type[Any], data: Any, file: Path, where: str, required: Collection[str] = ()) -> Any:
    """The ``cls`` settings in the table ``data`` at ``where``: strict, a key left out reads as its default."""
    return decode(cls, data, source=str(file), where=where, style=_STYLE, optional=True, required=required)


def _resolve_spec(raw: str, scenario_dir: Path, fail: _Fail) -> Path | None:
    """The spec file, looked for beside the scenario first, then under the root; a path there that
    is not a regular file (a FIFO, say) is refused rather than opened."""
    given = Path(raw).expanduser()
    for base in (scenario_dir, Path.cwd()):
        candidate = given if given.is_absolute() else base / given
        kind = not_regular(candidate)
        if kind is not None and kind != "a directory":
            raise fail("spec", f"{candidate} is {kind}, not a regular file")
        if candidate.is_file():
            return candidate.resolve()
    return None


def _resolve_config(raw: str, scenario_dir: Path, fail: _Fail) -> Path:
    """A transformers config: ``config.json`` or the folder holding it, looked for beside the scenario, then
    under the root, as a spec is; the file, absolute."""
    problem = config_problem(Path(raw).expanduser(), (scenario_dir, Path.cwd()))
    if isinstance(problem, str):
        raise fail("config", problem)
    return problem


def config_problem(given: Path, bases: Collection[Path]) -> Path | str:
    """The ``config.json`` that ``given`` names (the file, or a folder holding it), relative paths tried under each
    of ``bases`` in turn; else what is wrong, in words."""
    for base in bases:
        candidate = given if given.is_absolute() else base / given
        if candidate.is_dir():
            if (candidate / CONFIG_FILE).is_file():
                return (candidate / CONFIG_FILE).resolve()
            return f"{candidate} holds no {CONFIG_FILE} (a transformers model's folder does)"
        kind = not_regular(candidate)
        if kind is not None and not kind.startswith("cannot"):
            return f"{candidate} is {kind}, not a {CONFIG_FILE} file"
        if candidate.is_file():
            return candidate.resolve()
    return f"{str(given)!r} not found (looked in {', '.join(str(b) for b in bases)}): give a folder with " \
           f"{CONFIG_FILE} or the file"


_REQUIRED_MODEL_KEYS: dict[str, tuple[str, ...]] = {
    "synthetic": ("layers", "width", "vocab"), "spec": ("spec",), "lerobot": ("spec",),
    "factory": ("factory",), "transformers": ("config",),
}
"""The model keys a scenario must give for each source (their fields' default, None, means "not this source")."""


def _load_model(raw: Any, file: Path, scenario_dir: Path) -> ModelConfig:
    source = raw.get("source", ModelConfig.source) if isinstance(raw, dict) else None
    required = _REQUIRED_MODEL_KEYS.get(source, ()) if isinstance(source, str) else ()
    model: ModelConfig = _table(ModelConfig, raw, file, "model", required)
    fail = _failer(file, "model")
    for key in raw:
        if key not in _MODEL_KEYS[model.source]:
            raise fail(key, f"does not apply to source {model.source!r}")
    if model.source == "synthetic":
        assert model.layers is not None and model.width is not None and model.vocab is not None
        if model.width % model.heads or (model.width // model.heads) % 2:
            raise fail("width", f"{model.width} must split into {model.heads} heads of an even size")
        problem = _synthetic_problem(model.layers, model.width, model.vocab, model.ffn_mult, model.dtype)
        if problem:
            raise fail(None, problem)
        return model
    if model.source == "factory":
        return model
    if model.source == "transformers":
        return dataclasses.replace(model, config=_resolve_config(raw["config"], scenario_dir, fail))
    spec = _resolve_spec(raw["spec"], scenario_dir, fail)
    if spec is None:
        raise fail("spec", f"file {raw['spec']!r} not found (looked in {scenario_dir} and {Path.cwd()})")
    try:
        data = read_spec_data(spec)
    except SpecFileError as exc:
        raise fail("spec", str(exc)) from exc
    names = {t["name"] for t in data["tensors"]}
    for name in model.trim:
        if name not in names:
            raise fail("trim", f"{name!r} is not a tensor of {spec}")
    problem = spec_problem(data, model.trim)
    if problem:
        raise fail("spec", f"{spec} {problem}")
    return dataclasses.replace(model, spec=spec)


def _load_checkpoint(raw: Any, file: Path, model: ModelConfig) -> CheckpointConfig:
    """The checkpoint settings; without a path, the model's default checkpoint, which the harness may write."""
    given = isinstance(raw, dict) and "path" in raw
    if isinstance(raw, dict):
        raw = {"path": str(default_checkpoint_for(model)), "generate": default_generate(model, given), **raw}
    checkpoint: CheckpointConfig = _table(CheckpointConfig, raw, file, "checkpoint")
    fail = _failer(file, "checkpoint")
    if given:
        if not raw["path"].strip():
            raise fail("path", "expected a file path, got an empty string")
        checkpoint = dataclasses.replace(checkpoint, path=Path.cwd() / checkpoint.path.expanduser())
    broken = checkpoint.problem()
    if broken:
        raise fail(*broken)
    return checkpoint


def _load_build(raw: Any, file: Path) -> BuildConfig:
    build: BuildConfig = _table(BuildConfig, raw, file, "build")
    fail = _failer(file, "build")
    if (build.engines is None) == (build.engine_cap_mib is None):
        which = "neither is" if build.engines is None else "both are"
        raise fail("engines", f"give exactly one of engines / engine_cap_mib ({which} given)")
    cap = build.engine_cap_mib
    if cap is not None and int(cap * MIB) < 1:
        raise fail("engine_cap_mib", f"{cap:g} MiB is less than one byte ({cap * MIB:.3g} bytes)")
    if not build.compiler:
        for key in ("weights", "tokens"):
            if key in raw:
                raise fail(key, f"applies to compiler backends only ({', '.join(compiler_backends())}), "
                                f"not backend {build.backend!r}")
        return build
    spec = BACKENDS[build.backend]
    settings = spec.weights
    if build.weights not in settings:
        if "weights" not in raw and spec.default_weights is not None:  # the backend's only setting, left unsaid
            return dataclasses.replace(build, weights=spec.default_weights)
        raise fail("weights", f"backend {build.backend!r} builds engines with weights "
                              f"{' or '.join(repr(w) for w in settings)}, not {build.weights!r}")
    return build


def _load_references(raw: Any, file: Path) -> tuple[Reference, ...]:
    if not isinstance(raw, list):
        raise _failer(file, "")("reference", f"expected [[reference]] tables, got {describe_typed(raw)}")
    return tuple(_table(Reference, item, file, f"reference[{i}]") for i, item in enumerate(raw))


TOP_KEYS: tuple[str, ...] = ("name", "description", "strategies")
"""The fields of :class:`Scenario` a scenario file sets at its top level; the others come from :data:`TABLES`."""

TABLES: dict[str, type] = {"model": ModelConfig, "checkpoint": CheckpointConfig, "build": BuildConfig,
                           "run": RunConfig, "reference": Reference, "cluster": ClusterSettings}
"""The tables of a scenario file and the class each is read into, read one by one after its top-level keys."""


def parse_scenario(data: Mapping[str, Any], *, shown: str, base: Path) -> Scenario:
    """The scenario of ``data`` (a scenario file's tables, as :mod:`tomllib` reads them), validated as
    :func:`load_scenario` validates a file, for a scenario that comes from no file (the command line's flags):
    errors start with ``shown``, relative model paths resolve against ``base`` then the root, and ``path`` is None."""
    return _parse(data, None, Path(shown), base)


def _parse(data: Mapping[str, Any], path: Path | None, shown: Path, base: Path | None = None) -> Scenario:
    """Validate parsed TOML; ``path`` is the absolute file (None: no file), ``shown`` the name used in errors,
    ``base`` the directory model paths resolve against first (default: the file's)."""
    deep = _nesting(dict(data), MAX_NESTING)
    if deep is not None:
        raise ScenarioError(f"{shown}: {deep}: arrays and tables nest more than {MAX_NESTING} levels deep "
                            "(a scenario needs 3)")
    top = decode_fields(Scenario, dict(data), TOP_KEYS, others=tuple(TABLES),
                        source=str(shown), style=_STYLE, optional=True)
    model = _load_model(data.get("model", {}), shown, base if base is not None else Path(str(path)).parent)
    checkpoint = _load_checkpoint(data.get("checkpoint", {}), shown, model)
    build = _load_build(data.get("build", {}), shown)
    fail = _failer(shown, "")
    if build.compiler and model.source == "spec":
        raise fail("build.backend", f"backend {build.backend!r} exports the model, and a spec model has "
                                    "no forward: use a source with one (synthetic, lerobot, factory, transformers)")
    if build.compiler and model.fallback is not None:
        raise fail("model.fallback", f"backend {build.backend!r} exports the model, and the spec model "
                                     "it would fall back to has no forward: remove the fallback")
    return Scenario(
        **top,
        path=path,
        model=model,
        checkpoint=checkpoint,
        build=build,
        run=_table(RunConfig, data.get("run", {}), shown, "run"),
        references=_load_references(data.get("reference", []), shown),
        cluster=_table(ClusterSettings, data.get("cluster", {}), shown, "cluster"),
    )


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate the scenario at ``path``; raises :class:`ScenarioError`, never runs anything.

    A path that is not a regular file (a FIFO, a directory) is refused before it is opened.
    """
    file = Path(path)
    shown = file
    file = file if file.is_absolute() else Path.cwd() / file
    kind = not_regular(file)
    if kind is not None:
        raise ScenarioError(f"{shown}: {kind}" if kind.startswith("cannot")
                            else f"{shown}: is {kind}, not a regular file; a scenario is a TOML file")
    try:
        with open(file, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError as exc:
        raise ScenarioError(f"{shown}: scenario file not found") from exc
    except OSError as exc:
        raise ScenarioError(f"{shown}: cannot read scenario file: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{shown}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                            "scenario files are UTF-8 TOML") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{shown}: not valid TOML: {exc}") from exc
    except RecursionError as exc:
        raise ScenarioError(f"{shown}: not valid TOML here: arrays or tables nest too deeply to parse "
                            f"(a scenario nests at most {MAX_NESTING} levels)") from exc
    except ValueError as exc:  # an integer literal of more digits than Python converts
        raise ScenarioError(f"{shown}: not valid TOML here: {exc}") from exc
    return _parse(data, file.resolve(), shown)
