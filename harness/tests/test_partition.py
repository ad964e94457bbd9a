"""Grouping weights into engines in build order."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.models import SpecModel, SyntheticTransformer, load_spec
from harness.partition import cap_for, model_bytes, partition, units

SPEC = Path(__file__).resolve().parents[1] / "specs" / "pi05.json"


def synthetic() -> SyntheticTransformer:
    return SyntheticTransformer(layers=4, width=256, heads=4, vocab=4096)


def test_engines_cover_every_tensor_in_order_under_the_cap() -> None:
    model = synthetic()
    cap = cap_for(model, 6)
    engines = partition(model, cap)
    named = [n for u in units(model) for n in u.names]
    assert [n for e in engines for n in e.names] == named  # every name once, build order kept
    sizes = {u.module: sum(t.numel() * t.element_size() for t in u.tensors) for u in units(model)}
    for engine in engines:
        assert engine.nbytes <= cap or len(engine.modules) == 1, "only a unit larger than the cap may pass it"
        assert engine.nbytes == sum(sizes[m] for m in engine.modules)
    assert sum(e.nbytes for e in engines) == model_bytes(model) + sizes["lm_head"]  # the tied weight twice


def test_tied_weight_is_read_by_the_first_and_the_last_engine() -> None:
    engines = partition(synthetic(), cap_for(synthetic(), 6))
    assert "embed.weight" in engines[0].names
    assert "lm_head.weight" in engines[-1].names


def test_non_persistent_buffers_never_make_an_engine_of_their_own() -> None:
    model = synthetic()  # the root module owns only the rotary inv_freq
    engines = partition(model, cap_for(model, 6))
    assert "inv_freq" in engines[0].names
    assert all(any(not n.endswith("inv_freq") for n in e.names) for e in engines)
    assert engines[0].modules[0] == "embed"


def test_pi05_spec_splits_into_16_engines_at_a_sixteenth_of_the_model() -> None:
    model = SpecModel(load_spec(SPEC))
    engines = partition(model, cap_for(model, 16))
    assert len(engines) == 16
    lm_head = 257152 * 2048 * 2
    assert 0 <= max(e.nbytes for e in engines) - lm_head <= 64  # lm_head, or the embedding with its embed_scale
    assert engines[0].names == ("paligemma_with_expert.paligemma.lm_head.weight",)


def test_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        partition(synthetic(), 0)
    with pytest.raises(ValueError, match="at least 1"):
        cap_for(synthetic(), 0)
    assert torch.device("meta") == next(synthetic().parameters()).device
