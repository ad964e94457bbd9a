"""Generated checkpoints sharded as ``save_pretrained(max_shard_size=...)`` shards them
(:mod:`harness.models.sharded`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load_file

import harness.models.sharded as sharded
from harness.models import SyntheticTransformer
from harness.models.checkpoints import CheckpointError, ensure_checkpoint
from harness.models.sharded import INDEX_NAME, ensure_sharded_checkpoint
from harness.scenario import ScenarioError, load_scenario
from weightmap import TensorSpec, open_checkpoint, read_header

SHARD_BYTES = 3000
"""Under the embedding's 4096 bytes (64 x 32 bfloat16): it gets a shard of its own."""


def small_model() -> SyntheticTransformer:
    return SyntheticTransformer(layers=2, width=32, vocab=64, heads=4, dtype=torch.bfloat16)


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in open_checkpoint(folder).files:
        out.update(load_file(file))
    return out


def _mtimes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


def test_shards_hold_the_one_file_values_and_an_index_as_transformers_writes(tmp_path: Path) -> None:
    model = small_model()
    folder, generated = ensure_sharded_checkpoint(model, tmp_path / "ckpt", 7, SHARD_BYTES, progress=False)
    one, _ = ensure_checkpoint(model, tmp_path / "one.safetensors", 7, progress=False)
    assert generated
    index = json.loads((folder / INDEX_NAME).read_text())
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    count = len(shards)
    assert count > 2 and shards == [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    assert sorted(set(index["weight_map"].values())) == shards
    names = list(model.state_dict())
    assert sorted(index["weight_map"]) == sorted(n for n in names if n != "lm_head.weight")  # the tie once
    assert [index["weight_map"][n] for n in index["weight_map"]] == sorted(index["weight_map"].values())
    embed_file = index["weight_map"]["embed.weight"]
    assert [n for n, f in index["weight_map"].items() if f == embed_file] == ["embed.weight"]  # alone
    for shard in shards:
        header = read_header(folder / shard)
        metadata = header.metadata or {}
        assert metadata["seed"] == "7" and metadata["generator"] == "weightmap-harness"
        assert sum(e.nbytes for e in header.tensors.values()) <= SHARD_BYTES or len(header.tensors) == 1
    want = load_file(one)
    got = _tensors(folder)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in got.values())
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_split_follows_huggingface_hub() -> None:
    pytest.importorskip("huggingface_hub")
    from huggingface_hub import split_torch_state_dict_into_shards

    specs = [TensorSpec(n, torch.float32, (s,)) for n, s in [("a", 300), ("b", 300), ("big", 2000), ("c", 200),
                                                            ("d", 400), ("e", 100)]]
    state = {s.name: torch.zeros(s.shape, dtype=s.dtype) for s in specs}
    split = split_torch_state_dict_into_shards(state, max_shard_size=2400)
    hub = [sorted(names) for names in split.filename_to_tensors.values()]
    ours = [sorted(s.name for s in group) for group in sharded.shard_groups(specs, 2400)]
    assert sorted(ours) == sorted(hub) and len(ours) > 2


def test_a_finished_folder_is_reused_untouched_and_another_seed_replaces_it(tmp_path: Path) -> None:
    model = small_model()
    folder, _ = ensure_sharded_checkpoint(model, tmp_path / "ckpt", 7, SHARD_BYTES, progress=False)
    before = _mtimes(folder)
    assert ensure_sharded_checkpoint(model, folder, 7, SHARD_BYTES, progress=False) == (folder, False)
    assert _mtimes(folder) == before
    # another seed and another shard size: every old file replaced, none left beside the new ones
    assert ensure_sharded_checkpoint(model, folder, 8, 8000, progress=False) == (folder, True)
    headers = [read_header(f) for f in open_checkpoint(folder).files]
    assert {(h.metadata or {})["seed"] for h in headers} == {"8"}
    names = {p.name for p in folder.iterdir()}
    count = len(headers)
    assert names == {INDEX_NAME, *(f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1))}


def test_everything_in_one_shard_is_one_model_safetensors(tmp_path: Path) -> None:
    folder, _ = ensure_sharded_checkpoint(small_model(), tmp_path / "ckpt", 7, 10**9, progress=False)
    assert {p.name for p in folder.iterdir()} == {"model.safetensors"}


