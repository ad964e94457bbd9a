"""map_weights gives the state load_state_dict gives, on models built to tell them apart.

Each model is saved, then loaded twice: into a real model with ``load_state_dict`` (the
reference) and into the same model, on meta or real, with ``map_weights``. The two must
agree on every tensor's values, shape, strides and offset, on which names share a storage,
and on what an in-place write to each name changes; the checkpoint is never written.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from support import sha256
from torch import nn

from weightmap import MappingError, init_empty_weights, map_weights, preview_mapping


def _fill(model: nn.Module, seed: int) -> nn.Module:
    """Seeded values in every parameter and persistent buffer (written through each name in turn)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict(keep_vars=True).values():
            t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
    return model


class SameViewTie(nn.Module):
    """An embedding tied to the output layer: one object under two names."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight


class TransposedTie(nn.Module):
    """A parameter that is the transpose of another: one storage, two views."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 6)
        self.proj_t = nn.Parameter(self.proj.weight.data.t())


class OffsetTie(nn.Module):
    """Parameters that are a slice and a flat view of another, and a buffer that is a column of it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 6)
        self.tail = nn.Parameter(self.proj.weight.data[2:])
        self.flat = nn.Parameter(self.proj.weight.data.view(-1))
        self.register_buffer("column", self.proj.weight.data[:, 3])


class Aliases(nn.Module):
    """Two untied layers that key_map sends to one checkpoint entry each."""

    key_map = {"copy.weight": "source.weight", "copy.bias": "source.bias"}

    def __init__(self) -> None:
        super().__init__()
        self.source = nn.Linear(8, 8)
        self.copy = nn.Linear(8, 8)


class Buffers(nn.Module):
    """Buffers of both kinds, one of them tied to a parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.register_buffer("scale", torch.ones(8))
        self.register_buffer("inv_freq", torch.arange(8.0) / 8, persistent=False)
        self.register_buffer("gain", self.norm.weight.data)  # persistent, the same view as a parameter


class Everything(nn.Module):
    """All of the above in one model."""

    key_map = {"aliases.copy.weight": "aliases.source.weight", "aliases.copy.bias": "aliases.source.bias"}

    def __init__(self) -> None:
        super().__init__()
        self.same = SameViewTie()
        self.transposed = TransposedTie()
        self.offset = OffsetTie()
        self.aliases = Aliases()
        self.buffers = Buffers()


MODELS = [SameViewTie, TransposedTie, OffsetTie, Aliases, Buffers, Everything]


def _key_map(cls: type[nn.Module]) -> dict[str, str]:
    return dict(getattr(cls, "key_map", {}))


def _save(cls: type[nn.Module], path: Path, *, every_name: bool) -> Path:
    """The model's checkpoint: every name's values (ties held twice) or one name per storage.

    Names that key_map sends elsewhere are not saved: the checkpoint does not hold them.
    """
    state = _fill(cls(), seed=0).state_dict()
    aliased = _key_map(cls)
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, t in state.items():
        if name in aliased:
            continue
        storage = t.untyped_storage().data_ptr()
        whole = t.is_contiguous() and t.storage_offset() == 0 and t.nbytes == t.untyped_storage().nbytes()
        if every_name or (whole and storage not in storages):
            tensors[name] = t.detach().clone().contiguous()
            storages.add(storage)
    save_file(tensors, str(path))
    return path


def _reference(cls: type[nn.Module], path: Path) -> nn.Module:
    """What load_state_dict gives: each name copied from the checkpoint, in state_dict order."""
    held = load_file(str(path))
    model = _fill(cls(), seed=1)
    aliased = _key_map(cls)
    wanted = {name: held[aliased.get(name, name)] for name in model.state_dict() if aliased.get(name, name) in held}
    model.load_state_dict(wanted, strict=False)
    return model


def _tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    named = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    return dict(named)


def _sharing(model: nn.Module) -> list[list[str]]:
    """Names grouped by the storage they view."""
    groups: dict[int, list[str]] = {}
    for name, t in _tensors(model).items():
        groups.setdefault(t.untyped_storage()._cdata, []).append(name)
    return sorted(sorted(names) for names in groups.values())


def _assert_same_state(mapped: nn.Module, reference: nn.Module, when: str) -> None:
    got, want = _tensors(mapped), _tensors(reference)
    assert got.keys() == want.keys()
    for name, t in want.items():
        g = got[name]
        assert g.device.type == "cpu", f"{when}: {name} is on {g.device}"
        assert (type(g), g.dtype, g.shape, g.stride(), g.storage_offset(), g.requires_grad) == (
            type(t), t.dtype, t.shape, t.stride(), t.storage_offset(), t.requires_grad
        ), f"{when}: {name} differs in kind or geometry"
        assert torch.equal(g, t), f"{when}: {name} holds other values than load_state_dict gives"
    assert _sharing(mapped) == _sharing(reference), f"{when}: other names share storage than after load_state_dict"


