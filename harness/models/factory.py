"""The ``factory`` source: the user's own ``nn.Module``, returned by a function they name as
``package.module:function`` (:mod:`harness.models.user`: imported as ``python -m`` imports, built empty)."""

from __future__ import annotations

from harness.models.base import ModelInfo, describe
from harness.models.user import build_empty, import_function
from harness.scenario import ModelConfig

__all__ = ["build_factory"]


def build_factory(cfg: ModelConfig) -> ModelInfo:
    """The model ``cfg.factory`` returns, on meta; its ``source`` is ``"factory <module:function>"``."""
    assert cfg.factory is not None, "a factory model needs model.factory"
    make = import_function(cfg.factory, "model.factory")
    module = build_empty(make, f"model.factory {cfg.factory}")
    note = (f"{type(module).__qualname__} returned by {cfg.factory}() under weightmap.init_empty_weights; "
            f"{describe(module)}")
    return ModelInfo(module, cfg.key, f"factory {cfg.factory}", note)
