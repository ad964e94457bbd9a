"""map_weights: zero-copy views onto meta and real modules and ExportedPrograms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file, save_model
from support import TinyNet, inside, mapped_ranges, meta_tiny, seeded, snapshot

from weightmap import HeaderError, MappingError, map_weights


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[TinyNet, Path]:
    model = seeded(TinyNet())
    path = tmp_path / "tiny.safetensors"
    save_model(model, str(path))  # one name per tied group, as writers do
    return model, path


def assert_all_mapped(model: torch.nn.Module, path: Path, reference: torch.nn.Module) -> None:
    ranges = mapped_ranges(path)
    assert ranges, "the checkpoint is not mapped"
    ref = reference.state_dict()
    for name, t in model.state_dict().items():
        assert inside(t, ranges), f"{name} is not a view of the mapping"
        torch.testing.assert_close(t, ref[name], rtol=0, atol=0)


def test_meta_module_becomes_views_of_the_file(tiny: tuple[TinyNet, Path]) -> None:
    reference, path = tiny
    model = meta_tiny()
    mapped = map_weights(model, path)
    assert mapped.missing == [] and mapped.copied == []
    assert mapped.still_meta == ["inv_freq"]  # non-persistent: no checkpoint holds it
    assert model.head.weight is model.embed.weight
    assert isinstance(model.embed.weight, torch.nn.Parameter)
    assert_all_mapped(model, path, reference)
    assert mapped.nbytes == sum(t.nbytes for t in load_file(str(path)).values())
    assert mapped.paths == [path]


def test_mapped_model_runs_like_the_original(tiny: tuple[TinyNet, Path]) -> None:
    reference, path = tiny
    model = meta_tiny()
    map_weights(model, path)
    model.inv_freq = reference.inv_freq.clone()
    tokens = torch.tensor([[1, 5, 7, 3]])
    torch.testing.assert_close(model(tokens), reference(tokens))


def test_real_module_keeps_its_parameter_objects(tiny: tuple[TinyNet, Path]) -> None:
    reference, path = tiny
    model = TinyNet()
    before = snapshot(model)
    mapped = map_weights(model, path, strict=True)
    after = snapshot(model)
    assert {k: v[0] for k, v in before.items()} == {k: v[0] for k, v in after.items()}
    assert mapped.still_meta == [] and mapped.missing == []
    assert model.head.weight is model.embed.weight
    assert_all_mapped(model, path, reference)


def test_bf16_checkpoint_maps_without_copies(tmp_path: Path) -> None:
    reference = seeded(TinyNet(dtype=torch.bfloat16))
    path = tmp_path / "bf16.safetensors"
    save_model(reference, str(path))
    model = meta_tiny(dtype=torch.bfloat16)
    mapped = map_weights(model, path, strict=True)
    assert mapped.copied == []
    assert model.embed.weight.dtype == torch.bfloat16
    assert_all_mapped(model, path, reference)


def _export(model: torch.nn.Module, tokens: torch.Tensor) -> torch.export.ExportedProgram:
    return torch.export.export(model, (tokens,))


def test_real_exported_program(tiny: tuple[TinyNet, Path]) -> None:
    reference, path = tiny
    tokens = torch.tensor([[2, 4, 6]])
    program = _export(TinyNet(), tokens)  # random weights, replaced by the mapping
    mapped = map_weights(program, path, strict=True)
    assert mapped.missing == []
    ranges = mapped_ranges(path)
    for name, t in program.state_dict.items():
        assert inside(t, ranges), name
    assert program.state_dict["embed.weight"] is program.state_dict["head.weight"]
    program.constants["inv_freq"].copy_(reference.inv_freq)
    torch.testing.assert_close(program.module()(tokens), reference(tokens))


def test_meta_exported_program_with_tied_weights(tiny: tuple[TinyNet, Path]) -> None:
    reference, path = tiny
    with torch.device("meta"):
        program = _export(TinyNet(), torch.tensor([[2, 4, 6]], device="meta"))
    mapped = map_weights(program, path, strict=True)
    assert mapped.missing == [] and mapped.copied == []
    assert mapped.still_meta == ["inv_freq"]
    state = program.state_dict
    assert state["embed.weight"] is state["head.weight"]
    assert isinstance(state["embed.weight"], torch.nn.Parameter)
    ranges = mapped_ranges(path)
    for name, t in state.items():
        assert inside(t, ranges), name
        torch.testing.assert_close(t, reference.state_dict()[name], rtol=0, atol=0)
    program.constants["inv_freq"] = reference.inv_freq.clone()
    tokens = torch.tensor([[2, 4, 6]])
    torch.testing.assert_close(program.module()(tokens), reference(tokens))


def test_exported_program_strict_needs_lifted_constants(tmp_path: Path) -> None:
    class WithConstant(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.c = torch.arange(4.0)  # a lifted tensor constant

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) + self.c

    program = torch.export.export(WithConstant(), (torch.ones(2, 4),))
    path = tmp_path / "lin.safetensors"
    save_file({"lin.weight": torch.ones(4, 4), "lin.bias": torch.zeros(4)}, str(path))
    with pytest.raises(MappingError, match="'c'"):
        map_weights(program, path, strict=True)
    save_file({"lin.weight": torch.ones(4, 4), "lin.bias": torch.zeros(4), "c": torch.full((4,), 2.0)}, str(path))
    map_weights(program, path, strict=True)
    torch.testing.assert_close(program.module()(torch.zeros(2, 4)), torch.full((2, 4), 2.0))


def test_key_map_dict_and_callable(tiny: tuple[TinyNet, Path], tmp_path: Path) -> None:
    reference, path = tiny
    prefixed = tmp_path / "prefixed.safetensors"
    save_file({f"model.{k}": v for k, v in load_file(str(path)).items()}, str(prefixed))

    model = meta_tiny()
    mapped = map_weights(model, prefixed, key_map=lambda n: f"model.{n}", strict=True)
    assert mapped.missing == []
    assert_all_mapped(model, prefixed, reference)

    # A dict renames only what it holds; other names keep their own.
    renamed = tmp_path / "renamed.safetensors"
    tensors = load_file(str(path))
    tensors["emb"] = tensors.pop("embed.weight")
    save_file(tensors, str(renamed))
    model = meta_tiny()
    mapped = map_weights(model, renamed, key_map={"embed.weight": "emb"}, strict=True)
    assert model.embed.weight is model.head.weight
    torch.testing.assert_close(model.head.weight, reference.embed.weight, rtol=0, atol=0)

    # A callable returning None: not in the checkpoint.
    model = meta_tiny()
    mapped = map_weights(model, path, key_map=lambda n: None if n.startswith("norm.") else n)
    assert mapped.missing == ["norm.weight", "norm.bias"]
    assert "norm.weight" in mapped.still_meta


def test_missing_names_and_still_meta(tiny: tuple[TinyNet, Path], tmp_path: Path) -> None:
    _, path = tiny
    partial = tmp_path / "partial.safetensors"
    tensors = load_file(str(path))
    del tensors["blocks.1.bias"]
    tensors["unrelated.weight"] = torch.ones(3)  # names the model lacks are ignored
    save_file(tensors, str(partial))
    model = meta_tiny()
    mapped = map_weights(model, partial)
    assert mapped.missing == ["blocks.1.bias"]
    assert sorted(mapped.still_meta) == ["blocks.1.bias", "inv_freq"]
    assert model.blocks[1].bias.device.type == "meta"


def test_strict_raises_on_missing_and_leaves_the_model_unchanged(tiny: tuple[TinyNet, Path],
                                                                 tmp_path: Path) -> None:
    _, path = tiny
    partial = tmp_path / "partial.safetensors"
    tensors = load_file(str(path))
    del tensors["norm.bias"]
    save_file(tensors, str(partial))
    for model in (meta_tiny(), TinyNet()):
        before = snapshot(model)
        with pytest.raises(MappingError, match=r"norm\.bias.*missing"):
            map_weights(model, partial, strict=True)
        assert snapshot(model) == before


def test_strict_accepts_missing_non_persistent_buffer_when_allowed(tmp_path: Path) -> None:
    # save_file(model.state_dict()) never holds non-persistent buffers (inv_freq); the
    # caller fills them itself (tests/test_empty.py: what strict says otherwise).
    reference = seeded(TinyNet())
    path = tmp_path / "plain.safetensors"
    state = {k: v.clone() for k, v in reference.state_dict().items()}  # both tied names, separate copies
    save_file(state, str(path))
    model = meta_tiny()
    mapped = map_weights(model, path, strict=True)
    assert mapped.missing == []
    assert mapped.still_meta == ["inv_freq"]


def test_dtype_mismatch_strict_raises_otherwise_casts(tiny: tuple[TinyNet, Path]) -> None:
    reference, path = tiny  # float32 file
    model = meta_tiny(dtype=torch.bfloat16)
    before = snapshot(model)
    with pytest.raises(MappingError, match=r"dtype torch.float32 in the checkpoint, torch.bfloat16"):
        map_weights(model, path, strict=True)
    assert snapshot(model) == before

    mapped = map_weights(model, path)
    assert "embed.weight" in mapped.copied and "head.weight" in mapped.copied
    assert mapped.mapped == [] and mapped.nbytes == 0
    assert model.embed.weight.dtype == torch.bfloat16
    assert not inside(model.embed.weight, mapped_ranges(path))
    torch.testing.assert_close(model.embed.weight, reference.embed.weight.to(torch.bfloat16))


def test_shape_mismatch_raises_partway_and_leaves_model_unchanged(tiny: tuple[TinyNet, Path],
                                                                 tmp_path: Path) -> None:
    _, path = tiny
    bad = tmp_path / "bad.safetensors"
    tensors = load_file(str(path))
    tensors["blocks.2.weight"] = torch.zeros(32, 31)  # late in the model: earlier ones resolve first
    save_file(tensors, str(bad))
    for model in (meta_tiny(), TinyNet()):
        before = snapshot(model)
        real = model.embed.weight.device.type != "meta"
        values = {k: v.clone() for k, v in model.state_dict().items()} if real else {}
        with pytest.raises(MappingError) as err:
            map_weights(model, bad)
        message = str(err.value)
        assert str(bad) in message and "blocks.2.weight" in message and "shape" in message
        assert snapshot(model) == before
        for k, v in values.items():
            assert torch.equal(model.state_dict()[k], v)


def test_misaligned_offsets_are_copied_and_reported(tmp_path: Path) -> None:
    # An old writer's layout: a 1-byte tensor first, then float32 at an odd offset.
    path = tmp_path / "old.safetensors"
    header = {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
              "w": {"dtype": "F32", "shape": [4], "data_offsets": [1, 17]}}
    raw = json.dumps(header).encode()
    values = torch.arange(4, dtype=torch.float32)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\x07" + values.numpy().tobytes())

    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Parameter(torch.empty(1, dtype=torch.uint8, device="meta"), requires_grad=False)
            self.w = torch.nn.Parameter(torch.empty(4, device="meta"))

    model = Two()
    mapped = map_weights(model, path)
    assert mapped.copied == ["w"] and mapped.mapped == ["a"]
    torch.testing.assert_close(model.w.data, values)
    assert model.w.data_ptr() % 4 == 0
    with pytest.raises(MappingError, match="not a multiple of its item size"):
        map_weights(Two(), path, strict=True)


def test_zero_element_tensors_count_as_mapped(tmp_path: Path) -> None:
    path = tmp_path / "z.safetensors"
    save_file({"empty": torch.zeros(0, 3), "w": torch.ones(2)}, str(path))

    class Z(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("empty", torch.empty(0, 3, device="meta"))
            self.register_buffer("w", torch.empty(2, device="meta"))

    model = Z()
    mapped = map_weights(model, path, strict=True)
    assert sorted(mapped.mapped) == ["empty", "w"]
    assert model.empty.shape == (0, 3) and model.empty.device.type == "cpu"


def test_sharded_checkpoint(tiny: tuple[TinyNet, Path], tmp_path: Path) -> None:
    reference, path = tiny
    tensors = load_file(str(path))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    folder = tmp_path / "sharded"
    folder.mkdir()
    weight_map = {}
    for shard, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, str(folder / shard))
        weight_map.update(dict.fromkeys(shard_names, shard))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    for source in (folder, index):
        model = meta_tiny()
        mapped = map_weights(model, source, strict=True)
        assert sorted(p.name for p in mapped.paths) == sorted(shards)
        ranges = [r for shard in shards for r in mapped_ranges(folder / shard)]
        for name, t in model.state_dict().items():
            assert inside(t, ranges), name
            torch.testing.assert_close(t, reference.state_dict()[name], rtol=0, atol=0)


def test_bad_header_is_header_error_and_model_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "broken.safetensors"
    path.write_bytes((10).to_bytes(8, "little") + b"not json!!")
    model = meta_tiny()
    before = snapshot(model)
    with pytest.raises(HeaderError, match=str(path)):
        map_weights(model, path)
    assert snapshot(model) == before
    assert mapped_ranges(path) == []


def test_not_a_model_is_a_type_error(tiny: tuple[TinyNet, Path]) -> None:
    with pytest.raises(TypeError, match="nn.Module or a torch.export.ExportedProgram"):
        map_weights({"w": torch.ones(1)}, tiny[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_module_on_cuda_ends_up_mapped_on_the_cpu(tiny: tuple[TinyNet, Path]) -> None:
    reference, path = tiny
    model = TinyNet().cuda()
    params = {name: id(p) for name, p in model.named_parameters()}
    mapped = map_weights(model, path, strict=True)
    assert mapped.copied == []
    assert {name: id(p) for name, p in model.named_parameters()} == params  # same Parameter objects
    assert all(t.device.type == "cpu" for t in model.state_dict().values())
    assert_all_mapped(model, path, reference)
