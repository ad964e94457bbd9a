"""repr() of MappedWeights is a short summary that reads no weight."""

from __future__ import annotations

import mmap
from pathlib import Path

import torch
from safetensors.torch import save_file
from support import smaps_rss

from weightmap import map_weights

PAGE = mmap.PAGESIZE
COUNT = 300


class Many(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        for i in range(COUNT):
            self.register_buffer(f"layer_with_a_long_name_{i:04d}", torch.empty(4 * PAGE, dtype=torch.uint8))


def test_repr_is_short_and_faults_no_page_in(tmp_path: Path) -> None:
    path = tmp_path / "many.safetensors"
    save_file({f"layer_with_a_long_name_{i:04d}": torch.full((4 * PAGE,), 1, dtype=torch.uint8)
               for i in range(COUNT)}, str(path))
    with torch.device("meta"):
        model = Many()
    mapped = map_weights(model, path, strict=True)
    resident = smaps_rss(path)
    assert resident <= 2 * PAGE  # nothing was read by mapping

    text = repr(mapped)
    assert text == (f"MappedWeights(mapped={COUNT}, copied=0, missing=0, still_meta=0, "
                    f"nbytes={COUNT * 4 * PAGE}, files=1)")
    assert str(mapped) == text and f"{mapped}" == text
    assert smaps_rss(path) == resident
    mapped.close()
    assert repr(mapped) == text
