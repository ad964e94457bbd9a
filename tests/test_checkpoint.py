"""Resolving checkpoint paths: single files, sharded directories and index files."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from support import returned_or_raised

from weightmap.checkpoint import INDEX_NAME, Checkpoint, open_checkpoint
from weightmap.errors import HeaderError, MappingError
from weightmap.streamwrite import TensorSpec, write_checkpoint

ROOT = Path(__file__).resolve().parent.parent

SHARD_1 = "model-00001-of-00002.safetensors"
SHARD_2 = "model-00002-of-00002.safetensors"
FIRST = {"embed.weight": torch.randn(8, 4), "layers.0.weight": torch.randn(4, 4).bfloat16()}
SECOND = {"layers.1.weight": torch.randn(4, 4), "norm.weight": torch.ones(4), "step": torch.tensor(3)}


def write_index(path: Path, weight_map: Any, metadata: Any = None) -> Path:
    path.write_text(json.dumps({"metadata": metadata or {"total_size": 0}, "weight_map": weight_map}))
    return path


def weight_map_of(**shards: dict[str, torch.Tensor]) -> dict[str, str]:
    return {name: f"{shard}.safetensors" for shard, tensors in shards.items() for name in tensors}


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    """A directory with an index and two shards: one from safetensors, one from write_checkpoint."""
    save_file(FIRST, str(tmp_path / SHARD_1))
    specs = [TensorSpec(name, t.dtype, tuple(t.shape)) for name, t in SECOND.items()]
    write_checkpoint(tmp_path / SHARD_2, specs, lambda spec: SECOND[spec.name])
    weight_map = {**dict.fromkeys(FIRST, SHARD_1), **dict.fromkeys(SECOND, SHARD_2)}
    write_index(tmp_path / INDEX_NAME, weight_map)
    return tmp_path


def assert_holds(checkpoint: Checkpoint, directory: Path) -> None:
    """The checkpoint has every tensor of both shards, each with its own file's header."""
    assert checkpoint.files == (directory / SHARD_1, directory / SHARD_2)
    assert set(checkpoint.entries) == set(FIRST) | set(SECOND)
    for name, (header, entry) in checkpoint.entries.items():
        expected = FIRST if name in FIRST else SECOND
        assert header.path == directory / (SHARD_1 if name in FIRST else SHARD_2)
        assert header.tensors[name] is entry
        assert entry.dtype == expected[name].dtype and entry.shape == tuple(expected[name].shape)
        with open(header.path, "rb") as f:
            f.seek(entry.start)
            stored = f.read(entry.nbytes)
        assert stored == bytes(expected[name].reshape(-1).view(torch.uint8).numpy()), name


def test_directory_with_index(sharded: Path) -> None:
    checkpoint = open_checkpoint(sharded)
    assert checkpoint.source == sharded
    assert_holds(checkpoint, sharded)


def test_index_path_itself(sharded: Path) -> None:
    checkpoint = open_checkpoint(str(sharded / INDEX_NAME))
    assert checkpoint.source == sharded / INDEX_NAME
    assert_holds(checkpoint, sharded)


def test_index_with_another_name_and_a_shard_spelled_differently(sharded: Path) -> None:
    weight_map = {**{k: "./" + SHARD_1 for k in FIRST}, **dict.fromkeys(SECOND, SHARD_2)}
    weight_map["embed.weight"] = SHARD_1
    index = write_index(sharded / "other.index.json", weight_map)
    assert_holds(open_checkpoint(index), sharded)


def test_tensors_the_index_leaves_out_are_still_usable(sharded: Path) -> None:
    write_index(sharded / INDEX_NAME, {"embed.weight": SHARD_1, "norm.weight": SHARD_2})
    assert_holds(open_checkpoint(sharded), sharded)