def _build(cls: type[nn.Module], how: str) -> nn.Module:
    if how == "meta":
        with init_empty_weights():
            return cls()
    return _fill(cls(), seed=2)


@pytest.mark.parametrize("every_name", [True, False], ids=["every-name", "one-per-storage"])
@pytest.mark.parametrize("how", ["meta", "real"])
@pytest.mark.parametrize("cls", MODELS, ids=lambda c: c.__name__)
def test_map_weights_gives_what_load_state_dict_gives(
    tmp_path: Path, cls: type[nn.Module], how: str, every_name: bool
) -> None:
    path = _save(cls, tmp_path / "model.safetensors", every_name=every_name)
    digest = sha256(path)
    reference = _reference(cls, path)
    model = _build(cls, how)
    mapped = map_weights(model, path, key_map=_key_map(cls), strict=True)
    assert mapped.copied == [] and mapped.still_meta == []
    _assert_same_state(model, reference, "after mapping")
    with torch.no_grad():
        for step, name in enumerate(_tensors(reference)):
            _tensors(model)[name].add_(step + 1)
            _tensors(reference)[name].add_(step + 1)
            _assert_same_state(model, reference, f"after an in-place write to {name}")
    assert sha256(path) == digest, "the checkpoint was written"


def test_nbytes_counts_an_entry_that_two_names_take_once(tmp_path: Path) -> None:
    path = _save(Aliases, tmp_path / "model.safetensors", every_name=True)
    held = sum(t.nbytes for t in load_file(str(path)).values())
    with init_empty_weights():
        model = Aliases()
    preview = preview_mapping(model, path, key_map=Aliases.key_map)
    mapped = map_weights(model, path, key_map=Aliases.key_map)
    assert sorted(mapped.mapped) == sorted(_tensors(model))
    assert mapped.nbytes == preview.nbytes == held


def _checkpoint(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(path))
    return path


def _transposed_state(change: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
    state = {name: t.detach().clone() for name, t in _fill(TransposedTie(), seed=0).state_dict().items()}
    state["proj_t"] = change(state["proj_t"])
    return state


@pytest.mark.parametrize("how", ["meta", "real"])
def test_a_transposed_tie_held_with_other_values_is_refused_naming_both(tmp_path: Path, how: str) -> None:
    path = _checkpoint(tmp_path / "model.safetensors", _transposed_state(lambda t: t + 1))
    model = _build(TransposedTie, how)
    before = {name: (id(t), t.device, t.clone() if t.device.type != "meta" else None)
              for name, t in _tensors(model).items()}
    for call in (lambda: map_weights(model, path), lambda: preview_mapping(model, path)):
        with pytest.raises(MappingError) as caught:
            call()
        message = str(caught.value)
        assert str(path) in message and "'proj.weight'" in message and "'proj_t'" in message
        assert "one storage" in message
    for name, t in _tensors(model).items():
        ident, device, values = before[name]
        assert (id(t), t.device) == (ident, device)
        assert values is None or torch.equal(t, values)
    assert model.proj_t.untyped_storage()._cdata == model.proj.weight.untyped_storage()._cdata


def test_a_transposed_tie_held_only_as_its_view_is_refused(tmp_path: Path) -> None:
    state = _transposed_state(lambda t: t)
    del state["proj.weight"]
    path = _checkpoint(tmp_path / "model.safetensors", state)
    with init_empty_weights():
        model = TransposedTie()
    with pytest.raises(MappingError, match=r"'proj_t'.*'proj.weight'|'proj.weight'.*'proj_t'") as caught:
        map_weights(model, path)
    assert str(path) in str(caught.value)
    assert model.proj.weight.device.type == "meta"


def test_a_tie_held_in_another_dtype_under_its_view_is_refused(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path / "model.safetensors", _transposed_state(lambda t: t.double()))
    with init_empty_weights():
        model = TransposedTie()
    with pytest.raises(MappingError, match="dtype"):
        map_weights(model, path)


class Split(nn.Module):
    """Two parameters that are disjoint slices of one fused tensor that the model does not register."""

    def __init__(self) -> None:
        super().__init__()
        fused = torch.empty(6, 8)
        self.q = nn.Parameter(fused[:3])
        self.k = nn.Parameter(fused[3:])


@pytest.mark.parametrize("how", ["meta", "real"])
def test_disjoint_slices_of_one_storage_map_each_from_its_entry(tmp_path: Path, how: str) -> None:
    path = _save(Split, tmp_path / "model.safetensors", every_name=True)
    reference = _reference(Split, path)
    if how == "meta":
        with torch.device("meta"):
            model = Split()
    else:
        model = _fill(Split(), seed=2)
    mapped = map_weights(model, path, strict=True)
    assert sorted(mapped.mapped) == ["k", "q"]
    for name in ("q", "k"):
        assert torch.equal(getattr(model, name), getattr(reference, name))
    with torch.no_grad():
        model.q.add_(1)
    assert torch.equal(model.k, reference.k)
