"""The ``transformers`` source: a model from its transformers config (a hub snapshot's ``config.json``), built
empty.

transformers is imported only here, when this source is built; where it is missing the error says to install it.
The class is the one the config's ``architectures`` names, else ``AutoModelForCausalLM`` and then ``AutoModel``
(``from_config``), with ``use_cache`` off (one forward, no key/value cache among its outputs), built under
:func:`weightmap.init_empty_weights` (:func:`harness.models.user.build_empty`): ties
(``tie_word_embeddings``) are one parameter as transformers makes them, stored once in a checkpoint, and the
rotary frequencies are the ones transformers' own code computes, given back before a run. Nothing is downloaded
(``HF_HUB_OFFLINE=1`` unless set).
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from torch import nn

from harness.models.base import ModelError, ModelInfo, describe, show_path
from harness.models.user import build_empty
from harness.scenario import ModelConfig

__all__ = ["build_transformers", "import_transformers"]


def import_transformers() -> ModuleType:
    """The transformers package; :class:`ModelError` in one line saying to install it where it is missing."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError as exc:
        raise ModelError(f"model.source = \"transformers\" needs the transformers package, which does not import "
                         f"here ({exc}): pip install transformers") from exc
    return transformers


def _builder(transformers: ModuleType, config: Any, where: str) -> tuple[str, Any]:
    """The class the config's ``architectures`` names (its name, and how to build it)."""
    named = list(getattr(config, "architectures", None) or [])
    if named:
        cls = getattr(transformers, named[0], None)
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise ModelError(f"{where}: architectures names {named[0]!r}, which transformers "
                             f"{transformers.__version__} does not have")
        return named[0], lambda: cls._from_config(config)  # type: ignore[attr-defined]

    def auto() -> nn.Module:
        try:
            return transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-any-return]
        except ValueError:  # no causal-LM head for this model type
            return transformers.AutoModel.from_config(config)  # type: ignore[no-any-return]
    return "AutoModelForCausalLM/AutoModel", auto


def build_transformers(cfg: ModelConfig) -> ModelInfo:
    """The model of ``cfg.config`` on meta; its ``source`` is ``"transformers <class> <config path>"``.

    :class:`ModelError` where transformers is missing, the config cannot be read (an unknown ``model_type``), names
    an architecture transformers lacks, or building it raises.
    """
    assert cfg.config is not None, "a transformers model needs model.config"
    transformers = import_transformers()
    where = show_path(cfg.config)
    try:
        config = transformers.AutoConfig.from_pretrained(str(cfg.config))
    except Exception as exc:  # ValueError for an unknown model_type, OSError, JSON errors
        raise ModelError(f"{where}: transformers {transformers.__version__} cannot read this config "
                         f"({type(exc).__name__}: {exc})") from exc
    if hasattr(config, "use_cache"):  # one forward, as a compiler exports it: no key/value cache among its outputs
        config.use_cache = False
    named, build = _builder(transformers, config, where)
    module = build_empty(build, f"{where}: {named}")
    note = (f"transformers {transformers.__version__} {type(module).__name__} from {where} under "
            f"weightmap.init_empty_weights; {describe(module)}")
    return ModelInfo(module, cfg.key, f"transformers {type(module).__name__} {where}", note)
