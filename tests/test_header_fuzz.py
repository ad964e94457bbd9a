"""Fuzzing parse_header: whatever the bytes, it returns a valid Header or raises HeaderError.

Inputs are random bytes and valid headers mutated at the JSON level (values swapped for
other types or for raw JSON tokens Python cannot produce, such as ``-0``, ``1e0`` or deep
nesting; numbers changed; keys dropped or added), with shapes whose product overflows
before a 0, and at the byte level (truncated, bytes flipped or inserted, length prefix and
file size off by a little). A header that is accepted must also satisfy the format's
invariants and be accepted by safetensors' own reader (weightmap is at least as strict);
a header that safetensors accepts but weightmap rejects must break one of the rules
weightmap adds on purpose (see weightmap.format's docstring), and no other.
"""

from __future__ import annotations

import json
import math
import re
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
# Raw JSON text spliced in where a value was: tokens json.dumps never writes.
NUMBER_TOKENS = ["-0", "-0.0", "1.0", "1e0", "0e0", "01", "18446744073709551616", "1e400", "-1"]
RAW_TOKENS = [*NUMBER_TOKENS, "[" * 200 + "]" * 200, "[{},{},{}]", "{" + '"a":{' * 150 + "}" * 151]
RAW_MARK = "@@raw{}@@"
raw_tokens = st.integers(0, len(RAW_TOKENS) - 1).map(RAW_MARK.format)
number_tokens = st.integers(0, len(NUMBER_TOKENS) - 1).map(RAW_MARK.format)


def render(document: dict[str, Any]) -> str:
    """The document as JSON text, with raw-token placeholders replaced by their tokens."""
    text = json.dumps(document)
    return re.sub('"@@raw([0-9]+)@@"', lambda m: RAW_TOKENS[int(m.group(1))], text)


