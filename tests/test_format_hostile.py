"""Hostile headers: rejected at bounded memory, in a bounded number of calls, and without recursion.

Each measurement runs in a fresh interpreter, so that nothing this test process holds
counts, and reads the kernel's high-water mark of resident memory (VmHWM) after
resetting it (writing 5 to /proc/self/clear_refs). The work is counted, not timed: every
Python and C function call while the header is read (``sys.setprofile``). A reader that
walked the millions of items a hostile header holds would make millions of calls; one that
rejects a value where it starts makes a few hundred, whatever the size. Work inside one C
call (a regular expression matching part of the header) is not counted: its patterns are
possessive, so linear, and a quadratic one would take hours on 16 MB and time the child out.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

MB = 10**6
SIZE = 16 * MB  # each hostile header; the bound below is 64 MiB + 4 x this
CALLS = 1000  # function calls while one hostile header is read (a few hundred here), whatever its size
ROOT = Path(__file__).resolve().parent.parent


def pack(body: bytes) -> bytes:
    return struct.pack("<Q", len(body)) + body


def objects(count: int) -> bytes:
    return b",".join([b"{}"] * count)


def hostile_headers() -> dict[str, bytes]:
    """Headers of about SIZE bytes that a JSON parser would turn into millions of objects."""
    n = SIZE // 3
    deep = SIZE // 2 - 20
    return {
        "objects in __metadata__": pack(b'{"__metadata__":{"k":[' + objects(n) + b"]}}"),
        "__metadata__ of objects": pack(b'{"__metadata__":[' + objects(n) + b"]}"),
        "objects in a shape": pack(b'{"w":{"dtype":"F32","shape":[' + objects(n) + b'],"data_offsets":[0,0]}}'),
        "objects as entries": pack(b"{" + b'"a":{},' * (SIZE // 7) + b'"b":{}}'),
        "lists as entries": pack(b"{" + b'"a":[],' * (SIZE // 7) + b'"b":[]}'),
        "objects in an unknown field": pack(b'{"w":{"x":[' + objects(n) + b'],"dtype":"F32"}}'),
        "nested lists": pack(b"[" * deep + b"]" * deep),
        "nested lists in an entry": pack(b'{"w":' + b"[" * deep + b"]" * deep + b"}"),
        "nested objects in __metadata__": pack(
            b'{"__metadata__":{"a":"b","k":' + b'{"a":' * (SIZE // 6) + b"}" * (SIZE // 6) + b"}}"
        ),
        "numbers in __metadata__": pack(b'{"__metadata__":{"k":[' + b"0," * (SIZE // 2) + b"0]}}"),
        # Valid for safetensors: millions of dimensions of 1 make a one-element tensor.
        "dimensions in a valid shape": pack(
            b'{"w":{"dtype":"F32","shape":[' + b"1," * (SIZE // 2) + b'1],"data_offsets":[0,4]}}'
        ) + bytes(4),
    }


# Measures each file in turn, printing one JSON line; then, with the recursion limit raised as
# far as a caller might, parses deeply nested headers (a recursive parser overflows the C stack).
CHILD = r"""
import ctypes, json, struct, sys
from weightmap.errors import HeaderError
from weightmap.format import parse_header, read_header

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

try:
    trim = ctypes.CDLL(None).malloc_trim  # glibc: give freed heap back, so growth is measured afresh
except (OSError, AttributeError):
    trim = lambda pad: None

calls = 0

def count(frame, event, arg):
    global calls
    if event in ("call", "c_call"):
        calls += 1

results = {}
for path in sys.argv[1:]:
    trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status("VmRSS")
    calls = 0
    sys.setprofile(count)
    try:
        read_header(path)
        outcome = "accepted"
    except HeaderError as error:
        outcome = str(error)
    finally:
        sys.setprofile(None)
    results[path] = {"calls": calls, "growth": status("VmHWM") - base, "outcome": outcome}
print(json.dumps(results), flush=True)

sys.setrecursionlimit(10**6)
depth = 2_000_000
for body in (
    b"[" * depth + b"]" * depth,
    b'{"w":' + b"[" * depth + b"]" * depth + b"}",
    b'{"w":{"dtype":"F32","shape":' + b"[" * depth + b"]" * depth + b',"data_offsets":[0,0]}}',
    b'{"__metadata__":{"k":' + b'{"a":' * depth + b"}" * depth + b"}}",
    b'{"__metadata__":' + b"[" * depth + b"]" * depth + b"}",
):
    raw = struct.pack("<Q", len(body)) + body
    try:
        parse_header(raw, len(raw), "deep.safetensors")
    except HeaderError as error:
        print(str(error)[:90], flush=True)
    else:
        print("accepted", flush=True)
"""


def clear_refs_works() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict[str, Path]]:
    """One interpreter (importing torch once) that measures every hostile header, then the deep ones."""
    if not sys.platform.startswith("linux") or not clear_refs_works():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset VmHWM")
    directory = tmp_path_factory.mktemp("hostile")
    paths = {}
    for index, (label, raw) in enumerate(hostile_headers().items()):
        paths[label] = directory / f"hostile{index}.safetensors"
        paths[label].write_bytes(raw)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, paths.values())],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )
    return done, paths


def test_hostile_headers_are_rejected_at_bounded_memory_in_a_bounded_number_of_calls(
    child: tuple[subprocess.CompletedProcess[str], dict[str, Path]],
) -> None:
    done, paths = child
    assert done.stdout, done.stderr[-2000:]
    results = json.loads(done.stdout.splitlines()[0])
    for label, path in paths.items():
        result = results[str(path)]
        size = path.stat().st_size
        assert result["outcome"].startswith(f"{path}: "), (label, result["outcome"][:300])
        assert result["growth"] <= 64 * 2**20 + 4 * size, (label, result["growth"] / 2**20)
        assert result["calls"] <= CALLS, (label, result["calls"])


def test_deep_nesting_is_a_header_error_even_with_a_raised_recursion_limit(
    child: tuple[subprocess.CompletedProcess[str], dict[str, Path]],
) -> None:
    done, _ = child
    assert done.returncode == 0, f"the child died (return code {done.returncode}): {done.stderr[-2000:]}"
    lines = done.stdout.splitlines()[1:]
    assert len(lines) == 5 and all(line.startswith("deep.safetensors: ") for line in lines), lines
