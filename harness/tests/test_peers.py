"""The two peer loaders: values as in the file, ties kept, and where their memory lives."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file, save_model

from harness.load.peers import CONVERTED_DIR, StreamLoader, converted_path, ensure_pt, load_torch_mmap
from harness.measure.procfs import mapping_rss, read_status
from harness.units import MIB
from weightmap import release_storage


class Tiny(torch.nn.Module):
    """Tied embedding and head, a few 4 MiB layers, a persistent and a non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, 1024)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(1024, 1024) for _ in range(4))
        self.head = torch.nn.Linear(1024, 256, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.rand(1024))
        self.register_buffer("freqs", torch.arange(8.0), persistent=False)


def _model_bytes(model: Tiny) -> int:
    return sum(t.nbytes for t in model.state_dict(keep_vars=True).values()
               if not t.is_meta) - model.embed.weight.nbytes  # the tie once


@pytest.fixture
def tiny_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's checkpoint (no generator metadata); the repository root moved to ``tmp_path``, so that its
    ``.pt`` conversions go under the test's own data directory."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    path = tmp_path / "tiny.safetensors"
    save_model(Tiny(), str(path))
    return path


def _meta_tiny() -> Tiny:
    with torch.device("meta"):
        return Tiny()


def _read_all(tensors) -> None:
    for t in tensors:
        t.sum()  # touch every page