def test_shards_in_subdirectories(tmp_path: Path) -> None:
    (tmp_path / "parts").mkdir()
    save_file(FIRST, str(tmp_path / "parts" / "a.safetensors"))
    index = write_index(tmp_path / "w.index.json", dict.fromkeys(FIRST, "parts/a.safetensors"))
    checkpoint = open_checkpoint(index)
    assert checkpoint.files == (tmp_path / "parts" / "a.safetensors",)
    assert set(checkpoint.entries) == set(FIRST)


def test_directory_with_a_single_file(tmp_path: Path) -> None:
    save_file(FIRST, str(tmp_path / "model.safetensors"))
    (tmp_path / "._model.safetensors").write_bytes(b"hidden files are ignored")
    (tmp_path / "config.json").write_text("{}")
    checkpoint = open_checkpoint(tmp_path)
    assert checkpoint.source == tmp_path
    assert checkpoint.files == (tmp_path / "model.safetensors",)
    assert set(checkpoint.entries) == set(FIRST)


def test_single_file(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"  # any non-.json file is read as safetensors
    save_file(SECOND, str(path), metadata={"format": "pt"})
    checkpoint = open_checkpoint(path)
    assert checkpoint.source == path and checkpoint.files == (path,)
    assert checkpoint.headers[0].metadata == {"format": "pt"}
    header, entry = checkpoint.entries["step"]
    assert header is checkpoint.headers[0] and entry.dtype == torch.int64 and entry.shape == ()


def test_directory_with_two_files_and_no_index(sharded: Path) -> None:
    (sharded / INDEX_NAME).unlink()
    pattern = f"2 \\*.safetensors files \\({SHARD_1}, {SHARD_2}\\) but no {INDEX_NAME}"
    with pytest.raises(MappingError, match=pattern):
        open_checkpoint(sharded)


def test_directory_with_no_safetensors_file(tmp_path: Path) -> None:
    (tmp_path / "diffusion_pytorch_model.safetensors.index.json").write_text("{}")
    with pytest.raises(MappingError, match="no \\*.safetensors file.*other index files here: diffusion"):
        open_checkpoint(tmp_path)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(MappingError, match="absent.safetensors: does not exist$"):
        open_checkpoint(tmp_path / "absent.safetensors")
    with pytest.raises(MappingError, match="absent.index.json: does not exist$"):
        open_checkpoint(tmp_path / "absent.index.json")
    (tmp_path / "plain").write_bytes(b"")
    with pytest.raises(MappingError, match="a.safetensors: does not exist \\(a component of the path is not"):
        open_checkpoint(tmp_path / "plain" / "a.safetensors")


def test_index_naming_a_missing_shard(sharded: Path) -> None:
    write_index(sharded / INDEX_NAME, {**dict.fromkeys(FIRST, SHARD_1), "extra.weight": "gone.safetensors"})
    pattern = "tensor 'extra.weight': the index names shard 'gone.safetensors', but .* does not exist"
    with pytest.raises(HeaderError, match=pattern) as info:
        open_checkpoint(sharded)
    assert str(info.value).startswith(str(sharded / INDEX_NAME))


def test_index_assigning_a_tensor_to_the_wrong_shard(sharded: Path) -> None:
    weight_map = {**dict.fromkeys(FIRST, SHARD_1), **dict.fromkeys(SECOND, SHARD_2), "norm.weight": SHARD_1}
    write_index(sharded / INDEX_NAME, weight_map)
    pattern = f"tensor 'norm.weight': the index assigns it to shard '{SHARD_1}', whose header lacks it; it is"
    pattern += f" in '{SHARD_2}'"
    with pytest.raises(HeaderError, match=pattern):
        open_checkpoint(sharded)


def test_index_assigning_a_tensor_no_shard_holds(sharded: Path) -> None:
    write_index(sharded / INDEX_NAME, {**dict.fromkeys(FIRST, SHARD_1), "ghost": SHARD_2})
    with pytest.raises(HeaderError, match="tensor 'ghost': .*no shard holds it"):
        open_checkpoint(sharded)


def test_tensor_in_two_shards(sharded: Path) -> None:
    save_file({**SECOND, "embed.weight": torch.zeros(2)}, str(sharded / SHARD_2))
    pattern = f"tensor 'embed.weight' is in two shards: '{SHARD_1}' and '{SHARD_2}'"
    with pytest.raises(HeaderError, match=pattern):
        open_checkpoint(sharded)


def test_tensor_in_two_shards_even_when_the_index_omits_it(sharded: Path) -> None:
    save_file({"dup": torch.zeros(1)}, str(sharded / "x.safetensors"))
    save_file({"dup": torch.zeros(1)}, str(sharded / "y.safetensors"))
    write_index(sharded / INDEX_NAME, {"a": "x.safetensors", "b": "y.safetensors"})
    with pytest.raises(HeaderError, match="tensor 'dup' is in two shards"):
        open_checkpoint(sharded)


def test_broken_shard_header_names_the_shard(sharded: Path) -> None:
    (sharded / SHARD_2).write_bytes(b"\x05\0\0\0\0\0\0\0{}")
    with pytest.raises(HeaderError, match=f"{SHARD_2}: header length 5 runs past the end"):
        open_checkpoint(sharded)


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        ("not json", "not valid UTF-8 JSON"),
        ("[1]", "not a JSON object"),
        ('{"metadata": {}}', "needs a 'weight_map' object"),
        ('{"weight_map": ["a"]}', "needs a 'weight_map' object"),
        ('{"weight_map": {"a": 3}}', "tensor 'a': weight_map value must be a shard file name"),
        ('{"weight_map": {"a": "/etc/x.safetensors"}}', "tensor 'a': shard '/etc/x.safetensors' must be"),
        ('{"weight_map": {"a": "../x.safetensors"}}', "tensor 'a': shard '../x.safetensors' must be"),
        ('{"weight_map": {"a": ""}}', "tensor 'a': shard '' must be a relative"),
        ('{"weight_map": {"a": "s.safetensors", "a": "t.safetensors"}}', "key 'a' is given twice"),
    ],
)
def test_malformed_index(content: str, pattern: str, tmp_path: Path) -> None:
    index = tmp_path / "m.index.json"
    index.write_text(content)
    with pytest.raises(HeaderError, match=pattern) as info:
        open_checkpoint(index)
    assert str(info.value).startswith(str(index) + ": ")


