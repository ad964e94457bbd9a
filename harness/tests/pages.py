"""How much of a tensor's storage is in this process's memory, for the tests of dropped pages."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import psutil
import pytest
import torch

PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_pages(t: torch.Tensor) -> int:
    """Pages of a tensor's storage in this process's RSS (``/proc/self/pagemap``)."""
    storage = t.untyped_storage()
    first, last = storage.data_ptr() // PAGE, (storage.data_ptr() + storage.nbytes() - 1) // PAGE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        raw = f.read((last - first + 1) * 8)
    return sum(1 for (e,) in struct.iter_unpack("<Q", raw) if e >> 63)


def skip_if_in_memory(path: Path) -> None:
    """Skip the test where ``path`` lies on tmpfs or ramfs: such files have no page cache to drop."""
    target = os.path.realpath(path)
    mounts = [p for p in psutil.disk_partitions(all=True)
              if target == p.mountpoint or target.startswith(p.mountpoint.rstrip("/") + "/")]
    if mounts and max(mounts, key=lambda p: len(p.mountpoint)).fstype in ("tmpfs", "ramfs"):
        pytest.skip(f"{path} is in memory: its page cache cannot be dropped")
