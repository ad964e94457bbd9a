"""Checkpoint generation: layout and metadata, reuse, regeneration, values, bounded memory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from harness.models import SpecModel, SyntheticTransformer
from harness.models.checkpoints import (
    CHUNK_ELEMENTS,
    CheckpointError,
    SeededFill,
    checkpoint_matches,
    checkpoint_specs,
    ensure_checkpoint,
    tied_aliases,
)
from harness.units import MIB
from weightmap import TensorSpec, read_header, write_checkpoint

ROOT = Path(__file__).resolve().parents[2]
METADATA = {"format": "pt", "generator": "weightmap-harness", "values": "2", "seed": "7"}


def small_model(width: int = 32) -> SyntheticTransformer:
    return SyntheticTransformer(layers=2, width=width, vocab=64, heads=4, dtype=torch.bfloat16)


def test_specs_once_per_tensor_object() -> None:
    model = small_model()
    specs = checkpoint_specs(model)
    names = [s.name for s in specs]
    assert names == [n for n in model.state_dict() if n != "lm_head.weight"]
    assert specs[0] == TensorSpec("embed.weight", torch.bfloat16, (64, 32))
    assert tied_aliases(model) == {"lm_head.weight": "embed.weight"}


def test_generated_file_matches_specs_and_metadata(tmp_path: Path) -> None:
    model = small_model()
    path = tmp_path / "sub" / "m.safetensors"
    got, generated = ensure_checkpoint(model, path, 7, progress=False)
    assert got == path and generated
    header = read_header(path)
    assert header.metadata == METADATA
    specs = checkpoint_specs(model)
    assert {n: (e.dtype, e.shape) for n, e in header.tensors.items()} == {
        s.name: (s.dtype, s.shape) for s in specs
    }
    assert "lm_head.weight" not in header.tensors  # tied weight written once
    assert checkpoint_matches(path, specs, 7)
    assert not checkpoint_matches(path, specs, 8)
    assert not checkpoint_matches(path, specs[:-1], 7)
    assert [p.name for p in path.parent.iterdir()] == ["m.safetensors"]  # no temporary left


def test_the_format_is_safetensors_own_and_a_file_that_carried_the_values_there_is_regenerated(
        tmp_path: Path) -> None:
    model = small_model()
    path = tmp_path / "m.safetensors"
    ensure_checkpoint(model, path, 7, progress=False)
    with safe_open(str(path), framework="pt") as f:  # what readers that check the format read
        assert f.metadata()["format"] == "pt"
    specs = checkpoint_specs(model)
    earlier = {"generator": "weightmap-harness", "format": "2", "seed": "7"}  # the layout files had before
    write_checkpoint(path, specs, lambda spec: torch.zeros(spec.shape, dtype=spec.dtype), metadata=earlier)
    assert not checkpoint_matches(path, specs, 7)
    _, generated = ensure_checkpoint(model, path, 7, progress=False)
    assert generated and read_header(path).metadata == METADATA


def test_checkpoint_loads_into_the_model(tmp_path: Path) -> None:
    model = small_model()
    aliases = tied_aliases(model)
    path, _ = ensure_checkpoint(model, tmp_path / "m.safetensors", 7, progress=False)
    result = model.load_state_dict(load_file(path), strict=False, assign=True)
    assert set(result.missing_keys) == set(aliases) == {"lm_head.weight"}
    assert not result.unexpected_keys


def test_reused_when_matching(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    ensure_checkpoint(small_model(), path, 7, progress=False)
    before = path.stat().st_mtime_ns, path.stat().st_ino
    got, generated = ensure_checkpoint(small_model(), path, 7, progress=False)
    assert not generated and got == path
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before


def test_regenerated_when_model_or_seed_changes(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    ensure_checkpoint(small_model(), path, 7, progress=False)
    _, generated = ensure_checkpoint(small_model(width=64), path, 7, progress=False)
    assert generated
    assert read_header(path).tensors["embed.weight"].shape == (64, 64)
    _, generated = ensure_checkpoint(small_model(width=64), path, 8, progress=False)
    assert generated and read_header(path).metadata == {**METADATA, "seed": "8"}
    _, generated = ensure_checkpoint(small_model(width=64), path, 8, progress=False)
    assert not generated


def test_name_is_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")  # valid, empty, not ours
    assert not checkpoint_matches(path, checkpoint_specs(small_model()), 7)
    path.write_bytes(b"garbage")
    assert not checkpoint_matches(path, checkpoint_specs(small_model()), 7)
    assert not checkpoint_matches(tmp_path / "absent.safetensors", [], 7)


def test_foreign_file_is_never_replaced(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"precious data")
    with pytest.raises(CheckpointError, match="not written by the harness"):
        ensure_checkpoint(small_model(), path, 7, progress=False)
    assert path.read_bytes() == b"precious data"


def test_values_are_seeded_and_independent_of_workers(tmp_path: Path) -> None:
    spec = TensorSpec("w", torch.bfloat16, (3, CHUNK_ELEMENTS // 2 + 5))  # more than one chunk
    with SeededFill(1, workers=1) as one, SeededFill(1, workers=3) as three, SeededFill(2) as other:
        a, b, c = one(spec), three(spec), other(spec)
    assert a.dtype == torch.bfloat16 and a.shape == spec.shape
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    std = a.float().std().item()
    assert 0.018 < std < 0.022 and abs(a.float().mean().item()) < 1e-3
    flat = a.view(-1)
    assert not torch.equal(flat[:1000], flat[CHUNK_ELEMENTS : CHUNK_ELEMENTS + 1000])  # chunks differ
    with SeededFill(1, workers=2) as fill:
        assert not torch.equal(fill(TensorSpec("v", torch.bfloat16, spec.shape)), a)  # names differ

    path, _ = ensure_checkpoint(small_model(), tmp_path / "m.safetensors", 7, progress=False)
    stored = load_file(path)
    with SeededFill(7) as fill:
        for s in checkpoint_specs(small_model()):
            assert torch.equal(stored[s.name], fill(s)), s.name


def test_reused_buffer_gives_the_same_values() -> None:
    specs = [TensorSpec("a", torch.float32, (300, 7)), TensorSpec("b", torch.bfloat16, (500, 3))]  # smaller
    with SeededFill(3, reuse_buffer=True) as reuse, SeededFill(3) as fresh:
        first = reuse(specs[0])
        assert torch.equal(first, fresh(specs[0]))
        pointer = first.data_ptr()
        second = reuse(specs[1])
        assert second.data_ptr() == pointer  # one buffer, overwritten
        assert torch.equal(second, fresh(specs[1]))


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int8,
        torch.uint8,
        torch.bool,
    ],
)
def test_every_dtype_fills(dtype: torch.dtype) -> None:
    with SeededFill(0) as fill:
        t = fill(TensorSpec("x", dtype, (100, 10)))
    assert t.dtype == dtype and t.shape == (100, 10)
    if dtype.is_floating_point:
        assert 0.015 < t.float().std().item() < 0.025
    elif dtype == torch.bool:
        assert 300 < int(t.sum()) < 700
    else:
        assert t.min() >= (0 if dtype == torch.uint8 else -8) and t.max() < (
            16 if dtype == torch.uint8 else 8
        )
        assert len(t.unique()) > 8
    with SeededFill(0) as fill:
        assert fill(TensorSpec("empty", dtype, (0, 3))).shape == (0, 3)


_PEAK_SCRIPT = """
import json, os, resource, sys
import torch
from harness.models.checkpoints import SeededFill, ensure_checkpoint
from harness.models import SpecModel

