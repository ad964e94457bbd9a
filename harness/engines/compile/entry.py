"""What a compiler backend exports: the module whose forward is traced, and the example inputs.

:func:`export_entry` returns, for a scenario's model, the module to hand to
``torch.export.export`` and the inputs to trace, check and run it with:

* ``synthetic``: the model itself, on ``tokens`` token ids ``[1, tokens]`` (seeded);
* ``lerobot``: :class:`SampleActions`, lerobot's own ``PI05Pytorch.sample_actions`` with one
  denoise step, on one 224x224 image, ``tokens`` language tokens and seeded noise; the
  model is its child ``model``, so the program's weight names are ``model.<name>``;
* ``factory`` and ``transformers``: the model itself, on the inputs ``model.inputs`` returns, else token ids
  where the model takes them (:mod:`harness.engines.compile.user_inputs`);
* ``spec``: no entry: a spec model has no forward (:class:`EntryError`).

The entry's tensor names are the names the graph partitions, the release plan and the
records use.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from harness.engines.compile.entry_types import Entry, EntryError
from harness.engines.compile.user_inputs import user_entry
from harness.scenario import USER_SOURCES, ModelConfig

__all__ = ["Entry", "EntryError", "SampleActions", "export_entry"]


class SampleActions(nn.Module):
    """``model.sample_actions(images, img_masks, tokens, masks, noise=noise, num_steps=steps)`` as a forward.

    lerobot's ``PI05Pytorch`` runs inference through ``sample_actions``, not ``forward``;
    this module makes that call its forward without changing the model.
    """

    def __init__(self, model: nn.Module, num_steps: int = 1) -> None:
        super().__init__()
        self.model = model
        self.num_steps = num_steps

    def forward(
        self,
        images: list[torch.Tensor],
        img_masks: list[torch.Tensor],
        tokens: torch.Tensor,
        masks: torch.Tensor,
        noise: torch.Tensor,
    ) -> torch.Tensor:
        return self.model.sample_actions(images, img_masks, tokens, masks, noise=noise,  # type: ignore[operator]
                                         num_steps=self.num_steps)


def _lerobot_inputs(model: nn.Module, tokens: int, generator: torch.Generator) -> tuple[Any, ...]:
    config = getattr(model, "config", None)
    chunk = int(getattr(config, "chunk_size", 50))
    action_dim = int(getattr(config, "max_action_dim", 32))
    vocab = 257152  # PaliGemma's
    images = [torch.rand((1, 3, 224, 224), generator=generator) * 2 - 1]
    img_masks = [torch.ones(1, dtype=torch.bool)]
    ids = torch.randint(0, vocab, (1, tokens), generator=generator)
    masks = torch.ones((1, tokens), dtype=torch.bool)
    noise = torch.randn((1, chunk, action_dim), generator=generator)
    return images, img_masks, ids, masks, noise


def export_entry(cfg: ModelConfig, model: nn.Module, *, tokens: int, seed: int = 0) -> Entry:
    """The entry module and example inputs for ``model`` built from ``cfg`` (see the module docstring)."""
    generator = torch.Generator().manual_seed(seed)
    if cfg.source == "synthetic":
        assert cfg.vocab is not None
        return Entry(model, (torch.randint(0, cfg.vocab, (1, tokens), generator=generator),))
    if cfg.source in USER_SOURCES:
        return user_entry(cfg, model, tokens=tokens, generator=generator)
    if cfg.source == "lerobot" and hasattr(model, "sample_actions"):
        return Entry(SampleActions(model), _lerobot_inputs(model, tokens, generator))
    raise EntryError(f"model {cfg.key} ({cfg.source}) has no forward to export: compiler backends need "
                     "a model with a forward: synthetic, factory, transformers or lerobot (where lerobot imports)")
