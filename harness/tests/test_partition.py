"""Grouping weights into engines in build order."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.engines.partition import model_bytes, partition, split_into, units
from harness.models import SpecModel, SyntheticTransformer, load_spec

SPEC = Path(__file__).resolve().parents[1] / "specs" / "pi05.json"


def synthetic() -> SyntheticTransformer:
    return SyntheticTransformer(layers=4, width=256, heads=4, vocab=4096)


def test_engines_cover_every_tensor_in_order_under_the_cap() -> None:
    model = synthetic()
    cap = model_bytes(model) // 6
    engines = partition(model, cap)
    named = [n for u in units(model) for n in u.names]
    assert [n for e in engines for n in e.names] == named  # every name once, build order kept
    sizes = {u.module: sum(t.numel() * t.element_size() for t in u.tensors) for u in units(model)}
    for engine in engines:
        assert engine.nbytes <= cap or len(engine.modules) == 1, "only a unit larger than the cap may pass it"
        assert engine.nbytes == sum(sizes[m] for m in engine.modules)
    assert sum(e.nbytes for e in engines) == model_bytes(model) + sizes["lm_head"]  # the tied weight twice


def test_tied_weight_is_read_by_the_first_and_the_last_engine() -> None:
    engines, _ = split_into(synthetic(), 6)
    assert "embed.weight" in engines[0].names
    assert "lm_head.weight" in engines[-1].names


def test_non_persistent_buffers_never_make_an_engine_of_their_own() -> None:
    model = synthetic()  # the root module owns only the rotary inv_freq
    engines, _ = split_into(model, 6)
    assert "inv_freq" in engines[0].names
    assert all(any(not n.endswith("inv_freq") for n in e.names) for e in engines)
    assert engines[0].modules[0] == "embed"


def test_pi05_spec_splits_into_16_engines() -> None:
    model = SpecModel(load_spec(SPEC))
    engines, cap = split_into(model, 16)
    assert len(engines) == 16
    lm_head = 257152 * 2048 * 2
    assert 0 <= max(e.nbytes for e in engines) - lm_head <= 64  # lm_head, or the embedding with its embed_scale
    assert engines[0].names == ("paligemma_with_expert.paligemma.lm_head.weight",)
    assert [n for e in engines for n in e.names] == [n for u in units(model) for n in u.names]
    assert all(e.nbytes <= cap or len(e.modules) == 1 for e in engines)


@pytest.mark.parametrize("count", [1, 2, 5, 8, 13])
def test_split_into_gives_exactly_the_asked_number(count: int) -> None:
    model = SyntheticTransformer(layers=8, width=768, heads=12, vocab=12288)  # the smoke model
    engines, cap = split_into(model, count)
    assert len(engines) == count
    assert [e.index for e in engines] == list(range(count))
    assert [n for e in engines for n in e.names] == [n for u in units(model) for n in u.names]
    # no cap below the one found packs into `count` engines or fewer
    assert len(partition(model, cap - 1)) > count or cap == 1
    assert all(e.nbytes <= cap or len(e.modules) == 1 for e in engines)


def test_split_into_needs_as_many_units_as_engines() -> None:
    model = synthetic()
    found = len(units(model))
    assert len(split_into(model, found)[0]) == found
    with pytest.raises(ValueError, match=f"{found + 1} engines asked for, but the model has only {found} weight units"):
        split_into(model, found + 1)
    with pytest.raises(ValueError, match="at least 1"):
        split_into(model, 0)


def test_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        partition(synthetic(), 0)
    assert torch.device("meta") == next(synthetic().parameters()).device
