"""Models the harness measures, always built on the meta device (no memory, no values).

Three sources, chosen by :class:`~harness.scenario.ModelConfig.source`:

``synthetic``
    :class:`SyntheticTransformer`, a small decoder-only transformer of the configured
    size and dtype, with the traits real checkpoints have: an embedding tied to the
    output head and a non-persistent rotary buffer. It can run a forward pass.
``spec``
    :class:`SpecModel`, built from a weight-spec JSON (``harness/specs/*.json``): the
    exact names, shapes, dtypes, tied groups and non-persistent buffers of a real
    model, without its code. Weights only; it cannot run.
``lerobot``
    lerobot's pi0.5 (``PI05Pytorch``) itself, checked against its spec. lerobot is
    imported only when asked for; where it cannot be imported the build fails with
    the reason, unless the scenario says ``fallback = "spec"``.

Weights are filled later, from a checkpoint; non-persistent buffers are not in any
checkpoint, so :func:`fill_non_persistent` gives them values before a model runs.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from harness.scenario import ModelConfig

__all__ = [
    "LerobotUnavailableError",
    "ModelError",
    "ModelInfo",
    "SpecMismatchError",
    "SpecModel",
    "SyntheticTransformer",
    "build_model",
    "fill_non_persistent",
    "load_spec",
    "spec_differences",
    "spec_of",
    "weight_order",
]

_KINDS = ("param", "buffer")
_MAX_LISTED = 20


class ModelError(RuntimeError):
    """A model cannot be built as configured; the message says what and why."""


class SpecMismatchError(ModelError):
    """A model built from code differs from the spec it must match; lists the differences."""


class LerobotUnavailableError(ModelError):
    """lerobot cannot be imported in this interpreter; the message gives the reason."""


@dataclass(frozen=True, eq=False)
class ModelInfo:
    """A built model and where it came from.

    ``module`` holds every parameter and buffer on the meta device. ``name`` is the
    model key (see :attr:`ModelConfig.key`); ``source`` is ``"synthetic"``,
    ``"spec:<path>"`` or ``"lerobot <version>"``; ``source_note`` is a sentence for
    the results (e.g. why a spec was used instead of lerobot).
    """

    module: nn.Module
    name: str
    source: str
    source_note: str


# --------------------------------------------------------------------------- helpers


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _parse_dtype(name: object) -> torch.dtype | None:
    value = getattr(torch, name, None) if isinstance(name, str) else None
    return value if isinstance(value, torch.dtype) else None


def _pattern(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Deterministic CPU values for a buffer no checkpoint holds.

    Floating: ``1 / (1 + i)`` over the flat index (decreasing, like rotary
    frequencies; a scalar is 1). Integers: ``i``. Bool: ``i`` odd.
    """
    index = torch.arange(math.prod(shape), dtype=torch.int64)
    if dtype == torch.bool:
        values = index % 2 == 1
    elif dtype.is_floating_point or dtype.is_complex:
        values = (1.0 / (1.0 + index.to(torch.float64))).to(dtype)
    else:
        values = index.to(dtype)
    return values.reshape(tuple(shape))


