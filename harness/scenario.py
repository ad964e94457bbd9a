"""Benchmark scenarios: TOML files under ``scenarios/`` loaded into frozen dataclasses.

:func:`load_scenario` validates the whole file before anything runs. An unknown key,
a value of the wrong type, a value outside its allowed set or range, or a file that
does not exist raises :class:`ScenarioError` (a :class:`ValueError`) whose message
starts with the scenario file and the dotted key, e.g.
``scenarios/smoke.toml: build.engines: expected an integer > 0, got "8" (str)``.

Paths
    The repository root is the current working directory: run the harness from a
    checkout. ``checkpoint.path`` resolves against it. ``model.spec`` resolves
    against the scenario file's directory first and, when nothing is there, against
    the repository root (so ``spec = "harness/specs/pi05.json"`` works from
    ``scenarios/``). All paths in a loaded :class:`Scenario` are absolute.

Schema (defaults in brackets; see ``scenarios/*.toml`` for examples)::

    name          str, [a-z0-9_-]+, required: results go under results/<name>/
    description   str [""]
    strategies    list of strategy names (:data:`harness.strategies.STRATEGIES`: "map",
                  "load", "load_file"), no duplicates, order kept [all of them]
    [model]       source: "synthetic" | "spec" | "lerobot" ["synthetic"]
      synthetic:  layers, width, vocab: int > 0 (required); heads: int > 0 [8], width
                  a multiple of heads with an even head size; ffn_mult: int > 0 [4];
                  dtype: "float32" | "bfloat16" | "float16" ["float32"]
      spec:       spec: path to a weight-spec JSON (required, must exist and be UTF-8 JSON
                  with a "tensors" list)
      lerobot:    spec as above (what the lerobot model is checked against);
                  fallback: "spec" to build from the spec where lerobot cannot be
                  imported (recorded), else that is an error at run time [none]
      spec, lerobot: trim: list of tensor names left out [[]]; each must be in the spec
    [checkpoint]  path [data/<model key>.safetensors]; seed: int >= 0 [0];
                  generate: bool, write the checkpoint (seeded values) when the file is
                  missing or was generated for another model or seed [true without a
                  path, false with one: a path that does not exist is then an error]
    [build]       exactly one of engines: int > 0 (exactly that many engines; the model
                  needs at least as many weight units) / engine_cap_mib: number > 0
                  (at least one byte);
                  backend: "copy" | "inductor" | "tensorrt" ["copy"];
                  weights: "mapped" | "packaged", compiler backends only ["mapped"]:
                  whether each engine runs on the model's own (mapped) tensors or holds a
                  copy of its weights; tokens: int > 0, compiler backends only [16]: the
                  length of the example input the model is exported and checked with;
                  device: "auto" | "cpu" | "cuda" ["auto"]; release: bool [true]
    [run]         cache: "cold" | "warm" ["cold"]; sample_interval_ms: number > 0 [10.0];
                  residency_every: int > 0 [1]; memory_limit_gib: number > 0 or absent
                  (no limit) [absent]; timeout_s: number > 0 [1800];
                  prefetch: "off" | one of weightmap.PREFETCH_METHODS ("madvise", "fadvise",
                  "read") ["madvise"]: how strategies that map (``map``) warm the page cache
                  for the next engine while one builds (``map_no_prefetch`` never does);
                  drop_cache: bool [false]: such strategies also drop released weights from
                  the page cache (``map_keep_cache`` never does); repeats: int > 0 [1]: cold
                  runs of each strategy, each in a fresh process, interleaved; the report shows
                  the median wall time and the spread; warmup: int >= 0 [0]: rounds run first
                  and discarded (each strategy once, and the disk read), so that what a cold
                  guest cache does not reset (a virtual disk's host cache, memory the host
                  must back again) is alike for every measured round
    [[reference]] label: str (required); host_at_partitioning_gib, host_gpu_peak_gib,
                  host_peak_gib: number >= 0 [absent]; note: str [""]
"""

from __future__ import annotations

import difflib
import json
import math
import re
import tomllib
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.strategies import STRATEGIES
from weightmap import PREFETCH_METHODS

