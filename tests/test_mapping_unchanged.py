"""An error partway through map_weights leaves every tensor of the model exactly as it was."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import weightmap.mapping
from weightmap import MappingError, map_weights

State = dict[str, tuple[int, int | None, torch.layout, torch.Tensor | None]]


def state(model: torch.nn.Module) -> State:
    """Every tensor's object, data address, layout and (real ones) a copy of its values."""
    named = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    result: State = {}
    for name, t in named:
        real = t.device.type != "meta" and not isinstance(t, torch.nn.parameter.UninitializedTensorMixin)
        dense = real and t.layout == torch.strided and not t.is_quantized
        result[name] = (id(t), t.data_ptr() if dense else None, t.layout, t.detach().clone() if dense else None)
    return result


def assert_same(before: State, model: torch.nn.Module) -> None:
    after = state(model)
    assert after.keys() == before.keys()
    for name, (ident, address, layout, values) in before.items():
        assert after[name][:3] == (ident, address, layout), name
        if values is not None:
            torch.testing.assert_close(after[name][3], values, rtol=0, atol=0)


class DenseThen(torch.nn.Module):
    """A dense weight, then (in registration order, the order map_weights replaces in) a buffer."""

    def __init__(self, odd: Callable[[], torch.Tensor]) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)
        self.tail = torch.nn.Module()
        self.tail.register_buffer("odd", odd())


class Sub(torch.Tensor):
    pass


ODD: dict[str, tuple[Callable[[], torch.Tensor], str]] = {
    "sparse": (lambda: torch.zeros(4, 4).to_sparse(), "has layout torch.sparse_coo"),
    "sparse_csr": (lambda: torch.zeros(4, 4).to_sparse_csr(), "has layout torch.sparse_csr"),
    "quantized": (lambda: torch.quantize_per_tensor(torch.zeros(4, 4), 0.1, 0, torch.qint8),
                  r"is quantized \(torch.qint8\)"),
    "subclass": (lambda: torch.zeros(4, 4).as_subclass(Sub), r"is a .*Sub, a tensor subclass"),
}


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "dense.safetensors"
    save_file({"layer.weight": torch.ones(4, 4), "layer.bias": torch.ones(4), "tail.odd": torch.ones(4, 4)}, str(path))
    return path


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor", "ignore:Sparse CSR tensor support")
@pytest.mark.parametrize("kind", list(ODD))
def test_an_unreplaceable_tensor_is_found_before_anything_changes(checkpoint: Path, kind: str) -> None:
    make, reason = ODD[kind]
    model = DenseThen(make)
    before = state(model)
    pattern = f"^{checkpoint}: tensor 'tail.odd' \\(model name 'tail.odd'\\): the model's tensor {reason}"
    with pytest.raises(MappingError, match=pattern + ".*The model was left unchanged"):
        map_weights(model, checkpoint)
    assert_same(before, model)


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
def test_a_meta_sparse_buffer_is_not_silently_made_dense(checkpoint: Path) -> None:
    def sparse_meta() -> torch.Tensor:
        indices = torch.zeros(2, 0, dtype=torch.long)
        return torch.sparse_coo_tensor(indices, torch.zeros(0), (4, 4), device="meta")

    with torch.device("meta"):
        model = DenseThen(sparse_meta)
    before = state(model)
    with pytest.raises(MappingError, match="tensor 'tail.odd' .*has layout torch.sparse_coo"):
        map_weights(model, checkpoint)
    assert_same(before, model)


def test_an_uninitialized_parameter_is_a_mapping_error(checkpoint: Path) -> None:
    model = torch.nn.Module()
    model.layer = torch.nn.LazyLinear(4)
    before = state(model)
    with pytest.raises(MappingError, match="tensor 'layer.weight' .*UninitializedParameter, a tensor subclass"):
        map_weights(model, checkpoint)
    assert_same(before, model)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_an_assignment_that_fails_anyway_is_undone(checkpoint: Path, monkeypatch: pytest.MonkeyPatch,
                                                   device: str) -> None:
    """Whatever resolving could not foresee: the tensors already replaced are put back."""
    with torch.device(device):
        model = DenseThen(lambda: torch.zeros(4, 4))
    before = state(model)
    assign, calls = weightmap.mapping._assign, []

    def fail_on_the_third(target: object, new: torch.Tensor) -> object:
        calls.append(target)
        if len(calls) == 3:
            raise RuntimeError("refused")
        return assign(target, new)  # type: ignore[arg-type]

    monkeypatch.setattr(weightmap.mapping, "_assign", fail_on_the_third)
    with pytest.raises(MappingError, match=f"^{checkpoint}: tensor 'tail.odd' .*cannot be replaced .*RuntimeError: "
                                           "refused.*left unchanged"):
        map_weights(model, checkpoint)
    assert_same(before, model)
    assert isinstance(model.layer.weight, torch.nn.Parameter)
