"""A tie the checkpoint holds under several names: one storage, so never other weights than
load_state_dict would give."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from support import TinyNet, inside, mapped_ranges, meta_tiny, seeded, snapshot

from weightmap import MappingError, map_weights, preview_mapping


def _write_both(model: TinyNet, path: Path, head: torch.Tensor) -> Path:
    """The model's checkpoint with the tie saved twice: embed.weight as it is, head.weight as given."""
    tensors = {name: t.detach().clone() for name, t in model.state_dict().items()}
    tensors["head.weight"] = head
    save_file(tensors, str(path))
    return path


def test_tied_names_with_different_values_are_refused_naming_both(tmp_path: Path) -> None:
    reference = seeded(TinyNet())
    path = _write_both(reference, tmp_path / "two.safetensors", torch.full_like(reference.embed.weight, 2.0))
    for strict in (False, True):
        model = meta_tiny()
        before = snapshot(model)
        with pytest.raises(MappingError) as caught:
            map_weights(model, path, strict=strict)
        message = str(caught.value)
        assert "'embed.weight'" in message and "'head.weight'" in message and str(path) in message
        assert "different values" in message and "key_map" in message
        assert snapshot(model) == before and model.head.weight is model.embed.weight
    with pytest.raises(MappingError, match="different values"):
        preview_mapping(meta_tiny(), path)


def test_the_value_load_state_dict_keeps_can_be_chosen_with_key_map(tmp_path: Path) -> None:
    reference = seeded(TinyNet())
    twos = torch.full_like(reference.embed.weight, 2.0)
    path = _write_both(reference, tmp_path / "two.safetensors", twos)
    loaded = TinyNet()
    loaded.load_state_dict(load_file(str(path)), strict=True)
    assert torch.equal(loaded.embed.weight, twos)  # the later name wins in load_state_dict
    model = meta_tiny()
    mapped = map_weights(model, path, key_map={"embed.weight": "head.weight"}, strict=True)
    assert model.head.weight is model.embed.weight
    assert torch.equal(model.embed.weight, loaded.embed.weight)
    assert {"embed.weight", "head.weight"} <= set(mapped.mapped)


def test_byte_equal_copies_of_a_tie_map_to_one_storage(tmp_path: Path) -> None:
    reference = seeded(TinyNet())
    path = _write_both(reference, tmp_path / "same.safetensors", reference.embed.weight.detach().clone())
    model = meta_tiny()
    preview = preview_mapping(model, path)
    assert preview.unused == [] and preview.strict_problems == []
    mapped = map_weights(model, path, strict=True)
    assert model.head.weight is model.embed.weight
    assert {"embed.weight", "head.weight"} <= set(mapped.mapped) and mapped.copied == []
    assert inside(model.embed.weight, mapped_ranges(path))
    assert torch.equal(model.embed.weight, reference.embed.weight)


def test_a_tie_held_in_another_dtype_is_refused(tmp_path: Path) -> None:
    reference = seeded(TinyNet())
    path = _write_both(reference, tmp_path / "dtype.safetensors", reference.embed.weight.detach().double())
    with pytest.raises(MappingError, match=r"'head.weight' holds dtype torch.float64 against torch.float32"):
        map_weights(meta_tiny(), path)


def test_real_tied_module_is_refused_too_and_keeps_its_values(tmp_path: Path) -> None:
    reference = seeded(TinyNet())
    path = _write_both(reference, tmp_path / "two.safetensors", torch.full_like(reference.embed.weight, 2.0))
    model = seeded(TinyNet(), seed=1)
    before = model.embed.weight.detach().clone()
    with pytest.raises(MappingError, match="different values"):
        map_weights(model, path)
    assert torch.equal(model.embed.weight, before) and model.head.weight is model.embed.weight