tensors = [{"name": "big", "shape": [8192, 4096], "dtype": "bfloat16", "kind": "param"}]
tensors += [{"name": f"layer{i}.weight", "shape": [2048, 4096], "dtype": "float32", "kind": "param"}
            for i in range(6)]
model = SpecModel({"tensors": tensors})
if hasattr(os, "sched_setaffinity"):  # at most two fill workers
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
with SeededFill(0) as fill:
    workers = fill.workers  # the default pool ensure_checkpoint fills with
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
_, generated = ensure_checkpoint(model, sys.argv[1], 0, progress=False)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"before": before, "peak": peak, "workers": workers, "generated": generated}))
"""


def test_generation_memory_is_bounded(tmp_path: Path) -> None:
    """256 MiB checkpoint, largest tensor 64 MiB (bfloat16): the high-water mark grows by at most
    that tensor, a float32 chunk of scratch per fill worker and 32 MiB.

    Measured in a fresh process, so that this process's memory does not count, on at most two
    CPUs (hence two workers), so that the bound stays well under the file's size. Holding a
    second copy of the largest tensor, several tensors, a full-size float32 temporary of it or
    the whole file goes over the bound.
    """
    largest = 64 * MIB
    path = tmp_path / "big.safetensors"
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PEAK_SCRIPT), str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["generated"]
    bound = largest + result["workers"] * CHUNK_ELEMENTS * 4 + 32 * MIB
    assert path.stat().st_size >= 256 * MIB > bound
    assert result["peak"] - result["before"] <= bound, result


def test_spec_model_checkpoint_skips_trimmed(tmp_path: Path) -> None:
    spec = {
        "tensors": [
            {"name": "a.weight", "shape": [4, 4], "dtype": "float32", "kind": "param"},
            {"name": "b.weight", "shape": [4], "dtype": "bfloat16", "kind": "param"},
            {"name": "b.steps", "shape": [], "dtype": "int64", "kind": "buffer"},
        ]
    }
    path, _ = ensure_checkpoint(
        SpecModel(spec, trim=["a.weight"]), tmp_path / "t.safetensors", 0, progress=False
    )
    assert set(read_header(path).tensors) == {"b.weight", "b.steps"}


def test_a_missing_file_is_generated_only_when_allowed(tmp_path: Path) -> None:
    path = tmp_path / "typo.safetensors"
    with pytest.raises(CheckpointError, match="typo.safetensors: no such file; check checkpoint.path"):
        ensure_checkpoint(small_model(), path, 7, generate=False, progress=False)
    assert not path.exists()
    ensure_checkpoint(small_model(), path, 7, progress=False)
    _, generated = ensure_checkpoint(small_model(), path, 7, generate=False, progress=False)
    assert generated is False  # a matching file is used as it is
    with pytest.raises(CheckpointError, match="generated for another model or seed"):
        ensure_checkpoint(small_model(), path, 8, generate=False, progress=False)


def test_a_directory_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="is a directory"):
        ensure_checkpoint(small_model(), tmp_path, 7, progress=False)