__all__ = [
    "BACKENDS",
    "CACHES",
    "COMPILER_BACKENDS",
    "ENGINE_WEIGHTS",
    "DEVICES",
    "MODEL_DTYPES",
    "PREFETCH",
    "SOURCES",
    "BuildConfig",
    "CheckpointConfig",
    "ModelConfig",
    "Reference",
    "RunConfig",
    "Scenario",
    "ScenarioError",
    "default_checkpoint_for",
    "load_scenario",
]

SOURCES: tuple[str, ...] = ("synthetic", "spec", "lerobot")
MODEL_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
BACKENDS: tuple[str, ...] = ("copy", "inductor", "tensorrt")
COMPILER_BACKENDS: tuple[str, ...] = ("inductor", "tensorrt")
"""Backends that export the model and build engines from graph partitions (they need a model with a forward)."""
ENGINE_WEIGHTS: tuple[str, ...] = ("mapped", "packaged")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
CACHES: tuple[str, ...] = ("cold", "warm")
PREFETCH: tuple[str, ...] = ("off", *PREFETCH_METHODS)
DEFAULT_PREFETCH = "madvise"
"""Measured best for mapped weights here: ``madvise`` one engine ahead (``benchmarks/prefetch.py``)."""
FALLBACKS: tuple[str, ...] = ("spec",)

DATA_DIR = Path("data")
"""Where default checkpoints go, relative to the repository root."""

_NAME = re.compile(r"[a-z0-9_-]+")
_SYNTHETIC_KEYS = frozenset({"layers", "width", "heads", "vocab", "ffn_mult", "dtype"})
_SPEC_KEYS = frozenset({"spec", "trim"})
_MODEL_KEYS = {
    "synthetic": frozenset({"source"}) | _SYNTHETIC_KEYS,
    "spec": frozenset({"source"}) | _SPEC_KEYS,
    "lerobot": frozenset({"source", "fallback"}) | _SPEC_KEYS,
}


class ScenarioError(HarnessError, ValueError):
    """A scenario file is missing, is not UTF-8 TOML, or breaks the schema.

    The message starts with the file and, where there is one, the dotted key.
    """


# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class ModelConfig:
    """What model to build (see :mod:`harness.models`).

    ``layers``/``width``/``vocab`` are ``None`` unless the source is synthetic (where
    ``heads``/``ffn_mult``/``dtype`` also apply; elsewhere they keep their defaults
    and are ignored). ``spec``/``fallback``/``trim`` apply to spec and lerobot only;
    ``spec`` is an absolute path after :func:`load_scenario`.
    """

    source: str = "synthetic"
    layers: int | None = None
    width: int | None = None
    heads: int = 8
    vocab: int | None = None
    ffn_mult: int = 4
    dtype: str = "float32"
    spec: Path | None = None
    fallback: str | None = None
    trim: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Every field, ``spec`` as an absolute path string (what a worker process rebuilds it from)."""
        data = _fields(self)
        data["spec"] = None if self.spec is None else str(self.spec)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelConfig:
        """The inverse of :meth:`to_json`."""
        values = dict(data)
        values["spec"] = None if values.get("spec") is None else Path(values["spec"])
        values["trim"] = tuple(values.get("trim") or ())
        return cls(**values)

    @property
    def key(self) -> str:
        """A file-name-safe name that differs whenever the model's tensors differ.

        Synthetic: ``synthetic-l<layers>-w<width>-h<heads>-v<vocab>-f<ffn_mult>-<dtype>``.
        Spec and lerobot (which must equal its spec): the spec file's stem, plus
        ``-trim<count>-<crc32 of the sorted names>`` when tensors are trimmed.
        """
        if self.source == "synthetic":
            return (
                f"synthetic-l{self.layers}-w{self.width}-h{self.heads}-v{self.vocab}"
                f"-f{self.ffn_mult}-{self.dtype}"
            )
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.spec.stem if self.spec else "model")
        if not self.trim:
            return stem
        digest = zlib.crc32("\n".join(sorted(self.trim)).encode()) & 0xFFFFFFFF
        return f"{stem}-trim{len(self.trim)}-{digest:08x}"


@dataclass(frozen=True)
class CheckpointConfig:
    """Where the checkpoint lives (absolute after loading), the seed of its values, and whether
    the harness may write it (``generate``)."""

    path: Path
    seed: int = 0
    generate: bool = False


@dataclass(frozen=True)
class BuildConfig:
    """How the model is partitioned and built: exactly one of ``engines`` / ``engine_cap_mib``.

    ``weights`` and ``tokens`` apply to compiler backends (:data:`COMPILER_BACKENDS`) only.
    """

    engines: int | None = None
    engine_cap_mib: float | None = None
    backend: str = "copy"
    device: str = "auto"
    release: bool = True
    weights: str = "mapped"
    tokens: int = 16

    @property
    def compiler(self) -> bool:
        """Whether the backend exports the model and partitions its graph."""
        return self.backend in COMPILER_BACKENDS


@dataclass(frozen=True)
class RunConfig:
    """How a strategy run is sampled and bounded. ``memory_limit_gib=None``: no limit."""

    cache: str = "cold"
    sample_interval_ms: float = 10.0
    residency_every: int = 1
    memory_limit_gib: float | None = None
    timeout_s: float = 1800.0
    prefetch: str = DEFAULT_PREFETCH
    drop_cache: bool = False
    repeats: int = 1
    warmup: int = 0


@dataclass(frozen=True)
class Reference:
    """Figures measured on another setup, shown beside ours and marked as such."""

    label: str
    host_at_partitioning_gib: float | None = None
    host_gpu_peak_gib: float | None = None
    host_peak_gib: float | None = None
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A validated scenario: from :func:`load_scenario`, or built in code (fields are keyword-only).

    ``path`` is the file it was read from, ``None`` for one built in code.
    """

    name: str
    description: str = ""
    path: Path | None = None
    strategies: tuple[str, ...] = tuple(STRATEGIES)
    model: ModelConfig
    checkpoint: CheckpointConfig
    build: BuildConfig
    run: RunConfig = field(default_factory=RunConfig)
    references: tuple[Reference, ...] = ()

    def where(self, key: str) -> str:
        """``<file>: <key>``, how an error about ``key`` of this scenario starts."""
        return f"{_show_path(self.path) if self.path else f'scenario {self.name!r}'}: {key}"

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
    """``<root>/data/<model key>.safetensors``, the checkpoint path when a scenario names none."""
    return Path.cwd() / DATA_DIR / f"{model.key}.safetensors"


