"""map_weights maps the file it validated: replaced, truncated or rewritten files are never mapped silently."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_model
from support import TinyNet, meta_tiny, seeded, snapshot

import weightmap.mapping
import weightmap.registry
from weightmap import MappingError, map_weights

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")


def fds_on(path: Path) -> int:
    target = os.path.realpath(path)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}") == target
    return count


def write_tiny(path: Path, seed: int) -> TinyNet:
    model = seeded(TinyNet(), seed)
    save_model(model, str(path))
    return model


@contextlib.contextmanager
def after_validation(monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]) -> Iterator[None]:
    """Run ``change`` once every header was validated and every tensor resolved, before anything is mapped."""
    resolve = weightmap.mapping._resolve

    def resolve_then_change(*args: object, **kwargs: object) -> object:
        plans = resolve(*args, **kwargs)  # type: ignore[arg-type]
        change()
        return plans

    monkeypatch.setattr(weightmap.mapping, "_resolve", resolve_then_change)
    yield


def test_a_file_renamed_over_the_path_after_validation_is_not_what_gets_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, other = tmp_path / "model.safetensors", tmp_path / "other.safetensors"
    validated = write_tiny(path, seed=1)
    write_tiny(other, seed=2)  # same layout, other values
    model = meta_tiny()
    with after_validation(monkeypatch, lambda: os.replace(other, path)):
        map_weights(model, path, strict=True)
    torch.testing.assert_close(model.embed.weight, validated.embed.weight, rtol=0, atol=0)
    torch.testing.assert_close(model.blocks[2].bias, validated.blocks[2].bias, rtol=0, atol=0)


@pytest.mark.parametrize("how", ["truncate", "append", "rewrite"])
def test_a_file_changed_after_validation_is_not_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    path = tmp_path / "model.safetensors"
    write_tiny(path, seed=1)
    size = path.stat().st_size
    expected = {
        "truncate": f"size {size} -> {size - 16} bytes",
        "append": f"size {size} -> {size + 8} bytes",
        "rewrite": "header bytes differ",
    }[how]

    def change() -> None:
        if how == "truncate":
            os.truncate(path, size - 16)
        elif how == "append":
            with open(path, "ab") as f:
                f.write(b"\0" * 8)
        else:  # same size, same modification time, other header: tensors renamed in place
            stat = path.stat()
            raw = path.read_bytes().replace(b'"blocks.', b'"blockz.')
            with open(path, "r+b") as f:
                f.write(raw)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    model = meta_tiny()
    before = snapshot(model)
    with after_validation(monkeypatch, change), pytest.raises(MappingError) as info:
        map_weights(model, path)
    assert str(info.value).startswith(f"{path}: the file changed after its header was validated (")
    assert expected in str(info.value)
    assert snapshot(model) == before
    assert fds_on(path) == 0


def test_a_file_changed_while_it_is_being_mapped_is_not_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check right after mmap: a rewrite that lands between the last check and the mapping."""
    path = tmp_path / "model.safetensors"
    write_tiny(path, seed=1)
    map_descriptor = weightmap.registry.map_descriptor

    def rewrite_then_map(fd: int, length: int, where: object) -> object:
        with open(path, "r+b") as f:
            f.seek(8)
            f.write(b" ")  # the header's opening brace becomes a space: same size, other bytes
        return map_descriptor(fd, length, where)  # type: ignore[arg-type]

    monkeypatch.setattr(weightmap.registry, "map_descriptor", rewrite_then_map)
    model = meta_tiny()
    before = snapshot(model)
    with pytest.raises(MappingError, match="the file changed after its header was validated"):
        map_weights(model, path)
    assert snapshot(model) == before
    gc.collect()
    assert not [r for r in weightmap.registry.live_regions() if r.path == path]


def test_map_weights_keeps_no_descriptor_beyond_the_mapping(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_tiny(path, seed=1)
    model = meta_tiny()
    mapped = map_weights(model, path)
    # Python before 3.13 keeps a duplicate descriptor inside each mmap object for as long as it lives.
    assert fds_on(path) == (0 if sys.version_info >= (3, 13) else 1)
    del model, mapped
    gc.collect()
    assert fds_on(path) == 0


def test_a_failed_map_weights_leaves_no_descriptor_open(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_tiny(path, seed=1)
    with torch.device("meta"):
        wrong = TinyNet(width=16)
    with pytest.raises(MappingError, match="shapes must match"):
        map_weights(wrong, path)
    assert fds_on(path) == 0


ROOT = Path(__file__).resolve().parents[1]
TRUNCATE_CHILD = r"""
import os, sys, torch
from safetensors.torch import save_file
from weightmap import map_weights
page = 4096
path = sys.argv[1]
n = 3 * page // 4  # b: three pages of 2.0, the last tensor in the file
save_file({"a": torch.ones(n), "b": torch.full((n,), 2.0)}, path)
model = torch.nn.Module()
model.a = torch.nn.Parameter(torch.empty(n, device="meta"))
model.b = torch.nn.Parameter(torch.empty(n, device="meta"))
map_weights(model, path, strict=True)
b = model.b.detach()
end = os.path.getsize(path) - n * 4 // 2  # the new end: half-way through b
os.truncate(path, end)
before = n // 2  # elements of b before the new end
in_page = (-(end % page)) % page // 4  # elements after the new end in the page that holds it
print(float(b[:before].sum()), float(b[before : before + in_page].abs().sum()), in_page, flush=True)
print(float(b[-1]), flush=True)  # a page wholly past the new end
"""


def test_a_file_truncated_under_its_mapping_reads_zeros_in_the_last_page_then_sigbus(tmp_path: Path) -> None:
    # What the README says of files truncated by another process while mapped.
    done = subprocess.run([sys.executable, "-c", TRUNCATE_CHILD, str(tmp_path / "t.safetensors")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = done.stdout.split("\n")
    before, tail, in_page = lines[0].split()
    assert float(before) == 2.0 * 3 * 4096 // 4 // 2, "bytes before the new end changed"
    assert int(in_page) > 0 and float(tail) == 0.0, "the page holding the new end did not read zeros past it"
    assert done.returncode == -signal.SIGBUS, (done.returncode, done.stderr[-500:])
