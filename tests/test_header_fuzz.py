"""Fuzzing parse_header: whatever the bytes, it returns a valid Header or raises HeaderError.

Inputs are random bytes and valid headers mutated at the JSON level (values swapped for
other types, numbers changed, keys dropped or added) and at the byte level (truncated,
bytes flipped or inserted, length prefix and file size off by a little). A header that
is accepted must also satisfy the format's invariants and be accepted by safetensors'
own reader (weightmap is at least as strict).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from weightmap.errors import HeaderError
from weightmap.format import DTYPES, Header, parse_header

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NAME = "fuzz.safetensors"

names = st.text(min_size=1, max_size=6).filter(lambda s: s != "__metadata__")
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 2, 4, 8, -1, 2**63, 2**64]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.sampled_from(sorted(DTYPES) + ["F128", "", "f32"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=8,
)


@st.composite
def valid_documents(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """A valid header as a JSON document, and the size of its data section."""
    document: dict[str, Any] = {}
    position = 0
    for name in draw(st.lists(names, max_size=5, unique=True)):
        code = draw(st.sampled_from(sorted(DTYPES)))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        size = math.prod(shape) * DTYPES[code].itemsize
        document[name] = {"dtype": code, "shape": shape, "data_offsets": [position, position + size]}
        position += size
    if draw(st.booleans()):
        document["__metadata__"] = draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3))
    return document, position


def slots(node: Any) -> list[tuple[Any, Any]]:
    """Every (container, key-or-index) inside a JSON document, depth first."""
    found: list[tuple[Any, Any]] = []
    keys = list(node) if isinstance(node, dict) else range(len(node)) if isinstance(node, list) else []
    for key in keys:
        found.append((node, key))
        found.extend(slots(node[key]))
    return found


def mutate_document(data: st.DataObject, document: dict[str, Any]) -> None:
    """Apply a few JSON-level mutations in place."""
    for _ in range(data.draw(st.integers(1, 3), label="json mutations")):
        places = slots(document)
        if not places:
            document[data.draw(names)] = data.draw(json_values)
            continue
        container, key = places[data.draw(st.integers(0, len(places) - 1), label="place")]
        action = data.draw(st.sampled_from(["replace", "drop", "add", "nudge"]), label="action")
        if action == "replace":
            container[key] = data.draw(json_values, label="value")
        elif action == "drop":
            del container[key]
        elif action == "add" and isinstance(container, dict):
            key = data.draw(st.sampled_from(["x", "dtype", "__metadata__", "shape"]) | names, label="key")
            container[key] = data.draw(json_values, label="value")
        elif action == "add":
            container.append(data.draw(json_values))
        elif isinstance(container[key], int):
            container[key] += data.draw(st.sampled_from([-9, -1, 1, 2, 8, 2**62]), label="delta")


def mutate_bytes(data: st.DataObject, text: bytes) -> bytes:
    """Apply byte-level mutations: truncate, flip a byte, insert bytes, or splice in JSON oddities."""
    action = data.draw(st.sampled_from(["none", "truncate", "flip", "insert", "splice"]), label="byte action")
    if not text or action == "none":
        return text
    at = data.draw(st.integers(0, len(text) - 1), label="at")
    if action == "truncate":
        return text[:at]
    if action == "flip":
        return text[:at] + bytes([text[at] ^ data.draw(st.integers(1, 255))]) + text[at + 1 :]
    if action == "insert":
        return text[:at] + data.draw(st.binary(min_size=1, max_size=4)) + text[at:]
    oddities = [b"NaN", b"Infinity", b"1e400", b"-0", b"\\ud800", b"\xff", b'"', b"{"]
    oddity = data.draw(st.sampled_from(oddities), label="oddity")
    return text[:at] + oddity + text[at:]


def check_accepted(header: Header, raw: bytes, file_size: int, tmp: Path) -> None:
    """Invariants of an accepted header, and agreement with safetensors' reader."""
    position = header.data_start
    for entry in header.tensors.values():
        assert entry.start == position or (entry.nbytes == 0 and entry.start <= position)
        assert entry.nbytes == entry.numel * entry.dtype.itemsize
        position = max(position, entry.end)
    assert position == file_size
    path = tmp / NAME
    path.write_bytes(raw + b"\0" * (file_size - len(raw)))
    with safe_open(str(path), "pt") as reference:
        assert set(reference.keys()) == set(header.tensors)


def parse_or_header_error(raw: bytes, file_size: int) -> Header | None:
    """parse_header's result, or None when it raised HeaderError (anything else propagates)."""
    try:
        return parse_header(raw, file_size, NAME)
    except HeaderError:
        return None


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@settings(FUZZ, max_examples=60)
@given(blob=st.binary(max_size=96), extra=st.integers(0, 64))
def test_random_bytes(blob: bytes, extra: int) -> None:
    parse_or_header_error(blob, len(blob) + extra)


@settings(FUZZ, max_examples=60)
@given(body=st.binary(max_size=160), data_size=st.integers(0, 16))
def test_random_header_bodies(body: bytes, data_size: int) -> None:
    raw = struct.pack("<Q", len(body)) + body
    parse_or_header_error(raw, len(raw) + data_size)


@settings(FUZZ, max_examples=200)
@given(valid=valid_documents(), data=st.data())
def test_mutated_valid_headers(valid: tuple[dict[str, Any], int], data: st.DataObject, scratch: Path) -> None:
    document, data_size = valid
    if data.draw(st.integers(0, 5), label="mutate json?"):
        mutate_document(data, document)
    text = mutate_bytes(data, json.dumps(document).encode("utf-8"))
    text += b" " * data.draw(st.integers(0, 7), label="padding")
    skew = data.draw(st.sampled_from([0, 0, 0, 0, -1, 1, 2**40, 2**64 - 1 - len(text)]), label="length skew")
    length = len(text) + skew
    raw = struct.pack("<Q", max(0, min(length, 2**64 - 1))) + text
    file_size = len(raw) + max(0, data_size + data.draw(st.sampled_from([0, 0, 0, -1, 1, 4]), label="size"))
    header = parse_or_header_error(raw, file_size)
    event("accepted" if header is not None else "rejected")
    if header is not None:
        check_accepted(header, raw, file_size, scratch)


@settings(FUZZ, max_examples=30)
@given(valid=valid_documents())
def test_unmutated_documents_are_accepted(valid: tuple[dict[str, Any], int], scratch: Path) -> None:
    """The generator itself yields valid files, so the mutations start from real headers."""
    document, data_size = valid
    text = json.dumps(document).encode("utf-8")
    raw = struct.pack("<Q", len(text)) + text
    header = parse_header(raw, len(raw) + data_size, NAME)
    check_accepted(header, raw, len(raw) + data_size, scratch)
