"""Checking a tie the checkpoint holds twice reads both entries, and leaves the page cache as it was."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from pages import PAGE, cached_pages, drop_cache
from safetensors.torch import save_file
from torch import nn

from weightmap import inspect_checkpoint, map_weights, preview_mapping
from weightmap.format import read_header

ROWS, COLS = 1024, 1024  # 4 MiB a copy: past one comparison chunk's worth of pages for read-ahead to matter


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(ROWS, COLS)
        self.head = nn.Linear(COLS, ROWS, bias=False)
        self.head.weight = self.embed.weight
        self.proj_t = nn.Parameter(self.embed.weight.data.t())  # a transposed view of the same storage


def _meta() -> Tied:
    with torch.device("meta"):
        return Tied()


@pytest.fixture
def held_thrice(tmp_path: Path) -> tuple[Path, int]:
    """A checkpoint holding the tie under all three names, written back and out of the page cache."""
    weight = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(0))
    path = tmp_path / "tied.safetensors"
    save_file({"embed.weight": weight, "head.weight": weight.clone(), "proj_t": weight.t().contiguous()}, str(path))
    first_data_page = -(-read_header(path).data_start // PAGE) * PAGE  # read before the cache is emptied
    drop_cache(path)
    if cached_pages(path) != 0:
        pytest.skip("the file did not leave the page cache (fadvise DONTNEED refused here, or a tmpfs)")
    return path, first_data_page


CALLS: dict[str, Callable[[Path], object]] = {
    "preview_mapping": lambda path: preview_mapping(_meta(), path),
    "inspect_checkpoint": lambda path: inspect_checkpoint(path, _meta()),
    "map_weights": lambda path: map_weights(_meta(), path, strict=True),
}


@pytest.mark.parametrize("call", CALLS, ids=list(CALLS))
def test_the_tie_check_leaves_no_weight_in_the_page_cache(held_thrice: tuple[Path, int], call: str) -> None:
    path, first_data_page = held_thrice
    result = CALLS[call](path)
    assert cached_pages(path, first_data_page) == 0, f"{call} left pages of the data section in the page cache"
    del result


def test_pages_cached_before_the_check_stay_cached(held_thrice: tuple[Path, int]) -> None:
    path, _ = held_thrice
    path.read_bytes()  # the whole file into the page cache
    everything = cached_pages(path)
    preview_mapping(_meta(), path)
    assert cached_pages(path) == everything