# --------------------------------------------------------------------------- what a path is


def open_in_thread(path: Path, unblock: Path | None = None) -> BaseException | Checkpoint:
    """open_checkpoint(path) on a thread: what it raised or returned. A call still blocked after 10 s fails
    the test (after the FIFO is opened for writing, so that the thread ends)."""
    outcome = returned_or_raised(lambda: open_checkpoint(path), unblock or path, f"open_checkpoint({path})")
    assert isinstance(outcome, (BaseException, Checkpoint)), outcome
    return outcome


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
@pytest.mark.parametrize("name", ["model.safetensors", "model.safetensors.index.json"])
def test_a_fifo_is_an_error_and_never_blocks(tmp_path: Path, name: str) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    outcome = open_in_thread(fifo)
    assert isinstance(outcome, MappingError), outcome
    assert str(outcome) == f"{fifo}: is a named pipe (FIFO), not a regular file"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_in_a_directory_or_an_index_is_an_error(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "model.safetensors")
    outcome = open_in_thread(tmp_path, unblock=tmp_path / "model.safetensors")
    assert isinstance(outcome, MappingError)
    assert str(outcome) == f"{tmp_path / 'model.safetensors'}: is a named pipe (FIFO), not a regular file"

    write_index(tmp_path / INDEX_NAME, {"w": "model.safetensors"})
    outcome = open_in_thread(tmp_path, unblock=tmp_path / "model.safetensors")
    assert isinstance(outcome, HeaderError)
    assert "the index names shard 'model.safetensors', but" in str(outcome)
    assert str(outcome).endswith("model.safetensors is a named pipe (FIFO), not a regular file")


