"""Header reading/validation (weightmap.format) and the streaming writer (weightmap.streamwrite)."""

from __future__ import annotations

import gzip
import json
import mmap
import os
import pickle
import struct
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from support import returned_or_raised

from weightmap.errors import HeaderError, MappingError
from weightmap.format import (
    DTYPE_CODES,
    DTYPES,
    MAX_HEADER_BYTES,
    Header,
    check_little_endian,
    parse_header,
    read_header,
)
from weightmap.streamwrite import TensorSpec, write_checkpoint

NAME = "bad.safetensors"


def pack(header: Any, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file's bytes: length prefix, header (dict, str or bytes), data."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode("utf-8")
    return struct.pack("<Q", len(header) if length is None else length) + header + data


def raw_bytes(t: torch.Tensor) -> bytes:
    """The tensor's bytes as stored (little-endian, row-major)."""
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def entry(dtype: Any, shape: Any, begin: Any, end: Any) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def sample_tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=gen)
    tensors = {
        "f64": base.double(),
        "f32": base,
        "f16": base.half()[:3],
        "bf16": base.bfloat16().t().contiguous(),
        "i64": torch.arange(5, dtype=torch.int64),
        "i32": torch.arange(-3, 4, dtype=torch.int32),
        "i16": torch.arange(9, dtype=torch.int16).reshape(3, 3),
        "i8": torch.arange(-4, 3, dtype=torch.int8),
        "u8": torch.arange(11, dtype=torch.uint8),
        "bool": base[0] > 0,
        "f8e4m3": base.to(torch.float8_e4m3fn),
        "f8e5m2": base[1].to(torch.float8_e5m2),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 7),
        "empty_bf16": torch.zeros(3, 0, dtype=torch.bfloat16),
    }
    for attr in ("uint16", "uint32", "uint64"):
        if hasattr(torch, attr):
            tensors[attr] = torch.arange(6, dtype=torch.int32).to(getattr(torch, attr))
    return tensors


def specs_of(tensors: dict[str, torch.Tensor]) -> list[TensorSpec]:
    return [TensorSpec(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]


def safetensors_accepts(path: Path) -> bool:
    try:
        with safe_open(str(path), "pt") as f:
            list(f.keys())
    except Exception:
        return False
    return True


# --------------------------------------------------------------------------- dtypes


def test_dtype_tables_are_inverse_and_cover_the_common_codes() -> None:
    common = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2"}
    assert common <= set(DTYPES)
    assert DTYPES["BF16"] is torch.bfloat16 and DTYPES["F8_E4M3"] is torch.float8_e4m3fn
    assert {code: dtype for dtype, code in DTYPE_CODES.items()} == DTYPES
    if hasattr(torch, "uint16"):
        assert DTYPES["U16"] is torch.uint16 and DTYPES["U64"] is torch.uint64


# --------------------------------------------------------------------------- reading


def test_save_file_headers_agree_with_safe_open(tmp_path: Path) -> None:
    tensors = sample_tensors()
    path = tmp_path / "ref.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt", "note": "ünïcode"})
    header = read_header(path)
    blob = path.read_bytes()

    assert header.path == path and header.file_size == len(blob)
    assert header.data_start == 8 + struct.unpack("<Q", blob[:8])[0]
    with safe_open(str(path), "pt") as f:
        assert header.metadata == f.metadata() == {"format": "pt", "note": "ünïcode"}
        assert set(header.tensors) == set(f.keys()) == set(tensors)
        for name, e in header.tensors.items():
            reference = f.get_tensor(name)
            assert e.name == name
            assert e.dtype == reference.dtype == tensors[name].dtype
            assert e.shape == tuple(reference.shape) == tuple(tensors[name].shape)
            assert e.numel == reference.numel() and e.nbytes == e.end - e.start
            assert blob[e.start : e.end] == raw_bytes(reference) == raw_bytes(tensors[name]), name
    starts = [e.start for e in header.tensors.values()]
    assert starts == sorted(starts), "tensors must be ordered by start offset"
    assert parse_header(blob, len(blob), path) == header


def test_parse_header_ignores_bytes_after_the_header_and_takes_any_buffer() -> None:
    raw = pack({"w": entry("F32", [2], 0, 8)}, b"\0" * 8)
    header = parse_header(bytearray(raw[:-3]), len(raw), NAME)
    assert header.tensors["w"].start == len(raw) - 8 and header.tensors["w"].end == len(raw)
    assert parse_header(memoryview(raw), len(raw), NAME) == header


