"""The copy backend: engines built from a partition's tensors give back the model's output."""

from __future__ import annotations

from pathlib import Path

import torch

from harness.build.backends import ALIGN, CopyToDevice, CopyToFiles
from harness.build.partition import split_into
from harness.load.strategies import load_map
from harness.models import SyntheticTransformer, fill_non_persistent
from weightmap import save_weights_for_mapping


def eager_and_mapped(tmp_path: Path) -> tuple[torch.nn.Module, torch.nn.Module, dict[str, torch.Tensor]]:
    """A small synthetic model with random weights, and the same model mapped from its checkpoint."""
    torch.manual_seed(0)
    eager = SyntheticTransformer(layers=2, width=64, heads=4, vocab=256, device="cpu")
    with torch.no_grad():
        for t in eager.parameters():
            t.normal_(0, 0.05)
    path = save_weights_for_mapping(eager, tmp_path / "w.safetensors")
    with torch.device("meta"):
        model = SyntheticTransformer(layers=2, width=64, heads=4, vocab=256)
    mapped = load_map(model, path).model
    fill_non_persistent(mapped)
    named = dict(mapped.named_parameters(remove_duplicate=False)) | dict(mapped.named_buffers())
    return eager, mapped, named


def test_copy_backend_built_model_matches_eager(tmp_path: Path) -> None:
    eager, mapped, named = eager_and_mapped(tmp_path)
    backend = CopyToFiles(tmp_path / "engines")
    engines, _ = split_into(mapped, 3)
    for engine in engines:
        backend.build_engine(engine.index, {n: named[n] for n in engine.names})
    assert len(list((tmp_path / "engines").iterdir())) == 3
    built = backend.built_model(mapped)
    tokens = torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(built(tokens), eager(tokens))
    backend.close()
    assert not (tmp_path / "engines").exists()


def test_device_backend_packs_each_engine_into_one_buffer(tmp_path: Path) -> None:
    # The GPU path, run on the CPU: one buffer per engine, views into it, same output.
    eager, mapped, named = eager_and_mapped(tmp_path)
    backend = CopyToDevice(device="cpu")
    engines, _ = split_into(mapped, 3)
    for engine in engines:
        size = backend.build_engine(engine.index, {n: named[n] for n in engine.names})
        assert engine.nbytes <= size <= engine.nbytes + ALIGN * len(engine.names)
    for copies in backend.engines:
        storages = {t.untyped_storage().data_ptr() for t in copies.values()}
        assert len(storages) == 1, "an engine must be one allocation"
    tokens = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        torch.testing.assert_close(backend.built_model(mapped)(tokens), eager(tokens))
