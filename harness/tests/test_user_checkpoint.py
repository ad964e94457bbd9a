"""A user's checkpoint (a file, a sharded folder, its index) measured as it is: resolved and checked against the
model by the plan, recorded with its files and dtypes, read alike by every strategy, and never written to."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.load.strategies import STRATEGIES
from harness.models import build_model
from harness.models.checkpoints import CheckpointError
from harness.models.user_checkpoint import checkpoint_mismatch
from harness.plan import Plan, make_plan, read_plan, write_plan
from harness.report.markdown import checkpoint_clause
from harness.scenario import Scenario, load_scenario
from harness.tests.tiny_scenario import tiny_scenario_text
from harness.worker import measure
from weightmap import convert_checkpoint, open_checkpoint

SHARD_BYTES = 20_000
"""Small enough that the tiny model's checkpoint takes several shards."""

CPU_STRATEGIES = ("map", "map_no_prefetch", "map_keep_cache", "load", "load_file", "torch_mmap", "stream",
                  "read_file")


@pytest.fixture
def generated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Scenario, Path]:
    """The tiny scenario (the repository root moved to ``tmp_path``, so data/ is the test's) and its generated
    checkpoint."""
    monkeypatch.chdir(tmp_path)
    text = tiny_scenario_text(tmp_path / "c.safetensors", {"engines = 2": "engines = 3"},
                              extra='[run]\ncache = "warm"\n')
    (tmp_path / "s.toml").write_text(text)
    scenario = load_scenario(tmp_path / "s.toml")
    make_plan(scenario, name="t", workdir=tmp_path / "engines")
    return scenario, tmp_path / "c.safetensors"


def _user(scenario: Scenario, path: Path) -> Scenario:
    return dataclasses.replace(scenario, checkpoint=dataclasses.replace(scenario.checkpoint, path=path,
                                                                        generate=False))


def _shard(source: Path, folder: Path, **options: Any) -> list[Path]:
    files = convert_checkpoint(source, folder, max_shard_size=SHARD_BYTES, **options)
    assert len(files) > 3, "several shards and an index"
    return files


def _plan(scenario: Scenario, path: Path, tmp_path: Path) -> Plan:
    return make_plan(_user(scenario, path), name="t", workdir=tmp_path / "engines")


def _error(scenario: Scenario, path: Path, tmp_path: Path) -> str:
    with pytest.raises(CheckpointError) as raised:
        _plan(scenario, path, tmp_path)
    message = str(raised.value)
    assert "\n" not in message, message
    assert message.startswith(f"{scenario.source}: checkpoint.path: "), message
    return message


# --------------------------------------------------------------------------- the three forms


def test_a_sharded_folder_its_index_and_a_users_file_are_measured(
    generated: tuple[Scenario, Path], tmp_path: Path
) -> None:
    scenario, single = generated
    shards = tmp_path / "shards"
    files = _shard(single, shards)
    own = tmp_path / "own.safetensors"  # a user's file: no generator metadata
    save_file(load_file(str(single)), str(own))
    data = sum(e.nbytes for _, e in open_checkpoint(single).entries.values())
    for path in (shards, shards / "model.safetensors.index.json"):
        plan = _plan(scenario, path, tmp_path)
        shard_files = [f for f in files if f.suffix == ".safetensors"]
        assert [Path(f) for f in plan.checkpoint_files] == shard_files
        assert plan.checkpoint.path == str(path) and not plan.checkpoint.generated
        assert plan.checkpoint.files == len(shard_files) and plan.checkpoint.sharded
        assert plan.checkpoint.bytes == sum(f.stat().st_size for f in shard_files), "every file's bytes"
        assert plan.checkpoint.dtype_bytes == {"float32": data}
    plan = _plan(scenario, own, tmp_path)
    assert plan.checkpoint_files == (str(own),) and plan.checkpoint.files == 1 and not plan.checkpoint.sharded
    assert plan.checkpoint.bytes == own.stat().st_size