def test_a_directory_where_a_file_must_be(tmp_path: Path) -> None:
    (tmp_path / "inner.safetensors").mkdir()
    with pytest.raises(MappingError, match="inner.safetensors: is a directory, not a regular file$"):
        open_checkpoint(tmp_path)  # the directory's only *.safetensors entry
    (tmp_path / "shard.safetensors").mkdir()
    write_index(tmp_path / "w.index.json", {"a": "shard.safetensors"})
    with pytest.raises(HeaderError, match="shard.safetensors is a directory, not a regular file$"):
        open_checkpoint(tmp_path / "w.index.json")
    (tmp_path / INDEX_NAME).mkdir()
    with pytest.raises(MappingError, match=f"{INDEX_NAME}: is a directory, not a regular file$"):
        open_checkpoint(tmp_path)


def test_a_character_device(tmp_path: Path) -> None:
    if not stat.S_ISCHR(os.stat(os.devnull).st_mode):
        pytest.skip(f"{os.devnull} is not a character device here")
    with pytest.raises(MappingError, match=f"^{os.devnull}: is a character device, not a regular file$"):
        open_checkpoint(os.devnull)


def test_a_block_device(tmp_path: Path) -> None:
    device = tmp_path / "disk.safetensors"
    try:
        os.mknod(device, stat.S_IFBLK | 0o600, os.makedev(7, 0))
    except (OSError, AttributeError) as exc:
        pytest.skip(f"cannot make a block device node here: {exc}")
    with pytest.raises(MappingError, match="disk.safetensors: is a block device, not a regular file$"):
        open_checkpoint(device)


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="needs UNIX sockets")
def test_a_socket(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(MappingError, match="s.safetensors: is a socket, not a regular file$"):
            open_checkpoint(path)


def test_symbolic_links_dangling_looping_and_good(tmp_path: Path) -> None:
    (tmp_path / "dangling.safetensors").symlink_to("gone.safetensors")
    with pytest.raises(MappingError, match="dangling.safetensors: is a symbolic link to 'gone.safetensors', "
                                           "which does not exist$"):
        open_checkpoint(tmp_path / "dangling.safetensors")
    (tmp_path / "a.safetensors").symlink_to("b.safetensors")
    (tmp_path / "b.safetensors").symlink_to("a.safetensors")
    with pytest.raises(MappingError, match="a.safetensors: is a symbolic link loop"):
        open_checkpoint(tmp_path / "a.safetensors")
    write_index(tmp_path / INDEX_NAME, {"w": "a.safetensors"})
    with pytest.raises(HeaderError, match="but .*a.safetensors is a symbolic link loop"):
        open_checkpoint(tmp_path)

    save_file(FIRST, str(tmp_path / "real.bin"))
    (tmp_path / "link.safetensors").symlink_to("real.bin")
    checkpoint = open_checkpoint(tmp_path / "link.safetensors")
    assert checkpoint.files == (tmp_path / "link.safetensors",) and set(checkpoint.entries) == set(FIRST)


# --------------------------------------------------------------------------- descriptors


def fds_on(*paths: Path) -> int:
    """How many of this process's descriptors are open on any of ``paths``."""
    targets = {os.path.realpath(p) for p in paths}
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}") in targets
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_open_checkpoint_leaves_no_descriptor_open(sharded: Path) -> None:
    files = [sharded / SHARD_1, sharded / SHARD_2, sharded / INDEX_NAME]
    checkpoint = open_checkpoint(sharded)
    assert fds_on(*files) == 0 and checkpoint.closed
    assert_holds(checkpoint, sharded)  # what callers that only read headers use still works

    with open_checkpoint(sharded, keep_open=True) as held:
        assert fds_on(*files) == 2 and not held.closed
        assert [held.file(h).path for h in held.headers] == list(held.files)
    assert fds_on(*files) == 0 and held.closed


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_an_error_on_the_second_shard_closes_the_first(sharded: Path) -> None:
    (sharded / SHARD_2).write_bytes(b"\x05\0\0\0\0\0\0\0{}")
    with pytest.raises(HeaderError):
        open_checkpoint(sharded, keep_open=True)
    assert fds_on(sharded / SHARD_1, sharded / SHARD_2) == 0


