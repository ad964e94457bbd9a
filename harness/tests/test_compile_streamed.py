"""Packaged engines whose weights the harness streams into the artifact (``weights = "packaged"``).

One AOTInductor build (seconds of C++ compiling) from a mapped model serves the tests that need an
artifact; the layout, the size slot and the writer's refusals are tested without compiling.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from harness.engines.compile.compiler import EngineBuildError
from harness.engines.compile.inductor import InductorCompiler
from harness.engines.compile.streamed import BlobEntry, blob_layout, record_blob_size, write_blob
from harness.tests.fixtures import measured
from harness.tests.pages import PAGE, resident_pages
from harness.units import MIB
from weightmap import map_weights

WIDTH = 1024


class _Net(torch.nn.Module):
    """8 MiB of float32 weights in two layers, the second one's bias tied to nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.down = torch.nn.Linear(2 * WIDTH, WIDTH // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


@dataclass
class Built:
    artifact: Path
    columns: dict[str, Any]  # what the build measured
    checkpoint: Path
    inputs: Path
    expected: torch.Tensor
    weights: dict[str, torch.Tensor]
    weight_bytes: int
    resident_after_build: dict[str, int]  # each weight's pages in this process's RSS once the engine was written


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    work = tmp_path_factory.mktemp("streamed")
    torch.manual_seed(0)
    eager = _Net().eval()
    checkpoint = work / "net.safetensors"
    save_file({k: v.contiguous() for k, v in eager.state_dict().items()}, str(checkpoint))
    x = torch.randn(3, WIDTH)
    with torch.no_grad():
        expected = eager(x)
    torch.save(x, work / "x.pt")
    model = _Net().eval()
    map_weights(model, checkpoint, strict=True).close()
    program = torch.export.export(model, (x,))
    weights = dict(program.state_dict)
    compiler = InductorCompiler(weights="packaged")
    with compiler.session(work / "cache"):
        compiled = compiler.compile(program, work / "net")
    return Built(compiled.path, measured(compiled.columns), checkpoint, work / "x.pt", expected, weights,
                 sum(t.untyped_storage().nbytes() for t in weights.values()),
                 {name: resident_pages(t) for name, t in weights.items()})


def _blob(artifact: Path) -> zipfile.ZipInfo:
    with zipfile.ZipFile(artifact) as zf:
        (info,) = [i for i in zf.infolist() if i.filename.endswith("_weights.blob")]
    return info


def _data_offset(artifact: Path, info: zipfile.ZipInfo) -> int:
    with open(artifact, "rb") as f:
        f.seek(info.header_offset)
        header = f.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def test_the_weights_are_in_the_artifact_once_stored_and_mappable(built: Built) -> None:
    info = _blob(built.artifact)
    assert info.compress_type == zipfile.ZIP_STORED
    assert built.weight_bytes <= info.file_size < built.weight_bytes + 64 * len(built.weights)
    assert _data_offset(built.artifact, info) % PAGE == 0
    with zipfile.ZipFile(built.artifact) as zf:
        (so,) = [i for i in zf.infolist() if i.filename.endswith(".wrapper.so")]
        blob = zf.read(info)
    # The shared library holds no weight: it is smaller than the smallest weight matrix.
    assert so.file_size < built.weights["down.weight"].untyped_storage().nbytes()
    # Each weight's bytes are in the blob, as the engine's layout puts them.
    for name, tensor in built.weights.items():
        assert tensor.contiguous().view(torch.uint8).numpy().tobytes() in blob, name


def test_the_build_measures_the_compile_and_the_write_apart(built: Built) -> None:
    columns = built.columns
    assert set(columns) == {"compile_hwm_bytes", "write_rss_bytes", "write_peak_bytes", "write_read_bytes"}
    assert columns["write_rss_bytes"] <= columns["write_peak_bytes"]
    # every weight is read while written, but never all at once: 8 MiB written from 16 MiB chunks of mapped
    # pages, each dropped once written, so at most the largest weight is resident at a time
    largest = max(t.untyped_storage().nbytes() for t in built.weights.values())
    # (file-backed RSS also counts the pages of code the write runs for the first time: a few hundred KiB)
    assert 0 < columns["write_read_bytes"] <= largest + MIB


def test_the_written_weights_pages_are_dropped_from_the_build(built: Built) -> None:
    # Writing read every page of every weight; at most the two partial pages at a weight's ends stay
    # (they are its neighbours' too, so a release keeps them: weightmap.release_mapped_storage).
    assert all(n <= 2 for n in built.resident_after_build.values()), built.resident_after_build
    assert built.weights["up.weight"].untyped_storage().nbytes() // PAGE > 1000


LOADS_ALONE = """
import sys, torch
engine = torch._inductor.aoti_load_package(sys.argv[1])
out = engine(torch.load(sys.argv[2]))
torch.save(out[0] if isinstance(out, (list, tuple)) else out, sys.argv[3])
"""


def test_the_artifact_loads_and_runs_alone_in_a_fresh_process(built: Built, tmp_path: Path) -> None:
    # Only the artifact travels: the checkpoint the weights were streamed from is gone.
    alone = tmp_path / "elsewhere" / "net.pt2"
    alone.parent.mkdir()
    shutil.copy(built.artifact, alone)
    moved = built.checkpoint.rename(built.checkpoint.with_suffix(".away"))
    try:
        out = tmp_path / "out.pt"
        subprocess.run([sys.executable, "-c", textwrap.dedent(LOADS_ALONE), str(alone), str(built.inputs), str(out)],
                       check=True, cwd=tmp_path, timeout=300)
    finally:
        moved.rename(built.checkpoint)
    torch.testing.assert_close(torch.load(out), built.expected)