OK_SPACES = '  \n{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}\t  '


@pytest.mark.parametrize(
    ("header", "data"),
    [
        pytest.param("{}", b"", id="empty header, no data"),
        pytest.param(OK_SPACES, b"\0" * 8, id="whitespace"),
        pytest.param({"__metadata__": None, "w": entry("I8", [], 0, 1)}, b"\0", id="metadata null, scalar"),
        pytest.param({"z": entry("F32", [0], 0, 0), "w": entry("F32", [1], 0, 4)}, bytes(4), id="zero first"),
        pytest.param({"w": entry("F32", [1], 0, 4), "z": entry("F32", [0], 4, 4)}, b"\0" * 4, id="zero last"),
        pytest.param({"a": entry("U8", [0], 0, 0), "b": entry("BF16", [9, 0], 0, 0)}, b"", id="zero only"),
        pytest.param({"w": entry("F32", [2**62, 3, 0], 0, 0)}, b"", id="zero-size, product in range"),
        pytest.param('{"\\u0077":{"data_offsets":[0,4],"shape":[1],"dtype":"F32"}}', bytes(4),
                     id="escaped name, any order"),
        pytest.param(' {\n "w" : { "dtype" : "U8" , "shape" : [ 2 , 1 ] , "data_offsets" : [ 0 , 2 ] } ,\n'
                     ' "__metadata__" : { "a\\n" : "\\u00e9\\ud83d\\ude00" } }\n', b"\0\0", id="spaces everywhere"),
        pytest.param({"w": entry("U8", [1] * 64, 0, 1)}, b"\0", id="64 dimensions, the most accepted"),
        pytest.param({"w": entry("F64", [0, 2**62, 7], 0, 0)}, b"", id="zero-size, 0 first"),
        pytest.param({"w": entry("U8", [2**63 - 1, 2, 0], 0, 0)}, b"", id="zero-size, product below 2**64"),
    ],
)
def test_valid_edge_cases_are_accepted_like_safetensors(header: Any, data: bytes, tmp_path: Path) -> None:
    raw = pack(header, data)
    parsed = parse_header(raw, len(raw), NAME)
    assert sum(e.nbytes for e in parsed.tensors.values()) == len(data)
    path = tmp_path / "ok.safetensors"
    path.write_bytes(raw)
    assert safetensors_accepts(path)


@pytest.mark.parametrize(
    ("header", "order"),
    [
        ({"c": entry("U8", [2], 6, 8), "a": entry("F32", [1], 0, 4), "z": entry("U8", [0], 4, 4),
          "b": entry("U8", [2], 4, 6)}, ["a", "z", "b", "c"]),
        ({"a": entry("F32", [1], 0, 4), "z": entry("U8", [0], 4, 4), "y": entry("U8", [0], 4, 4),
          "b": entry("U8", [4], 4, 8)}, ["a", "y", "z", "b"]),
        ({"a": entry("F32", [1], 0, 4), "b": entry("U8", [4], 4, 8), "z": entry("U8", [0], 4, 4)},
         ["a", "z", "b"]),
        ({"a": entry("F32", [1], 0, 4), "b": entry("U8", [4], 4, 8), "z": entry("U8", [0], 8, 8)},
         ["a", "b", "z"]),
    ],
)
def test_tensors_are_ordered_by_offset_then_name_whatever_the_json_order(
    header: dict[str, Any], order: list[str]
) -> None:
    raw = pack(header, bytes(8))
    parsed = parse_header(raw, len(raw), NAME)
    assert list(parsed.tensors) == order
    assert all(e.start == e.end for e in parsed.tensors.values() if e.nbytes == 0)


def test_metadata_null_reads_as_none_and_empty_header_has_no_tensors() -> None:
    raw = pack({"__metadata__": None})
    header = parse_header(raw, len(raw), NAME)
    assert header.metadata is None and header.tensors == {}


W8 = {"w": entry("F32", [2], 0, 8)}
Z8 = b"\0" * 8
BIG_INT = "9" * 5000
ONE_W = '"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}'
TWO_W = "{" + ONE_W + "," + ONE_W + "}"


def case(label: str, raw: bytes, pattern: str, *, size: int | None = None, reference: bool = True) -> Any:
    """A malformed file: its bytes, the file size (default len(raw)), the message pattern, and
    whether safetensors' reader rejects it too (False for the rules weightmap adds)."""
    return pytest.param(raw, size, pattern, reference, id=label)


