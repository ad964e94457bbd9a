"""convert_checkpoint and `python -m weightmap convert`: aligned, cast, streamed, atomic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pages import PAGE, cached_pages, drop_cache
from safetensors.torch import load_file, save_file
from support import TinyNet, inside, mapped_ranges, seeded, smaps_rss

from weightmap import MappingError, convert_checkpoint, init_empty_weights, inspect_checkpoint, map_weights
from weightmap.cli import main
from weightmap.convert import parse_size

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fp32(tmp_path: Path) -> tuple[TinyNet, Path]:
    reference = seeded(TinyNet())
    path = tmp_path / "fp32.safetensors"
    save_file({k: v.clone() for k, v in reference.state_dict().items() if k != "head.weight"}, str(path))
    return reference, path


def assert_maps_without_copy(model: torch.nn.Module, path: Path) -> None:
    mapped = map_weights(model, path, strict=True)
    assert mapped.copied == [] and mapped.missing == [] and mapped.still_meta == []
    ranges = mapped_ranges(path)
    for name, tensor in model.state_dict().items():
        assert inside(tensor, ranges), f"{name} is not a view of {path}"


def test_fp32_to_bf16_maps_strict_into_the_bf16_model(fp32: tuple[TinyNet, Path], tmp_path: Path) -> None:
    reference, source = fp32
    out = tmp_path / "bf16.safetensors"
    assert convert_checkpoint(source, out, dtype=torch.bfloat16) == [out]
    written = load_file(str(out))
    assert {t.dtype for t in written.values()} == {torch.bfloat16}
    for name, tensor in load_file(str(source)).items():
        assert torch.equal(written[name], tensor.to(torch.bfloat16)), name
    assert inspect_checkpoint(out).misaligned == []
    with init_empty_weights():
        model = TinyNet(dtype=torch.bfloat16)
    assert_maps_without_copy(model, out)
    tokens = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(model(tokens), reference.to(torch.bfloat16)(tokens), rtol=0, atol=0)


def test_model_dtypes_per_tensor(fp32: tuple[TinyNet, Path], tmp_path: Path) -> None:
    _, source = fp32
    with init_empty_weights():
        model = TinyNet(dtype=torch.bfloat16)
    model.norm.float()  # norms often stay in float32
    out = tmp_path / "mixed.safetensors"
    convert_checkpoint(source, out, model=model)
    written = load_file(str(out))
    assert written["norm.weight"].dtype == torch.float32 and written["blocks.0.weight"].dtype == torch.bfloat16
    assert_maps_without_copy(model, out)


def test_only_floating_point_tensors_take_the_dtype(tmp_path: Path) -> None:
    source = tmp_path / "mixed.safetensors"
    save_file({"w": torch.randn(3, 5), "ids": torch.arange(7), "mask": torch.tensor([True, False])}, str(source))
    out = tmp_path / "half.safetensors"
    convert_checkpoint(source, out, dtype=torch.float16)
    written = load_file(str(out))
    assert written["w"].dtype == torch.float16 and torch.equal(written["ids"], torch.arange(7))
    assert written["mask"].dtype == torch.bool


def test_sharded_in_single_out_and_back_to_shards(fp32: tuple[TinyNet, Path], tmp_path: Path) -> None:
    reference, source = fp32
    tensors = load_file(str(source))
    names = sorted(tensors)
    folder = tmp_path / "sharded"
    folder.mkdir()
    weight_map = {}
    for i, part in enumerate((names[:4], names[4:])):
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, str(folder / shard))
        weight_map.update(dict.fromkeys(part, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    single = tmp_path / "single.safetensors"
    convert_checkpoint(folder, single, dtype=torch.bfloat16)
    assert load_file(str(single)).keys() == tensors.keys()

    out = tmp_path / "shards"
    written = convert_checkpoint(single, out, max_shard_size=6000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2 and written[-1] == out / "model.safetensors.index.json"
    assert [p.name for p in written[:-1]] == shards
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in tensors.values())
    for shard in shards:
        assert (out / shard).stat().st_size <= 6000 + 4096 or len(load_file(str(out / shard))) == 1
    with init_empty_weights():
        model = TinyNet(dtype=torch.bfloat16)
    mapped = map_weights(model, out, strict=True)
    assert mapped.copied == []
    tokens = torch.tensor([[5, 6]])
    torch.testing.assert_close(model(tokens), reference.to(torch.bfloat16)(tokens), rtol=0, atol=0)

    whole = tmp_path / "one-shard"
    assert convert_checkpoint(single, whole, max_shard_size=10**9) == [whole / "model.safetensors"]


def test_misaligned_source_comes_out_aligned(tmp_path: Path) -> None:
    source = tmp_path / "old.safetensors"
    header = {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
              "w": {"dtype": "F32", "shape": [4], "data_offsets": [1, 17]}}
    raw = json.dumps(header).encode()
    values = torch.arange(4, dtype=torch.float32)
    source.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\x07" + values.numpy().tobytes())
    assert inspect_checkpoint(source).misaligned == ["w"]
    out = tmp_path / "new.safetensors"
    convert_checkpoint(source, out)
    assert inspect_checkpoint(out).misaligned == []
    written = load_file(str(out))
    assert torch.equal(written["w"], values) and written["a"].tolist() == [7]


def test_a_model_that_does_not_fit_writes_nothing(fp32: tuple[TinyNet, Path], tmp_path: Path) -> None:
    _, source = fp32
    with init_empty_weights():
        model = TinyNet(width=16)
    out = tmp_path / "never.safetensors"
    with pytest.raises(MappingError, match=r"'scale'.*has shape \[32\] in the checkpoint but \[16\] in the model"):
        convert_checkpoint(source, out, model=model)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["fp32.safetensors"]


def test_an_error_midway_leaves_the_destination_as_it_was(fp32: tuple[TinyNet, Path], tmp_path: Path) -> None:
    _, source = fp32
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"previous")
    calls = []

    def fail_after_two(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(source, out, dtype=torch.bfloat16, progress=fail_after_two)
    assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp32.safetensors", "out.safetensors"]


def test_converting_onto_the_source_itself(fp32: tuple[TinyNet, Path]) -> None:
    _, source = fp32
    before = load_file(str(source))
    convert_checkpoint(source, source, dtype=torch.bfloat16)
    after = load_file(str(source))
    assert all(torch.equal(after[k], v.to(torch.bfloat16)) for k, v in before.items())


def test_source_pages_are_released_as_tensors_are_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "big.safetensors"
    count, numel = 24, 2**20  # 24 tensors of 4 MiB
    save_file({f"w{i:02d}": torch.full((numel,), float(i)) for i in range(count)}, str(source))
    drop_cache(source)  # written back: dirty pages would stay in the cache whatever convert asks
    tensor_bytes = numel * 4
    seen: list[int] = []
    cached: list[int] = []

    def sample(done: int, total: int) -> None:
        seen.append(smaps_rss(source))
        cached.append(cached_pages(source) * PAGE)

    out = tmp_path / "out.safetensors"
    convert_checkpoint(source, out, dtype=torch.bfloat16, progress=sample)
    assert len(seen) == count + 1
    assert max(seen) < 2 * tensor_bytes, f"up to {max(seen) / 2**20:.1f} MiB of the source stayed resident"
    # The page cache holds what was read ahead for the next tensors, not what was written.
    assert max(cached) < 8 * tensor_bytes, f"up to {max(cached) / 2**20:.1f} MiB of the source stayed cached"
    assert cached_pages(source) * PAGE < 2 * tensor_bytes

    # drop_cache=False leaves the page cache alone: nothing asks the kernel to drop the source's pages.
    # (Not its residency afterwards: any process on the machine may drop or evict the cache meanwhile.)
    advised: list[tuple[str, int]] = []
    advise = os.posix_fadvise

    def recorded(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append((os.readlink(f"/proc/self/fd/{fd}"), advice))
        advise(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", recorded)
    convert_checkpoint(source, out, dtype=torch.bfloat16, drop_cache=False)
    assert (str(source), os.POSIX_FADV_DONTNEED) not in advised
    advised.clear()
    convert_checkpoint(source, out, dtype=torch.bfloat16)  # and the default does ask
    assert (str(source), os.POSIX_FADV_DONTNEED) in advised


def test_parse_size() -> None:
    assert parse_size("2GB") == 2 * 10**9 and parse_size("500MiB") == 500 * 2**20 and parse_size("1e3") == 1000
    assert parse_size("1.5 GiB") == 3 * 2**29
    for bad in ("", "GB", "12XB", "-1", "0"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_cli_convert_with_progress(fp32: tuple[TinyNet, Path], tmp_path: Path) -> None:
    _, source = fp32
    out = tmp_path / "cli.safetensors"
    result = subprocess.run([sys.executable, "-m", "weightmap", "convert", str(source), str(out), "--dtype", "bf16"],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "writing cli.safetensors" in result.stderr and f"wrote {out}: 1 file" in result.stderr
    assert {t.dtype for t in load_file(str(out)).values()} == {torch.bfloat16}


@pytest.mark.parametrize("case", ["missing", "dtype", "directory", "shard-size", "not-a-directory"])
def test_cli_convert_errors_are_one_line_and_exit_2(case: str, fp32: tuple[TinyNet, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _, source = fp32
    args, expected = {
        "missing": ([str(tmp_path / "nope.safetensors"), str(tmp_path / "o.safetensors")], "nope.safetensors"),
        "dtype": ([str(source), str(tmp_path / "o.safetensors"), "--dtype", "float99"], "--dtype 'float99'"),
        "directory": ([str(source), str(tmp_path)], "is a directory"),
        "shard-size": ([str(source), str(tmp_path / "d"), "--max-shard-size", "lots"], "--max-shard-size"),
        "not-a-directory": ([str(source), str(source), "--max-shard-size", "1GB"], "is not a directory"),
    }[case]
    assert main(["convert", "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and expected in err, err
