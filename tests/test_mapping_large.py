"""Checkpoints larger than the machine's memory: mapped without being charged, read only where touched."""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import smaps_rss

from weightmap import MappingError, map_weights, release_mapped_storage

GiB = 2**30
MiB = 2**20
TOUCH = 64 * MiB
SMALL = {"layer.weight": torch.arange(16, dtype=torch.float32).reshape(4, 4), "layer.bias": torch.ones(4)}


def meminfo_bytes(field: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name == field:
                return int(rest.split()[0]) * 1024
    raise KeyError(field)


def larger_than_memory() -> int:
    """Twice RAM + swap, in whole GiB: more than the kernel's overcommit heuristic lets one private mapping have."""
    total = meminfo_bytes("MemTotal") + meminfo_bytes("SwapTotal")
    return -(-2 * total // GiB) * GiB


def write_sparse_checkpoint(path: Path, huge: int) -> int:
    """Two real tensors, then one uint8 tensor of ``huge`` bytes that is a hole in the file; returns its start."""
    entries: dict[str, object] = {}
    offset = 0
    for name, tensor in SMALL.items():
        entries[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + tensor.nbytes]}
        offset += tensor.nbytes
    entries["huge"] = {"dtype": "U8", "shape": [huge], "data_offsets": [offset, offset + huge]}
    text = json.dumps(entries).encode()
    text += b" " * (-len(text) % 8)
    data_start = 8 + len(text)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for tensor in SMALL.values():
            f.write(tensor.numpy().tobytes())
        f.truncate(data_start + offset + huge)
    return data_start + offset


class Large(torch.nn.Module):
    def __init__(self, huge: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)
        self.register_buffer("huge", torch.empty(huge, dtype=torch.uint8))


def why_the_kernel_must_refuse(size: int) -> str | None:
    """What makes a private mapping of ``size`` bytes fail here even with MAP_NORESERVE (None: nothing)."""
    with open("/proc/sys/vm/overcommit_memory") as f:
        if f.read().strip() == "2":
            return "strict overcommit accounting ignores MAP_NORESERVE"
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit != resource.RLIM_INFINITY and limit < size + 8 * GiB:
        return "the address space is limited (ulimit -v)"
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and Linux's MAP_NORESERVE")
def test_checkpoint_larger_than_memory_maps_reads_writes_and_releases(tmp_path: Path) -> None:
    huge = larger_than_memory()
    path = tmp_path / "large.safetensors"
    huge_start = write_sparse_checkpoint(path, huge)
    before = os.stat(path)
    if before.st_blocks * 512 > 64 * MiB:
        pytest.skip(f"the file system of {tmp_path} does not keep sparse files")
    with torch.device("meta"):
        model = Large(huge)

    if why_the_kernel_must_refuse(huge):
        refused = f"{path}: cannot map its {before.st_size} bytes copy-on-write: Cannot allocate memory"
        with pytest.raises(MappingError, match=refused):
            map_weights(model, path)
        assert model.huge.device.type == "meta"
        return

    mapped = map_weights(model, path, strict=True)
    assert mapped.nbytes == huge + sum(t.nbytes for t in SMALL.values())
    assert smaps_rss(path) < 2 * MiB, "mapping read the data"

    torch.testing.assert_close(model.layer.weight, SMALL["layer.weight"], rtol=0, atol=0)
    points = [0, huge // 3, huge // 2, huge - 1]
    assert [int(model.huge[i]) for i in points] == [0, 0, 0, 0]
    with torch.no_grad():
        model.layer.weight[0, 0] = 42.0
        model.huge[huge // 3] = 7
    assert int(model.huge[huge // 3]) == 7 and float(model.layer.weight.detach()[0, 0]) == 42.0

    middle = huge // 2
    assert int(model.huge[middle : middle + TOUCH].sum()) == 0  # read 64 MiB of the hole
    model.huge[huge - TOUCH :].fill_(1)  # write the last 64 MiB: private pages
    assert smaps_rss(path) >= 2 * TOUCH * 0.9

    assert release_mapped_storage(model.huge) is True
    assert smaps_rss(path) < 2 * MiB
    # Writes on pages wholly inside the tensor revert to the file. (Release rounds inward: the file,
    # and so the tensor, ends mid-page, and that last partial page keeps its write.)
    assert int(model.huge[huge // 3]) == 0 and int(model.huge[huge - TOUCH // 2]) == 0

    after = os.stat(path)
    assert (after.st_size, after.st_blocks, after.st_mtime_ns) == (before.st_size, before.st_blocks, before.st_mtime_ns)
    with open(path, "rb") as f:
        assert os.pread(f.fileno(), 1, huge_start + huge // 3) == b"\0"
        assert os.pread(f.fileno(), 64, huge_start - 80) == SMALL["layer.weight"].numpy().tobytes()


_MAP_UNDER_A_LIMIT = """
import resource, sys, torch
sys.path.insert(0, "tests")
from test_mapping_large import Large
from weightmap import MappingError, map_weights
huge, path = int(sys.argv[1]), sys.argv[2]
with torch.device("meta"):
    model = Large(huge)
with open("/proc/self/status") as f:
    used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (used + huge // 2, resource.RLIM_INFINITY))
try:
    map_weights(model, path)
except MappingError as exc:
    print("MappingError:", exc)
    print("meta" if model.huge.device.type == "meta" else "changed")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS as Linux applies it")
def test_a_mapping_the_kernel_refuses_is_a_mapping_error_naming_the_file(tmp_path: Path) -> None:
    huge = larger_than_memory()
    path = tmp_path / "large.safetensors"
    write_sparse_checkpoint(path, huge)
    result = subprocess.run(
        [sys.executable, "-c", _MAP_UNDER_A_LIMIT, str(huge), str(path)],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent.parent,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"MappingError: {path}: cannot map"), result.stdout
    assert "Cannot allocate memory" in lines[0]
    assert lines[1] == "meta"
