"""convert_checkpoint commits a conversion as a whole: the destination always reads as the complete
earlier checkpoint or the complete new one, and nothing of a failed conversion is left behind."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from support import tmpfs

from weightmap import MappingError, convert_checkpoint, inspect_checkpoint, save_weights_for_mapping
from weightmap.checkpoint import INDEX_NAME, open_checkpoint
from weightmap.commit import _Transaction

ROOT = Path(__file__).resolve().parent.parent
SHARD = 2048  # bytes of tensors per shard: the float64 source below (four 2 KiB tensors) makes four shards


def tensors(seed: int = 0, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(256, generator=gen, dtype=torch.float64).to(dtype) for name in "abcd"}


def read(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint at ``path`` (a file or a directory), read through weightmap's reader."""
    with open_checkpoint(path, keep_open=True) as checkpoint:
        out = {}
        for name, (header, entry) in checkpoint.entries.items():
            raw = checkpoint.file(header).read(entry.start, entry.nbytes)
            out[name] = torch.frombuffer(bytearray(raw), dtype=entry.dtype).view(entry.shape).clone()
        return out


def same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return got.keys() == want.keys() and all(
        got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want
    )


def sharded(directory: Path, values: dict[str, torch.Tensor]) -> Path:
    """A float64 source written as shards into ``directory``, by convert itself."""
    flat = directory.parent / f"{directory.name}-flat.safetensors"
    save_file(values, str(flat))
    convert_checkpoint(flat, directory, max_shard_size=SHARD)
    flat.unlink()
    assert len([p for p in os.listdir(directory) if p.endswith(".safetensors")]) == 4
    return directory


def listing(directory: Path) -> set[str]:
    return set(os.listdir(directory))