MALFORMED = [
    case("too short", b"\x02\0\0", "too short for the 8-byte header length"),
    case("empty file", b"", "0 bytes, too short"),
    case("oversized length", pack("{}", length=MAX_HEADER_BYTES + 1),
         "over the limit", size=2 * MAX_HEADER_BYTES),
    case("length past EOF", pack("{}", length=100), "runs past the end of the file"),
    case("huge length", pack("{}", length=2**64 - 1), "over the limit"),
    case("not utf-8", pack(b'{"w\xff":1}'), "not valid UTF-8"),
    case("not json", pack("{not json"), "not valid JSON"),
    case("trailing garbage", pack("{}  x"), "not valid JSON"),
    case("trailing nul padding", pack("{}\0\0"), "not valid JSON"),
    case("not an object", pack("[1, 2]"), "not an object"),
    case("string header", pack('"hi"'), "not an object"),
    case("nan constant", pack('{"w":{"dtype":"F32","shape":[NaN],"data_offsets":[0,4]}}', b"\0" * 4),
         "tensor 'w': shape must be a list of non-negative integers, got \\[NaN\\]$"),
    case("metadata value int", pack({"__metadata__": {"k": 1}, **W8}, Z8),
         "__metadata__ value for key 'k' is not a string"),
    case("metadata list", pack({"__metadata__": ["k"], **W8}, Z8), "__metadata__ must be an object"),
    case("metadata string", pack({"__metadata__": "k", **W8}, Z8), "__metadata__ must be an object"),
    case("entry not object", pack({"w": [1, 2]}), "tensor 'w': entry must be an object"),
    case("missing field", pack({"w": {"dtype": "F32", "shape": [0]}}),
         "tensor 'w': entry lacks field.*data_offsets"),
    case("unknown field", pack({"w": {**entry("F32", [2], 0, 8), "extra": 1}}, Z8),
         "tensor 'w': entry has unknown field.*extra", reference=False),
    case("unknown dtype", pack({"w": entry("F128", [1], 0, 16)}, Z8 * 2), "tensor 'w': unknown dtype 'F128'"),
    case("dtype not string", pack({"w": entry(4, [1], 0, 4)}, b"\0" * 4),
         "tensor 'w': dtype must be a string"),
    case("shape not list", pack({"w": entry("F32", 2, 0, 8)}, Z8), "tensor 'w': shape must be a list"),
    case("bool in shape", pack({"w": entry("F32", [True], 0, 4)}, b"\0" * 4), "tensor 'w': shape must be"),
    case("float in shape", pack({"w": entry("F32", [2.0], 0, 8)}, Z8), "tensor 'w': shape must be"),
    case("negative dim", pack({"w": entry("F32", [-2], 0, 8)}, Z8), "tensor 'w': shape must be"),
    case("dim over int64", pack({"w": entry("F32", [2**63, 0], 0, 0)}),
         "tensor 'w': .*2\\*\\*63", reference=False),
    case("huge digits", pack('{"w":{"dtype":"F32","shape":[' + BIG_INT + '],"data_offsets":[0,4]}}'),
         "tensor 'w': shape must be .*: an integer of 5000 digits is out of the 64-bit range"),
    case("21 digits", pack({"w": entry("F32", [0], 0, 10**20)}),
         "tensor 'w': data_offsets must be .*: an integer of 21 digits is out of the 64-bit range"),
    case("object in shape", pack({"w": entry("F32", [{}, [1]], 0, 4)}, bytes(4)),
         "shape must be .*got \\[\\{\\}, \\[1\\]\\]$"),
    case("negative offset", pack({"w": entry("F32", [2], -1, 7)}, Z8),
         "tensor 'w': data_offsets must be \\[begin, end\\] of non-negative"),
    case("float offset", pack({"w": entry("F32", [2], 0, 8.0)}, Z8), "tensor 'w': data_offsets must be"),
    case("bool offset", pack({"w": entry("U8", [1], False, True)}, b"\0"),
         "tensor 'w': data_offsets must be"),
    case("three offsets", pack({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 8]}}, Z8),
         "tensor 'w': data_offsets must be"),
    case("begin > end", pack({"w": entry("F32", [0], 8, 0)}, Z8),
         "tensor 'w': .*begin 8 is greater than end 0"),
    case("out of bounds", pack({"w": entry("F32", [4], 0, 16)}, Z8),
         "tensor 'w': data_offsets end 16 is past the end of the 8-byte data section"),
    case("hole between", pack({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 12, 20)}, b"\0" * 20),
         "tensor 'b': hole of 4 bytes after tensor 'a'"),
    case("hole at start", pack({"a": entry("F32", [2], 4, 12)}, b"\0" * 12),
         "tensor 'a': hole of 4 bytes at the start"),
    case("overlap", pack({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, b"\0" * 12),
         "tensor 'b': .*overlap tensor 'a'"),
    case("zero-size inside another", pack({"a": entry("F32", [2], 0, 8), "z": entry("F32", [0], 4, 4)}, Z8),
         "tensor 'z': .*overlap tensor 'a'"),
    case("data not covered", pack(W8, b"\0" * 12),
         "not covered exactly: it is 12 bytes but the last tensor 'w' ends at 8"),
    case("data but no tensors", pack("{}", b"\0" * 4), "not covered exactly.*no tensor"),
    case("size mismatch", pack({"w": entry("F32", [3], 0, 8)}, Z8),
         "tensor 'w': data_offsets span 8 bytes but shape \\[3\\] of F32 needs 12 bytes"),
    case("size mismatch bf16", pack({"w": entry("BF16", [2, 2], 0, 4)}, b"\0" * 4),
         "tensor 'w': .*needs 8 bytes"),
    case("product overflows u64", pack({"w": entry("F64", [2**62, 2**62, 2**40], 0, 8)}, Z8),
         "tensor 'w': .*product of its dimensions exceeds 2\\*\\*64 - 1 at dimension 1$"),
    case("zero-size overflow", pack({"w": entry("F32", [2**62, 7, 0], 0, 0)}),
         "tensor 'w': .*exceeds 2\\*\\*64 - 1 at dimension 1 \\(a later dimension is 0"),
    case("zero-size overflow at 2**64", pack({"w": entry("U8", [2**32, 2**32, 0], 0, 0)}),
         "tensor 'w': .*exceeds 2\\*\\*64 - 1 at dimension 1 \\(a later dimension is 0"),
    case("elements times bits overflow", pack({"w": entry("F64", [2**61], 0, 8)}, Z8),
         "tensor 'w': .*2305843009213693952 elements of 8 bytes exceed 2\\*\\*64 - 1 bits"),
    case("-0 dimension", pack('{"w":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}}'),
         "tensor 'w': shape must be a list of non-negative integers"),
    case("-0 dimension among others", pack('{"w":{"dtype":"F32","shape":[2,-0],"data_offsets":[0,0]}}'),
         "tensor 'w': shape must be a list of non-negative integers"),
    case("-0 offset", pack('{"w":{"dtype":"F32","shape":[0],"data_offsets":[-0,0]}}'),
         "tensor 'w': data_offsets must be \\[begin, end\\] of non-negative integers"),
    case("duplicate name", pack(TWO_W, b"\0"), "tensor 'w': name appears twice", reference=False),
    case("65 dimensions", pack({"w": entry("U8", [1] * 65, 0, 1)}, b"\0"),
         "tensor 'w': shape has more than 64 dimensions, the most this reader accepts$", reference=False),
    case("40000 dimensions", pack({"w": entry("U8", [1] * 40_000, 0, 1)}, b"\0"),
         "tensor 'w': shape has more than 64 dimensions", reference=False),
    case("duplicate field", pack('{"w":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"),
         "tensor 'w': entry: key 'dtype' is given twice"),
    case("duplicate metadata", pack('{"__metadata__":{},"__metadata__":{}}'), "__metadata__ is given twice",
         reference=False),
    case("lone surrogate name", pack('{"\\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"),
         "tensor name is not valid UTF-8"),
    case("lone surrogate metadata", pack('{"__metadata__":{"\\udfff":"v"}}'),
         "__metadata__ key is not valid UTF-8"),
    case("deep nesting", pack("[" * 100_000 + "]" * 100_000), "header JSON is not an object: it starts with \\[\\[\\["),
    case("deep nesting in an entry", pack('{"w":' + "[" * 100_000 + "]" * 100_000 + "}"),
         "tensor 'w': entry must be an object .*got \\[\\[\\[\\[.*\\.\\.\\.$"),
    case("deep nesting in a shape", pack('{"w":{"dtype":"F32","shape":' + "[" * 100_000 + "]" * 100_000 + "}}"),
         "tensor 'w': shape must be a list of non-negative integers, got \\[\\[\\["),
    case("deep nesting in metadata", pack('{"__metadata__":{"a":"b","k":' + "{" * 100_000 + "}" * 100_000 + "}}"),
         "__metadata__ value for key 'k' is not a string: \\{\\{\\{"),
    case("objects in metadata", pack('{"__metadata__":{"k":[{},{},{}]}}'),
         "__metadata__ value for key 'k' is not a string: \\[\\{\\},\\{\\},\\{\\}\\]$"),
    case("null metadata value", pack('{"__metadata__":{"k":"v","n":null}}'),
         "__metadata__ value for key 'n' is not a string: null$"),
    case("tensor named __metadata__", pack({"__metadata__": entry("U8", [1], 0, 1)}, b"\0"),
         "__metadata__ value for key 'shape' is not a string"),
    case("duplicate metadata key", pack('{"__metadata__":{"k":"a","k":"b"}}'),
         "__metadata__: key 'k' is given twice", reference=False),
    case("lone surrogate metadata value", pack('{"__metadata__":{"k":"\\udc00"}}'),
         "__metadata__ value for key 'k' is not valid UTF-8"),
    case("entry null", pack('{"w":null}'), "tensor 'w': entry must be an object .*got null$"),
    case("entry string", pack('{"w":"F32"}'), "tensor 'w': entry must be an object .*got \"F32\"$"),
    case("empty header", pack(""), "header is not valid JSON: it is empty"),
    case("trailing comma", pack('{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},}', b"\0"),
         "not valid JSON: expected a tensor name in double quotes at byte 53, found }"),
    case("trailing comma in entry", pack('{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],}}', b"\0"),
         "not valid JSON: expected a field name in double quotes at byte 52"),
    case("missing colon", pack('{"w" {}}'), "not valid JSON: expected ':' after the name 'w' at byte 5"),
    case("missing comma", pack('{"__metadata__":{} "w":{}}'), "not valid JSON: expected ',' or '}' after __metadata__"),
    case("unterminated string", pack('{"w'), "the string at byte 1 is unterminated"),
    case("control character in a string", pack('{"a\tb":{}}'), "string at byte 1 is unterminated or holds a control"),
    case("bad escape", pack('{"a\\x":{}}'), "string at byte 1 is unterminated or holds a control character or a bad"),
    case("single quotes", pack("{'w':{}}"), "expected a tensor name in double quotes at byte 1, found 'w':{}}"),
    case("not utf-8 outside strings", pack(b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}\xff}', b"\0"),
         "header is not valid UTF-8 \\(byte 52 of the header\\)"),
    case("negative dim in a long shape",
         pack('{"w":{"dtype":"U8","shape":[' + "1," * 60 + '-1],"data_offsets":[0,1]}}', b"\0"),
         "tensor 'w': shape must be a list of non-negative integers, got \\[1,1,1,"),
]


@pytest.mark.parametrize(("raw", "size", "pattern", "reference_rejects"), MALFORMED)
def test_malformed_headers_raise_header_error_naming_the_rule(
    raw: bytes, size: int | None, pattern: str, reference_rejects: bool, tmp_path: Path
) -> None:
    file_size = len(raw) if size is None else size
    with pytest.raises(HeaderError, match=pattern) as info:
        parse_header(raw, file_size, tmp_path / NAME)
    assert str(info.value).startswith(str(tmp_path / NAME) + ": "), "the message must name the file"
    if size is None and reference_rejects:
        # The rule is safetensors' own: its reader rejects the same file.
        path = tmp_path / "same.safetensors"
        path.write_bytes(raw)
        assert not safetensors_accepts(path)


def test_header_error_is_a_mapping_error_and_a_value_error() -> None:
    assert issubclass(HeaderError, MappingError) and issubclass(MappingError, ValueError)


def test_long_names_are_shortened_in_messages() -> None:
    name = "x" * 10_000
    raw = pack({name: entry("F32", [3], 0, 8)}, b"\0" * 8)
    with pytest.raises(HeaderError, match="xxx\\.\\.\\.") as info:
        parse_header(raw, len(raw), NAME)
    assert len(str(info.value)) < 500


def test_raw_shorter_than_its_header_is_a_header_error() -> None:
    raw = pack(W8, b"\0" * 8)
    with pytest.raises(HeaderError, match="fewer than"):
        parse_header(raw[:20], len(raw), NAME)
    with pytest.raises(HeaderError, match="too few"):
        parse_header(raw[:5], len(raw), NAME)


def test_read_header_reports_missing_files_as_os_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_header(tmp_path / "absent.safetensors")
    with pytest.raises(IsADirectoryError):
        read_header(tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_read_header_of_a_fifo_is_an_error_and_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    outcome = returned_or_raised(lambda: read_header(fifo), fifo, "read_header")
    assert isinstance(outcome, MappingError), outcome
    assert str(outcome) == f"{fifo}: is a named pipe (FIFO), not a regular file"


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        (b"", "0 bytes, too short"),
        (b"\x10\0\0", "3 bytes, too short"),
        (pack("{}", length=64), "runs past the end of the file"),
        (struct.pack("<Q", MAX_HEADER_BYTES + 8) + b"{}", "over the limit"),
        (pack(W8, b"\0" * 4), "past the end of the 4-byte data section"),
    ],
)
def test_read_header_content_errors_are_header_errors(content: bytes, pattern: str, tmp_path: Path) -> None:
    path = tmp_path / "f.safetensors"
    path.write_bytes(content)
    with pytest.raises(HeaderError, match=pattern):
        read_header(path)