json_values = st.recursive(
    scalars | raw_tokens,
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
        if draw(st.booleans()):
            shape = draw(st.lists(st.integers(0, 4), max_size=3))
        else:  # zero-size, with dimensions whose running product may pass 2**64 - 1 before the 0
            big = st.sampled_from([1, 3, 7, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1])
            shape = draw(st.lists(big, min_size=1, max_size=3))
            shape.insert(draw(st.sampled_from([len(shape), len(shape), 0, 1])), 0)
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
        action = data.draw(st.sampled_from(["replace", "drop", "add", "nudge", "token"]), label="action")
        if action == "replace":
            container[key] = data.draw(json_values | raw_tokens, label="value")
        elif action == "drop":
            del container[key]
        elif action == "add" and isinstance(container, dict):
            key = data.draw(st.sampled_from(["x", "dtype", "__metadata__", "shape"]) | names, label="key")
            container[key] = data.draw(json_values, label="value")
        elif action == "add":
            container.append(data.draw(json_values))
        elif action == "token":  # a number where there was a number (often -0 for 0), else anything
            value = container[key]
            tokens = raw_tokens if type(value) is not int else number_tokens
            if value == 0 and type(value) is int:
                tokens = st.just(RAW_MARK.format(0)) | tokens
            container[key] = data.draw(tokens, label="token")
        elif isinstance(container[key], int):
            container[key] += data.draw(st.sampled_from([-9, -1, 1, 2, 8, 2**62]), label="delta")


def mutate_bytes(data: st.DataObject, text: bytes) -> bytes:
    """Apply byte-level mutations: truncate, flip a byte, insert bytes, or splice in JSON oddities."""
    actions = ["none", "none", "none", "none", "truncate", "flip", "insert", "splice"]
    action = data.draw(st.sampled_from(actions), label="byte action")
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


# The rules weightmap adds to safetensors' (each stricter): the only reasons it may reject a
# file that safetensors accepts.
DELIBERATE = re.compile(
    "entry has unknown field|is given twice|name appears twice|has a dimension over 2\\*\\*63 - 1"
)


def check_rejected(error: HeaderError, raw: bytes, file_size: int, tmp: Path) -> None:
    """A file weightmap rejects is rejected by safetensors too, unless a deliberate rule applies."""
    if len(raw) > file_size:
        return  # no file holds these bytes and has this size
    path = tmp / NAME
    path.write_bytes(raw + b"\0" * (file_size - len(raw)))
    try:
        with safe_open(str(path), "pt") as reference:
            reference.keys()
    except Exception:
        event("both reject")
        return
    event("deliberately stricter")
    assert DELIBERATE.search(str(error)), f"safetensors accepts this file: {raw!r} (size {file_size}): {error}"


def parse_or_header_error(raw: bytes, file_size: int, tmp: Path | None = None) -> Header | None:
    """parse_header's result, or None when it raised HeaderError (anything else propagates).

    With ``tmp``, a rejection is checked against safetensors' reader (see check_rejected).
    """
    try:
        return parse_header(raw, file_size, NAME)
    except HeaderError as error:
        if tmp is not None:
            check_rejected(error, raw, file_size, tmp)
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
def test_random_header_bodies(body: bytes, data_size: int, scratch: Path) -> None:
    raw = struct.pack("<Q", len(body)) + body
    parse_or_header_error(raw, len(raw) + data_size, scratch)


@settings(FUZZ, max_examples=200)
@given(valid=valid_documents(), data=st.data())
def test_mutated_valid_headers(valid: tuple[dict[str, Any], int], data: st.DataObject, scratch: Path) -> None:
    document, data_size = valid
    if data.draw(st.integers(0, 5), label="mutate json?"):
        mutate_document(data, document)
    text = mutate_bytes(data, render(document).encode("utf-8"))
    text += b" " * data.draw(st.integers(0, 7), label="padding")
    skew = data.draw(st.sampled_from([0] * 12 + [-1, 1, 2**40, 2**64 - 1 - len(text)]), label="length skew")
    length = len(text) + skew
    raw = struct.pack("<Q", max(0, min(length, 2**64 - 1))) + text
    file_size = len(raw) + max(0, data_size + data.draw(st.sampled_from([0] * 6 + [-1, 1, 4]), label="size"))
    header = parse_or_header_error(raw, file_size, scratch)
    event("accepted" if header is not None else "rejected")
    if header is not None:
        check_accepted(header, raw, file_size, scratch)


@settings(FUZZ, max_examples=60)
@given(valid=valid_documents())
def test_unmutated_documents_agree_with_safetensors(valid: tuple[dict[str, Any], int], scratch: Path) -> None:
    """The generator yields well-formed files, so the mutations start from real headers.

    Those with small shapes are valid; zero-size shapes with huge dimensions are valid or not
    by safetensors' overflow rule, and both readers must agree on each (up to the rules
    weightmap adds on purpose).
    """
    document, data_size = valid
    text = json.dumps(document).encode("utf-8")
    raw = struct.pack("<Q", len(text)) + text
    header = parse_or_header_error(raw, len(raw) + data_size, scratch)
    small = all(max(entry["shape"], default=0) <= 4 for name, entry in document.items() if name != "__metadata__")
    event("accepted" if header is not None else "rejected")
    if small:
        assert header is not None
    if header is not None:
        check_accepted(header, raw, len(raw) + data_size, scratch)


@settings(FUZZ, max_examples=40)
@given(valid=valid_documents(), data=st.data())
def test_negative_zero_is_rejected_wherever_a_zero_was(
    valid: tuple[dict[str, Any], int], data: st.DataObject, scratch: Path
) -> None:
    """JSON's ``-0`` is no integer to safetensors (serde reads it as the float -0.0)."""
    document, data_size = valid
    zeros = [(c, k) for c, k in slots(document) if type(c[k]) is int and c[k] == 0]
    if not zeros:
        document["z"] = {"dtype": "U8", "shape": [0], "data_offsets": [data_size, data_size]}
        zeros = [(document["z"]["shape"], 0)]
    container, key = zeros[data.draw(st.integers(0, len(zeros) - 1), label="zero")]
    container[key] = RAW_MARK.format(RAW_TOKENS.index("-0"))
    text = render(document).encode("utf-8")
    raw = struct.pack("<Q", len(text)) + text
    assert parse_or_header_error(raw, len(raw) + data_size, scratch) is None