# --------------------------------------------------------------------------- what an index costs


def traced_peak(call: Any) -> tuple[int, BaseException | None]:
    """Peak bytes Python allocated while ``call()`` ran, and what it raised."""
    tracemalloc.start()
    try:
        call()
        raised = None
    except Exception as exc:
        raised = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, raised


def test_an_index_of_millions_of_tiny_names_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    # 14 MB of "7":"s" pairs: json.loads would build two million strings (about 200 MiB).
    index = tmp_path / INDEX_NAME
    index.write_text(json.dumps({"metadata": {}, "weight_map": {str(i): "s" for i in range(1_000_000)}}))
    size = index.stat().st_size
    peak, raised = traced_peak(lambda: open_checkpoint(index))
    assert isinstance(raised, HeaderError), raised
    assert str(raised).startswith(f"{index}: index of {size} bytes holds too many values for its size")
    assert peak <= 64 * 2**20 + 8 * size, peak / 2**20


def test_a_large_real_index_opens_within_the_bound(tmp_path: Path) -> None:
    names = [f"model.layers.{i}.mlp.experts.down_proj.weight" for i in range(100_000)]
    header = {name: {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i, name in enumerate(names)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    (tmp_path / "model-00001-of-00001.safetensors").write_bytes(
        len(text).to_bytes(8, "little") + text + bytes(len(names)))
    index = write_index(tmp_path / INDEX_NAME, dict.fromkeys(names, "model-00001-of-00001.safetensors"))
    peak, raised = traced_peak(lambda: open_checkpoint(index))
    assert raised is None, raised
    assert peak <= 64 * 2**20 + 8 * index.stat().st_size + 8 * len(text), peak / 2**20


WIDE_INDEX_CHILD = r"""
import json, sys
from pathlib import Path
from weightmap.checkpoint import _load_index
from weightmap.errors import HeaderError

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = status("VmRSS")
try:
    _load_index(Path(sys.argv[1]))
    outcome = "parsed"
except HeaderError as error:
    outcome = str(error)
print(json.dumps({"growth": status("VmHWM") - base, "outcome": outcome}))
"""


def test_an_index_of_wide_characters_stays_within_the_bound(tmp_path: Path) -> None:
    # 94 MB of ASCII names plus one emoji: the decoded text takes 4 bytes a character, not 1.
    if not sys.platform.startswith("linux"):
        pytest.skip("reads VmHWM from /proc")
    index = tmp_path / INDEX_NAME
    weight_map = {f"model.layers.{i}.self_attn.q_proj.weight": "model-00001-of-00002.safetensors"
                  for i in range(1_180_000)}
    index.write_bytes(json.dumps({"metadata": {"note": "\U0001F600"}, "weight_map": weight_map},
                                 ensure_ascii=False).encode())
    del weight_map
    size = index.stat().st_size
    done = subprocess.run([sys.executable, "-c", WIDE_INDEX_CHILD, str(index)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["growth"] <= 64 * 2**20 + 8 * size, (result["growth"] / 2**20, result["outcome"][:200])
    index.unlink()


def test_a_nul_in_a_shard_name_is_a_header_error_naming_the_index(tmp_path: Path) -> None:
    index = write_index(tmp_path / INDEX_NAME, {"w": "model\x00.safetensors"})
    with pytest.raises(HeaderError, match=r"tensor 'w': shard name .* holds a NUL character") as caught:
        open_checkpoint(index)
    assert str(caught.value).startswith(f"{index}: ")