def test_ensure_pt_converts_once_and_again_when_the_checkpoint_changes(tiny_checkpoint: Path) -> None:
    pt = converted_path(tiny_checkpoint)
    assert pt.parent == tiny_checkpoint.parent / CONVERTED_DIR and pt.name.startswith("tiny.safetensors-"), \
        "a user's checkpoint is converted outside its folder"
    assert ensure_pt(tiny_checkpoint, pt) is True
    assert ensure_pt(tiny_checkpoint, pt) is False
    state = torch.load(pt, weights_only=True)
    assert set(state) == set(load_file(str(tiny_checkpoint)))
    stat = tiny_checkpoint.stat()
    os.utime(tiny_checkpoint, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert ensure_pt(tiny_checkpoint, pt) is True
    assert not list(tiny_checkpoint.parent.glob(".*.tmp"))
    assert json.loads((pt.parent / (pt.name + ".source.json")).read_text())["tensors"] == len(state)


def test_torch_mmap_has_the_files_values_and_ties(tiny_checkpoint: Path) -> None:
    ensure_pt(tiny_checkpoint, converted_path(tiny_checkpoint))
    model = load_torch_mmap(_meta_tiny(), tiny_checkpoint).model
    assert isinstance(model, Tiny)
    expected = load_file(str(tiny_checkpoint))
    assert model.head.weight is model.embed.weight
    state = model.state_dict()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name
    stored = expected["embed.weight"] if "embed.weight" in expected else expected["head.weight"]
    assert torch.equal(model.head.weight, stored)
    assert model.freqs.is_meta  # non-persistent: not in any checkpoint, filled by the harness later


def test_torch_mmap_weights_are_file_backed_and_cannot_be_released(tiny_checkpoint: Path) -> None:
    pt = converted_path(tiny_checkpoint)
    ensure_pt(tiny_checkpoint, pt)
    before = read_status()
    model = load_torch_mmap(_meta_tiny(), tiny_checkpoint).model
    assert isinstance(model, Tiny)
    nbytes = _model_bytes(model)
    untouched = mapping_rss(pt)
    _read_all(model.state_dict().values())
    after = read_status()
    assert untouched < nbytes // 4  # nothing is read at load time
    assert mapping_rss(pt) >= 0.9 * nbytes  # read through the .pt's mapping
    assert after.anon_bytes - before.anon_bytes < nbytes // 4  # and not copied into anonymous memory
    assert release_storage(model.embed.weight.untyped_storage()) is False
    assert mapping_rss(pt) >= 0.9 * nbytes


def test_torch_mmap_without_its_conversion_says_how_to_make_it(tiny_checkpoint: Path) -> None:
    with pytest.raises(FileNotFoundError, match="ensure_pt"):
        load_torch_mmap(_meta_tiny(), tiny_checkpoint)


def test_stream_has_the_files_values_and_keeps_ties(tiny_checkpoint: Path) -> None:
    model = _meta_tiny()
    expected = load_file(str(tiny_checkpoint))
    with StreamLoader.for_model(model, tiny_checkpoint) as loader:
        assert not loader.holds("freqs") and loader.holds("head.weight") and loader.holds("embed.weight")
        names = [n for n, _ in model.named_parameters(remove_duplicate=False)] + ["scale"]
        got = loader.load(names)
        assert got["head.weight"] is got["embed.weight"]
        for name, tensor in expected.items():
            assert torch.equal(got[name], tensor), name
        tied = got["embed.weight"].nbytes
        loader.drop(["embed.weight"])
        held = loader.resident_bytes
        loader.drop(["head.weight"])
        assert loader.resident_bytes == held - tied  # a tied tensor goes with the last of its names


def _engines_checkpoint(tmp_path: Path, engines: int = 4, per_engine: int = 2) -> tuple[Path, list[list[str]]]:
    torch.manual_seed(1)
    tensors = {f"e{e}.t{k}": torch.randn(MIB) for e in range(engines) for k in range(per_engine)}  # 4 MiB each
    path = tmp_path / "engines.safetensors"
    save_file(tensors, str(path))
    return path, [[f"e{e}.t{k}" for k in range(per_engine)] for e in range(engines)]


def test_stream_holds_at_most_one_engines_weights(tmp_path: Path) -> None:
    path, engines = _engines_checkpoint(tmp_path)
    engine_bytes = 8 * MIB
    loader = StreamLoader(path)
    anon_before = read_status().anon_bytes
    for names in engines:
        weights = loader.load(names)
        assert loader.resident_bytes == engine_bytes
        _read_all(weights.values())
        resident = mapping_rss(path)
        # This engine only (the kernel maps up to 64 KiB around each fault), not the last one's too.
        assert 0.9 * engine_bytes <= resident <= engine_bytes + MIB
        loader.drop(names)
        del weights
        gc.collect()
        assert mapping_rss(path) == 0  # unmapped once the engine's tensors are gone
        assert loader.resident_bytes == 0
    assert loader.peak_resident_bytes == engine_bytes
    assert read_status().anon_bytes - anon_before < engine_bytes  # views, never copies


def test_stream_reads_a_sharded_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the conversion goes under the test's own data directory
    torch.manual_seed(2)
    a, b = {"x.a": torch.randn(64)}, {"y.b": torch.randn(32), "y.c": torch.arange(5)}
    save_file(a, str(tmp_path / "model-1.safetensors"))
    save_file(b, str(tmp_path / "model-2.safetensors"))
    weight_map = {"x.a": "model-1.safetensors", "y.b": "model-2.safetensors", "y.c": "model-2.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loader = StreamLoader(tmp_path)
    got = loader.load(["x.a", "y.c"])
    assert torch.equal(got["x.a"], a["x.a"]) and torch.equal(got["y.c"], b["y.c"])
    pt = converted_path(tmp_path)
    assert ensure_pt(tmp_path, pt)
    state = torch.load(pt, mmap=True, weights_only=True)
    assert set(state) == set(weight_map) and torch.equal(state["y.b"], b["y.b"])


def test_stream_refuses_unknown_names_before_loading_anything(tmp_path: Path) -> None:
    path, engines = _engines_checkpoint(tmp_path, engines=1)
    loader = StreamLoader(path)
    with pytest.raises(KeyError, match=r"engines\.safetensors: no tensor 'nope'"):
        loader.load([engines[0][0], "nope"])
    assert loader.resident_bytes == 0
    with pytest.raises(KeyError, match="is not loaded"):
        loader.drop([engines[0][0]])
