"""What a release does to in-place writes, byte for byte.

Pages entirely inside the released storage revert to the file; the partial
pages at its ends, shared with its neighbours in the file, keep every write;
whatever view is passed, the whole storage is released.
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from weightmap import map_weights, release_mapped_storage, release_storage

PAGE = mmap.PAGESIZE
NAMES = ("a", "b", "c")


class Three(torch.nn.Module):
    def __init__(self, sizes: dict[str, int]) -> None:
        super().__init__()
        for name, size in sizes.items():
            self.register_buffer(name, torch.empty(size, dtype=torch.uint8, device="meta"))


def file_offsets(path: Path) -> dict[str, int]:
    """Where each tensor's bytes start in the file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {name: 8 + n + entry["data_offsets"][0] for name, entry in header.items() if name != "__metadata__"}


def mapped_three(tmp_path: Path, sizes: dict[str, int]) -> tuple[Three, dict[str, int]]:
    path = tmp_path / "three.safetensors"
    save_file({name: torch.full((size,), i + 1, dtype=torch.uint8) for i, (name, size) in enumerate(sizes.items())},
              str(path))
    model = Three(sizes)
    map_weights(model, path, strict=True)
    for i, name in enumerate(sizes):
        getattr(model, name).fill_(101 + i)
    return model, file_offsets(path)


def expected_after_release(offset: int, size: int, written: int, original: int) -> torch.Tensor:
    """Per byte: the file's value on pages entirely inside ``[offset, offset + size)``, else the write."""
    position = torch.arange(offset, offset + size)
    page_start = position // PAGE * PAGE
    inside = (page_start >= offset) & (page_start + PAGE <= offset + size)
    return torch.where(inside, torch.tensor(original, dtype=torch.uint8), torch.tensor(written, dtype=torch.uint8))


@pytest.mark.parametrize("pages", [2.5, 7.25])
def test_whole_pages_revert_and_boundary_pages_keep_the_writes(tmp_path: Path, pages: float) -> None:
    size = int(PAGE * pages)
    model, offsets = mapped_three(tmp_path, dict.fromkeys(NAMES, size))
    assert release_mapped_storage(model.b) is True
    want = expected_after_release(offsets["b"], size, written=102, original=2)
    assert torch.equal(model.b, want)
    assert 0 < int((want == 2).sum()) < size  # the file has partial pages at both ends of b
    assert bool((model.a == 101).all()) and bool((model.c == 103).all()), "a neighbour's write was lost"


def test_a_slice_view_releases_its_whole_storage(tmp_path: Path) -> None:
    size = PAGE * 6 + 100
    model, offsets = mapped_three(tmp_path, dict.fromkeys(NAMES, size))
    assert release_storage(model.b[10:20]) is True  # ten bytes named, the whole storage released
    assert torch.equal(model.b, expected_after_release(offsets["b"], size, written=102, original=2))
    assert int((model.b == 2).sum()) >= 4 * PAGE


def test_a_storage_without_a_whole_page_keeps_every_write(tmp_path: Path) -> None:
    model, _ = mapped_three(tmp_path, {"a": PAGE * 3, "b": PAGE // 2, "c": PAGE * 3})
    assert release_mapped_storage(model.b) is True  # ours, though no page lies entirely inside it
    assert bool((model.b == 102).all())
