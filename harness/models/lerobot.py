"""The ``lerobot`` source: lerobot's pi0.5 (``PI05Pytorch``) itself, checked against its spec.

lerobot is imported only inside :func:`build_lerobot`, never when this module is
imported; where it cannot be imported the build raises
:class:`~harness.models.base.LerobotUnavailableError` with the reason.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from harness.models.base import (
    LerobotUnavailableError,
    ModelError,
    ModelInfo,
    SpecMismatchError,
    describe,
    owner_of,
    show_path,
)
from harness.models.spec import spec_differences, spec_of
from harness.scenario import ModelConfig

__all__ = ["build_lerobot"]

_MAX_LISTED = 20


def lerobot_reason(exc: BaseException, python: tuple[int, ...] = tuple(sys.version_info[:3]),
                   torch_version: str = torch.__version__) -> str:
    """Why lerobot did not import: the requirements this interpreter does not meet, else the error itself."""
    version = ".".join(map(str, python))
    torch_release = tuple(int(p) for p in torch_version.split("+")[0].split(".")[:2])
    unmet = []
    if python < (3, 12):
        unmet.append(f"Python >= 3.12 (this is {version})")
    if torch_release >= (2, 12):
        unmet.append(f"torch < 2.12 (this is {torch_version})")
    error = f"{type(exc).__name__}: {exc}"
    if unmet:
        return f"lerobot 0.6 needs {' and '.join(unmet)}; {error}"
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "lerobot":
        return f"not installed (Python {version} and torch {torch_version} would do); {error}"
    return error


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
        raise LerobotUnavailableError(f"lerobot is not importable here ({lerobot_reason(exc)})") from exc
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
        owner, leaf = owner_of(module, name, create=False)
        if leaf in owner._parameters:
            del owner._parameters[leaf]
        elif leaf in owner._buffers:
            del owner._buffers[leaf]
        else:
            raise ModelError(f"trim: {name} is not a tensor of the model")


def build_lerobot(cfg: ModelConfig, spec: Mapping[str, Any]) -> ModelInfo:
    """lerobot's pi0.5 on meta, compared with ``spec`` (already loaded from ``cfg.spec``), then trimmed.

    Raises :class:`LerobotUnavailableError` when lerobot cannot be imported,
    :class:`SpecMismatchError` when the model differs from ``spec`` (the first 20
    differences listed) and :class:`ModelError` for a trim name the model lacks.
    """
    assert cfg.spec is not None
    real, source, _ = _build_lerobot_pi05()
    problems = spec_differences(spec, spec_of(real))
    if problems:
        listed = "\n  ".join(problems[:_MAX_LISTED])
        more = f"\n  ... and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
        raise SpecMismatchError(
            f"{source}'s pi0.5 differs from {show_path(cfg.spec)} in {len(problems)} ways:\n  {listed}{more}"
        )
    missing = sorted(set(cfg.trim) - {t["name"] for t in spec["tensors"]})
    if missing:
        raise ModelError(f"trim names tensors the model does not have: {', '.join(missing)}")
    _drop(real, cfg.trim)
    trimmed = f"; trimmed {', '.join(cfg.trim)}" if cfg.trim else ""
    note = f"{source} PI05Pytorch on meta, matches {show_path(cfg.spec)}{trimmed}; {describe(real)}"
    return ModelInfo(real, cfg.key, source, note)
