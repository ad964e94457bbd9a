"""inspect_checkpoint and `python -m weightmap inspect`: what a checkpoint holds, from its headers alone."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pages import PAGE, cached_pages, drop_cache
from safetensors.torch import save_file
from support import TinyNet, seeded

from weightmap import HeaderError, inspect_checkpoint, save_weights_for_mapping
from weightmap.cli import main

ROOT = Path(__file__).resolve().parent.parent
PI05_SPEC = ROOT / "harness" / "specs" / "pi05.json"
_CODES = {"bfloat16": "BF16", "float32": "F32", "float16": "F16", "int64": "I64"}
_SIZES = {"bfloat16": 2, "float32": 4, "float16": 2, "int64": 8}

FACTORY = '''
import torch
from torch import nn


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.blocks = nn.ModuleList([nn.Linear(32, 32, dtype=torch.bfloat16)])
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 64, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("inv_freq", torch.arange(16.0), persistent=False)


def build():
    return Small()


def broken():
    raise RuntimeError("no config")
'''


def sparse_checkpoint(path: Path, tensors: list[tuple[str, str, list[int]]]) -> int:
    """A valid safetensors file whose data section is a hole: full size, no disk used. Returns the data start."""
    ordered = sorted(tensors, key=lambda t: (-_SIZES[t[1]], t[0]))
    document: dict[str, object] = {"__metadata__": {"format": "pt"}}
    position = 0
    for name, dtype, shape in ordered:
        size = math.prod(shape) * _SIZES[dtype]
        document[name] = {"dtype": _CODES[dtype], "shape": shape, "data_offsets": [position, position + size]}
        position += size
    raw = json.dumps(document, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + position)
    return 8 + len(raw)


def pi05_tensors() -> list[tuple[str, str, list[int]]]:
    spec = json.loads(PI05_SPEC.read_text())
    return [(t["name"], t["dtype"], t["shape"]) for t in spec["tensors"] if t["kind"] != "buffer"]


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return save_weights_for_mapping(seeded(TinyNet()), tmp_path / "tiny.safetensors")


def test_summary_of_one_file(tiny: Path) -> None:
    report = inspect_checkpoint(tiny)
    assert report.tensors == 10 and report.misaligned == [] and report.index is None
    assert [(d.code, d.tensors) for d in report.dtypes] == [("F32", 10)]
    assert report.nbytes == sum(t.nbytes for t in seeded(TinyNet()).state_dict().values()) - 64 * 32 * 4
    (file,) = report.files
    assert file.size == tiny.stat().st_size and file.header_bytes + file.nbytes == file.size
    text = report.to_text()
    assert f"header      {file.header_bytes:,} bytes" in text
    assert "every tensor starts at a multiple of its item size" in text
    assert "dtypes      F32" in text and "10 tensors" in text


def test_misaligned_tensors_are_named(tmp_path: Path) -> None:
    path = tmp_path / "old.safetensors"
    header = {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
              "w": {"dtype": "F32", "shape": [4], "data_offsets": [1, 17]}}
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(17))
    report = inspect_checkpoint(path)
    assert report.misaligned == ["w"]
    text = report.to_text()
    assert "1 tensor is at an offset that is not a multiple of its item size" in text
    assert "w: F32 at offset" in text


def test_sharded_checkpoint_lists_its_shards(tmp_path: Path) -> None:
    folder = tmp_path / "sharded"
    folder.mkdir()
    save_file({"a": torch.ones(4), "b": torch.ones(2, dtype=torch.bfloat16)}, str(folder / "m-1.safetensors"))
    save_file({"c": torch.ones(3, dtype=torch.int64)}, str(folder / "m-2.safetensors"))
    weight_map = {"a": "m-1.safetensors", "b": "m-1.safetensors", "c": "m-2.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for source in (folder, folder / "model.safetensors.index.json"):
        report = inspect_checkpoint(source)
        assert report.tensors == 3 and len(report.files) == 2
        assert {d.code: d.nbytes for d in report.dtypes} == {"F32": 16, "BF16": 4, "I64": 24}
        text = report.to_text()
        assert "index       model.safetensors.index.json: 2 shards" in text
        assert "m-1.safetensors: 2 tensors" in text and "m-2.safetensors: 1 tensor," in text


THREAD_IO = Path("/proc/thread-self/io")


def thread_reads() -> tuple[int, int]:
    """(bytes, calls) this thread has read through read system calls so far (``rchar``, ``syscr``)."""
    fields = dict(line.split(": ", 1) for line in THREAD_IO.read_text().splitlines())
    return int(fields["rchar"]), int(fields["syscr"])


def test_pi05_sized_checkpoint_reads_its_header_and_no_weight(tmp_path: Path) -> None:
    if not THREAD_IO.exists():
        pytest.skip(f"{THREAD_IO}: missing (a kernel without per-task I/O accounting)")
    path = tmp_path / "pi05.safetensors"
    data_start = sparse_checkpoint(path, pi05_tensors())
    assert path.stat().st_size > 9 * 10**9
    drop_cache(path)
    first_data_page = -(-data_start // PAGE) * PAGE
    start = thread_reads()
    between = thread_reads()  # what reading the counters costs, taken off below
    report = inspect_checkpoint(path)
    end = thread_reads()
    read_bytes = (end[0] - between[0]) - (between[0] - start[0])
    read_calls = (end[1] - between[1]) - (between[1] - start[1])
    assert report.tensors == 813 and report.nbytes == 9_353_911_360
    # The header's bytes (up to a few digits more in the counters' own text), in a read or two.
    assert data_start <= read_bytes <= data_start + 16, f"inspect read {read_bytes} bytes; the header is {data_start}"
    assert 1 <= read_calls <= 3, f"inspect made {read_calls} read calls"
    assert cached_pages(path, first_data_page) == 0, "inspect brought pages of the data section into the cache"
    assert cached_pages(path, 0, data_start) > 0  # the header itself was read


def test_model_fit_reads_no_weight_either(tmp_path: Path) -> None:
    path = tmp_path / "pi05.safetensors"
    tensors = pi05_tensors()
    data_start = sparse_checkpoint(path, tensors)
    drop_cache(path)
    wanted = {name: (dtype, shape) for name, dtype, shape in tensors}

    class Spec(torch.nn.Module):  # every tensor as a flat parameter list, on meta
        def __init__(self) -> None:
            super().__init__()
            self.params = torch.nn.ParameterDict({
                name.replace(".", "/"): torch.nn.Parameter(torch.empty(shape, dtype=getattr(torch, dtype)))
                for name, (dtype, shape) in list(wanted.items())[:50]
            })

    from weightmap import init_empty_weights

    with init_empty_weights():
        model = Spec()
    report = inspect_checkpoint(path, model, key_map=lambda n: n.removeprefix("params.").replace("/", "."))
    assert report.fit is not None and len(report.fit.mapped) == 50 and not report.fit.copied
    assert len(report.fit.unused) == 813 - 50
    assert cached_pages(path, -(-data_start // PAGE) * PAGE) == 0


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weightmap", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_cli_inspect_with_a_model(tiny: Path, tmp_path: Path) -> None:
    factory = tmp_path / "models.py"
    factory.write_text(FACTORY)
    result = run_cli("inspect", tiny, "--model", f"{factory}:build")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "what map_weights would do (no weight read)" in out
    assert "copy      2 tensors, 2.06 KiB of new memory" in out
    assert "blocks.0.weight: dtype torch.float32 in the checkpoint, torch.bfloat16 in the model" in out
    assert "missing   none" in out and "none left on the meta device" in out
    assert "computed  1 non-persistent buffer as the model computed it: inv_freq" in out
    assert "unused    5 checkpoint tensors no model tensor takes: " in out and "scale" in out
    assert "would refuse: 2 problems" in out


def test_cli_inspect_json_and_tensor_list(tiny: Path) -> None:
    assert main(["inspect", str(tiny), "--json"]) == 0
    result = run_cli("inspect", tiny, "--json")
    data = json.loads(result.stdout)
    assert data["tensors"]["embed.weight"] == {"dtype": "F32", "shape": [64, 32], "offset": data["tensors"][
        "embed.weight"]["offset"], "nbytes": 64 * 32 * 4}
    listed = run_cli("inspect", tiny, "--tensors").stdout
    assert "  embed.weight  F32  [64, 32]" in listed


@pytest.mark.parametrize("case", ["missing", "text", "truncated", "model", "factory"])
def test_cli_errors_are_one_line_and_exit_2(case: str, tiny: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    factory = tmp_path / "models.py"
    factory.write_text(FACTORY)
    bad = tmp_path / "bad.safetensors"
    args = {
        "missing": [str(tmp_path / "nope.safetensors")],
        "text": [str(factory)],
        "truncated": [str(bad)],
        "model": [str(tiny), "--model", f"{factory}:broken"],
        "factory": [str(tiny), "--model", "no_such_module_here:build"],
    }[case]
    bad.write_bytes(tiny.read_bytes()[:100])
    assert main(["inspect", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    expected = {"missing": "nope.safetensors", "text": "not a safetensors file", "truncated": str(bad),
                "model": "building the model failed: RuntimeError: no config",
                "factory": "cannot import 'no_such_module_here'"}[case]
    assert expected in err


def test_header_errors_are_the_librarys(tmp_path: Path) -> None:
    path = tmp_path / "holes.safetensors"
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}}
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(20))
    with pytest.raises(HeaderError, match=str(path)):
        inspect_checkpoint(path)


def test_inspect_leaves_no_descriptor_open(tiny: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        inspect_checkpoint(tiny)
    assert len(os.listdir("/proc/self/fd")) == before
