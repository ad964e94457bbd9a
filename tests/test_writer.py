"""save_weights_for_mapping, and interop with the safetensors package both ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from support import TinyNet, inside, mapped_ranges, meta_tiny, seeded, sha256

from weightmap import MappingError, map_weights, save_weights_for_mapping
from weightmap.format import read_header


def test_saved_file_loads_with_safetensors_and_maps_without_copies(tmp_path: Path) -> None:
    model = seeded(TinyNet(dtype=torch.bfloat16))
    path = save_weights_for_mapping(model, tmp_path / "m.safetensors")
    loaded = load_file(str(path))
    assert set(loaded) == {"embed.weight", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias",
                           "blocks.2.weight", "blocks.2.bias", "norm.weight", "norm.bias", "scale"}
    assert "head.weight" not in loaded  # the tied weight once
    assert "inv_freq" not in loaded  # non-persistent buffers are never written
    for name, t in loaded.items():
        assert torch.equal(t, model.state_dict()[name])
    target = meta_tiny(dtype=torch.bfloat16)
    mapped = map_weights(target, path, strict=True)
    assert mapped.copied == [] and mapped.missing == []
    assert target.head.weight is target.embed.weight


def test_offsets_are_aligned_to_item_size(tmp_path: Path) -> None:
    tensors = {"u8": torch.ones(3, dtype=torch.uint8), "f64": torch.ones(3, dtype=torch.float64),
               "bf16": torch.ones(5, dtype=torch.bfloat16), "f32": torch.ones(7)}

    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for k, v in tensors.items():
                self.register_buffer(k, v.clone())

    path = save_weights_for_mapping(Mixed(), tmp_path / "mixed.safetensors")
    header = read_header(path)
    for entry in header.tensors.values():
        assert entry.start % entry.dtype.itemsize == 0, entry.name
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
    assert length % 8 == 0


def test_cast_once_then_map_without_copies(tmp_path: Path) -> None:
    fp32 = tmp_path / "fp32.safetensors"
    reference = seeded(TinyNet())
    save_file({k: v.clone() for k, v in reference.state_dict().items()}, str(fp32))
    # Stored in fp32, run in bf16: mapping it casts (copies) every weight.
    cast = meta_tiny(dtype=torch.bfloat16)
    assert map_weights(cast, fp32).copied
    bf16 = save_weights_for_mapping(cast, tmp_path / "bf16.safetensors")
    again = meta_tiny(dtype=torch.bfloat16)
    mapped = map_weights(again, bf16, strict=True)
    assert mapped.copied == []
    ranges = mapped_ranges(bf16)
    for name, t in again.state_dict().items():
        assert inside(t, ranges), name
        torch.testing.assert_close(t, reference.state_dict()[name].to(torch.bfloat16), rtol=0, atol=0)


def test_exported_program_writes_state_dict_and_constants(tmp_path: Path) -> None:
    reference = seeded(TinyNet())
    program = torch.export.export(reference, (torch.tensor([[1, 2]]),))
    path = save_weights_for_mapping(program, tmp_path / "ep.safetensors")
    with safe_open(str(path), "pt") as f:
        keys = set(f.keys())
    assert "embed.weight" in keys and "head.weight" not in keys
    assert "inv_freq" in keys  # an ExportedProgram needs its constants to run
    with torch.device("meta"):
        meta_program = torch.export.export(TinyNet(), (torch.tensor([[1, 2]], device="meta"),))
    mapped = map_weights(meta_program, path, strict=True)
    assert mapped.still_meta == []
    tokens = torch.tensor([[4, 0]])
    torch.testing.assert_close(meta_program.module()(tokens), reference(tokens))


def test_overwriting_the_mapped_file_is_safe(tmp_path: Path) -> None:
    path = tmp_path / "self.safetensors"
    reference = seeded(TinyNet())
    save_weights_for_mapping(reference, path)
    model = meta_tiny()
    map_weights(model, path, strict=True)
    with torch.no_grad():
        model.blocks[0].weight.mul_(2)  # a private copy-on-write change
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    save_weights_for_mapping(model, path)  # reads the old mapping while writing the new file
    for name, t in load_file(str(path)).items():
        assert torch.equal(t, expected[name]), name
    assert not list(tmp_path.glob(".*"))  # no temporary left behind
    for name, t in model.state_dict().items():  # the live views still read the old file's pages
        assert torch.equal(t, expected[name])


def test_meta_tensors_cannot_be_saved_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "meta.safetensors"
    with pytest.raises(MappingError, match=r"cannot save 'scale' and 9 more: it is on the meta device"):
        save_weights_for_mapping(meta_tiny(), path)
    assert not path.exists() and not list(tmp_path.iterdir())


def test_safetensors_save_file_checkpoints_map_and_file_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "st.safetensors"
    tensors = {"a": torch.randn(5, 3), "b": torch.arange(10, dtype=torch.int64),
               "c": torch.randn(4).to(torch.bfloat16), "d": torch.tensor([True, False])}
    save_file(tensors, str(path), metadata={"format": "pt"})
    digest = sha256(path)

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for k, v in tensors.items():
                self.register_buffer(k, torch.empty(v.shape, dtype=v.dtype, device="meta"))

    model = M()
    mapped = map_weights(model, path, strict=True)
    assert sorted(mapped.mapped) == ["a", "b", "c", "d"]
    for k, v in tensors.items():
        assert torch.equal(getattr(model, k), v)
    model.a.zero_()
    assert sha256(path) == digest
    assert json.loads(path.read_bytes()[8:8 + int.from_bytes(path.read_bytes()[:8], "little")])["__metadata__"]