def _torch_zip(path: Path) -> None:
    torch.save({"w": torch.ones(3)}, path)


def _torch_legacy(path: Path) -> None:
    torch.save({"w": torch.ones(3)}, path, _use_new_zipfile_serialization=False)


def _numpy_npy(path: Path) -> None:
    import numpy

    with open(path, "wb") as f:
        numpy.save(f, numpy.ones(3))


def _writes(content: bytes) -> Any:
    return lambda path: path.write_bytes(content)


NOT_SAFETENSORS = [
    pytest.param(_torch_zip, "a zip archive \\(torch.save writes those", id="torch.save zip"),
    pytest.param(_torch_legacy, "a Python pickle \\(torch.save", id="torch.save legacy pickle"),
    pytest.param(_writes(pickle.dumps({"w": [1.0] * 3}, protocol=2)), "a Python pickle", id="pickle 2"),
    pytest.param(_writes(pickle.dumps({"w": [1.0] * 300}, protocol=5)), "a Python pickle", id="pickle 5"),
    pytest.param(_writes(json.dumps({"weight_map": {"w": "a.safetensors"}}).encode()), "JSON text", id="json"),
    pytest.param(_writes(b"  [1, 2, 3]\n"), "JSON text", id="json list"),
    pytest.param(_writes(b"version https://git-lfs.github.com/spec/v1\noid sha256:00\n"), "like text",
                 id="git-lfs pointer"),
    pytest.param(_writes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0)), "a GGUF file", id="gguf"),
    pytest.param(_writes(b"\x89HDF\r\n\x1a\n" + bytes(40)), "an HDF5 file", id="hdf5"),
    pytest.param(_numpy_npy, "a NumPy .npy array", id="npy"),
    pytest.param(_writes(gzip.compress(b"{}" * 100)), "gzip-compressed", id="gzip"),
    pytest.param(_writes(bytes(range(200, 256)) * 4), "its first 8 bytes \\(c8 c9 ca cb cc cd ce cf\\) "
                 "read as a header length of \\d+, over the limit .* match no format", id="random bytes"),
]


