"""The example inputs of a user's own model (``factory`` and ``transformers`` sources), which a compiler backend
exports and checks it with.

``model.inputs`` (``package.module:function``) is called with the model (its weights mapped) and returns a tensor,
a tuple (or list) of tensors, or a dict of tensors (keyword arguments). Without it:

* ``transformers``: the architecture's ``main_input_name`` must be ``input_ids``: ``tokens`` token ids below the
  config's ``vocab_size`` (the model is built with ``use_cache`` off: :mod:`harness.models.hf`). Models that take
  anything else (``pixel_values`` of vision models, ``input_features`` or ``input_values`` of speech models,
  encoder-decoders' ``decoder_input_ids`` beside them) are not supported without ``model.inputs``;
* ``factory``: a model whose ``forward`` takes ``input_ids`` first, or whose first submodule is an
  ``nn.Embedding``: ``tokens`` token ids below that (first) embedding's size; any other needs ``model.inputs``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from harness.engines.compile.entry_types import Entry, EntryError
from harness.errors import HarnessError
from harness.scenario import ModelConfig

__all__ = ["user_entry"]

TOKEN_INPUT = "input_ids"


def _given(cfg: ModelConfig, model: nn.Module) -> Entry:
    from harness.models.user import import_function

    assert cfg.inputs is not None
    try:
        make = import_function(cfg.inputs, "model.inputs")
    except HarnessError as exc:
        raise EntryError(str(exc)) from exc
    try:
        value = make(model)
    except Exception as exc:
        raise EntryError(f"model.inputs {cfg.inputs} raised {type(exc).__name__}: {exc}") from exc
    if isinstance(value, torch.Tensor):
        return Entry(model, (value,))
    if isinstance(value, tuple | list) and value and all(isinstance(v, torch.Tensor) for v in value):
        return Entry(model, tuple(value))
    if (isinstance(value, dict) and value and all(isinstance(k, str) for k in value)
            and all(isinstance(v, torch.Tensor) for v in value.values())):
        return Entry(model, (), dict(value))
    raise EntryError(f"model.inputs {cfg.inputs} returned {_shown(value)}: expected a tensor, a tuple of tensors "
                     "or a dict of tensors")


def _shown(value: Any) -> str:
    if isinstance(value, tuple | list | dict):
        inner = value.values() if isinstance(value, dict) else value
        kinds = sorted({type(v).__name__ for v in inner})
        return f"a {type(value).__name__} of {', '.join(kinds) or 'nothing'}"
    return f"a {type(value).__name__}"


def _first_embedding(model: nn.Module) -> nn.Embedding | None:
    return next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)


def _takes_tokens_first(model: nn.Module) -> bool:
    try:
        params = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return False
    if params and params[0] == TOKEN_INPUT:
        return True
    first = next(iter(model.children()), None)
    return isinstance(first, nn.Embedding)


def _token_vocab(cfg: ModelConfig, model: nn.Module) -> int:
    if cfg.source == "transformers":
        main = getattr(model, "main_input_name", TOKEN_INPUT)
        if main != TOKEN_INPUT:
            raise EntryError(f"{type(model).__name__} takes {main}, not token ids: the harness makes only input_ids; "
                             "give model.inputs (--inputs package.module:function) returning its inputs")
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        if isinstance(vocab, int) and vocab > 0:
            return vocab
    elif not _takes_tokens_first(model):
        raise EntryError(f"{type(model).__name__}.forward takes neither {TOKEN_INPUT} first nor starts with an "
                         "nn.Embedding: give model.inputs (--inputs package.module:function) returning its inputs")
    embedding = _first_embedding(model)
    if embedding is None:
        raise EntryError(f"{type(model).__name__} has no nn.Embedding to size token ids by: give model.inputs "
                         "(--inputs package.module:function) returning its inputs")
    return embedding.num_embeddings


def user_entry(cfg: ModelConfig, model: nn.Module, *, tokens: int, generator: torch.Generator) -> Entry:
    """The entry of a user's own model: the model itself, on the inputs the module docstring describes."""
    if cfg.inputs is not None:
        return _given(cfg, model)
    return Entry(model, (torch.randint(0, _token_vocab(cfg, model), (1, tokens), generator=generator),))