WRAPPER = """
  constants_info_[0].name = "up_weight";
  constants_info_[0].dtype = static_cast<int32_t>(cached_torch_dtype_float32);
  constants_info_[0].offset = 0;
  constants_info_[0].data_size = 128;
  constants_info_[0].from_folded = false;
  constants_info_[0].original_fqn = "up.weight";
  constants_info_[1].name = "_FOLDED_CONST_x";
  constants_info_[1].offset = 0;
  constants_info_[1].data_size = 64;
  constants_info_[1].from_folded = true;
  constants_info_[1].original_fqn = "x";
  constants_info_[2].name = "up_bias";
  constants_info_[2].offset = 2;
  constants_info_[2].data_size = 64;
  constants_info_[2].from_folded = false;
  constants_info_[2].original_fqn = "up.bias";
"""


def test_the_blob_layout_is_the_wrappers_order_without_folded_constants(tmp_path: Path) -> None:
    path = tmp_path / "x.wrapper.cpp"
    path.write_text(WRAPPER)
    assert blob_layout(path) == [BlobEntry(0, "up_weight", "up.weight", 128, 0),
                                 BlobEntry(2, "up_bias", "up.bias", 64, 2)]
    path.write_text(WRAPPER.replace('  constants_info_[2].data_size = 64;\n', ""))
    with pytest.raises(EngineBuildError, match=r"x.wrapper.cpp: constants_info_\[2\] has no data_size"):
        blob_layout(path)


def test_a_blob_is_streamed_in_order_padded_and_aligned(tmp_path: Path) -> None:
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("a/first", b"x" * 100)
    a, b = torch.arange(24, dtype=torch.float32), torch.arange(5, dtype=torch.int16)
    layout = [BlobEntry(0, "b", "b", 64, 0), BlobEntry(1, "a", "a", 128, 0)]
    stats = write_blob(archive, "a/w_weights.blob", layout, {"a": a, "b": b}, chunk_bytes=40)
    assert (stats.nbytes, stats.chunks) == (192, 1 + 3)
    data = zipfile.ZipFile(archive).read("a/w_weights.blob")
    assert data == b.numpy().tobytes() + bytes(54) + a.numpy().tobytes() + bytes(32)
    assert zipfile.ZipFile(archive).read("a/first") == b"x" * 100
    assert _data_offset(archive, _blob_named(archive, "a/w_weights.blob")) % 4096 == 0


def test_a_mapped_weight_is_written_with_a_chunk_of_it_resident_at_a_time(tmp_path: Path) -> None:
    checkpoint = tmp_path / "w.safetensors"
    save_file({"w": torch.randn(8 * MIB)}, str(checkpoint))  # 32 MiB
    holder = torch.nn.Module()
    holder.register_buffer("w", torch.empty(8 * MIB, device="meta"))
    map_weights(holder, checkpoint, strict=True).close()
    weight = holder.get_buffer("w")
    archive = tmp_path / "a.zip"
    for _ in range(2):  # the first write runs code for the first time, whose pages are file-backed RSS too
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr("a/first", b"x")
        write_blob(archive, "a/w_weights.blob", [BlobEntry(0, "w", "w", 64, 0)], {"w": torch.ones(16)})
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("a/first", b"x")
    stats = write_blob(archive, "a/w_weights.blob", [BlobEntry(0, "w", "w", 32 * MIB, 0)], {"w": weight},
                       chunk_bytes=MIB)
    assert (stats.chunks, stats.released) == (32, 32)
    # the weights read: a chunk's pages at a time (each dropped once written), not the weight; a fault maps
    # the page cache's whole folio, and a kernel with large folios holds up to 2 MiB in one, so a chunk
    # brings in up to a folio more at either end
    assert MIB // 2 <= stats.peak_read_bytes <= 5 * MIB + MIB // 2, stats
    assert stats.rss_start_bytes <= stats.peak_rss_bytes <= stats.rss_start_bytes + 6 * MIB, stats
    assert resident_pages(weight) <= 2


def _blob_named(archive: Path, name: str) -> zipfile.ZipInfo:
    with zipfile.ZipFile(archive) as zf:
        return zf.getinfo(name)


def test_a_weight_missing_or_laid_out_otherwise_is_refused_before_writing(tmp_path: Path) -> None:
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("a/first", b"x")
    before = archive.read_bytes()
    wide = torch.zeros(64)
    layout = [BlobEntry(0, "w", "w", 128, 0), BlobEntry(1, "v", "v", 64, 0), BlobEntry(2, "s", "s", 64, 3)]
    with pytest.raises(EngineBuildError) as caught:
        write_blob(archive, "a/w_weights.blob", layout, {"w": wide, "s": torch.zeros(8)[3:]})
    message = str(caught.value)
    assert message.startswith("a.zip: cannot write the engine's weights: ")
    assert "w: built for storage offset 0 and 128 bytes, the tensor has 0 and 256" in message
    assert "v: the engine needs it but the partition has no such tensor" in message
    assert "s: built for storage offset 3" not in message  # offset 3 and 32 bytes fit
    assert archive.read_bytes() == before


def test_the_size_slot_is_refused_where_it_is_not_an_empty_external_blobs(built: Built, tmp_path: Path) -> None:
    with pytest.raises(EngineBuildError, match=r"true: no (symbol table|_binary_constants_bin_start)"):
        record_blob_size(shutil.copy(shutil.which("true") or "/bin/true", tmp_path / "true"), 8)
    with zipfile.ZipFile(built.artifact) as zf:
        (so,) = [n for n in zf.namelist() if n.endswith(".wrapper.so")]
        library = tmp_path / "engine.so"
        library.write_bytes(zf.read(so))
    # The built engine's slot already holds its blob's size.
    with pytest.raises(EngineBuildError, match="already holds a size"):
        record_blob_size(library, 8)
