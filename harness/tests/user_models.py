"""Models the tests bring as a user would: a module of their own in the working directory (``model.factory``),
and a tiny Llama-shaped transformers folder (``model.config``), each with the checkpoint its user would save."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

FACTORY_MODULE = "tied_user_model"
"""The module :func:`write_factory` writes into the working directory."""

FACTORY = f"{FACTORY_MODULE}:make_tied"

FACTORY_SOURCE = '''
import torch
from torch import nn


class Tied(nn.Module):
    """Token ids in, logits out: an embedding tied to the head, and a non-persistent buffer the forward needs."""

    def __init__(self, vocab: int = {vocab}, width: int = {width}) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mixes = nn.ModuleList(nn.Linear(width, width) for _ in range(3))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.arange(width, dtype=torch.float32) / width + 1.0, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) * self.scale
        for mix in self.mixes:
            x = x + torch.tanh(mix(x))
        return self.head(x)


def make_tied() -> nn.Module:
    return Tied()


def token_inputs(model: nn.Module) -> dict:
    return {{"input_ids": torch.arange(8).reshape(1, 8) % model.embed.num_embeddings}}
'''


def write_factory(directory: Path, *, vocab: int = 64, width: int = 32) -> Path:
    """Write :data:`FACTORY_MODULE` into ``directory`` and its checkpoint, ``tied.safetensors``, saved with
    ``safetensors.torch.save_model`` from a real instance (the tie stored once); returns the checkpoint."""
    from safetensors.torch import save_model

    (directory / f"{FACTORY_MODULE}.py").write_text(textwrap.dedent(FACTORY_SOURCE.format(vocab=vocab, width=width)))
    sys.modules.pop(FACTORY_MODULE, None)
    sys.path.insert(0, str(directory))
    try:
        module = importlib.import_module(FACTORY_MODULE)
    finally:
        sys.path.remove(str(directory))
        sys.modules.pop(FACTORY_MODULE, None)
    checkpoint = directory / "tied.safetensors"
    save_model(module.make_tied(), str(checkpoint))
    return checkpoint


def write_llama(directory: Path, *, vocab: int = 64, hidden: int = 32, max_shard_size: str | None = None) -> Path:
    """A small ``LlamaForCausalLM`` (tied embeddings, rotary) saved with ``save_pretrained`` into ``directory``
    (``config.json`` and one ``model.safetensors``, or with ``max_shard_size`` shards and their index, as
    ``save_pretrained`` writes them); returns the folder."""
    import transformers

    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config)
    if max_shard_size is None:
        model.save_pretrained(directory, safe_serialization=True)
    else:
        model.save_pretrained(directory, safe_serialization=True, max_shard_size=max_shard_size)
    return directory
