"""The ``spec`` source and weight specs: read them, build from them, describe and compare.

A weight spec (``harness/specs/*.json``, format in ``harness/specs/README.md``) gives
the exact names, shapes, dtypes, tied groups and non-persistent buffers of a real
model, without its code. :class:`SpecModel` is built from one (weights only; it cannot
run); :func:`spec_of` writes one for any module and :func:`spec_differences` compares two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import chain
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.models.base import (
    ModelError,
    ModelInfo,
    describe,
    dtype_name,
    owner_of,
    parse_dtype,
    pattern,
    show_path,
)
from harness.scenario import ModelConfig
from harness.weightspec import load_json_bounded

__all__ = ["SpecModel", "build_from_spec", "load_spec", "spec_differences", "spec_of"]

_KINDS = ("param", "buffer")


def load_spec(path: str | Path) -> dict[str, Any]:
    """Read and check a weight-spec JSON (the format of ``harness/specs/README.md``).

    Requires ``tensors``: a list of ``{name, shape, dtype, kind}`` with unique names,
    non-negative integer shapes, torch dtype names and kind ``param``/``buffer``;
    optional ``tied`` (lists of tensor names) and ``non_persistent_buffers``
    (``{name, shape, dtype}``). Raises :class:`ModelError` naming the file and the entry; a
    path that is not a regular file is refused before it is opened, and JSON nested deeper than
    :data:`~harness.weightspec.MAX_SPEC_NESTING` before it is parsed.
    """
    where = Path(path)
    try:
        if not where.is_file() and where.exists():  # a FIFO would block the read below
            raise OSError(f"{where} is not a regular file")
        data = load_json_bounded(where.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, not JSON, nested too deeply
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
        if parse_dtype(entry["dtype"]) is None:
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
            owner, leaf = owner_of(self, name, create=True)
            group = group_of.get(name)
            tensor = shared.get(group) if group is not None else None
            if tensor is None:
                dtype = parse_dtype(entry["dtype"])
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
            dtype = parse_dtype(entry["dtype"])
            assert dtype is not None, f"{entry['name']}: unchecked spec (use load_spec)"
            owner, leaf = owner_of(self, entry["name"], create=True)
            owner.register_buffer(
                leaf, torch.empty(entry["shape"], dtype=dtype, device=device), persistent=False
            )
            self._non_persistent_names.append(entry["name"])

    def reset_non_persistent_buffers(self) -> None:
        """Give every non-persistent buffer deterministic CPU values (see :func:`~harness.models.base.pattern`)."""
        for name in self._non_persistent_names:
            owner, leaf = owner_of(self, name, create=False)
            current = owner._buffers[leaf]
            assert current is not None
            owner._buffers[leaf] = pattern(current.shape, current.dtype)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Always raises: a spec model describes weights only."""
        raise TypeError("a SpecModel describes weights only and cannot run forward")


def build_from_spec(cfg: ModelConfig, spec: Mapping[str, Any], note: str) -> ModelInfo:
    """A :class:`SpecModel` of ``spec`` trimmed as configured; ``note`` opens its source note."""
    assert cfg.spec is not None
    module = SpecModel(spec, cfg.trim)
    trimmed = f"; trimmed {', '.join(cfg.trim)}" if cfg.trim else ""
    made = f" (made from {spec['source']})" if spec.get("source") else ""
    text = f"{note}weights only, from a weight spec{made}{trimmed}; {describe(module)}"
    return ModelInfo(module, cfg.key, f"spec:{show_path(cfg.spec)}", text)


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
            "dtype": dtype_name(t.dtype),
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
                transient.append({"name": full, "shape": list(t.shape), "dtype": dtype_name(t.dtype)})
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
