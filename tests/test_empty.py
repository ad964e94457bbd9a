"""init_empty_weights: parameters on meta, buffers computed, ties kept, and a model that runs once mapped."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
import torch
from support import TinyNet, seeded, snapshot
from torch import nn

from weightmap import (
    MappingError,
    assert_runnable,
    init_empty_weights,
    map_weights,
    preview_mapping,
    save_weights_for_mapping,
)

ORIGINAL_REGISTER_PARAMETER = nn.Module.register_parameter


class Rotary(nn.Module):
    """Rotary position embedding as Llama-style models have it: frequencies computed in __init__, never saved."""

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[-2], dtype=torch.float32)
        angles = torch.outer(positions, self.inv_freq)
        cos, sin = angles.cos(), angles.sin()
        first, second = x[..., 0::2], x[..., 1::2]
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class RotaryLM(nn.Module):
    """A small decoder: tied embedding, attention with rotary positions, a causal mask buffer."""

    def __init__(self, vocab: int = 97, width: int = 32, heads: int = 4, layers: int = 2, context: int = 16) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, width)
        self.rotary = Rotary(width // heads)
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width, bias=False) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.norm = nn.RMSNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied in __init__
        self.register_buffer("mask", torch.ones(context, context, dtype=torch.bool).tril(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        batch, steps, width = x.shape
        for qkv, out in zip(self.qkv, self.out, strict=True):
            q, k, v = qkv(x).view(batch, steps, 3, self.heads, width // self.heads).unbind(2)
            q, k = self.rotary(q.transpose(1, 2)), self.rotary(k.transpose(1, 2))
            scores = q @ k.transpose(-1, -2) / math.sqrt(width // self.heads)
            scores = scores.masked_fill(~self.mask[:steps, :steps], float("-inf"))
            x = x + out((scores.softmax(-1) @ v.transpose(1, 2)).transpose(1, 2).reshape(batch, steps, width))
        return self.head(self.norm(x))


@pytest.fixture
def rotary(tmp_path: Path) -> tuple[RotaryLM, Path]:
    torch.manual_seed(0)
    reference = RotaryLM()
    return reference, save_weights_for_mapping(reference, tmp_path / "rotary.safetensors")


def test_parameters_on_meta_buffers_computed_ties_kept() -> None:
    with init_empty_weights():
        model = RotaryLM()
    assert all(p.device.type == "meta" for p in model.parameters())
    assert model.head.weight is model.embed.weight
    assert isinstance(model.embed.weight, nn.Parameter) and model.embed.weight.requires_grad
    reference = RotaryLM()
    assert model.rotary.inv_freq.device.type == "cpu"
    assert torch.equal(model.rotary.inv_freq, reference.rotary.inv_freq)
    assert torch.equal(model.mask, reference.mask)


@pytest.mark.filterwarnings("error")
def test_mapped_strict_rotary_model_runs_like_the_original(rotary: tuple[RotaryLM, Path]) -> None:
    reference, path = rotary
    with init_empty_weights():
        model = RotaryLM()
    mapped = map_weights(model, path, strict=True)
    assert mapped.still_meta == [] and mapped.missing == [] and mapped.copied == []
    assert model.head.weight is model.embed.weight
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    torch.testing.assert_close(model(tokens), reference(tokens), rtol=0, atol=0)


def test_the_same_real_parameter_registered_twice_stays_one_tensor() -> None:
    shared = nn.Parameter(torch.ones(4, 4))
    with init_empty_weights():
        a, b = nn.Linear(4, 4), nn.Linear(4, 4)
        a.weight = shared
        b.weight = shared
        holder = nn.ParameterList([shared, shared])
    assert a.weight is b.weight and a.weight.device.type == "meta"
    assert holder[0] is holder[1] is a.weight


def test_parameter_class_attributes_and_requires_grad_are_kept() -> None:
    class Tagged(nn.Parameter):
        pass

    with init_empty_weights():
        module = nn.Module()
        param = Tagged(torch.ones(3), requires_grad=False)
        param.shard_dim = 1  # type: ignore[attr-defined]
        module.w = param
    assert type(module.w) is Tagged and module.w.device.type == "meta"
    assert module.w.requires_grad is False and module.w.shard_dim == 1


def test_include_buffers_puts_buffers_on_meta_too() -> None:
    with init_empty_weights(include_buffers=True):
        model = TinyNet()
    assert all(t.device.type == "meta" for t in model.state_dict(keep_vars=True).values())
    assert model.inv_freq.device.type == "meta"
    assert model.head.weight is model.embed.weight


def test_the_patch_is_gone_afterwards_and_blocks_nest() -> None:
    original = nn.Module.register_parameter
    with init_empty_weights():
        with init_empty_weights(include_buffers=True):
            inner = TinyNet()
        outer = TinyNet()
    assert nn.Module.register_parameter is original
    assert inner.inv_freq.device.type == "meta" and outer.inv_freq.device.type == "cpu"
    assert outer.embed.weight.device.type == "meta"
    assert TinyNet().embed.weight.device.type == "cpu"


def test_other_threads_build_as_usual_meanwhile() -> None:
    inside, built = threading.Event(), threading.Event()
    found: list[str] = []

    def other() -> None:
        inside.wait(10)
        found.append(nn.Linear(2, 2).weight.device.type)
        built.set()

    thread = threading.Thread(target=other)
    thread.start()
    with init_empty_weights():
        inside.set()
        built.wait(10)
        mine = nn.Linear(2, 2)
    thread.join()
    assert found == ["cpu"] and mine.weight.device.type == "meta"


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_building_does_not_hold_the_real_parameters() -> None:
    # Each parameter is made real (and touched) before it is registered; the meta copy
    # must not keep the real one alive, or building holds the whole model.
    class Big(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.ParameterList(nn.Parameter(torch.ones(8, 2**20)) for _ in range(12))  # 12 x 32 MiB

    before = _rss_bytes()
    with init_empty_weights():
        model = Big()
        during = _rss_bytes()
    assert all(p.device.type == "meta" for p in model.parameters())
    assert during - before < 160 * 2**20, f"building held {(during - before) / 2**20:.0f} MiB"


def test_real_non_persistent_buffer_is_left_alone_even_when_the_checkpoint_has_it(tmp_path: Path) -> None:
    reference = seeded(TinyNet())
    path = tmp_path / "with_buffer.safetensors"
    from safetensors.torch import save_file

    tensors = {k: v.clone() for k, v in reference.state_dict().items()}
    tensors["inv_freq"] = torch.full_like(reference.inv_freq, 7.0)  # a stale copy the model must not take
    save_file(tensors, str(path))
    with init_empty_weights():
        model = TinyNet()
    computed = model.inv_freq
    values = computed.clone()
    mapped = map_weights(model, path, strict=True)
    assert model.inv_freq is computed and torch.equal(model.inv_freq, values)
    assert "inv_freq" not in mapped.mapped and mapped.still_meta == []
    tokens = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(model(tokens), reference(tokens), rtol=0, atol=0)


def test_strict_accepts_meta_buffers_and_assert_runnable_names_them(tmp_path: Path) -> None:
    class TwoBuffers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.rotary = Rotary(8)
            self.register_buffer("position_ids", torch.arange(16), persistent=False)

    path = save_weights_for_mapping(TwoBuffers(), tmp_path / "two.safetensors")
    with torch.device("meta"):
        model = TwoBuffers()
    mapped = map_weights(model, path, strict=True)  # the contract: non-persistent buffers are not required
    assert sorted(mapped.mapped) == ["lin.bias", "lin.weight"]
    assert mapped.still_meta == ["position_ids", "rotary.inv_freq"] and mapped.missing == []
    with pytest.raises(MappingError) as caught:
        assert_runnable(model)
    message = str(caught.value)
    assert "'position_ids', 'rotary.inv_freq'" in message
    assert "2 non-persistent buffers are on the meta device" in message and "init_empty_weights" in message

    with torch.device("meta"):
        again = TwoBuffers()
    with init_empty_weights():
        del again.rotary
        again.rotary = Rotary(8)
    map_weights(again, path, strict=True)
    with pytest.raises(MappingError, match=r"1 non-persistent buffer is on the meta device .*: 'position_ids'\."):
        assert_runnable(again)
    again.position_ids = torch.arange(16)
    assert_runnable(again)  # filled by the caller: runnable


def test_assert_runnable_names_persistent_tensors_left_on_meta(tmp_path: Path) -> None:
    reference = seeded(TinyNet())
    path = save_weights_for_mapping(reference, tmp_path / "tiny.safetensors")
    with init_empty_weights():
        model = TinyNet()
    model.extra = nn.Parameter(torch.empty(2, device="meta"))
    mapped = map_weights(model, path)
    assert mapped.missing == ["extra"]
    with pytest.raises(MappingError, match=r"1 parameter or persistent buffer is on the meta device.*'extra'"):
        assert_runnable(model)


def test_deprecated_allow_meta_buffers_warns_and_false_still_refuses(tmp_path: Path) -> None:
    reference = seeded(TinyNet())
    path = save_weights_for_mapping(reference, tmp_path / "tiny.safetensors")
    with torch.device("meta"):
        model = TinyNet()
    before = snapshot(model)
    with pytest.warns(DeprecationWarning, match="assert_runnable"), pytest.raises(
        MappingError, match=r"non-persistent buffer is on the meta device.*'inv_freq'"
    ):
        map_weights(model, path, strict=True, allow_meta_buffers=False)
    assert snapshot(model) == before
    with pytest.warns(DeprecationWarning):
        mapped = map_weights(model, path, strict=True, allow_meta_buffers=True)
    assert mapped.still_meta == ["inv_freq"]


@pytest.mark.filterwarnings("error")
def test_strict_is_silent_and_leaves_meta_buffers_on_meta(tmp_path: Path) -> None:
    reference = seeded(TinyNet())
    path = save_weights_for_mapping(reference, tmp_path / "tiny.safetensors")
    with torch.device("meta"):
        model = TinyNet()
    mapped = map_weights(model, path, strict=True)
    assert mapped.still_meta == ["inv_freq"]
    assert preview_mapping(model, path).strict_problems == []


def test_counted_messages_agree_with_their_number(tmp_path: Path) -> None:
    reference = seeded(TinyNet())
    path = save_weights_for_mapping(reference, tmp_path / "tiny.safetensors")
    with init_empty_weights():
        one = TinyNet(dtype=torch.bfloat16)
    with pytest.raises(MappingError) as caught:
        map_weights(one, path, strict=True)  # every float tensor would be cast
    assert "10 problems:" in str(caught.value)


def test_preview_says_what_map_weights_would_do_and_changes_nothing(tmp_path: Path) -> None:
    reference = seeded(TinyNet())
    path = save_weights_for_mapping(reference, tmp_path / "tiny.safetensors")
    with init_empty_weights():
        model = TinyNet()
    model.norm.float()
    model.blocks[0].bias = nn.Parameter(torch.empty(32, dtype=torch.bfloat16, device="meta"))
    model.extra = nn.Parameter(torch.empty(2, device="meta"))
    before = snapshot(model)
    preview = preview_mapping(model, path)
    assert snapshot(model) == before
    assert set(preview.copied) == {"blocks.0.bias"} and "bfloat16" in preview.copied["blocks.0.bias"]
    assert preview.missing == ["extra"] and preview.still_meta == ["extra"]
    assert preview.computed == ["inv_freq"] and preview.unused == []
    assert "embed.weight" in preview.mapped and "head.weight" in preview.mapped
    assert preview.copied_bytes == 32 * 2
    assert len(preview.strict_problems) == 2  # the cast and the missing 'extra'
    mapped = map_weights(model, path)
    assert sorted(mapped.mapped) == sorted(preview.mapped) and mapped.nbytes == preview.nbytes
    assert mapped.still_meta == preview.still_meta


def test_the_innermost_block_decides_whether_buffers_are_real() -> None:
    class WithBuffer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.register_buffer("ids", torch.arange(3), persistent=False)

    with init_empty_weights(include_buffers=True):
        outer = WithBuffer()
        with init_empty_weights():
            inner = WithBuffer()
        after = WithBuffer()
    assert outer.ids.device.type == "meta" and after.ids.device.type == "meta"
    assert inner.ids.device.type == "cpu" and torch.equal(inner.ids, torch.arange(3))
    assert inner.lin.weight.device.type == "meta"
    assert torch.arange(2).device.type == "cpu"


def test_lazy_modules_are_built_and_run() -> None:
    with init_empty_weights():
        lazy = nn.LazyLinear(4)
    assert isinstance(lazy.weight, nn.parameter.UninitializedParameter)
    assert lazy(torch.ones(2, 3)).shape == (2, 4)  # materialised on first use, outside the block


def test_a_storage_tie_stays_one_tensor_after_mapping(tmp_path: Path) -> None:
    class StorageTied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4, bias=False)
            self.b = nn.Linear(4, 4, bias=False)
            self.b.weight = nn.Parameter(self.a.weight.data)  # another object on the same storage

    reference = seeded(StorageTied())
    assert reference.b.weight.untyped_storage().data_ptr() == reference.a.weight.untyped_storage().data_ptr()
    path = save_weights_for_mapping(reference, tmp_path / "tied.safetensors")
    with init_empty_weights():
        model = StorageTied()
    mapped = map_weights(model, path, strict=True)
    assert sorted(mapped.mapped) == ["a.weight", "b.weight"]
    assert model.b.weight.data_ptr() == model.a.weight.data_ptr()
    assert torch.equal(model.b.weight, reference.a.weight)
    real = StorageTied()
    map_weights(real, path, strict=True)
    assert real.b.weight.data_ptr() == real.a.weight.data_ptr()  # real objects share the view again


@pytest.mark.parametrize("include_buffers", [False, True])
def test_a_block_closed_on_another_thread_leaves_nothing_on(include_buffers: bool) -> None:
    block = init_empty_weights(include_buffers=include_buffers)
    block.__enter__()
    errors: list[BaseException] = []

    def close() -> None:
        try:
            block.__exit__(None, None, None)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    closer = threading.Thread(target=close)
    closer.start()
    closer.join()
    assert errors == []
    assert nn.Linear(2, 2).weight.device.type == "cpu" and torch.arange(2).device.type == "cpu"
    assert nn.Module.register_parameter is ORIGINAL_REGISTER_PARAMETER
