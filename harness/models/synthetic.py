"""The ``synthetic`` source: a small decoder-only transformer of a configured size.

:class:`SyntheticTransformer` has the traits real checkpoints have (an embedding tied
to the output head, a non-persistent rotary buffer) and can run a forward pass.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from harness.models.base import ModelError, ModelInfo, describe
from harness.scenario import ModelConfig, synthetic_numel

__all__ = ["SyntheticTransformer", "build_synthetic"]


def _rotary_frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """The standard rotary inverse frequencies ``base ** (-2i / head_dim)``, float32 on CPU."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return (1.0 / (base**exponents)).to(torch.float32)


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
        """Elements in the state dict with the tied weight counted once (:func:`harness.scenario.synthetic_numel`,
        which the scenario's size check uses)."""
        return synthetic_numel(layers=layers, width=width, vocab=vocab, ffn_mult=ffn_mult)

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


def build_synthetic(cfg: ModelConfig) -> ModelInfo:
    """The configured :class:`SyntheticTransformer` on meta, with a note describing it."""
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
        f"vocab {cfg.vocab}, ffn x{cfg.ffn_mult}, {cfg.dtype}; {describe(module)}"
    )
    return ModelInfo(module, cfg.key, "synthetic", note)