# --------------------------------------------------------------------------- validation

_REQUIRED: Any = object()


class _Table:
    """One TOML table being validated: typed getters that raise :class:`ScenarioError`.

    ``allowed`` keys are checked on construction, so a misspelt key is reported as
    unknown before any other problem in the table.
    """

    def __init__(self, data: Any, file: Path, prefix: str, allowed: frozenset[str]) -> None:
        self.file = file
        self.prefix = prefix
        if not isinstance(data, dict):
            raise self.error(None, f"expected a table, got {_describe(data)}")
        self.data: dict[str, Any] = data
        for key in data:
            if key not in allowed:
                raise self.error(key, f"unknown key{_suggest(key, allowed)}")

    def where(self, key: str | None) -> str:
        if key is None:
            return self.prefix or "<top level>"
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str | None, problem: str) -> ScenarioError:
        return ScenarioError(f"{self.file}: {self.where(key)}: {problem}")

    def has(self, key: str) -> bool:
        return key in self.data

    def _get(self, key: str, default: Any) -> Any:
        if key in self.data:
            return self.data[key]
        if default is _REQUIRED:
            raise self.error(key, "required key is missing")
        return default

    def string(self, key: str, default: Any = _REQUIRED, choices: tuple[str, ...] | None = None) -> Any:
        value = self._get(key, default)
        if key not in self.data:
            return value
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {_describe(value)}")
        if choices is not None and value not in choices:
            raise self.error(key, f"expected one of {', '.join(map(repr, choices))}, got {value!r}")
        return value

    def integer(self, key: str, default: Any = _REQUIRED, minimum: int = 1) -> Any:
        value = self._get(key, default)
        if key not in self.data:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(key, f"expected an integer >= {minimum}, got {_describe(value)}")
        return value

    def number(self, key: str, default: Any = _REQUIRED, *, allow_zero: bool = False) -> Any:
        value = self._get(key, default)
        if key not in self.data:
            return value
        bound = ">= 0" if allow_zero else "> 0"
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value < 0 or (value == 0 and not allow_zero):
            raise self.error(key, f"expected a number {bound}, got {_describe(value)}")
        return float(value)

    def boolean(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self._get(key, default)
        if key in self.data and not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {_describe(value)}")
        return value

    def strings(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self._get(key, default)
        if key not in self.data:
            return value
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, f"expected a list of strings, got {_describe(value)}")
        seen: set[str] = set()
        for item in value:
            if item in seen:
                raise self.error(key, f"{item!r} is listed twice")
            seen.add(item)
        return tuple(value)

    def table(self, key: str, allowed: frozenset[str]) -> _Table:
        return _Table(self.data.get(key, {}), self.file, self.where(key), allowed)


def _describe(value: Any) -> str:
    text = json.dumps(value, default=str)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _suggest(key: str, allowed: frozenset[str]) -> str:
    close = difflib.get_close_matches(key, sorted(allowed), n=1)
    known = ", ".join(sorted(allowed))
    return f" (did you mean {close[0]!r}?; known: {known})" if close else f" (known: {known})"


def _resolve_spec(raw: str, scenario_dir: Path) -> Path | None:
    """The spec file, looked for beside the scenario first, then under the root."""
    given = Path(raw).expanduser()
    for base in (scenario_dir, Path.cwd()):
        candidate = given if given.is_absolute() else base / given
        if candidate.is_file():
            return candidate.resolve()
    return None


def _spec_tensor_names(path: Path, model: _Table) -> set[str]:
    """Names of the tensors in a weight-spec JSON; raises naming ``model.spec`` when it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise model.error("spec", f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise model.error("spec", f"{path} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
    except OSError as exc:
        raise model.error("spec", f"cannot read {path} ({exc.strerror or exc})") from exc
    tensors = data.get("tensors") if isinstance(data, dict) else None
    if not isinstance(tensors, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                for t in tensors):
        raise model.error("spec", f"{path} is not a weight spec: expected an object whose \"tensors\" "
                                  "is a list of objects with a \"name\"")
    return {t["name"] for t in tensors}


def _load_model(top: _Table, scenario_dir: Path) -> ModelConfig:
    raw = top.data.get("model", {})
    everything = frozenset().union(*_MODEL_KEYS.values())
    model = _Table(raw, top.file, "model", everything)
    source = model.string("source", "synthetic", SOURCES)
    for key in model.data:
        if key not in _MODEL_KEYS[source]:
            raise model.error(key, f"does not apply to source {source!r}")
    if source == "synthetic":
        layers = model.integer("layers")
        width = model.integer("width")
        heads = model.integer("heads", 8)
        vocab = model.integer("vocab")
        ffn_mult = model.integer("ffn_mult", 4)
        dtype = model.string("dtype", "float32", MODEL_DTYPES)
        if width % heads or (width // heads) % 2:
            raise model.error("width", f"{width} must split into {heads} heads of an even size")
        return ModelConfig(source, layers, width, heads, vocab, ffn_mult, dtype)
    spec_raw = model.string("spec")
    spec = _resolve_spec(spec_raw, scenario_dir)
    if spec is None:
        raise model.error("spec", f"file {spec_raw!r} not found (looked in {scenario_dir} and {Path.cwd()})")
    trim = model.strings("trim", ())
    fallback = model.string("fallback", None, FALLBACKS) if source == "lerobot" else None
    names = _spec_tensor_names(spec, model)
    if trim:
        for name in trim:
            if name not in names:
                raise model.error("trim", f"{name!r} is not a tensor of {spec}")
    return ModelConfig(source, spec=spec, fallback=fallback, trim=trim)


def _load_build(top: _Table) -> BuildConfig:
    keys = frozenset({"engines", "engine_cap_mib", "backend", "device", "release", "weights", "tokens"})
    build = top.table("build", keys)
    if build.has("engines") == build.has("engine_cap_mib"):
        which = "both are" if build.has("engines") else "neither is"
        raise build.error("engines", f"give exactly one of engines / engine_cap_mib ({which} given)")
    cap = build.number("engine_cap_mib", None)
    if cap is not None and int(cap * 2**20) < 1:
        raise build.error("engine_cap_mib", f"{cap:g} MiB is less than one byte ({cap * 2**20:.3g} bytes)")
    backend = build.string("backend", "copy", BACKENDS)
    if backend not in COMPILER_BACKENDS:
        for key in ("weights", "tokens"):
            if build.has(key):
                raise build.error(key, f"applies to compiler backends only ({', '.join(COMPILER_BACKENDS)}), "
                                       f"not backend {backend!r}")
    return BuildConfig(
        engines=build.integer("engines", None),
        engine_cap_mib=cap,
        backend=backend,
        device=build.string("device", "auto", DEVICES),
        release=build.boolean("release", True),
        weights=build.string("weights", "mapped", ENGINE_WEIGHTS),
        tokens=build.integer("tokens", 16),
    )


def _load_run(top: _Table) -> RunConfig:
    keys = frozenset({"cache", "sample_interval_ms", "residency_every", "memory_limit_gib", "timeout_s",
                      "prefetch", "drop_cache", "repeats", "warmup"})
    run = top.table("run", keys)
    return RunConfig(
        cache=run.string("cache", "cold", CACHES),
        sample_interval_ms=run.number("sample_interval_ms", 10.0),
        residency_every=run.integer("residency_every", 1),
        memory_limit_gib=run.number("memory_limit_gib", None),
        timeout_s=run.number("timeout_s", 1800.0),
        prefetch=run.string("prefetch", DEFAULT_PREFETCH, PREFETCH),
        drop_cache=run.boolean("drop_cache", False),
        repeats=run.integer("repeats", 1),
        warmup=run.integer("warmup", 0, minimum=0),
    )


def _load_references(top: _Table) -> tuple[Reference, ...]:
    raw = top.data.get("reference", [])
    if not isinstance(raw, list):
        raise top.error("reference", f"expected [[reference]] tables, got {_describe(raw)}")
    keys = frozenset({"label", "host_at_partitioning_gib", "host_gpu_peak_gib", "host_peak_gib", "note"})
    out = []
    for i, item in enumerate(raw):
        ref = _Table(item, top.file, f"reference[{i}]", keys)
        out.append(
            Reference(
                label=ref.string("label"),
                host_at_partitioning_gib=ref.number("host_at_partitioning_gib", None, allow_zero=True),
                host_gpu_peak_gib=ref.number("host_gpu_peak_gib", None, allow_zero=True),
                host_peak_gib=ref.number("host_peak_gib", None, allow_zero=True),
                note=ref.string("note", ""),
            )
        )
    return tuple(out)


def _parse(data: Mapping[str, Any], path: Path, shown: Path) -> Scenario:
    """Validate parsed TOML; ``path`` is the absolute file, ``shown`` the name used in errors."""
    top_keys = frozenset(
        {"name", "description", "strategies", "model", "checkpoint", "build", "run", "reference"}
    )
    top = _Table(dict(data), shown, "", top_keys)
    name = top.string("name")
    if not _NAME.fullmatch(name):
        raise top.error("name", f"expected [a-z0-9_-]+, got {name!r}")
    description = top.string("description", "")
    strategies = top.strings("strategies", tuple(STRATEGIES))
    if not strategies:
        raise top.error("strategies", "expected at least one strategy")
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise top.error("strategies", f"unknown strategy {strategy!r} (known: {', '.join(STRATEGIES)})")
    model = _load_model(top, path.parent)
    ckpt = top.table("checkpoint", frozenset({"path", "seed", "generate"}))
    raw_path = ckpt.string("path", None)
    if raw_path is not None and not raw_path.strip():
        raise ckpt.error("path", "expected a file path, got an empty string")
    checkpoint = CheckpointConfig(
        path=(Path.cwd() / Path(raw_path).expanduser()) if raw_path else default_checkpoint_for(model),
        seed=ckpt.integer("seed", 0, minimum=0),
        generate=ckpt.boolean("generate", raw_path is None),
    )
    build = _load_build(top)
    if build.compiler and model.source == "spec":
        raise top.error("build.backend", f"backend {build.backend!r} exports the model, and a spec model has "
                                         "no forward: use model.source = \"synthetic\" or \"lerobot\"")
    if build.compiler and model.fallback is not None:
        raise top.error("model.fallback", f"backend {build.backend!r} exports the model, and the spec model "
                                          "it would fall back to has no forward: remove the fallback")
    return Scenario(
        name=name,
        path=path,
        model=model,
        checkpoint=checkpoint,
        build=build,
        description=description,
        strategies=strategies,
        run=_load_run(top),
        references=_load_references(top),
    )


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate the scenario at ``path``; raises :class:`ScenarioError`, never runs anything."""
    file = Path(path)
    shown = file
    file = file if file.is_absolute() else Path.cwd() / file
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
    return _parse(data, file.resolve(), shown)