@pytest.mark.parametrize("foreign", ["notes.txt", "adapter_model.safetensors"])
def test_a_folder_holding_a_users_file_is_refused_and_nothing_deleted(tmp_path: Path, foreign: str) -> None:
    model = small_model()
    folder, _ = ensure_sharded_checkpoint(model, tmp_path / "ckpt", 7, SHARD_BYTES, progress=False)
    (folder / foreign).write_bytes(b"the user's")
    before = _mtimes(folder)
    with pytest.raises(CheckpointError, match=f"{folder}.*did not write.*{foreign}.*nothing was deleted"):
        ensure_sharded_checkpoint(model, folder, 8, SHARD_BYTES, progress=False)
    assert _mtimes(folder) == before


def test_a_write_killed_in_the_second_shard_leaves_no_index_and_the_next_writes_it_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = small_model()
    real = sharded.write_checkpoint
    calls = []

    def dies_in_the_second(path: Path, specs: list[TensorSpec], fill: Callable[[TensorSpec], torch.Tensor],
                           **kwargs: Any) -> Any:
        calls.append(path)
        if len(calls) < 2:
            return real(path, specs, fill, **kwargs)
        assert len(specs) > 1  # so that one tensor of the shard is written and the next is not
        filled: list[TensorSpec] = []

        def one_then_die(spec: TensorSpec) -> torch.Tensor:
            if filled:
                raise KeyboardInterrupt("killed")
            filled.append(spec)
            return fill(spec)
        return real(path, specs, one_then_die, **kwargs)

    monkeypatch.setattr(sharded, "write_checkpoint", dies_in_the_second)
    folder = tmp_path / "ckpt"
    with pytest.raises(KeyboardInterrupt):
        ensure_sharded_checkpoint(model, folder, 7, 20_000, progress=False)
    assert not (folder / INDEX_NAME).exists() and len(list(folder.glob("*.safetensors"))) == 1
    monkeypatch.setattr(sharded, "write_checkpoint", real)
    assert ensure_sharded_checkpoint(model, folder, 7, 20_000, progress=False) == (folder, True)
    one, _ = ensure_checkpoint(model, tmp_path / "one.safetensors", 7, progress=False)
    want, got = load_file(one), _tensors(folder)
    assert got.keys() == want.keys() and all(torch.equal(got[n], t) for n, t in want.items())


@pytest.mark.parametrize("tied", [False, True])
def test_transformers_loads_the_generated_folder_with_no_missing_or_unexpected_key(tmp_path: Path,
                                                                                  tied: bool) -> None:
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=tied)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    folder, _ = ensure_sharded_checkpoint(model, tmp_path / "llama", 3, 20_000, progress=False)
    assert len(open_checkpoint(folder).files) > 2
    config.save_pretrained(folder)  # beside the checkpoint, as a hub snapshot holds it
    done: Any = transformers.LlamaForCausalLM.from_pretrained(folder, output_loading_info=True)
    loaded, info = done
    assert info["missing_keys"] in ([], set()) and info["unexpected_keys"] in ([], set())
    assert info["mismatched_keys"] in ([], set())
    got = _tensors(folder)
    assert torch.equal(loaded.model.embed_tokens.weight, got["model.embed_tokens.weight"])
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == tied


def _scenario(tmp_path: Path, checkpoint: str) -> Path:
    file = tmp_path / "s.toml"
    file.write_text(f'name = "s"\n[model]\nlayers = 1\nwidth = 16\nvocab = 8\n[checkpoint]\n{checkpoint}\n'
                    '[build]\nengines = 1\n', encoding="utf-8")
    return file


def test_max_shard_size_is_read_and_checked_naming_the_key(tmp_path: Path) -> None:
    ok = load_scenario(_scenario(tmp_path, f'path = "{tmp_path}/c"\ngenerate = true\nmax_shard_size = "5GB"'))
    assert ok.checkpoint.max_shard_bytes == 5 * 10**9
    cases = {
        f'path = "{tmp_path}/c"\nmax_shard_size = "5GB"': "checkpoint.max_shard_size: only with generate = true",
        f'path = "{tmp_path}/c"\ngenerate = true\nmax_shard_size = "5 parsecs"':
            "checkpoint.max_shard_size: .*not a size",
        f'path = "{tmp_path}/s.toml"\ngenerate = true\nmax_shard_size = "5GB"':
            "checkpoint.path: .*is a file;.*folder",
    }
    for text, message in cases.items():
        with pytest.raises(ScenarioError, match=message):
            load_scenario(_scenario(tmp_path, text))