@pytest.mark.parametrize(("make", "pattern"), NOT_SAFETENSORS)
def test_files_that_are_not_safetensors_say_what_they_look_like(make: Any, pattern: str, tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    make(path)
    with pytest.raises(HeaderError, match=f"^{path}: not a safetensors file: .*{pattern}"):
        read_header(path)
    # Readers that read only the first 8 bytes and hand them to parse_header get the same answer.
    content = path.read_bytes()
    with pytest.raises(HeaderError, match=f"not a safetensors file: .*{pattern}"):
        parse_header(content[:8], len(content), path)


def test_a_signature_behind_a_plausible_length_is_found_before_the_header_is_read(tmp_path: Path) -> None:
    # "PK\x03\x04" then zeros reads as a 67 MB header: the zip signature is reported without
    # reading (or allocating) that header.
    path = tmp_path / "odd.zip"
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04" + bytes(60))
        f.truncate(80 * 2**20)
    with pytest.raises(HeaderError, match="not a safetensors file: it starts like a zip archive"):
        read_header(path)


def test_truncated_safetensors_is_still_reported_as_truncated(tmp_path: Path) -> None:
    path = tmp_path / "cut.safetensors"
    save_file({"w": torch.ones(1000)}, str(path))
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(HeaderError, match="header length \\d+ runs past the end of the file \\(40 bytes\\)"):
        read_header(path)
    raw = pack("[1]")  # a plausible length and a broken header: safetensors' own rules still apply
    with pytest.raises(HeaderError, match="not an object"):
        parse_header(raw, len(raw), NAME)


def test_check_little_endian(monkeypatch: pytest.MonkeyPatch) -> None:
    if sys.byteorder == "little":
        check_little_endian()
    monkeypatch.setattr(sys, "byteorder", "big")
    with pytest.raises(MappingError, match="little-endian host"):
        check_little_endian()


def test_header_is_hashable() -> None:
    raw = pack(W8, b"\0" * 8)
    a, b = parse_header(raw, len(raw), NAME), parse_header(raw, len(raw), NAME)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1


# --------------------------------------------------------------------------- writing


def write(path: Path, tensors: dict[str, torch.Tensor], **kwargs: Any) -> Header:
    return write_checkpoint(path, specs_of(tensors), lambda spec: tensors[spec.name], **kwargs)


def test_written_file_is_byte_identical_to_save_file(tmp_path: Path) -> None:
    # One dtype per item size: for equal item sizes safetensors orders by its dtype enum
    # before the name, where write_checkpoint orders by name alone.
    every = sample_tensors()
    tensors = {name: every[name] for name in ("f64", "f32", "bf16", "u8", "scalar", "empty", "empty_bf16")}
    tensors["ünï"] = torch.ones(3, dtype=torch.bfloat16)
    # One metadata key: safetensors keeps metadata in a hash map, so the order of several varies.
    for metadata in (None, {"ключ": "значение"}):
        save_file(tensors, str(tmp_path / "ref.safetensors"), metadata=metadata)
        write(tmp_path / "ours.safetensors", tensors, metadata=metadata)
        assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()


def test_written_file_loads_with_safetensors_and_is_aligned(tmp_path: Path) -> None:
    tensors = sample_tensors()
    path = tmp_path / "out.safetensors"
    seen: list[int] = []
    header = write(path, tensors, metadata={"k": "v"}, progress=seen.append)

    loaded = load_file(str(path))
    assert set(loaded) == set(tensors)
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape, name
        assert raw_bytes(loaded[name]) == raw_bytes(t), name
    assert header == read_header(path)
    assert header.metadata == {"k": "v"}
    assert header.data_start % 8 == 0
    for e in header.tensors.values():
        assert e.start % e.dtype.itemsize == 0, e.name
    assert seen == [e.nbytes for e in header.tensors.values()]
    assert sorted(os.listdir(tmp_path)) == ["out.safetensors"], "no temporary file may be left"


def test_writer_accepts_non_contiguous_views_and_grad_tensors(tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tensors = {
        "transposed": base.t(),
        "strided": base[::2, 1::2],
        "expanded": torch.arange(3.0).expand(4, 3),
        "param": torch.nn.Parameter(base.clone()),
        "conj": torch.complex(base, -base).conj(),
        "neg": torch.complex(base, base).conj().imag,
    }
    write(tmp_path / "v.safetensors", tensors)
    loaded = load_file(str(tmp_path / "v.safetensors"))
    for name, t in tensors.items():
        assert torch.equal(loaded[name], t.detach()), name


def test_writer_holds_one_tensor_at_a_time_in_file_order(tmp_path: Path) -> None:
    specs = [TensorSpec(f"t{i}", dtype, (64, 64)) for i, dtype in
             enumerate([torch.float16, torch.float64, torch.float32, torch.uint8, torch.float64])]
    order: list[str] = []
    previous: list[weakref.ref[torch.Tensor]] = []

    def fill(spec: TensorSpec) -> torch.Tensor:
        assert all(ref() is None for ref in previous), "the previous tensor was not dropped"
        order.append(spec.name)
        t = torch.full(spec.shape, len(order), dtype=spec.dtype)
        previous.append(weakref.ref(t))
        return t

    header = write_checkpoint(tmp_path / "o.safetensors", specs, fill)
    assert order == list(header.tensors) == ["t1", "t4", "t2", "t0", "t3"]


def test_fill_that_raises_leaves_no_file_and_no_temp(tmp_path: Path) -> None:
    calls = []

    def fill(spec: TensorSpec) -> torch.Tensor:
        calls.append(spec.name)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return torch.zeros(spec.shape, dtype=spec.dtype)

    specs = [TensorSpec("a", torch.float32, (8,)), TensorSpec("b", torch.float32, (8,))]
    with pytest.raises(RuntimeError, match="boom"):
        write_checkpoint(tmp_path / "x.safetensors", specs, fill)
    assert os.listdir(tmp_path) == []


def test_failed_overwrite_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    write(path, {"old": torch.ones(4)})
    before = path.read_bytes()

    def fill(spec: TensorSpec) -> torch.Tensor:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(path, [TensorSpec("new", torch.float32, (4,))], fill)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["x.safetensors"]


@pytest.mark.parametrize(
    ("returned", "pattern"),
    [
        (torch.zeros(3, 2), "tensor 'w': fill returned shape \\[3, 2\\], the spec says \\[2, 3\\]"),
        (torch.zeros(2, 3, dtype=torch.float16), "tensor 'w': fill returned dtype torch.float16"),
        ([0.0] * 6, "tensor 'w': fill returned list, not a tensor"),
        (torch.zeros(2, 3, device="meta"), "tensor 'w': fill returned a meta tensor"),
        (torch.zeros(2, 3).to_sparse(), "tensor 'w': fill returned a torch.sparse_coo tensor"),
    ],
)
def test_fill_result_must_match_the_spec(returned: Any, pattern: str, tmp_path: Path) -> None:
    specs = [TensorSpec("w", torch.float32, (2, 3))]
    with pytest.raises(MappingError, match=pattern):
        write_checkpoint(tmp_path / "x.safetensors", specs, lambda spec: returned)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("specs", "metadata", "pattern"),
    [
        ([TensorSpec("a", torch.float32, (1,)), TensorSpec("a", torch.float16, (2,))], None,
         "tensor 'a': name appears twice"),
        ([TensorSpec("__metadata__", torch.float32, (1,))], None, "reserved"),
        ([TensorSpec("c", torch.complex128, (1,))], None, "tensor 'c': dtype torch.complex128 has no"),
        ([TensorSpec("n", torch.float32, (-1,))], None, "tensor 'n': shape must be non-negative"),
        ([TensorSpec("b", torch.float32, (True,))], None, "tensor 'b': shape must be"),
        ([TensorSpec("s", torch.float32, (1,))], {"k": 1}, "metadata must map strings to strings"),
    ],
)
def test_invalid_specs_raise_before_anything_is_written(
    specs: list[TensorSpec], metadata: Any, pattern: str, tmp_path: Path
) -> None:
    def fill(spec: TensorSpec) -> torch.Tensor:
        raise AssertionError("fill must not be called")

    with pytest.raises(MappingError, match=pattern):
        write_checkpoint(tmp_path / "x.safetensors", specs, fill, metadata=metadata)
    assert os.listdir(tmp_path) == []


def test_zero_element_and_empty_checkpoints(tmp_path: Path) -> None:
    header = write_checkpoint(tmp_path / "empty.safetensors", [], lambda spec: torch.zeros(0))
    assert header.tensors == {} and header.file_size == header.data_start
    assert load_file(str(tmp_path / "empty.safetensors")) == {}
    tensors = {"z": torch.zeros(0, 4), "s": torch.tensor(7, dtype=torch.int64), "e": torch.zeros(5, 0, 2)}
    header = write(tmp_path / "z.safetensors", tensors)
    loaded = load_file(str(tmp_path / "z.safetensors"))
    assert {k: v.shape for k, v in loaded.items()} == {k: v.shape for k, v in tensors.items()}
    assert loaded["s"].item() == 7 and header.tensors["z"].nbytes == 0


def test_overwrite_keeps_existing_mapping_readable(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    write(path, {"w": torch.arange(1024, dtype=torch.float32)})
    old = path.read_bytes()
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        view = torch.frombuffer(mm, dtype=torch.float32, offset=read_header(path).data_start, count=1024)
        write(path, {"w": -torch.arange(1024, dtype=torch.float32), "extra": torch.ones(3)})
        assert mm[:] == old, "the old mapping must still read the old file"
        assert torch.equal(view, torch.arange(1024, dtype=torch.float32))
        del view
    finally:
        mm.close()
    assert torch.equal(load_file(str(path))["w"], -torch.arange(1024, dtype=torch.float32))


def test_writing_onto_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d.safetensors").mkdir()
    with pytest.raises(IsADirectoryError):
        write(tmp_path / "d.safetensors", {"w": torch.ones(1)})
    assert os.listdir(tmp_path) == ["d.safetensors"]
