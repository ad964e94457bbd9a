"""The export phase: exporting a mapped model reads no checkpoint page and copies no weight."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from harness.engines.compile.export import export_mapped, shared_with_model
from harness.measure.coldcache import write_back_and_drop
from harness.models import SyntheticTransformer, fill_non_persistent
from harness.models.checkpoints import ensure_checkpoint
from harness.units import KIB, MIB
from weightmap import map_weights

# About 4.5 MiB of bfloat16 weights: a read of them would show as hundreds of pages.
SHAPE: dict[str, Any] = {"layers": 2, "width": 256, "heads": 4, "vocab": 4096, "dtype": torch.bfloat16}
TOKENS = torch.tensor([[1, 2, 3, 4095]])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path, _ = ensure_checkpoint(SyntheticTransformer(**SHAPE), tmp_path_factory.mktemp("ckpt") / "m.safetensors",
                                seed=1, progress=False)
    return path


def _mapped(path: Path) -> SyntheticTransformer:
    model = SyntheticTransformer(**SHAPE)
    map_weights(model, path, strict=True).close()
    fill_non_persistent(model)
    return model


def test_export_of_a_mapped_model_reads_nothing_and_holds_the_views(checkpoint: Path) -> None:
    model = _mapped(checkpoint)
    write_back_and_drop(checkpoint)
    result = export_mapped(model, (TOKENS,), checkpoint=[checkpoint])
    assert result.record.pages_read_bytes == 0
    assert result.record.residency_read_bytes is not None
    assert result.record.residency_read_bytes < 64 * KIB
    names = set(model.state_dict()) | {"inv_freq"}
    assert set(result.shared) == names and result.not_shared == ()
    for name, tensor in result.program.state_dict.items():
        assert tensor.data_ptr() == model.get_parameter(name).data_ptr()
    assert result.record.nodes == len(result.program.graph.nodes) > 50
    assert result.record.not_shared == 0 and len(result.shared) == len(names)


def test_an_export_that_reads_the_weights_is_seen(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The figures can see a read: here export is made to run the model first, touching every weight."""
    real = torch.export.export

    def reading(model: torch.nn.Module, *args: object, **kwargs: object) -> torch.export.ExportedProgram:
        with torch.no_grad():
            model(TOKENS)
        return real(model, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.export, "export", reading)
    model = _mapped(checkpoint)
    write_back_and_drop(checkpoint)
    result = export_mapped(model, (TOKENS,), checkpoint=[checkpoint])
    assert result.record.pages_read_bytes is not None and result.record.pages_read_bytes > 4 * MIB
    assert result.record.residency_read_bytes is not None
    assert result.record.residency_read_bytes > 4 * MIB


def test_a_copied_weight_is_reported_as_not_shared(checkpoint: Path) -> None:
    model = _mapped(checkpoint)
    program = export_mapped(model, (TOKENS,)).program
    model.norm.weight = torch.nn.Parameter(model.norm.weight.clone())
    shared, not_shared = shared_with_model(program, model)
    assert not_shared == ["norm.weight"]
    assert "embed.weight" in shared


def test_a_model_on_meta_is_refused_before_export() -> None:
    with pytest.raises(ValueError, match="meta device .*embed.weight.*map its weights first"):
        export_mapped(SyntheticTransformer(**SHAPE), (TOKENS,))