def test_in_place_sharded_conversion_replaces_the_checkpoint_as_a_whole(tmp_path: Path) -> None:
    original = tensors()
    folder = sharded(tmp_path / "ckpt", original)
    convert_checkpoint(folder, folder, dtype=torch.bfloat16, max_shard_size=SHARD // 4)
    assert same(read(folder), {k: v.to(torch.bfloat16) for k, v in original.items()})
    names = listing(folder)
    assert INDEX_NAME in names and not any(n.startswith(".") for n in names)
    assert len(names) == 5  # the index and its four shards; nothing of the float64 checkpoint


@pytest.mark.parametrize("after", ["park", "publish", "commit"])
def test_a_kill_at_any_step_leaves_the_old_or_the_new_checkpoint(tmp_path: Path, after: str) -> None:
    original = tensors()
    folder = sharded(tmp_path / "ckpt", original)
    script = textwrap.dedent(f"""
        import os, signal, sys, torch
        sys.path.insert(0, {str(ROOT)!r})
        from weightmap import commit, convert_checkpoint
        step = getattr(commit._Transaction, {after!r})
        def then_die(self, *args):
            step(self, *args)
            os.kill(os.getpid(), signal.SIGKILL)
        setattr(commit._Transaction, {after!r}, then_die)
        convert_checkpoint({str(folder)!r}, {str(folder)!r}, dtype=torch.float32, max_shard_size={SHARD // 2})
    """)  # four float32 shards under the names of the four float64 ones: the earlier ones are parked first
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    got = read(folder)
    new = {k: v.to(torch.float32) for k, v in original.items()}
    assert same(got, original) if after != "commit" else same(got, new)
    assert inspect_checkpoint(folder).tensors == 4


def test_sigkill_after_the_first_shard_is_written_leaves_the_source_intact(tmp_path: Path) -> None:
    original = tensors()
    folder = sharded(tmp_path / "ckpt", original)
    before = listing(folder)
    script = textwrap.dedent(f"""
        import os, signal, sys, torch
        sys.path.insert(0, {str(ROOT)!r})
        from weightmap import convert_checkpoint
        def progress(done, total):
            if done >= {SHARD // 4}:
                os.kill(os.getpid(), signal.SIGKILL)
        convert_checkpoint({str(folder)!r}, {str(folder)!r}, dtype=torch.bfloat16, max_shard_size={SHARD // 4},
                           progress=progress)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert same(read(folder), original)
    assert listing(folder) == before  # unnamed new files vanish with the process


@pytest.mark.parametrize("failure", [KeyboardInterrupt, OSError(errno.ENOSPC, "No space left on device")])
def test_an_error_mid_way_leaves_nothing_behind(tmp_path: Path, failure: BaseException | type) -> None:
    original = tensors()
    folder = sharded(tmp_path / "ckpt", original)
    before = listing(folder)

    def progress(done: int, total: int) -> None:
        if done > SHARD:  # in the second shard
            raise failure  # type: ignore[misc]

    with pytest.raises((KeyboardInterrupt, OSError)):
        convert_checkpoint(folder, folder, dtype=torch.float32, max_shard_size=SHARD // 2, progress=progress)
    assert listing(folder) == before and same(read(folder), original)

    fresh = tmp_path / "fresh"
    with pytest.raises((KeyboardInterrupt, OSError)):
        convert_checkpoint(folder, fresh, dtype=torch.float32, max_shard_size=SHARD // 2, progress=progress)
    assert not fresh.exists()  # the directory the conversion made is gone too


@pytest.mark.parametrize("shard", [SHARD, SHARD // 2], ids=["new names", "parked"])
@pytest.mark.parametrize("step", ["publish", "commit"])
def test_a_failure_in_the_commit_puts_the_earlier_checkpoint_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, shard: int
) -> None:
    original = tensors()
    folder = sharded(tmp_path / "ckpt", original)
    before = listing(folder)

    def fail(self: _Transaction, *args: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(_Transaction, step, fail)
    with pytest.raises(OSError, match="Input/output"):
        convert_checkpoint(folder, folder, dtype=torch.float32, max_shard_size=shard)
    assert listing(folder) == before and same(read(folder), original)


def test_a_single_file_replaces_an_earlier_sharded_conversion(tmp_path: Path) -> None:
    folder = sharded(tmp_path / "ckpt", tensors(0))
    source = tmp_path / "next.safetensors"
    save_file(tensors(1), str(source))
    written = convert_checkpoint(source, folder, max_shard_size=10**9)
    assert written == [folder / "model.safetensors"]
    assert listing(folder) == {"model.safetensors"}
    assert same(read(folder), tensors(1))


def test_shards_replace_an_earlier_single_file(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file(tensors(0), str(folder / "model.safetensors"))
    source = tmp_path / "next.safetensors"
    save_file(tensors(1), str(source))
    convert_checkpoint(source, folder, max_shard_size=SHARD)
    assert "model.safetensors" not in listing(folder) and len(listing(folder)) == 5
    assert same(read(folder), tensors(1))


def test_a_lone_file_converted_into_its_own_directory_becomes_shards(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file(tensors(0), str(folder / "model.safetensors"))
    convert_checkpoint(folder / "model.safetensors", folder, dtype=torch.float32, max_shard_size=SHARD // 2)
    assert "model.safetensors" not in listing(folder)
    assert same(read(folder), {k: v.float() for k, v in tensors(0).items()})


def test_a_directory_that_is_not_a_checkpoint_is_refused_untouched(tmp_path: Path) -> None:
    folder = tmp_path / "mixed"
    folder.mkdir()
    save_file(tensors(0), str(folder / "a.safetensors"))
    save_file(tensors(1), str(folder / "b.safetensors"))
    source = tmp_path / "src.safetensors"
    save_file(tensors(2), str(source))
    with pytest.raises(MappingError, match=r"mixed: holds files that are not a checkpoint"):
        convert_checkpoint(source, folder, max_shard_size=SHARD)
    assert listing(folder) == {"a.safetensors", "b.safetensors"}


@pytest.mark.parametrize("onto", ["shard", "index", "single beside an index"])
def test_a_file_destination_that_would_break_a_sharded_checkpoint_is_refused(tmp_path: Path, onto: str) -> None:
    original = tensors()
    folder = sharded(tmp_path / "ckpt", original)
    before = {name: (folder / name).read_bytes() for name in listing(folder)}
    target = {
        "shard": folder / "model-00002-of-00004.safetensors",
        "index": folder / INDEX_NAME,
        "single beside an index": folder / "model.safetensors",
    }[onto]
    with pytest.raises(MappingError, match=str(target)):
        convert_checkpoint(folder, target, dtype=torch.float32)
    assert {name: (folder / name).read_bytes() for name in listing(folder)} == before


def test_save_weights_for_mapping_validates_the_header_before_replacing(tmp_path: Path) -> None:
    target = tmp_path / "model.safetensors"
    save_file(tensors(0), str(target))
    before = target.read_bytes()
    model = torch.nn.Module()
    model.register_buffer("deep", torch.zeros([1] * 65))
    with pytest.raises(MappingError, match="64 dimensions"):
        save_weights_for_mapping(model, target)
    assert target.read_bytes() == before and listing(tmp_path) == {"model.safetensors"}


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.complex64])
def test_convert_casts_to_floating_point_dtypes_only(tmp_path: Path, dtype: torch.dtype) -> None:
    source = tmp_path / "src.safetensors"
    save_file(tensors(0), str(source))
    with pytest.raises(MappingError, match="not a floating-point dtype"):
        convert_checkpoint(source, tmp_path / "out.safetensors", dtype=dtype)
    assert listing(tmp_path) == {"src.safetensors"}


def test_a_zero_element_tensor_of_huge_shape_converts(tmp_path: Path) -> None:
    source = tmp_path / "src.safetensors"
    header = b'{"empty":{"dtype":"F32","shape":[0,4611686018427387904,4611686018427387904],"data_offsets":[0,0]}}'
    header += b" " * (-len(header) % 8)
    source.write_bytes(len(header).to_bytes(8, "little") + header)
    out = tmp_path / "out.safetensors"
    convert_checkpoint(source, out, dtype=torch.bfloat16)
    entry = open_checkpoint(out).entries["empty"][1]
    assert entry.shape == (0, 2**62, 2**62) and entry.dtype == torch.bfloat16  # F32 is floating: cast


def test_a_full_disk_leaves_the_earlier_checkpoint_and_nothing_else(tmp_path: Path) -> None:
    source = tmp_path / "big.safetensors"
    save_file({f"t{i}": torch.ones(64, 1024) for i in range(8)}, str(source))  # 2 MiB of float32
    with tmpfs(tmp_path / "small", "size=1536k") as small:
        folder = small / "ckpt"
        folder.mkdir()
        save_file(tensors(0), str(folder / "model.safetensors"))
        before = {name: (folder / name).read_bytes() for name in listing(folder)}
        with pytest.raises(OSError) as caught:
            convert_checkpoint(source, folder, max_shard_size=256 * 1024)
        assert caught.value.errno == errno.ENOSPC and str(folder) in str(caught.value)
        assert {name: (folder / name).read_bytes() for name in listing(folder)} == before
        assert same(read(folder), tensors(0))
