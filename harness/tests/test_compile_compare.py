"""The built model against eager: dtype tolerances, and a float32 run of eager as the judge for bfloat16 models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.engines.compile.compare import REFERENCE_MULTIPLIER, compare_outputs, upcast_reference
from harness.units import GIB, MIB


class Mixed(nn.Module):
    """bfloat16 layers and a float32 head, as lerobot's pi0.5: a float32 output computed through bfloat16."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(256, 512).to(torch.bfloat16)
        self.down = nn.Linear(512, 256).to(torch.bfloat16)
        self.head = nn.Linear(256, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(torch.nn.functional.gelu(self.up(x.to(self.up.weight.dtype))))
        return self.head(h.float())


def fused(model: Mixed, x: torch.Tensor) -> torch.Tensor:
    """What a compiler does with the same weights: float32 arithmetic, one bfloat16 rounding per layer."""
    w = {k: v.float() for k, v in model.state_dict().items()}
    h = (x.bfloat16().float() @ w["up.weight"].T + w["up.bias"]).bfloat16().float()
    h = (torch.nn.functional.gelu(h) @ w["down.weight"].T + w["down.bias"]).bfloat16().float()
    return h @ w["head.weight"].T + w["head.bias"]


def test_a_bfloat16_model_compiled_correctly_passes_against_a_float32_run() -> None:
    model, x = Mixed(), torch.randn(64, 256)
    with torch.no_grad():
        built, eager = fused(model, x), model(x)
    alone = compare_outputs(built, eager)
    assert not alone.ok and "beyond 0.0001" in alone.detail  # float32's tolerance cannot judge bfloat16 noise
    reference, why = upcast_reference(model, (x,), {}, free_bytes=GIB)
    assert why == "" and model.up.weight.dtype == torch.float32
    judged = compare_outputs(built, eager, reference)
    assert judged.ok, judged.detail
    assert "as accurate as eager" in judged.detail and "RMS error against a torch.float32 run" in judged.detail
    assert judged.max_abs_diff == alone.max_abs_diff


def test_a_wrong_built_model_still_fails_against_the_float32_run() -> None:
    model, x = Mixed(), torch.randn(64, 256)
    with torch.no_grad():
        eager = model(x)
        built = fused(model, x) + 0.05 * torch.randn(64, 32)
    reference, _ = upcast_reference(model, (x,), {}, free_bytes=GIB)
    judged = compare_outputs(built, eager, reference)
    assert not judged.ok
    assert f"beyond {REFERENCE_MULTIPLIER:g}x" in judged.detail
    with pytest.raises(AssertionError, match="RMS error against"):
        judged.check()


def test_no_float32_run_where_it_would_not_fit_or_cannot_be_more_precise() -> None:
    model, x = Mixed(), torch.randn(4, 256)
    reference, why = upcast_reference(model, (x,), {}, free_bytes=1000)
    assert reference is None and "no float32 run of eager" in why and "GiB free" in why
    assert model.up.weight.dtype == torch.bfloat16  # left as it was
    plain = nn.Linear(8, 8)
    reference, why = upcast_reference(plain, (torch.randn(2, 8),), {}, free_bytes=GIB)
    assert reference is None and "precision already" in why


def test_upcasting_keeps_tied_weights_tied() -> None:
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16, bias=False)).to(torch.bfloat16)
    model[1].weight = model[0].weight
    reference, why = upcast_reference(model, (torch.arange(4),), {}, free_bytes=GIB)
    assert why == "" and reference.dtype == torch.float32
    assert model[1].weight is model[0].weight


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2048, 2048, bias=False, dtype=torch.bfloat16)  # 8 MiB
        self.b = nn.Linear(2048, 64, bias=False)  # float32, 0.5 MiB: keeps the file mapped

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x.to(self.a.weight.dtype)).float())


def test_upcasting_a_mapped_model_drops_its_pages_as_the_copies_come_in(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import save_file

    from harness.measure.procfs import mapping_rss
    from weightmap import map_weights

    path = tmp_path / "w.safetensors"
    save_file({"a.weight": torch.randn(2048, 2048).bfloat16(), "b.weight": torch.randn(64, 2048)}, str(path))
    with torch.device("meta"):
        model = _Pair()
    map_weights(model, path).close()
    x = torch.randn(2, 2048)
    with torch.no_grad():
        model(x)  # every page of both weights read
    assert mapping_rss(path) > 8 * MIB
    reference, why = upcast_reference(model, (x,), {}, free_bytes=GIB)
    assert why == "" and reference.dtype == torch.float32
    # the float32 weight still maps the file; the bfloat16 one's pages left RSS with its copy
    assert mapping_rss(path) < 2 * MIB