def _rotary_frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """The standard rotary inverse frequencies ``base ** (-2i / head_dim)``, float32 on CPU."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return (1.0 / (base**exponents)).to(torch.float32)


# --------------------------------------------------------------------------- synthetic


class _RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale (computed in float32)."""

    def __init__(self, width: int, dtype: torch.dtype, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * scale * self.weight.float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply rotary position embedding to ``x[..., T, head_dim]`` (halves layout)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class _Block(nn.Module):
    """Pre-norm decoder block: causal self-attention with rotary, then a SiLU MLP."""

    def __init__(self, width: int, heads: int, ffn_mult: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = _RMSNorm(width, dtype)
        self.q_proj = nn.Linear(width, width, bias=False, dtype=dtype)
        self.k_proj = nn.Linear(width, width, bias=False, dtype=dtype)
        self.v_proj = nn.Linear(width, width, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(width, width, bias=False, dtype=dtype)
        self.mlp_norm = _RMSNorm(width, dtype)
        self.up_proj = nn.Linear(width, ffn_mult * width, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(ffn_mult * width, width, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, steps, width = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, steps, self.heads, width // self.heads).transpose(1, 2)

        h = self.attn_norm(x)
        q = _rotate(heads(F.linear(h, self.q_proj.weight.float())), cos, sin)
        k = _rotate(heads(F.linear(h, self.k_proj.weight.float())), cos, sin)
        v = heads(F.linear(h, self.v_proj.weight.float()))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + F.linear(attended.transpose(1, 2).reshape(batch, steps, width), self.o_proj.weight.float())
        h = self.mlp_norm(x)
        up = F.silu(F.linear(h, self.up_proj.weight.float()))
        return x + F.linear(up, self.down_proj.weight.float())


class SyntheticTransformer(nn.Module):
    """A decoder-only transformer of a given size, for measurements without a real model.

    State dict (registration order): ``embed.weight``, then per layer ``layers.<i>.``
    ``attn_norm.weight``, ``q_proj.weight``, ``k_proj.weight``, ``v_proj.weight``,
    ``o_proj.weight``, ``mlp_norm.weight``, ``up_proj.weight``, ``down_proj.weight``;
    then ``norm.weight`` and ``lm_head.weight``, which is the same Parameter object as
    ``embed.weight`` (tied). ``inv_freq`` (head_dim / 2 rotary frequencies, float32) is
    a non-persistent buffer: not in the state dict, not in a checkpoint.

    Built on ``device`` (default meta: nothing allocated). ``forward`` computes in
    float32 whatever the weight dtype and is deterministic given the weights.
    """

    def __init__(
        self,
        *,
        layers: int,
        width: int,
        vocab: int,
        heads: int = 8,
        ffn_mult: int = 4,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "meta",
    ) -> None:
        super().__init__()
        if width % heads or (width // heads) % 2:
            raise ModelError(f"width {width} must split into {heads} heads of an even size")
        self.heads = heads
        self.head_dim = width // heads
        with torch.device(device):
            self.embed = nn.Embedding(vocab, width, dtype=dtype)
            self.layers = nn.ModuleList(_Block(width, heads, ffn_mult, dtype) for _ in range(layers))
            self.norm = _RMSNorm(width, dtype)
            self.lm_head = nn.Linear(width, vocab, bias=False, dtype=dtype)
            self.lm_head.weight = self.embed.weight
            inv_freq = torch.empty(self.head_dim // 2, dtype=torch.float32)
            self.register_buffer("inv_freq", inv_freq, persistent=False)
        if not self.inv_freq.is_meta:
            self.reset_non_persistent_buffers()

    @staticmethod
    def expected_numel(*, layers: int, width: int, vocab: int, ffn_mult: int = 4, **_: Any) -> int:
        """Elements in the state dict with the tied weight counted once."""
        per_layer = 2 * width + 4 * width * width + 2 * ffn_mult * width * width
        return vocab * width + layers * per_layer + width

    def reset_non_persistent_buffers(self) -> None:
        """Give ``inv_freq`` its real rotary values, on the CPU."""
        self.inv_freq = _rotary_frequencies(self.head_dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens[B, T]`` (int64) -> logits ``[B, T, vocab]`` in float32, causal."""
        if self.inv_freq.is_meta:
            raise RuntimeError("inv_freq is still on meta: call fill_non_persistent(model) first")
        steps = tokens.shape[1]
        positions = torch.arange(steps, dtype=torch.float32, device=tokens.device)
        angles = torch.outer(positions, self.inv_freq.float().to(tokens.device))
        cos, sin = angles.cos(), angles.sin()
        x = F.embedding(tokens, self.embed.weight).float()
        for block in self.layers:
            x = block(x, cos, sin)
        return F.linear(self.norm(x), self.lm_head.weight.float())


# --------------------------------------------------------------------------- spec


def load_spec(path: str | Path) -> dict[str, Any]:
    """Read and check a weight-spec JSON (the format of ``harness/specs/README.md``).

    Requires ``tensors``: a list of ``{name, shape, dtype, kind}`` with unique names,
    non-negative integer shapes, torch dtype names and kind ``param``/``buffer``;
    optional ``tied`` (lists of tensor names) and ``non_persistent_buffers``
    (``{name, shape, dtype}``). Raises :class:`ModelError` naming the file and the entry.
    """
    where = Path(path)
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{where}: cannot read weight spec: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("tensors"), list):
        raise ModelError(f"{where}: a weight spec is an object with a 'tensors' list")

    def check(entry: Any, what: str, fields: tuple[str, ...]) -> None:
        if not isinstance(entry, dict) or not all(f in entry for f in fields):
            raise ModelError(f"{where}: {what}: expected an object with {', '.join(fields)}, got {entry!r}")
        if not isinstance(entry["name"], str) or not entry["name"]:
            raise ModelError(f"{where}: {what}: name must be a non-empty string")
        shape = entry["shape"]
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ModelError(f"{where}: {entry['name']}: shape must be a list of integers >= 0")
        if _parse_dtype(entry["dtype"]) is None:
            raise ModelError(f"{where}: {entry['name']}: unknown dtype {entry['dtype']!r}")

    names: set[str] = set()
    for i, entry in enumerate(data["tensors"]):
        check(entry, f"tensors[{i}]", ("name", "shape", "dtype", "kind"))
        if entry["kind"] not in _KINDS:
            raise ModelError(f"{where}: {entry['name']}: kind must be 'param' or 'buffer'")
        if entry["name"] in names:
            raise ModelError(f"{where}: {entry['name']}: listed twice")
        names.add(entry["name"])
    data.setdefault("tied", [])
    data.setdefault("non_persistent_buffers", [])
    for group in data["tied"]:
        if not isinstance(group, list) or not all(isinstance(n, str) and n in names for n in group):
            raise ModelError(f"{where}: tied group {group!r} must list tensors of the spec")
    for i, entry in enumerate(data["non_persistent_buffers"]):
        check(entry, f"non_persistent_buffers[{i}]", ("name", "shape", "dtype"))
        if entry["name"] in names:
            raise ModelError(f"{where}: {entry['name']}: both persistent and non-persistent")
    return data


def _owner(root: nn.Module, dotted: str, *, create: bool) -> tuple[nn.Module, str]:
    """The module that holds tensor ``dotted`` and the tensor's own name, creating containers."""
    *path, leaf = dotted.split(".")
    module = root
    for i, part in enumerate(path):
        child = module._modules.get(part)
        if child is None:
            if not create or hasattr(module, part):
                raise ModelError(f"{dotted}: {'.'.join(path[: i + 1])} is not a submodule")
            child = nn.Module()
            module.add_module(part, child)
        module = child
    return module, leaf


class SpecModel(nn.Module):
    """A module with exactly the tensors a weight spec lists, for measurement only.

    Submodules are plain ``nn.Module`` containers named by the dotted paths.
    Parameters and persistent buffers are registered in spec order, which reproduces
    the spec's ``state_dict()`` key order (a state dict lists each module's own
    tensors, then its children's, so any real model's order can be rebuilt this way).
    Each tied group is one object under all its names; non-persistent buffers are
    registered with ``persistent=False`` after everything else. Names in ``trim`` are
    left out (each must be a tensor of the spec, else :class:`ModelError`).
    ``forward`` raises :class:`TypeError`: a spec describes weights, not computation.
    """

    def __init__(
        self, spec: Mapping[str, Any], trim: Iterable[str] = (), device: torch.device | str = "meta"
    ) -> None:
        super().__init__()
        trimmed = set(trim)
        known = {t["name"] for t in spec["tensors"]}
        missing = sorted(trimmed - known)
        if missing:
            raise ModelError(f"trim names tensors the spec does not have: {', '.join(missing)}")
        group_of = {name: i for i, group in enumerate(spec.get("tied", [])) for name in group}
        shared: dict[int, torch.Tensor] = {}
        for entry in spec["tensors"]:
            name = entry["name"]
            if name in trimmed:
                continue
            owner, leaf = _owner(self, name, create=True)
            group = group_of.get(name)
            tensor = shared.get(group) if group is not None else None
            if tensor is None:
                dtype = _parse_dtype(entry["dtype"])
                assert dtype is not None, f"{name}: unchecked spec (use load_spec)"
                tensor = torch.empty(entry["shape"], dtype=dtype, device=device)
                if entry["kind"] == "param":
                    grad = dtype.is_floating_point or dtype.is_complex
                    tensor = nn.Parameter(tensor, requires_grad=grad)
                if group is not None:
                    shared[group] = tensor
            if isinstance(tensor, nn.Parameter):
                owner.register_parameter(leaf, tensor)
            else:
                owner.register_buffer(leaf, tensor, persistent=True)
        self._non_persistent_names: list[str] = []
        for entry in spec.get("non_persistent_buffers", []):
            dtype = _parse_dtype(entry["dtype"])
            assert dtype is not None, f"{entry['name']}: unchecked spec (use load_spec)"
            owner, leaf = _owner(self, entry["name"], create=True)
            owner.register_buffer(
                leaf, torch.empty(entry["shape"], dtype=dtype, device=device), persistent=False
            )
            self._non_persistent_names.append(entry["name"])

    def reset_non_persistent_buffers(self) -> None:
        """Give every non-persistent buffer deterministic CPU values (see :func:`_pattern`)."""
        for name in self._non_persistent_names:
            owner, leaf = _owner(self, name, create=False)
            current = owner._buffers[leaf]
            assert current is not None
            owner._buffers[leaf] = _pattern(current.shape, current.dtype)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Always raises: a spec model describes weights only."""
        raise TypeError("a SpecModel describes weights only and cannot run forward")


# --------------------------------------------------------------------------- inspection


def weight_order(module: nn.Module) -> list[str]:
    """Persistent state-dict names in registration (``state_dict()``) order.

    Every name of a tied group appears, as in ``state_dict()``.
    """
    return list(module.state_dict(keep_vars=True))


def spec_of(
    module: nn.Module, *, source: str = "", config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Describe ``module``'s tensors in the weight-spec format (``harness/specs/README.md``).

    ``tensors`` follows ``state_dict()`` order with every name of a tied group;
    ``numel``/``nbytes`` sum over those entries (a tied tensor counts once per name,
    as the state dict lists it); ``tied`` lists the names that share one tensor
    object (parameters first, then buffers, in module order); ``non_persistent_buffers``
    follows module order and, within a module, buffer registration order.
    """
    state = module.state_dict(keep_vars=True)
    tensors = [
        {
            "name": name,
            "shape": list(t.shape),
            "dtype": _dtype_name(t.dtype),
            "kind": "param" if isinstance(t, nn.Parameter) else "buffer",
        }
        for name, t in state.items()
    ]
    holders: dict[int, list[str]] = {}
    every = chain(
        module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False)
    )
    for name, t in every:
        holders.setdefault(id(t), []).append(name)
    transient = []
    for prefix, sub in module.named_modules():
        for leaf, t in sub._buffers.items():
            if t is not None and leaf in sub._non_persistent_buffers_set:
                full = f"{prefix}.{leaf}" if prefix else leaf
                transient.append({"name": full, "shape": list(t.shape), "dtype": _dtype_name(t.dtype)})
    return {
        "source": source,
        "config": dict(config or {}),
        "numel": sum(t.numel() for t in state.values()),
        "nbytes": sum(t.numel() * t.element_size() for t in state.values()),
        "tensors": tensors,
        "tied": [names for names in holders.values() if len(names) > 1],
        "non_persistent_buffers": transient,
    }


def _normal(value: Any) -> Any:
    """Shapes may come as lists or tuples; compare them as lists."""
    return list(value) if isinstance(value, list | tuple) else value


def spec_differences(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """Human-readable differences between two weight specs (empty when they match).

    Compares tensor names, order, shapes, dtypes and kinds; tied groups (as sets);
    non-persistent buffers by name (their order within a module is not stable).
    """
    out: list[str] = []
    want = {t["name"]: t for t in expected["tensors"]}
    got = {t["name"]: t for t in actual["tensors"]}
    out += [f"missing: {name}" for name in want if name not in got]
    out += [f"unexpected: {name}" for name in got if name not in want]
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            continue
        for key in ("shape", "dtype", "kind"):
            if _normal(w[key]) != _normal(g[key]):
                out.append(f"{name}: {key} {g[key]} here, {w[key]} in the spec")
    common_w = [n for n in want if n in got]
    common_g = [n for n in got if n in want]
    if common_w != common_g:
        i = next(i for i, (a, b) in enumerate(zip(common_w, common_g, strict=True)) if a != b)
        out.append(f"order differs at tensor {i}: {common_g[i]} here, {common_w[i]} in the spec")
    tied_w = {frozenset(g) for g in expected.get("tied", [])}
    tied_g = {frozenset(g) for g in actual.get("tied", [])}
    out += [f"tied in the spec only: {sorted(g)}" for g in tied_w - tied_g]
    out += [f"tied here only: {sorted(g)}" for g in tied_g - tied_w]
    np_w = {b["name"]: b for b in expected.get("non_persistent_buffers", [])}
    np_g = {b["name"]: b for b in actual.get("non_persistent_buffers", [])}
    out += [f"missing non-persistent buffer: {n}" for n in np_w if n not in np_g]
    out += [f"unexpected non-persistent buffer: {n}" for n in np_g if n not in np_w]
    for name in np_w.keys() & np_g.keys():
        w, g = np_w[name], np_g[name]
        if list(w["shape"]) != list(g["shape"]) or w["dtype"] != g["dtype"]:
            out.append(f"{name}: {g['dtype']}{g['shape']} here, {w['dtype']}{w['shape']} in the spec")
    return out


def fill_non_persistent(model: nn.Module) -> list[str]:
    """Materialise non-persistent buffers on the CPU so that the model can run.

    Calls ``reset_non_persistent_buffers()`` on every submodule that defines it (the
    synthetic model computes its real rotary frequencies, a spec model a pattern),
    then gives any non-persistent buffer still on meta the deterministic pattern of
    :func:`_pattern`. Returns the names of all non-persistent buffers, in module order.
    """
    for sub in model.modules():
        reset = getattr(sub, "reset_non_persistent_buffers", None)
        if callable(reset):
            reset()
    names = []
    for prefix, sub in model.named_modules():
        for leaf in list(sub._buffers):
            current = sub._buffers[leaf]
            if current is None or leaf not in sub._non_persistent_buffers_set:
                continue
            if current.is_meta:
                sub._buffers[leaf] = _pattern(current.shape, current.dtype)
            names.append(f"{prefix}.{leaf}" if prefix else leaf)
    return names


# --------------------------------------------------------------------------- lerobot


def _lerobot_reason(exc: BaseException) -> str:
    version = ".".join(map(str, sys.version_info[:3]))
    needs = "lerobot 0.6 needs Python >= 3.12, torch < 2.12 and transformers >= 5.4, < 5.6"
    return f"Python {version}, torch {torch.__version__}; {needs}; {type(exc).__name__}: {exc}"


def _build_lerobot_pi05() -> tuple[nn.Module, str, dict[str, Any]]:
    """lerobot's ``PI05Pytorch`` (``PI05Config(dtype="bfloat16")``) on meta.

    Returns the module, ``"lerobot <version>"`` and the config fields a spec records.
    Sets ``HF_HUB_OFFLINE=1`` unless already set: nothing may be downloaded.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import lerobot
        from lerobot.configs.types import FeatureType, PolicyFeature
        from lerobot.policies.pi05.configuration_pi05 import PI05Config
        from lerobot.policies.pi05.modeling_pi05 import PI05Pytorch
    except Exception as exc:  # ImportError, or a version check raising something else
        raise LerobotUnavailableError(f"lerobot is not importable here ({_lerobot_reason(exc)})") from exc
    config = PI05Config(dtype="bfloat16", device="cpu")
    config.input_features = {
        "observation.images.base_0_rgb": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 224, 224)),
        "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(8,)),
    }
    config.output_features = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(7,))}
    # The policy wrapper moves itself to config.device, which fails on meta: build the inner model.
    with torch.device("meta"):
        module = PI05Pytorch(config)
    fields = {
        "dtype": config.dtype,
        "paligemma_variant": config.paligemma_variant,
        "action_expert_variant": config.action_expert_variant,
        "chunk_size": config.chunk_size,
    }
    return module, f"lerobot {getattr(lerobot, '__version__', '?')}", fields


def _drop(module: nn.Module, names: Iterable[str]) -> None:
    """Unregister the named parameters/persistent buffers of ``module``."""
    for name in names:
        owner, leaf = _owner(module, name, create=False)
        if leaf in owner._parameters:
            del owner._parameters[leaf]
        elif leaf in owner._buffers:
            del owner._buffers[leaf]
        else:
            raise ModelError(f"trim: {name} is not a tensor of the model")


def _show(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _describe(module: nn.Module) -> str:
    seen: set[int] = set()
    total = 0
    for t in module.state_dict(keep_vars=True).values():
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return f"{len(seen)} tensors, {total:,} bytes ({total / 2**30:.2f} GiB)"


def _from_spec(cfg: ModelConfig, spec: Mapping[str, Any], note: str) -> ModelInfo:
    assert cfg.spec is not None
    module = SpecModel(spec, cfg.trim)
    trimmed = f"; trimmed {', '.join(cfg.trim)}" if cfg.trim else ""
    text = f"{note}weights only, from {spec.get('source') or 'a weight spec'}{trimmed}; {_describe(module)}"
    return ModelInfo(module, cfg.key, f"spec:{_show(cfg.spec)}", text)


def build_model(cfg: ModelConfig) -> ModelInfo:
    """Build the configured model on the meta device.

    Raises :class:`ModelError` for a bad spec or trim name,
    :class:`SpecMismatchError` when lerobot's model differs from its spec (the first
    20 differences listed), and :class:`LerobotUnavailableError` when lerobot cannot
    be imported and the scenario has no ``fallback = "spec"``; with the fallback the
    spec model is built and ``source_note`` starts with
    ``"lerobot not importable (<reason>); built from spec"``.
    """
    if cfg.source == "synthetic":
        assert cfg.layers and cfg.width and cfg.vocab, "synthetic model needs layers, width and vocab"
        module = SyntheticTransformer(
            layers=cfg.layers,
            width=cfg.width,
            vocab=cfg.vocab,
            heads=cfg.heads,
            ffn_mult=cfg.ffn_mult,
            dtype=getattr(torch, cfg.dtype),
        )
        note = (
            f"synthetic transformer: {cfg.layers} layers, width {cfg.width}, {cfg.heads} heads, "
            f"vocab {cfg.vocab}, ffn x{cfg.ffn_mult}, {cfg.dtype}; {_describe(module)}"
        )
        return ModelInfo(module, cfg.key, "synthetic", note)
    if cfg.spec is None:
        raise ModelError(f"source {cfg.source!r} needs a spec file")
    spec = load_spec(cfg.spec)
    if cfg.source == "spec":
        return _from_spec(cfg, spec, "")
    if cfg.source != "lerobot":
        raise ModelError(f"unknown model source {cfg.source!r}")
    try:
        real, source, _ = _build_lerobot_pi05()
    except LerobotUnavailableError as exc:
        if cfg.fallback != "spec":
            raise
        reason = str(exc).removeprefix("lerobot is not importable here (").removesuffix(")")
        return _from_spec(cfg, spec, f"lerobot not importable ({reason}); built from spec; ")
    problems = spec_differences(spec, spec_of(real))
    if problems:
        listed = "\n  ".join(problems[:_MAX_LISTED])
        more = f"\n  ... and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
        raise SpecMismatchError(
            f"{source}'s pi0.5 differs from {_show(cfg.spec)} in {len(problems)} ways:\n  {listed}{more}"
        )
    missing = sorted(set(cfg.trim) - {t["name"] for t in spec["tensors"]})
    if missing:
        raise ModelError(f"trim names tensors the model does not have: {', '.join(missing)}")
    _drop(real, cfg.trim)
    trimmed = f"; trimmed {', '.join(cfg.trim)}" if cfg.trim else ""
    note = f"{source} PI05Pytorch on meta, matches {_show(cfg.spec)}{trimmed}; {_describe(real)}"
    return ModelInfo(real, cfg.key, source, note)