def test_a_generated_checkpoint_is_recorded_as_before_with_its_file_and_dtypes(
    generated: tuple[Scenario, Path], tmp_path: Path
) -> None:
    scenario, single = generated
    plan = make_plan(scenario, name="t", workdir=tmp_path / "engines")
    assert plan.checkpoint.path == str(single) and plan.checkpoint.bytes == single.stat().st_size
    assert plan.checkpoint.files == 1 and list(plan.checkpoint.dtype_bytes or {}) == ["float32"]
    again = read_plan(write_plan(tmp_path / "plan.json", plan))
    assert again.checkpoint == plan.checkpoint, "the new fields go through plan.json"


def test_a_folder_to_generate_into_is_still_refused(generated: tuple[Scenario, Path], tmp_path: Path) -> None:
    scenario, _ = generated
    (tmp_path / "empty").mkdir()
    folder = dataclasses.replace(scenario, checkpoint=dataclasses.replace(scenario.checkpoint,
                                                                          path=tmp_path / "empty"))
    with pytest.raises(Exception, match="is a directory; the harness reads and writes one .safetensors file"):
        make_plan(folder, name="t", workdir=tmp_path / "engines")


# --------------------------------------------------------------------------- errors, one line each


def test_what_cannot_be_read_is_refused_in_one_line_naming_the_key_and_the_file(
    generated: tuple[Scenario, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario, single = generated
    missing = tmp_path / "nothing-here"
    assert f"{missing}: no such file" in _error(scenario, missing, tmp_path)
    text = tmp_path / "notes.safetensors"
    text.write_text("these are notes, not tensors\n" * 4)
    assert str(text) in _error(scenario, text, tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    message = _error(scenario, empty, tmp_path)
    assert str(empty) in message and "no model.safetensors.index.json and no *.safetensors" in message
    several = tmp_path / "several"
    several.mkdir()
    for name in ("a.safetensors", "b.safetensors"):
        shutil.copy(single, several / name)
    message = _error(scenario, several, tmp_path)
    assert str(several) in message and "2 *.safetensors files (a.safetensors, b.safetensors)" in message
    shards = tmp_path / "shards"
    files = _shard(single, shards)
    files[1].unlink()
    message = _error(scenario, shards, tmp_path)
    assert files[1].name in message, message
    shards = tmp_path / "shards2"
    files = _shard(single, shards)
    real_open = os.open

    def refused(path: Any, *args: Any, **kwargs: Any) -> int:
        if Path(os.fsdecode(path)) == files[2]:
            raise PermissionError(13, "Permission denied", os.fsdecode(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refused)  # the tests run as root, whom chmod does not stop
    message = _error(scenario, shards, tmp_path)
    assert str(files[2]) in message and "ermission denied" in message, message


def test_a_checkpoint_of_another_model_is_refused_before_any_strategy_runs(
    generated: tuple[Scenario, Path], tmp_path: Path
) -> None:
    scenario, single = generated
    _shard(single, tmp_path / "shards")
    wider = dataclasses.replace(scenario, model=dataclasses.replace(scenario.model, vocab=128, layers=2))
    message = _error(wider, tmp_path / "shards", tmp_path)
    assert f"{tmp_path / 'shards'}: does not fit the model: " in message
    assert "'embed.weight' has shape [64, 64], the model [128, 64]" in message or "missing" in message
    assert "tensors differ" in message and "more" in message, "how many in all, the first few named"
    _shard(single, tmp_path / "bf16", dtype=torch.bfloat16)
    message = _error(scenario, tmp_path / "bf16", tmp_path)
    assert "is bfloat16, the model float32" in message and "does not fit the model" in message
    assert not (tmp_path / "engines").exists(), "nothing measured"


def test_a_missing_or_unexpected_tensor_is_named(generated: tuple[Scenario, Path], tmp_path: Path) -> None:
    scenario, single = generated
    state = load_file(str(single))
    first = next(iter(state))
    save_file({k: v for k, v in state.items() if k != first}, str(tmp_path / "less.safetensors"))
    assert f"1 tensor differ: {first!r} missing" in _error(scenario, tmp_path / "less.safetensors", tmp_path)
    save_file({**state, "extra.weight": torch.zeros(2)}, str(tmp_path / "more.safetensors"))
    assert "'extra.weight' unexpected" in _error(scenario, tmp_path / "more.safetensors", tmp_path)


def test_ties_stored_once_and_non_persistent_buffers_fit_as_load_state_dict_takes_them(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "llama", max_shard_size="20KB")
    checkpoint = open_checkpoint(tmp_path / "llama")
    assert len(checkpoint.files) > 1 and "lm_head.weight" not in checkpoint.entries
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    assert any(n.endswith("inv_freq") for n, _ in model.named_buffers()), "a non-persistent buffer"
    assert checkpoint_mismatch(model, checkpoint) is None
    untied = transformers.LlamaConfig(**{**config.to_dict(), "tie_word_embeddings": False})
    with torch.device("meta"):
        other = transformers.LlamaForCausalLM(untied)
    assert checkpoint_mismatch(other, checkpoint) == "does not fit the model: 1 tensor differ: 'lm_head.weight' missing"


# --------------------------------------------------------------------------- every strategy reads shards


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def _loaded(plan: Plan, name: str, path: Path) -> dict[str, torch.Tensor]:
    """Every persistent tensor of the model as strategy ``name`` puts it there from ``path`` (per engine for
    strategies with hooks)."""
    strategy = STRATEGIES[name]
    if strategy.prepare is not None:
        strategy.prepare(path)
    model = strategy.load(build_model(plan.scenario.model).module, path).model
    if strategy.hooks is None:
        return _weights(model)
    hooks = strategy.hooks(model, path, "cpu", [e.names for e in plan.engines])
    seen: dict[str, torch.Tensor] = {}
    for engine in plan.engines:
        hooks.before(engine.index, engine.names)
        state = model.state_dict(keep_vars=True)
        seen.update({n: state[n].detach().clone() for n in engine.names if n in state and not state[n].is_meta})
        hooks.after(engine.index, engine.names)
    return seen


@pytest.mark.parametrize("name", [*CPU_STRATEGIES, "fastsafetensors"])
def test_every_strategy_reads_a_sharded_checkpoint_as_the_single_file(
    name: str, generated: tuple[Scenario, Path], tmp_path: Path
) -> None:
    if STRATEGIES[name].hooks is not None and name == "fastsafetensors":
        pytest.importorskip("fastsafetensors")
    scenario, single = generated
    _shard(single, tmp_path / "shards")
    plan = _plan(dataclasses.replace(scenario, strategies=(name,)), tmp_path / "shards", tmp_path)
    reference = _loaded(plan, name, single)
    sharded = _loaded(plan, name, tmp_path / "shards")
    assert reference and sorted(sharded) == sorted(reference)
    assert all(torch.equal(sharded[n], reference[n]) for n in reference), "the same weights"
    record = measure(plan, name, tmp_path / "out")
    assert record.ok, record.error


def test_torch_mmap_converts_a_users_checkpoint_outside_its_folder(
    generated: tuple[Scenario, Path], tmp_path: Path
) -> None:
    from harness.load.peers import CONVERTED_DIR, converted_path

    scenario, single = generated
    assert converted_path(single) == tmp_path / "c.safetensors.pt", "a generated file's conversion stays beside it"
    _shard(single, tmp_path / "shards")
    for path in (tmp_path / "shards", tmp_path / "shards" / "model.safetensors.index.json"):
        pt = converted_path(path)
        assert pt.parent == tmp_path / CONVERTED_DIR, pt
        assert STRATEGIES["torch_mmap"].files_read(path) == (pt,)


def _snapshot(folder: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every entry of ``folder``: inode, size, modification time and a digest of its bytes."""
    out = {}
    for entry in sorted(folder.iterdir()):
        stat = entry.stat()
        out[entry.name] = (stat.st_ino, stat.st_size, stat.st_mtime_ns, hashlib.sha256(entry.read_bytes()).hexdigest())
    return out


def test_no_strategy_writes_renames_or_deletes_anything_in_a_users_folder(
    generated: tuple[Scenario, Path], tmp_path: Path
) -> None:
    scenario, single = generated
    folder = tmp_path / "shards"
    _shard(single, folder)
    names = tuple(n for n in CPU_STRATEGIES + ("fastsafetensors",)
                  if n != "fastsafetensors" or _installed("fastsafetensors"))
    for path in (folder, folder / "model.safetensors.index.json"):
        before = _snapshot(folder)
        folder_mtime = folder.stat().st_mtime_ns
        for mode in (0o444, 0o555):  # files, then the folder: read-only as a user's download may be
            for entry in folder.iterdir():
                entry.chmod(0o444)
            folder.chmod(mode)
        try:
            plan = _plan(dataclasses.replace(scenario, strategies=names), path, tmp_path)
            for name in names:
                record = measure(plan, name, tmp_path / "out" / name)
                assert record.ok, (name, record.error)
        finally:
            folder.chmod(0o755)
        assert _snapshot(folder) == before, "every file as it was"
        assert folder.stat().st_mtime_ns == folder_mtime, "nothing added, renamed or removed"


def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


# --------------------------------------------------------------------------- the report


def test_the_report_names_the_files_of_a_sharded_checkpoint_only() -> None:
    from harness.results.record import CheckpointInfo
    from harness.units import GIB

    sharded = CheckpointInfo(path="m", generated=False, seed=0, bytes=4 * GIB, files=3,
                             dtype_bytes={"bfloat16": 3 * GIB, "float32": GIB})
    assert checkpoint_clause(sharded, 2) == "; checkpoint in 3 files (4.00 GiB: bfloat16 3.00 GiB, float32 1.00 GiB)"
    assert checkpoint_clause(dataclasses.replace(sharded, files=1), 2) == ""
    assert checkpoint_clause(dataclasses.replace(sharded, files=None, dtype_bytes=None), 2) == "", "older layouts"


@pytest.mark.parametrize("name", ["st_prefetch", "instanttensor"])
def test_the_gpu_peers_read_a_sharded_checkpoint_as_the_single_file(
    name: str, generated: tuple[Scenario, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.tests.test_gpu_peers import _install_fakes  # their packages, faked to hand out CPU tensors

    scenario, single = generated
    _shard(single, tmp_path / "shards")
    plan = _plan(scenario, tmp_path / "shards", tmp_path)
    reference = load_file(str(single))
    calls: list[tuple[Any, ...]] = []
    _install_fakes(monkeypatch, calls)
    model = build_model(plan.scenario.model).module
    hooks = STRATEGIES[name].hooks(model, tmp_path / "shards", "cuda:0", [e.names for e in plan.engines])  # type: ignore[misc]
    seen: dict[str, torch.Tensor] = {}
    for engine in plan.engines:
        hooks.before(engine.index, engine.names)
        state = model.state_dict(keep_vars=True)
        seen.update({n: state[n].detach().clone() for n in engine.names if n in reference})
        hooks.after(engine.index, engine.names)
    assert sorted(seen) == sorted(reference) and all(torch.equal(seen[n], reference[n]) for n in reference)
    read = [c[1] for c in calls if c[0] in ("prefetch", "instant_open")]
    opened = {Path(f).parent for files in read for f in (files if isinstance(files, tuple) else (files,))}
    assert opened == {tmp_path / "shards"}, "the shards are what is read"
