"""Models the harness measures, always built on the meta device (no memory, no values).

Five sources, chosen by :class:`~harness.scenario.ModelConfig.source`:

``synthetic``
    :class:`SyntheticTransformer` (:mod:`harness.models.synthetic`), a small
    decoder-only transformer of the configured size and dtype, with the traits real
    checkpoints have: an embedding tied to the output head and a non-persistent rotary
    buffer. It can run a forward pass.
``spec``
    :class:`SpecModel` (:mod:`harness.models.spec`), built from a weight-spec JSON
    (``harness/specs/*.json``): the exact names, shapes, dtypes, tied groups and
    non-persistent buffers of a real model, without its code. Weights only; it cannot run.
``lerobot``
    lerobot's pi0.5 (``PI05Pytorch``) itself, checked against its spec
    (:mod:`harness.models.lerobot`). lerobot is imported only when asked for; where it
    cannot be imported the build fails with the reason, unless the scenario says
    ``fallback = "spec"``.
``factory``
    the user's own ``nn.Module``, returned by a function they name (:mod:`harness.models.factory`).
``transformers``
    a transformers model from its ``config.json`` (:mod:`harness.models.hf`); transformers is imported only
    when asked for.

The last two are built under :func:`weightmap.init_empty_weights`, then put on meta
(:mod:`harness.models.user`).

Weights are filled later, from a checkpoint; non-persistent buffers are not in any
checkpoint, so :func:`fill_non_persistent` gives them values before a model runs.
The errors and :class:`ModelInfo` live in :mod:`harness.models.base`; every public
name is importable from this package.
"""

from __future__ import annotations

from torch import nn

from harness.models.base import (
    LerobotUnavailableError,
    ModelError,
    ModelInfo,
    SpecMismatchError,
    pattern,
)
from harness.models.factory import build_factory
from harness.models.hf import build_transformers
from harness.models.lerobot import build_lerobot
from harness.models.spec import SpecModel, build_from_spec, load_spec, spec_differences, spec_of
from harness.models.synthetic import SyntheticTransformer, build_synthetic
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


def weight_order(module: nn.Module) -> list[str]:
    """Persistent state-dict names in registration (``state_dict()``) order.

    Every name of a tied group appears, as in ``state_dict()``.
    """
    return list(module.state_dict(keep_vars=True))


def fill_non_persistent(model: nn.Module) -> list[str]:
    """Materialise non-persistent buffers on the CPU so that the model can run.

    Calls ``reset_non_persistent_buffers()`` on every submodule that defines it (the
    synthetic model computes its real rotary frequencies, a spec model a pattern),
    then gives any non-persistent buffer still on meta the deterministic pattern of
    :func:`~harness.models.base.pattern`. Returns the names of all non-persistent
    buffers, in module order.
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
                sub._buffers[leaf] = pattern(current.shape, current.dtype)
            names.append(f"{prefix}.{leaf}" if prefix else leaf)
    return names


def build_model(cfg: ModelConfig) -> ModelInfo:
    """Build the configured model on the meta device.

    Raises :class:`ModelError` for a bad spec or trim name, a factory or config that cannot build a model,
    :class:`SpecMismatchError` when lerobot's model differs from its spec (the first
    20 differences listed), and :class:`LerobotUnavailableError` when lerobot cannot
    be imported and the scenario has no ``fallback = "spec"``; with the fallback the
    spec model is built and ``source_note`` starts with
    ``"lerobot not importable (<reason>); built from spec"``.
    """
    if cfg.source == "synthetic":
        return build_synthetic(cfg)
    if cfg.source == "factory":
        return build_factory(cfg)
    if cfg.source == "transformers":
        return build_transformers(cfg)
    if cfg.spec is None:
        raise ModelError(f"source {cfg.source!r} needs a spec file")
    spec = load_spec(cfg.spec)
    if cfg.source == "spec":
        return build_from_spec(cfg, spec, "")
    if cfg.source != "lerobot":
        raise ModelError(f"unknown model source {cfg.source!r}")
    try:
        return build_lerobot(cfg, spec)
    except LerobotUnavailableError as exc:
        if cfg.fallback != "spec":
            raise
        reason = str(exc).removeprefix("lerobot is not importable here (").removesuffix(")")
        return build_from_spec(cfg, spec, f"lerobot not importable ({reason}); built from spec; ")
